"""The local GPU, seen through torch and the cuDNN frontend (the [gpu] extra).

Imported lazily: the client installs and fetches plans without torch; only
detecting the local target and executing a plan need it.
"""

from __future__ import annotations

from typing import Any

from plancache.keys.target import Target
from plancache.run.execution import handle_state
from plancache.run.stack import load_math_libraries, require_gpu_stack, torch_dtype

__all__ = ["cudnn_handle", "detect_target", "load_math_libraries", "torch_dtype"]


def detect_target(device: int = 0) -> Target:
    """The exact target of a local GPU: architecture, versions, device name, SM count."""
    torch, cudnn = require_gpu_stack()
    major, minor = torch.cuda.get_device_capability(device)
    props = torch.cuda.get_device_properties(device)
    return Target(
        compute_capability=f"sm_{major}{minor}",
        cudnn_version=int(cudnn.backend_version()),
        frontend_version=str(cudnn.__version__),
        device_name=str(props.name),
        sm_count=int(props.multi_processor_count),
    )


def cudnn_handle(device: int | None = None) -> Any:
    """This thread's cuDNN handle on `device` (a handle must not cross threads).

    plancache remembers which stream it set on this handle and sets it again
    only when the current torch stream differs: do not call
    `cudnn.set_stream` on it yourself (create your own handle for that)."""
    return handle_state(device).handle

"""The local GPU, seen through torch and the cuDNN frontend (the [gpu] extra).

Imported lazily: the client installs and fetches plans without torch; only
detecting the local target and executing a plan need it.
"""

from __future__ import annotations

import os
from typing import Any

from plancache.errors import InvalidRequest
from plancache.target import Target

_TORCH_DTYPES = {
    "float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64", "int8": "int8",
    "int32": "int32", "int64": "int64", "uint8": "uint8", "boolean": "bool", "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}  # fmt: skip

def _require_gpu_stack() -> tuple[Any, Any]:
    try:
        import cudnn
        import torch
    except ImportError as e:
        raise InvalidRequest(
            f"this needs the GPU stack ({e.name} is missing): pip install 'plancache[gpu]', or pass target= explicitly"
        ) from e
    if not torch.cuda.is_available():
        raise InvalidRequest("no CUDA GPU is visible to this process: pass target= explicitly to compile for another machine")
    return torch, cudnn


def detect_target(device: int = 0) -> Target:
    """The exact target of a local GPU: architecture, versions, device name, SM count."""
    torch, cudnn = _require_gpu_stack()
    major, minor = torch.cuda.get_device_capability(device)
    props = torch.cuda.get_device_properties(device)
    return Target(
        compute_capability=f"sm_{major}{minor}",
        cudnn_version=int(cudnn.backend_version()),
        frontend_version=str(cudnn.__version__),
        device_name=str(props.name),
        sm_count=int(props.multi_processor_count),
    )


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def cudnn_handle(device: int | None = None) -> Any:
    """This thread's cuDNN handle on `device` (a handle must not cross threads).

    plancache remembers which stream it set on this handle and sets it again
    only when the current torch stream differs: do not call
    `cudnn.set_stream` on it yourself (create your own handle for that)."""
    from plancache.execution import handle_state

    return handle_state(device).handle


def load_math_libraries(device: int) -> None:
    """Load cuBLAS/cuBLASLt into the process with the handle.

    cuDNN's matmul engines run on cuBLASLt, which a process loads on first
    use: on an H200 the first deserialize of such a plan took 110-157 ms
    against 1 ms for the next one, and 37 ms once torch had run one matmul.
    A local build loads it too, so this is set-up, not plan loading; doing it
    here keeps it off the first plan's path. PLANCACHE_NO_WARMUP=1 skips it.
    """
    if os.environ.get("PLANCACHE_NO_WARMUP") == "1":
        return
    torch, _ = _require_gpu_stack()
    a = torch.ones(16, 16, device=f"cuda:{device}", dtype=torch.float16)
    torch.matmul(a, a)
    torch.cuda.synchronize(device)

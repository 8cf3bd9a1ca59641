"""The exact target of a local GPU (what a plan built or run here is valid on)."""

from __future__ import annotations

from plancache.gpu.stack import require_gpu_stack
from plancache.keys.target import Target


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

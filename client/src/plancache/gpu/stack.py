"""The GPU stack itself (torch and the cuDNN frontend, the [gpu] extra),
loaded lazily: the client installs and fetches plans without torch. The
bottom of plancache.run: execution and gpu both stand on it."""

from __future__ import annotations

from typing import Any

from plancache.env import env_bool
from plancache.errors import InvalidRequest

_TORCH_DTYPES = {
    "float": "float32",
    "half": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "int8": "int8",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "boolean": "bool",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "fp8_e8m0": "float8_e8m0fnu",
}


def require_gpu_stack() -> tuple[Any, Any]:
    try:
        import cudnn
        import torch
    except ImportError as e:
        raise InvalidRequest(
            f"this needs the GPU stack ({e.name} is missing): pip install 'plancache[gpu]', or pass target= explicitly"
        ) from e
    if not torch.cuda.is_available():
        raise InvalidRequest(
            "no CUDA GPU is visible to this process: pass target= explicitly to compile for another machine"
        )
    return torch, cudnn


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def load_math_libraries(device: int) -> None:
    """Load cuBLAS/cuBLASLt into the process with the handle.

    cuDNN's matmul engines run on cuBLASLt, which a process loads on first
    use: on an H200 the first deserialize of such a plan took 110-157 ms
    against 1 ms for the next one, and 37 ms once torch had run one matmul.
    A local build loads it too, so this is set-up, not plan loading; doing it
    here keeps it off the first plan's path. PLANCACHE_NO_WARMUP=1 skips it.
    """
    if env_bool("PLANCACHE_NO_WARMUP", False):
        return
    torch, _ = require_gpu_stack()
    a = torch.ones(16, 16, device=f"cuda:{device}", dtype=torch.float16)
    torch.matmul(a, a)
    # This stream only: a device-wide synchronize from a background thread would wait for (and, while the
    # program captures a CUDA graph, fail beside) the program's own work.
    torch.cuda.current_stream(device).synchronize()

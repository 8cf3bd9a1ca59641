"""GPU faults met while building or timing a plan, told apart from cuDNN
refusing a graph: the device out of memory, and the process's CUDA context
lost. Neither says anything about the graph, so neither is remembered as a
rejection (the negative cache); a lost context also means nothing more can
run in the process that met it.

The frontend and torch raise them as RuntimeError (or torch's
OutOfMemoryError) with CUDA's or cuDNN's words in the message; `gpu_fault`
reads those words. The stand-in compiler (tests/support/standin.py) raises
the same messages to play them on a CPU.
"""

from __future__ import annotations

# The exit status of a process whose GPU was lost (EX_TEMPFAIL): its supervisor restarts it.
EXIT_GPU_LOST = 75
# CUDA, cuDNN and torch, out of device memory.
_OUT_OF_MEMORY = (
    "out of memory",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "OutOfMemoryError",
)
# Sticky errors: the context is unusable after them (an Xid on the host: 13, 31, 43, 48, 63, 74, 79, 94, 95 ...).
_CONTEXT_LOST = (
    "illegal memory access",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "cudaErrorIllegalAddress",
    "unspecified launch failure",
    "CUDA_ERROR_LAUNCH_FAILED",
    "cudaErrorLaunchFailure",
    "fallen off the bus",
    "uncorrectable ECC",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "cudaErrorECCUncorrectable",
    "CUDA_ERROR_DEVICE_UNAVAILABLE",
    "cudaErrorDevicesUnavailable",
    "no CUDA-capable device",
    "device-side assert",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "cudaErrorLaunchTimeout",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
)


class GpuOutOfMemory(Exception):
    """The device had not the memory a build or timing needed (other
    processes' memory, or a graph larger than the device): the job fails
    with the reason and is built again when asked again."""


class GpuLost(Exception):
    """The CUDA context of this process is gone (the GPU fell off the bus,
    an uncorrectable ECC error, an illegal address): nothing more runs in
    this process; its builds fail with the reason and it must be restarted."""


def gpu_fault(error: BaseException) -> GpuOutOfMemory | GpuLost | None:
    """The GPU fault `error` is, if it is one."""
    if isinstance(error, (GpuOutOfMemory, GpuLost)):
        return error
    said = f"{type(error).__name__}: {error}"
    if any(sign in said for sign in _CONTEXT_LOST):
        return GpuLost(said[:500])
    if any(sign in said for sign in _OUT_OF_MEMORY):
        return GpuOutOfMemory(said[:500])
    return None

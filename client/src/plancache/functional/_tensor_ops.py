"""The tensors a served call makes, through torch, imported only when a call needs it.

`TorchOps` makes a served call's output (one C call, everything bound) and
the constants made once per geometry, and says which device is current and
whether a CUDA graph is being captured. Tests install a stand-in with
`use_tensor_ops` (tests/support/frontdoor_standins.py). Torch's side of each
operator (its fallback) is in the operator's own module; `torch_module` is
how each reaches torch without importing it before a call needs it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from plancache.dtypes import INTEGER_TYPES
from plancache.functional._requests import Constant


@functools.cache
def available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_module() -> Any:
    """torch, imported at the first call that needs it (plancache stays importable without it)."""
    import torch

    return torch


# torch.cuda._sleep counts GPU clock cycles: 2e9 a second is the fastest SM clock of the GPUs we run (an H100's is
# 1.98 GHz), so a sleep lasts at least the seconds asked.
SLEEP_CYCLES_A_SECOND = 2e9


class TensorOps(Protocol):
    def allocator(
        self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: str, device: int
    ) -> Callable[[], Any]: ...
    def constant(self, constant: Constant, device: int) -> Any: ...
    def current_device(self) -> Callable[[], int]: ...
    def on_device(self, device: int) -> contextlib.AbstractContextManager[None]: ...
    def capturing(self) -> bool: ...
    # What plancache.functional._race times a call's plan against torch's function with.
    def synchronize(self, device: int) -> None: ...
    def device_seconds(self, run: Callable[[], None], runs: int, device: int, hold_s: float) -> float | None: ...
    def no_grad_unless(self, needs_grad: bool) -> contextlib.AbstractContextManager[None]: ...
    def leaves(self, tensors: tuple[Any, ...]) -> tuple[Any, ...]: ...
    def random_like(self, tensor: Any) -> Any: ...
    def gradients(self, result: Any, leaves: tuple[Any, ...], grad: Any) -> None: ...


class TorchOps:
    def allocator(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: str, device: int) -> Callable[[], Any]:
        """A call's output, made by one C call (empty_strided with everything bound)."""
        from plancache.gpu.stack import torch_dtype

        torch = torch_module()
        return functools.partial(
            torch.empty_strided, shape, stride, dtype=torch_dtype(dtype), device=torch.device("cuda", device)
        )

    def constant(self, constant: Constant, device: int) -> Any:
        from plancache.gpu.stack import torch_dtype

        torch = torch_module()
        value = int(constant.value) if constant.dtype in INTEGER_TYPES else constant.value
        if constant.on_host:
            return torch.full(constant.shape, value, dtype=torch_dtype(constant.dtype), device="cpu")
        # Kept for the geometry's life: made outside the private pool that torch.compile(mode="reduce-overhead")
        # allocates this thread's tensors from (a tensor kept from there failed the step, GPU run 30).
        from plancache.run.execution import outside_graph_pools

        dtype, where = torch_dtype(constant.dtype), f"cuda:{device}"
        return outside_graph_pools(lambda: torch.full(constant.shape, value, dtype=dtype, device=where), device)

    def current_device(self) -> Callable[[], int]:
        torch = torch_module()
        # ~0.05 µs; torch.cuda.current_device() is a Python wrapper of it
        raw = getattr(torch._C, "_cuda_getDevice", None)
        return raw if raw is not None else torch.cuda.current_device  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def on_device(self, device: int) -> Iterator[None]:
        with torch_module().cuda.device(device):
            yield

    def capturing(self) -> bool:
        """Whether the current stream is capturing a CUDA graph."""
        return bool(torch_module().cuda.is_current_stream_capturing())

    def synchronize(self, device: int) -> None:
        torch_module().cuda.synchronize(device)

    def device_seconds(self, run: Callable[[], None], runs: int, device: int, hold_s: float) -> float | None:
        """Seconds a run takes the device alone: the stream is held by a sleeping kernel for about `hold_s` while
        the runs are issued behind it, then timed by events from the sleep's end to the last run's end. None
        where the sleep ended before the host had issued them all (the device would have waited on the host)."""
        torch = torch_module()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(max(1, int(hold_s * SLEEP_CYCLES_A_SECOND)))
        start.record()
        for _ in range(runs):
            run()
        end.record()
        held = not start.query()  # the sleep still running: every run was queued before the device reached it
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / runs if held else None

    def no_grad_unless(self, needs_grad: bool) -> contextlib.AbstractContextManager[None]:
        torch = torch_module()
        mode: contextlib.AbstractContextManager[None] = torch.enable_grad() if needs_grad else torch.no_grad()
        return mode

    def leaves(self, tensors: tuple[Any, ...]) -> tuple[Any, ...]:
        """The call's tensors without their history (the same storage), each wanting a gradient as it did."""
        return tuple(t.detach().requires_grad_(t.requires_grad) if t.is_floating_point() else t for t in tensors)

    def random_like(self, tensor: Any) -> Any:
        return torch_module().randn_like(tensor)

    def gradients(self, result: Any, leaves: tuple[Any, ...], grad: Any) -> None:
        """The backward of `result` into `leaves` (their `.grad` untouched)."""
        wanting = [t for t in leaves if t.requires_grad]
        torch_module().autograd.grad(result, wanting, grad, allow_unused=True)


_ops: TensorOps | None = None


def ops() -> TensorOps:
    global _ops
    if _ops is None:
        _ops = TorchOps()
    return _ops


def use_tensor_ops(stand_in: TensorOps | None) -> None:
    """Install a stand-in (tests), or None for torch's on next use."""
    global _ops
    _ops = stand_in


def dropout_seed(device: Any) -> Any:
    """A Philox seed for cuDNN's dropout, drawn from torch's CUDA generator on
    the tensors' device (torch.manual_seed reproduces it; a CUDA graph
    replays the draw, as torch's own dropout does)."""
    torch = torch_module()
    return torch.randint(0, 2**62, (1, 1, 1, 1), dtype=torch.int64, device=device)

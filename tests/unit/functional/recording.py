"""torch's autograd.Function as the CPU tests run it: the forward now, the
backward when the test asks, with a context that records what is saved."""

from __future__ import annotations

from typing import Any

from plancache.functional import _autograd
from tests.support.frontdoor_standins import StandInTensor


class RecordingContext:
    """What torch's autograd gives a Function: save_for_backward, saved_tensors, needs_input_grad."""

    def __init__(self, tensors: tuple[Any, ...]) -> None:
        self.needs_input_grad = (False, *(bool(getattr(t, "requires_grad", False)) for t in tensors))
        self.saved_tensors: tuple[Any, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors


class RecordingFunction:
    """autograd.Function.apply, as torch runs it: forward now, backward when the test asks."""

    calls: list[tuple[RecordingContext, Any]] = []

    @classmethod
    def apply(cls, node: Any, *tensors: Any) -> Any:
        ctx = RecordingContext(tensors)
        out = _autograd.forward(ctx, node, *tensors)
        cls.calls.append((ctx, out))
        return out


def backward(grad: Any | None = None) -> tuple[Any, ...]:
    ctx, out = RecordingFunction.calls[-1]
    return _autograd.backward(
        ctx, grad if grad is not None else StandInTensor(out.shape, out.stride(), out.dtype.name)
    )[1:]

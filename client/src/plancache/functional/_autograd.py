"""Autograd through served plans.

A geometry called with autograd (grad mode on, an input that requires
grad) runs its training forward, a served plan that also writes what the
backward graphs read (SDPA's softmax statistics, a norm's mean and inverse
deviation, a GELU's input), inside a torch.autograd.Function whose backward
runs served backward graphs (`Rule`: the requests, and how a backward call
binds them). Each operator's rule is in its own module, beside its forward:
this one is what every rule runs in.

Every plan a geometry's training needs is fetched at its first call: the
forward and each backward graph. If cuDNN refuses any of them, torch's own
function runs the geometry, forward and backward (so a gradient is never
computed from a forward it did not see: dropout's mask, say).

What torch checks, torch still checks: saved tensors go through
`save_for_backward` (an input modified in place before the backward raises
torch's error, a second backward through freed buffers raises torch's), and
the backward is `once_differentiable` (a double backward raises torch's
error for it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plancache.functional._geometry import Dims
from plancache.functional._requests import Request
from plancache.functional._table import Served

# A rule's backward: (pieces, saved inputs (None where not saved), saved outputs, dY, which inputs need a
# gradient) -> one gradient (or None) per input, in the call's order.
Run = Callable[[dict[str, Any], list[Any], tuple[Any, ...], Any, Sequence[bool]], tuple[Any, ...]]


@dataclass
class Rule:
    """A function's backward at one geometry: the backward graphs to fetch,
    the inputs (positions in the call's tuple: the signature's saved slots,
    plancache.functional._signature.Bound.saved) and forward outputs to
    save, and `run`."""

    requests: dict[str, Request]
    save_inputs: tuple[int, ...]
    save_outputs: tuple[int, ...]
    run: Run
    inputs: int = 0  # the call's tensors (one gradient each)
    out_shape: Dims = ()
    out_stride: Dims = ()
    # Pieces torch may run when cuDNN refuses their graph: a bias gradient
    # (a sum: what ran the forward does not change it). Piece name -> torch's own.
    optional: dict[str, Callable[[tuple[Any, ...]], Any]] = field(default_factory=dict)


class Differentiable:
    """A geometry served with autograd: its training forward and the backward's plans."""

    __slots__ = ("forward", "pieces", "rule", "used")

    def __init__(self, forward: Served, rule: Rule, pieces: dict[str, Served]) -> None:
        self.forward, self.rule, self.pieces, self.used = forward, rule, pieces, 0

    @property
    def plan(self) -> Any:
        return self.forward.plan

    @property
    def request(self) -> Request:
        return self.forward.request

    def __call__(self, tensors: tuple[Any, ...]) -> Any:
        return _function().apply(self, *tensors)


def forward(ctx: Any, node: Differentiable, *tensors: Any) -> Any:
    """The autograd.Function's forward: the training plan, what the backward needs saved."""
    outs = node.forward.outputs(tensors)
    rule = node.rule
    ctx.node = node
    ctx.save_for_backward(*(tensors[i] for i in rule.save_inputs), *(outs[i] for i in rule.save_outputs))
    return outs[0]


def backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
    """The autograd.Function's backward: the rule's served graphs, one gradient (or None) per input."""
    node: Differentiable = ctx.node
    rule = node.rule
    saved = ctx.saved_tensors
    count = len(rule.save_inputs)
    inputs: list[Any] = [None] * rule.inputs
    for index, tensor in zip(rule.save_inputs, saved[:count], strict=True):
        inputs[index] = tensor
    grads = rule.run(node.pieces, inputs, saved[count:], conform(grad, rule.out_stride), ctx.needs_input_grad[1:])
    return (None, *grads)


@functools.cache
def _function() -> Any:
    """The torch.autograd.Function (made when torch is first needed)."""
    import torch
    from torch.autograd.function import once_differentiable

    class ServedFunction(torch.autograd.Function):  # type: ignore[misc]
        forward = staticmethod(forward)
        backward = staticmethod(once_differentiable(backward))

    return ServedFunction


class TorchSum:
    """A bias gradient where cuDNN refuses its reduction: torch's sum over the
    same axes (float32, as the plan's), in the shape the plan's output is allocated in (the bias's)."""

    __slots__ = ("axes", "dims")

    def __init__(self, axes: tuple[int, ...], dims: Dims) -> None:
        self.axes, self.dims = axes, dims

    def __call__(self, tensors: tuple[Any, ...]) -> Any:
        import torch

        # Accumulated in float32 without a float32 copy of dZ (run 22: `.float().sum()` cost a pass over dZ).
        return tensors[0].view(self.dims).sum(self.axes, dtype=torch.float32)


def conform(tensor: Any, stride: Sequence[int]) -> Any:
    """`tensor` in the layout a backward graph declared for it (an incoming
    gradient may be an expanded view, a sum's, or a transposed one): itself, or a copy."""
    if tuple(tensor.stride()) == tuple(stride):
        return tensor
    import torch

    return torch.empty_strided(tensor.shape, tuple(stride), dtype=tensor.dtype, device=tensor.device).copy_(tensor)


def needed(needs: Sequence[bool], index: int | None) -> bool:
    """Whether the input at `index` (None: not in the call) needs a gradient."""
    return index is not None and index < len(needs) and needs[index]

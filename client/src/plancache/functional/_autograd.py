"""Autograd through served plans.

A geometry called with autograd (grad mode on, an input that requires
grad) runs its training forward, a served plan that also writes what the
backward graphs read (SDPA's softmax statistics, a norm's mean and inverse
deviation, a GELU's input), inside a torch.autograd.Function whose backward
runs served backward graphs (`Rule`: the requests, and how a backward call
binds them).

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
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plancache.functional import _grads, _specs
from plancache.functional._geometry import Dims, Geo, Unserved, collapse
from plancache.functional._grads import shaped
from plancache.functional._specs import Attention, Request, dense_like
from plancache.functional._table import Served
from plancache.graphspec.layouts import row_major


@dataclass
class Rule:
    """A function's backward at one geometry: the backward graphs to fetch,
    the inputs and forward outputs to save, and `run` (pieces, saved inputs
    (None where not saved), saved outputs, dY, which inputs need a
    gradient) -> one gradient (or None) per input."""

    requests: dict[str, Request]
    save_inputs: tuple[int, ...]
    save_outputs: tuple[int, ...]
    run: Callable[[dict[str, Any], list[Any], tuple[Any, ...], Any, Sequence[bool]], tuple[Any, ...]]
    inputs: int = 0
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


def _needed(needs: Sequence[bool], *indices: int) -> bool:
    return any(i < len(needs) and needs[i] for i in indices)


# ---- the rules ------------------------------------------------------------------------


def linear(x: Geo, w: Geo, bias: Geo | None, act: str | None, forward: Request) -> Rule:
    """dZ = act'(Z) dY (a ReLU's from its output, a GELU's or SiLU's from the
    pre-activation its training forward saved), dX = dZ W, dW = dZ^T X, dBias = sum of dZ's rows."""
    n, k = w.shape
    m, sm = collapse(x.shape[:-1], x.stride[:-1], "input's leading dims")
    x_strides = [
        m * k,
        _specs._row_stride(m, sm, k * x.stride[-1]),
        x.stride[-1],
    ]  # the view the forward declared (_specs.linear)
    dt = forward.outputs[0].dtype
    out = forward.outputs[0]
    rows = (1, m, n)
    requests = {
        "dgrad": shaped(_grads.linear_data_grad(m, n, k, w.stride, dt), x.shape),
        "wgrad": shaped(_grads.linear_weight_grad(m, n, k, x_strides, dt), w.shape),
    }
    if bias is not None:
        requests["bgrad"] = shaped(_grads.bias_grad("linear.backward", rows, row_major(rows), (1, 1, n), dt), (n,))
    if act is not None:
        requests["act"] = _grads.activation_backward("linear.backward", rows, row_major(rows), act, dt)
    save_outputs = () if act is None else (0,) if act == "relu" else (1,)

    def run(
        p: dict[str, Served], inputs: list[Any], saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]
    ) -> tuple[Any, ...]:
        xt, wt = inputs[0], inputs[1]
        # dY (conformed to the output's dense layout) and the saved tensor are
        # the [1, m, n] rows the graphs declare, as memory: no view needed.
        dz = p["act"]((grad, saved[0])) if act is not None else grad
        dx = p["dgrad"]((dz, wt)) if needs[0] else None
        dw = p["wgrad"]((dz, xt)) if needs[1] else None
        db = p["bgrad"]((dz,)).to(dz.dtype) if bias is not None and _needed(needs, 2) else None
        return (dx, dw, db)[: 3 if bias is not None else 2]

    return Rule(
        requests,
        (0, 1),
        save_outputs,
        run,
        3 if bias is not None else 2,
        out.shape,
        out.stride,
        {"bgrad": TorchSum((0, 1), rows)},
    )


def conv2d(x: Geo, w: Geo, bias: Geo | None, relu: bool, attrs: dict[str, Any], forward: Request) -> Rule:
    """dY' = relu'(Y) dY, dX = conv_dgrad(dY', W), dW = conv_wgrad(X, dY'), dBias = sum of dY' over N, H, W."""
    out = forward.outputs[0]
    dt = out.dtype
    requests = {
        "dgrad": _grads.conv_data_grad(
            out.shape, out.stride, w.shape, w.stride, x.shape, dense_like(x.shape, x.stride), attrs, dt
        ),
        "wgrad": _grads.conv_weight_grad(
            x.shape, x.stride, out.shape, out.stride, w.shape, dense_like(w.shape, w.stride), attrs, dt
        ),
    }
    if bias is not None:
        requests["bgrad"] = shaped(
            _grads.bias_grad("conv2d.backward", out.shape, out.stride, (1, out.shape[1], 1, 1), dt), (out.shape[1],)
        )
    if relu:
        requests["act"] = _grads.activation_backward("conv2d.backward", out.shape, out.stride, "relu", dt)

    def run(
        p: dict[str, Served], inputs: list[Any], saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]
    ) -> tuple[Any, ...]:
        xt, wt = inputs[0], inputs[1]
        dy = p["act"]((grad, saved[0])) if relu else grad
        dx = p["dgrad"]((dy, wt)) if needs[0] else None
        dw = p["wgrad"]((xt, dy)) if needs[1] else None
        db = p["bgrad"]((dy,)).to(dy.dtype) if bias is not None and _needed(needs, 2) else None
        return (dx, dw, db)[: 3 if bias is not None else 2]

    return Rule(
        requests,
        (0, 1),
        (0,) if relu else (),
        run,
        3 if bias is not None else 2,
        out.shape,
        out.stride,
        {"bgrad": TorchSum((0, 2, 3), out.shape)},
    )


def norm(function: str, x: Geo, shape: Dims, weight: Geo | None, bias: Geo | None, forward: Request) -> Rule:
    """layer_norm's and rms_norm's own backward node: dX, dWeight (and dBias)
    from dY, the input, the weight and the saved row statistics."""
    out = forward.outputs[0]
    rows, s_rows = collapse(x.shape[: -len(shape)], x.stride[: -len(shape)], "input's leading dims")
    hidden = math.prod(shape)
    dt = out.dtype
    dense = row_major(x.shape)
    request = _grads.norm_backward(
        function,
        rows,
        hidden,
        _specs._row_stride(rows, s_rows, hidden),
        weight.dtype if weight is not None else None,
        dt,
        weight is not None,
    )
    request = shaped(request, x.shape, *((shape,) * (len(request.outputs) - 1)))
    stats = (1, 2) if function == "layer_norm" else (1,)
    has_weight, has_bias = weight is not None, bias is not None

    count = 1 + has_weight + has_bias
    return Rule(
        {"backward": request},
        (0, 1) if has_weight else (0,),
        stats,
        _norm_node_run(has_weight, has_bias, count),
        count,
        x.shape,
        dense,
    )


def sdpa(
    q: Geo,
    k: Geo,
    v: Geo,
    mask: Geo | None,
    seq_q: Geo | None,
    seq_kv: Geo | None,
    options: Attention,
    mask_grad: bool,
    forward: Request,
    count: int,
) -> Rule:
    """sdpa_backward with the forward's options, inputs, output and statistics."""
    request = _specs.sdpa_backward(q, k, v, mask, seq_q, seq_kv, options, mask_grad=mask_grad)
    out = forward.outputs[0]

    def run(
        p: dict[str, Served], inputs: list[Any], saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]
    ) -> tuple[Any, ...]:
        o, stats = saved
        outs = p["backward"].outputs((*inputs, o, grad, stats))
        grads: list[Any] = [outs[i] if needs[i] else None for i in range(3)]
        grads += [None] * (count - 3)
        if mask_grad and needs[3]:
            grads[3] = outs[3]
        return tuple(grads)

    return Rule({"backward": request}, tuple(range(count)), (0, 1), run, count, out.shape, out.stride)


def batch_norm(x: Geo, weight: Geo | None, bias: Geo | None, forward: Request, count: int) -> Rule:
    """batchnorm_backward from dY, the input, the weight and the batch's saved mean and inv_variance."""
    out = forward.outputs[0]
    request = shaped(
        _grads.batch_norm_backward(x.shape, out.stride, x.shape[1], out.dtype, weight is not None),
        None,
        (x.shape[1],),
        (x.shape[1],),
    )
    if tuple(x.stride) != tuple(out.stride):
        raise Unserved(
            f"input strides {x.stride} are not a dense layout (batchnorm's backward reads it as its output's)"
        )
    has_weight, has_bias = weight is not None, bias is not None
    return Rule(
        {"backward": request},
        (0, 1) if has_weight else (0,),
        (1, 2),
        _norm_node_run(has_weight, has_bias, count),
        count,
        out.shape,
        out.stride,
    )


def _norm_node_run(
    has_weight: bool, has_bias: bool, count: int
) -> Callable[[dict[str, Served], list[Any], tuple[Any, ...], Any, Sequence[bool]], tuple[Any, ...]]:
    """The run of a norm's own backward node (layernorm, rmsnorm, batchnorm): dY, the input,
    the weight and the saved statistics in; dX, dWeight, dBias out (None where not needed),
    padded with None to the function's `count` inputs."""

    def run(
        p: dict[str, Served], inputs: list[Any], saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]
    ) -> tuple[Any, ...]:
        outs = p["backward"].outputs((grad, inputs[0], *((inputs[1],) if has_weight else ()), *saved))
        grads: list[Any] = [outs[0] if needs[0] else None]
        if has_weight:
            grads.append(outs[1] if needs[1] else None)
        if has_bias:
            grads.append(outs[2] if needs[len(grads)] else None)
        return (*grads, *([None] * (count - len(grads))))

    return run

"""A served layer's call under torch.compile: the few lines dynamo traces for it (plancache.torch._serve).

The route's checks and race run once, in plain Python on dynamo's fake tensors (_mode._traced_torch_runs, a
constant of the trace), and dynamo traces torch's function or plancache's operator, as the route makes it. This
module is imported by a served forward's compiled branch only (an import dynamo runs as it traces), so that
`comptime` is a name of its own: reached as `torch._dynamo.comptime.comptime`, dynamo resolved the chain of
modules at every traced call, and importing torch._dynamo where plancache.torch is imported costs an eager program
1.3 s. What each traced call costs is the compiled program's cold start: bench/compiled_trace.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._dynamo.comptime import comptime

from plancache.torch._mode import (
    OPS,
    _conv2d_pairs,
    _keep_traced,
    _shape,
    _traced_conv1d_torch_runs,
    _traced_torch_runs,
    dispatch,
    undecided_conv2d,
    undecided_layer_norm,
    undecided_linear,
    undecided_rms_norm,
)

# Each traced call: its locals traced_0..traced_3 are the ones _keep_traced reads (as _raced_left's), `training` is
# _training's written out (dynamo traces a generator's frame too), and the operator's call is the route's.


def traced_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Any:
    """A served linear layer's call under torch.compile (F.linear(x, w, b)): torch's function or plancache's
    operator, as the linear route decides it."""
    traced_0, traced_1, traced_2, traced_3 = x, w, b, None  # noqa: F841
    comptime(_keep_traced)
    training = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad))
    torch_runs = _traced_torch_runs("linear", 3, (), training)
    if torch_runs is None:
        return dispatch("linear", undecided_linear, F.linear, (x, w, b), {})
    if torch_runs:
        return F.linear(x, w, b)
    return OPS.linear_train(x, w, b, None)[0] if training else OPS.linear(x, w, b, None)


def traced_conv1d(x: Tensor, weight: Tensor, bias: Tensor) -> Any:
    """transformers' Conv1D's call under torch.compile, on its input as a 2-D view: torch.addmm(bias, x, weight),
    the layer's own, where the linear route leaves the call to torch (the compiled graph is then the unserved
    model's), else plancache's linear operator on the weight transposed."""
    traced_0, traced_1, traced_2, traced_3 = x, weight, bias, None  # noqa: F841
    comptime(_keep_traced)
    training = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad)
    torch_runs = _traced_conv1d_torch_runs(training)
    if torch_runs is None:
        return dispatch("linear", undecided_linear, F.linear, (x, weight.t(), bias), {})
    if torch_runs:
        return torch.addmm(bias, x, weight)
    w = weight.t()
    return OPS.linear_train(x, w, bias, None)[0] if training else OPS.linear(x, w, bias, None)


def traced_layer_norm(x: Tensor, shape: Any, w: Tensor | None, b: Tensor | None, eps: float) -> Any:
    """A served layer norm's call under torch.compile (F.layer_norm(x, shape, w, b, eps)), as traced_linear's."""
    traced_0, traced_1, traced_2, traced_3 = x, w, b, None  # noqa: F841
    comptime(_keep_traced)
    training = torch.is_grad_enabled() and (
        x.requires_grad or (w is not None and w.requires_grad) or (b is not None and b.requires_grad)
    )
    torch_runs = _traced_torch_runs("layer_norm", 3, (shape, eps), training)
    if torch_runs is None:
        return dispatch("layer_norm", undecided_layer_norm, F.layer_norm, (x, shape, w, b, eps), {})
    if torch_runs:
        return F.layer_norm(x, shape, w, b, eps)
    if training:
        return OPS.layer_norm_train(x, _shape(shape), w, b, float(eps))[0]
    return OPS.layer_norm(x, _shape(shape), w, b, float(eps))


def traced_rms_norm(x: Tensor, shape: Any, w: Tensor | None, eps: float | None) -> Any:
    """A served RMS norm's call under torch.compile (F.rms_norm(x, shape, w, eps)), as traced_linear's."""
    traced_0, traced_1, traced_2, traced_3 = x, w, None, None  # noqa: F841
    comptime(_keep_traced)
    training = torch.is_grad_enabled() and (x.requires_grad or (w is not None and w.requires_grad))
    torch_runs = _traced_torch_runs("rms_norm", 2, (shape, eps), training)
    if torch_runs is None:
        return dispatch("rms_norm", undecided_rms_norm, F.rms_norm, (x, shape, w, eps), {})
    if torch_runs:
        return F.rms_norm(x, shape, w, eps)
    eps = None if eps is None else float(eps)
    return OPS.rms_norm_train(x, _shape(shape), w, eps)[0] if training else OPS.rms_norm(x, _shape(shape), w, eps)


def traced_conv2d(x: Tensor, w: Tensor, b: Tensor | None, stride: Any, padding: Any, dilation: Any, groups: int) -> Any:
    """A served Conv2d's call under torch.compile (F.conv2d(x, w, b, stride, padding, dilation, groups)), as
    traced_linear's."""
    traced_0, traced_1, traced_2, traced_3 = x, w, b, None  # noqa: F841
    comptime(_keep_traced)
    training = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad))
    torch_runs = _traced_torch_runs("conv2d", 3, (stride, padding, dilation, groups), training)
    if torch_runs is None:
        args = (x, w, b, stride, padding, dilation, groups)
        return dispatch("conv2d", undecided_conv2d, F.conv2d, args, {})
    if torch_runs:
        return F.conv2d(x, w, b, stride, padding, dilation, groups)
    s, p, d = _conv2d_pairs(stride, padding, dilation)
    if training:
        return OPS.conv2d_train(x, w, b, s, p, d, groups, False)
    return OPS.conv2d(x, w, b, s, p, d, groups, False)

"""conv2d: torch's 2-D convolution, its bias and ReLU fused, its output in torch's memory format.

The module's order is every operator module's (plancache.functional.
_linear says it): signature, call, forward spec, backward graphs and rule,
torch's function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plancache.functional import _modes
from plancache.functional._autograd import Rule, TorchSum, needed
from plancache.functional._first_call import first_call
from plancache.functional._geometry import (
    Dims,
    Geo,
    Unserved,
    hashable,
    is_channels_last,
    no_zero_strides,
    pair,
    served_dtype,
    weighted_key,
)
from plancache.functional._op_call import OpCall
from plancache.functional._requests import (
    OUTPUT_UID,
    Output,
    Request,
    activation_backward,
    bias_grad,
    dense_like,
    finish,
    graph,
    request,
    shaped,
)
from plancache.functional._signature import Bound, Signature, Slot
from plancache.functional._table import TABLE, Served
from plancache.functional._tensor_ops import torch_module
from plancache.graphspec.classic_ops import conv_output_dims
from plancache.graphspec.layouts import channels_last, row_major
from plancache.graphspec.schema import ShapeError

CONV2D = Signature(
    "conv2d",
    "CONV_FPROP",
    Slot("input", 1, saved=True),
    Slot("weight", 2, saved=True),
    Slot("bias", 3, optional=True),
)
_grad_on, _compiling = _modes.install(globals())


def conv2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
    *,
    relu: bool = False,
) -> Any:
    """torch.nn.functional.conv2d, with a fused ReLU (`relu=True`). The result
    is channels-last when an operand is (as torch's), contiguous otherwise.
    Differentiable: conv_dgrad, conv_wgrad, dBias (a reduction), the ReLU's backward."""
    return _conv2d(input, weight, bias, stride, padding, dilation, groups, relu=relu)


def _conv2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
    *,
    relu: bool = False,
    op: OpCall | None = None,
) -> Any:
    """conv2d (`op`: a torch operator's call)."""
    if _compiling():
        return torch_conv2d(input, weight, bias, stride, padding, dilation, groups, relu=relu)
    options = (hashable(stride), hashable(padding), hashable(dilation), groups, bool(relu))
    try:
        grad = (
            op.train
            if op is not None
            else _grad_on()
            and (input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        )
        key = weighted_key("conv2d", input, weight, bias, options, grad)
    except (AttributeError, TypeError):
        return torch_conv2d(input, weight, bias, stride, padding, dilation, groups, relu=relu)
    tensors = (input, weight) if bias is None else (input, weight, bias)
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors) if op is None else op.take(entry, tensors)
    bound = CONV2D.bind(tensors, input=input, weight=weight, bias=bias)

    def forward() -> Request:
        x, w, b = bound.geo("input"), bound.geo("weight"), bound.geo_or_none("bias")
        return conv2d_request(x, w, b, stride, padding, dilation, groups, relu)

    def rule(forward: Request) -> Rule:
        attributes = conv_attributes(stride, padding, dilation, bound.geo("weight").shape)
        return conv2d_rule(bound, relu, attributes, forward)

    fallback = bound.fallback(torch_conv2d, stride=stride, padding=padding, dilation=dilation, groups=groups, relu=relu)
    return first_call(bound, key, forward, fallback, grad, rule, op, raced=True)


# ---- the forward graph -----------------------------------------------------------------------


def _conv_padding(
    padding: Any, stride: tuple[int, int], dilation: tuple[int, int], kernel: Dims
) -> dict[str, tuple[int, ...]]:
    if padding == "valid":
        return {"padding": (0, 0)}
    if padding == "same":
        if stride != (1, 1):
            raise Unserved("padding='same' with a stride other than 1")
        totals = [d * (r - 1) for d, r in zip(dilation, kernel, strict=True)]
        pre, post = tuple(t // 2 for t in totals), tuple(t - t // 2 for t in totals)
        return {"padding": pre} if pre == post else {"pre_padding": pre, "post_padding": post}
    if isinstance(padding, str):
        raise Unserved(f"padding {padding!r} (torch takes 'valid', 'same' or ints)")
    return {"padding": pair(padding, "padding")}


def conv_attributes(stride: Any, padding: Any, dilation: Any, weight_dims: Dims) -> dict[str, tuple[int, ...]]:
    """torch's stride, padding and dilation as the conv nodes' attributes (forward, dgrad and wgrad alike)."""
    steps, dilations = pair(stride, "stride"), pair(dilation, "dilation")
    return {**_conv_padding(padding, steps, dilations, weight_dims[2:]), "stride": steps, "dilation": dilations}


def decided(input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any) -> Any:
    """The table's entry for an eager call `conv2d(input, weight, bias, stride, padding, dilation, groups)`
    (tensors; no fused ReLU), or None: plancache.torch's served layers look here first."""
    grad = _grad_on() and (input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    options = (hashable(stride), hashable(padding), hashable(dilation), groups, False)
    return TABLE.get(weighted_key("conv2d", input, weight, bias, options, grad))


def conv2d_request(
    x: Geo, w: Geo, bias: Geo | None, stride: Any, padding: Any, dilation: Any, groups: Any, relu: bool
) -> Request:
    dt = served_dtype(x, w, bias)
    if groups != 1:
        raise Unserved("a grouped convolution (groups != 1)")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise Unserved(
            f"input {x.shape} and weight {w.shape} must be 4-D (torch's unbatched 3-D input stays with torch)"
        )
    if x.shape[1] != w.shape[1]:
        raise Unserved(f"input has {x.shape[1]} channels, weight expects {w.shape[1]}")
    out_channels = w.shape[0]
    if bias is not None and (bias.shape != (out_channels,) or (out_channels > 1 and bias.stride != (1,))):
        raise Unserved(
            f"bias must be a contiguous ({out_channels},) tensor, got dims {bias.shape} strides {bias.stride}"
        )
    no_zero_strides(x)
    no_zero_strides(w)
    attrs = conv_attributes(stride, padding, dilation, w.shape)
    try:
        out = conv_output_dims(x.shape, w.shape, attrs)
    except ShapeError as e:
        raise Unserved(str(e)) from None
    # torch's conv output takes the channels-last format when an operand has it.
    layout = (
        channels_last(out)
        if is_channels_last(x.shape, x.stride) or is_channels_last(w.shape, w.stride)
        else row_major(out)
    )
    g = graph(CONV2D.function, dt)
    y = g.conv_fprop(
        CONV2D.tensor(g, "input", x.shape, x.stride), CONV2D.tensor(g, "weight", w.shape, w.stride), **attrs
    )
    if bias is not None:
        y = g.bias(y, CONV2D.tensor(g, "bias", [1, out_channels, 1, 1]))
    if relu:
        y = g.relu(y)
    finish(y, layout)
    return request(CONV2D.function, g, CONV2D.uids(input=x, weight=w, bias=bias), out, layout, dt)


# ---- the backward ----------------------------------------------------------------------------


def _data_grad(
    dy_dims: Dims,
    dy_strides: Dims,
    w_dims: Dims,
    w_strides: Dims,
    x_dims: Dims,
    dx_strides: Dims,
    attrs: dict[str, object],
    dtype: str,
) -> Request:
    """dX = conv_dgrad(dY, W): uids dY 1, weight 2; dX in the input's dims and layout."""
    g = graph("conv2d.backward", dtype)
    dy = g.tensor(list(dy_dims), list(dy_strides), name="dY", uid=1)
    w = g.tensor(list(w_dims), list(w_strides), name="weight", uid=2)
    dx = g.conv_dgrad(dy, w, **attrs)
    dx.set_output(True).set_name("dX").set_uid(OUTPUT_UID).set_dim(list(x_dims)).set_stride(list(dx_strides))
    return Request("conv2d.backward", g, (1, 2), (Output(OUTPUT_UID, x_dims, dx_strides, dtype),))


def _weight_grad(
    x_dims: Dims,
    x_strides: Dims,
    dy_dims: Dims,
    dy_strides: Dims,
    w_dims: Dims,
    dw_strides: Dims,
    attrs: dict[str, object],
    dtype: str,
) -> Request:
    """dW = conv_wgrad(X, dY): uids input 1, dY 2; dW in the weight's dims and layout."""
    g = graph("conv2d.backward", dtype)
    x = g.tensor(list(x_dims), list(x_strides), name="input", uid=1)
    dy = g.tensor(list(dy_dims), list(dy_strides), name="dY", uid=2)
    dw = g.conv_wgrad(x, dy, **attrs)
    dw.set_output(True).set_name("dW").set_uid(OUTPUT_UID).set_dim(list(w_dims)).set_stride(list(dw_strides))
    return Request("conv2d.backward", g, (1, 2), (Output(OUTPUT_UID, w_dims, dw_strides, dtype),))


def conv2d_rule(bound: Bound, relu: bool, attrs: dict[str, Any], forward: Request) -> Rule:
    """dY' = relu'(Y) dY, dX = conv_dgrad(dY', W), dW = conv_wgrad(X, dY'), dBias = sum of dY' over N, H, W."""
    x, w, bias = bound.geo("input"), bound.geo("weight"), bound.geo_or_none("bias")
    out = forward.outputs[0]
    dt = out.dtype
    requests = {
        "dgrad": _data_grad(
            out.shape, out.stride, w.shape, w.stride, x.shape, dense_like(x.shape, x.stride), attrs, dt
        ),
        "wgrad": _weight_grad(
            x.shape, x.stride, out.shape, out.stride, w.shape, dense_like(w.shape, w.stride), attrs, dt
        ),
    }
    if bias is not None:
        requests["bgrad"] = shaped(
            bias_grad("conv2d.backward", out.shape, out.stride, (1, out.shape[1], 1, 1), dt), (out.shape[1],)
        )
    if relu:
        requests["act"] = activation_backward("conv2d.backward", out.shape, out.stride, "relu", dt)
    at_x, at_w, at_b, count = bound.index("input"), bound.index("weight"), bound.index("bias"), len(bound.tensors)
    assert at_x is not None and at_w is not None

    def run(
        p: dict[str, Served], inputs: list[Any], saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]
    ) -> tuple[Any, ...]:
        xt, wt = inputs[at_x], inputs[at_w]
        dy = p["act"]((grad, saved[0])) if relu else grad
        grads: list[Any] = [None] * count
        grads[at_x] = p["dgrad"]((dy, wt)) if needs[at_x] else None
        grads[at_w] = p["wgrad"]((xt, dy)) if needs[at_w] else None
        if at_b is not None and needed(needs, at_b):
            grads[at_b] = p["bgrad"]((dy,)).to(dy.dtype)
        return tuple(grads)

    saved = (0,) if relu else ()
    return Rule(
        requests, bound.saved, saved, run, count, out.shape, out.stride, {"bgrad": TorchSum((0, 2, 3), out.shape)}
    )


# ---- torch's --------------------------------------------------------------------------------


def torch_conv2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
    *,
    relu: bool = False,
) -> Any:
    y = torch_module().nn.functional.conv2d(input, weight, bias, stride, padding, dilation, groups)
    return torch_module().relu(y) if relu else y

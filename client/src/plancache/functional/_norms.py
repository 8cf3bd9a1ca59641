"""layer_norm and rms_norm: rows normalized over their last dims, served as cuDNN's norm nodes.

The module's order is every operator module's (plancache.functional.
_linear says it): signatures, calls, forward specs, backward graph and
rules, torch's functions. A norm's input is seen as [rows, hidden, 1, 1]
(the layout of examples/generate.py's norms), its parameters as [1, hidden,
1, 1]; a missing parameter is a constant (ones, zeros) made once. Its
backward is cuDNN's own backward node, from the row statistics the
training forward keeps (`norm_node_run` is batch_norm's too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from plancache.frontdoors.buckets import AUTO, BUCKETS, pad_rows
from plancache.functional import _modes
from plancache.functional._autograd import Rule, Run
from plancache.functional._first_call import at_bucket, auto_checked, auto_padded, first_call
from plancache.functional._geometry import Dims, Geo, Unserved, collapse, hashable, is_dense, served_dtype
from plancache.functional._op_call import OpCall
from plancache.functional._requests import (
    OUTPUT_UID,
    Constant,
    Output,
    Request,
    finish,
    graph,
    request,
    row_stride,
    shaped,
)
from plancache.functional._signature import Bound, Signature, Slot
from plancache.functional._table import TABLE, Served
from plancache.functional._tensor_ops import torch_module
from plancache.graphspec.layouts import row_major

LAYER_NORM = Signature(
    "layer_norm",
    "LAYERNORM",
    Slot("input", 1, saved=True),
    Slot("weight", 2, optional=True, saved=True),
    Slot("bias", 3, optional=True),
)
RMS_NORM = Signature("rms_norm", "RMSNORM", Slot("input", 1, saved=True), Slot("weight", 2, optional=True, saved=True))
EPSILON_UID = 10
MEAN_UID, INV_VARIANCE_UID = 21, 22  # a training forward's row statistics: what its backward reads
# torch.finfo(dtype).eps for the served dtypes: rms_norm's default eps, as torch documents it.
FINFO_EPS = {"half": 2.0**-10, "bfloat16": 2.0**-7}
_grad_on, _compiling = _modes.install(globals())


# ---- the calls -------------------------------------------------------------------------------


def _rows_of_last_dim(x: Any, normalized_shape: Any) -> bool:
    """Whether a norm normalizes `x` over its last dim alone (its rows can be padded)."""
    shape: tuple[int, ...] = tuple(getattr(x, "shape", ()))
    if len(shape) < 2:
        return False
    wanted = tuple(normalized_shape) if isinstance(normalized_shape, list | tuple) else (normalized_shape,)
    return wanted == (shape[-1],)


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """torch.nn.functional.layer_norm. Differentiable: cuDNN's layernorm
    backward, from the rows' statistics its training forward keeps."""
    if BUCKETS.functions and _rows_of_last_dim(input, normalized_shape):
        padded = pad_rows("layer_norm", input)
        if padded is not None:
            rows_in, rows = padded
            return _layer_norm(rows_in, normalized_shape, weight, bias, eps)[:rows].reshape(input.shape)
    return _layer_norm(input, normalized_shape, weight, bias, eps)


def _layer_norm(
    input: Any,
    normalized_shape: Any,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    *,
    op: OpCall | None = None,
) -> Any:
    """layer_norm without bucketing (`op`: a torch operator's call)."""
    if _compiling():
        return torch_layer_norm(input, normalized_shape, weight, bias, eps)
    shape = hashable(normalized_shape)
    try:
        grad = (
            op.train
            if op is not None
            else _grad_on()
            and (
                input.requires_grad
                or (weight is not None and weight.requires_grad)
                or (bias is not None and bias.requires_grad)
            )
        )
        key = _norm_key("layer_norm", input, shape, eps, grad, weight, bias)
    except (AttributeError, TypeError):
        return torch_layer_norm(input, normalized_shape, weight, bias, eps)
    tensors: tuple[Any, ...] = (input,)
    if weight is not None:
        tensors += (weight,)
    if bias is not None:
        tensors += (bias,)
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors) if op is None else op.take(entry, tensors)
    if op is None and AUTO.enabled and _rows_of_last_dim(input, normalized_shape):  # rows that vary: a bucket
        padded = auto_padded("layer_norm", key, input)
        if padded is not None:
            rows_in, rows = padded
            out = at_bucket(key, rows_in, tensors, lambda: _layer_norm(rows_in, normalized_shape, weight, bias, eps))
            return out[:rows].reshape(input.shape)
    bound = LAYER_NORM.bind(tensors, input=input, weight=weight, bias=bias)

    def forward() -> Request:
        x, w, b = bound.geo("input"), bound.geo_or_none("weight"), bound.geo_or_none("bias")
        return layer_norm_request(x, normalized_shape, w, b, eps, training=grad)

    out = first_call(
        bound,
        key,
        forward,
        bound.fallback(torch_layer_norm, normalized_shape=normalized_shape, eps=eps),
        grad,
        lambda forward: norm_rule(bound, normalized(normalized_shape), forward),
        op,
        raced=True,
    )
    return auto_checked(key, input, out) if op is None and AUTO.enabled else out


def _norm_key(function: str, input: Any, shape: Any, eps: Any, grad: bool, weight: Any, bias: Any) -> tuple[Any, ...]:
    """A norm call's geometry key (`shape` hashable; rms_norm's bias None): what its table entry is found by."""
    return (
        function,
        input.shape,
        input.stride(),
        input.dtype,
        input.get_device(),
        shape,
        eps,
        grad,
        None if weight is None else (weight.shape, weight.stride(), weight.dtype, weight.get_device()),
        None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()),
    )


def decided_layer_norm(input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any) -> Any:
    """The table's entry for an eager call `layer_norm(input, normalized_shape, weight, bias, eps)` (tensors or
    None: the key the call would look up first), or None (row buckets set: the call pads its rows first).
    plancache.torch's served layers look here first."""
    if BUCKETS.functions:
        return None
    grad = _grad_on() and (
        input.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad)
    )
    return TABLE.get(_norm_key("layer_norm", input, hashable(normalized_shape), eps, grad, weight, bias))


def rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> Any:
    """torch.nn.functional.rms_norm; eps None is torch.finfo(input.dtype).eps,
    as torch documents it. Differentiable: cuDNN's rmsnorm backward."""
    if BUCKETS.functions and _rows_of_last_dim(input, normalized_shape):
        padded = pad_rows("rms_norm", input)
        if padded is not None:
            rows_in, rows = padded
            return _rms_norm(rows_in, normalized_shape, weight, eps)[:rows].reshape(input.shape)
    return _rms_norm(input, normalized_shape, weight, eps)


def _rms_norm(
    input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None, *, op: OpCall | None = None
) -> Any:
    """rms_norm without bucketing (`op`: a torch operator's call)."""
    if _compiling():
        return torch_rms_norm(input, normalized_shape, weight, eps)
    shape = hashable(normalized_shape)
    try:
        grad = (
            op.train
            if op is not None
            else _grad_on() and (input.requires_grad or (weight is not None and weight.requires_grad))
        )
        key = _norm_key("rms_norm", input, shape, eps, grad, weight, None)
    except (AttributeError, TypeError):
        return torch_rms_norm(input, normalized_shape, weight, eps)
    tensors = (input,) if weight is None else (input, weight)
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors) if op is None else op.take(entry, tensors)
    if op is None and AUTO.enabled and _rows_of_last_dim(input, normalized_shape):  # rows that vary: a bucket
        padded = auto_padded("rms_norm", key, input)
        if padded is not None:
            rows_in, rows = padded
            out = at_bucket(key, rows_in, tensors, lambda: _rms_norm(rows_in, normalized_shape, weight, eps))
            return out[:rows].reshape(input.shape)
    bound = RMS_NORM.bind(tensors, input=input, weight=weight)
    out = first_call(
        bound,
        key,
        lambda: rms_norm_request(bound.geo("input"), normalized_shape, bound.geo_or_none("weight"), eps, training=grad),
        bound.fallback(torch_rms_norm, normalized_shape=normalized_shape, eps=eps),
        grad,
        lambda forward: norm_rule(bound, normalized(normalized_shape), forward),
        op,
        raced=True,
    )
    return auto_checked(key, input, out) if op is None and AUTO.enabled else out


# ---- the forward graphs ----------------------------------------------------------------------


def normalized(shape: Any) -> Dims:
    if isinstance(shape, int) and not isinstance(shape, bool):
        return (shape,)
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise Unserved(f"normalized_shape must be an int or a sequence of ints, got {shape!r}") from None


def decided_rms_norm(input: Any, normalized_shape: Any, weight: Any, eps: Any) -> Any:
    """The table's entry for an eager call `rms_norm(input, normalized_shape, weight, eps)`, or None (as
    decided_layer_norm)."""
    if BUCKETS.functions:
        return None
    grad = _grad_on() and (input.requires_grad or (weight is not None and weight.requires_grad))
    return TABLE.get(_norm_key("rms_norm", input, hashable(normalized_shape), eps, grad, weight, None))


def _norm(
    signature: Signature,
    x: Geo,
    shape: Dims,
    params: Sequence[tuple[str, Geo | None, float]],
    eps: float,
    training: bool,
) -> Request:
    """layer_norm and rms_norm: x as [rows, hidden, 1, 1], each parameter (its slot's name, its geometry, the
    fill of the constant made without it) as [1, hidden, 1, 1]."""
    dt = served_dtype(x, *(p for _, p, _ in params), allowed=("float",))
    if not shape or len(shape) > len(x.shape) or x.shape[len(x.shape) - len(shape) :] != shape:
        raise Unserved(f"input dims {x.shape} do not end with normalized_shape {shape}")
    rows, s_rows = collapse(x.shape[: -len(shape)], x.stride[: -len(shape)], "input's leading dims")
    hidden, s_hidden = collapse(shape, x.stride[-len(shape) :], "input's normalized dims")
    if s_hidden not in (0, 1):
        raise Unserved(f"input's normalized dims are not contiguous (strides {x.stride})")
    g = graph(signature.function, dt)
    constants = []
    tensors = [signature.tensor(g, "input", [rows, hidden, 1, 1], [row_stride(rows, s_rows, hidden), 1, 1, 1])]
    # A missing parameter takes the type of the one given (a float32 weight, say), else the input's.
    fill_dtype = next((p.dtype for _, p, _ in params if p is not None and p.dtype is not None), dt)
    for name, p, fill in params:
        if p is None:
            constants.append(Constant(signature.uid(name), (1, hidden, 1, 1), fill, fill_dtype))
        else:
            if p.shape != shape:
                raise Unserved(f"{name} must have dims {shape} (normalized_shape), got {p.shape}")
            if not is_dense(p):
                raise Unserved(f"{name} is not contiguous (strides {p.stride})")
        tensors.append(signature.tensor(g, name, [1, hidden, 1, 1], data_type=p.dtype if p is not None else fill_dtype))
    epsilon = g.scalar(float(eps), name="epsilon", uid=EPSILON_UID)
    constants.append(Constant(EPSILON_UID, (1, 1, 1, 1), float(eps), "float", on_host=True))
    phase = "TRAINING" if training else "INFERENCE"
    if signature is LAYER_NORM:
        y, *stats = g.layernorm(tensors[0], tensors[1], tensors[2], epsilon, norm_forward_phase=phase)
    else:
        y, *stats = g.rmsnorm(tensors[0], tensors[1], epsilon, norm_forward_phase=phase)
    assert y is not None
    finish(y)
    extra: list[Output] = []
    if training:  # the row statistics the backward reads, float32 [rows, 1, 1, 1]
        for t, (name, uid) in zip(
            stats, (("mean", MEAN_UID), ("inv_variance", INV_VARIANCE_UID))[-len(stats) :], strict=True
        ):
            assert t is not None
            t.set_output(True).set_name(name).set_uid(uid).set_data_type("float")
            extra.append(Output(uid, (rows, 1, 1, 1), (1, 1, 1, 1), "float"))
    inputs = signature.uids(input=x, **{name: p for name, p, _ in params})
    return request(signature.function, g, inputs, x.shape, x.stride, dt, constants, extra)


def layer_norm_request(
    x: Geo, shape: Any, weight: Geo | None, bias: Geo | None, eps: float, *, training: bool = False
) -> Request:
    """`training`: the rows' mean and inverse deviation are outputs too (the backward's)."""
    return _norm(LAYER_NORM, x, normalized(shape), (("weight", weight, 1.0), ("bias", bias, 0.0)), eps, training)


def rms_norm_request(x: Geo, shape: Any, weight: Geo | None, eps: float | None, *, training: bool = False) -> Request:
    return _norm(RMS_NORM, x, normalized(shape), (("weight", weight, 1.0),), rms_eps(x, eps), training)


def rms_eps(x: Geo, eps: float | None) -> float:
    return FINFO_EPS.get(x.dtype or "", 2.0**-10) if eps is None else eps


# ---- the backward ----------------------------------------------------------------------------


def _backward(
    function: str, rows: int, hidden: int, x_row_stride: int, param_dtype: str | None, dtype: str, weight_given: bool
) -> Request:
    """layer_norm's and rms_norm's backward over the forward's [rows, hidden, 1, 1]
    view: uids dY 1 (dense), input 2, weight 3 (a constant of ones without one),
    [mean 4,] inv_variance 5 (float32 [rows, 1, 1, 1]); outputs dX 20 (dense),
    dWeight 21 [, dBias 22] ([1, hidden, 1, 1], the weight's type)."""
    g = graph(f"{function}.backward", dtype)
    scale_type = param_dtype or dtype
    dy = g.tensor([rows, hidden, 1, 1], [hidden, 1, 1, 1], name="dY", uid=1)
    x = g.tensor([rows, hidden, 1, 1], [x_row_stride, 1, 1, 1], name="input", uid=2)
    scale = g.tensor([1, hidden, 1, 1], data_type=scale_type, name="weight", uid=3)
    inv_var = g.tensor([rows, 1, 1, 1], data_type="float", name="inv_variance", uid=5)
    inputs: tuple[int, ...] = (1, 2, 3, 5)
    if function == "layer_norm":
        mean = g.tensor([rows, 1, 1, 1], data_type="float", name="mean", uid=4)
        grads = g.node("layernorm_backward", grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_var)
        inputs = (1, 2, 3, 4, 5)
    else:
        grads = g.node("rmsnorm_backward", grad=dy, input=x, scale=scale, inv_variance=inv_var, has_dbias=False)
    outputs = [Output(OUTPUT_UID, (rows, hidden, 1, 1), (hidden, 1, 1, 1), dtype)]
    for t, name, uid in zip(
        grads, ("dX", "dWeight", "dBias"), (OUTPUT_UID, OUTPUT_UID + 1, OUTPUT_UID + 2), strict=True
    ):
        if t is None:
            continue
        t.set_output(True).set_name(name).set_uid(uid)
        if uid != OUTPUT_UID:
            t.set_data_type(scale_type)
            outputs.append(Output(uid, (1, hidden, 1, 1), (hidden, 1, 1, 1), scale_type))
    if weight_given:
        return Request(f"{function}.backward", g, inputs, tuple(outputs))
    return Request(
        f"{function}.backward",
        g,
        tuple(u for u in inputs if u != 3),
        tuple(outputs),
        (Constant(3, (1, hidden, 1, 1), 1.0, scale_type),),
    )


def norm_rule(bound: Bound, shape: Dims, forward: Request) -> Rule:
    """layer_norm's and rms_norm's own backward node: dX, dWeight (and dBias)
    from dY, the input, the weight and the saved row statistics."""
    x, weight = bound.geo("input"), bound.geo_or_none("weight")
    out = forward.outputs[0]
    rows, s_rows = collapse(x.shape[: -len(shape)], x.stride[: -len(shape)], "input's leading dims")
    hidden = math.prod(shape)
    param_dtype = weight.dtype if weight is not None else None
    backward = _backward(
        bound.function, rows, hidden, row_stride(rows, s_rows, hidden), param_dtype, out.dtype, weight is not None
    )
    backward = shaped(backward, x.shape, *((shape,) * (len(backward.outputs) - 1)))
    stats = (1, 2) if bound.signature is LAYER_NORM else (1,)
    count = len(bound.tensors)
    return Rule({"backward": backward}, bound.saved, stats, norm_node_run(bound), count, x.shape, row_major(x.shape))


def norm_node_run(bound: Bound) -> Run:
    """The run of a norm's own backward node (layernorm, rmsnorm, batchnorm): dY, the input,
    the weight and the saved statistics in; dX, dWeight, dBias out (None where not needed)."""
    at_x, at_w, at_b, count = bound.index("input"), bound.index("weight"), bound.index("bias"), len(bound.tensors)
    assert at_x is not None

    def run(
        p: dict[str, Served], inputs: list[Any], saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]
    ) -> tuple[Any, ...]:
        weight = () if at_w is None else (inputs[at_w],)
        outs = p["backward"].outputs((grad, inputs[at_x], *weight, *saved))
        grads: list[Any] = [None] * count
        grads[at_x] = outs[0] if needs[at_x] else None
        if at_w is not None:
            grads[at_w] = outs[1] if needs[at_w] else None
        if at_b is not None:
            grads[at_b] = outs[2] if needs[at_b] else None
        return tuple(grads)

    return run


# ---- torch's --------------------------------------------------------------------------------


def torch_layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    return torch_module().nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)


def torch_rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> Any:
    return torch_module().nn.functional.rms_norm(input, normalized_shape, weight, eps)

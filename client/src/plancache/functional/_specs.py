"""The GraphSpec each function asks for, from its arguments' geometry.

One builder per function, written with plancache's own builder (the same
calls as examples/generate.py), with fixed uids: the function binds its
tensors to them. A builder raises Unserved when cuDNN is not the one to
run the call (torch then runs it, or says what is wrong with it) and
InvalidRequest for a mistake in an argument torch does not have.

Views cost nothing here: a matrix's leading dims collapse into one (a
linear's input [b, s, k] is A [1, b*s, k]); a weight read transposed is B
with swapped strides; torch's 1-D bias is [1, 1, n]. The call then binds
the caller's own tensors: cuDNN reads their addresses through the
geometry the spec declares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plancache.errors import InvalidRequest
from plancache.functional._geometry import (
    Dims,
    Geo,
    Unserved,
    collapse,
    is_channels_last,
    is_dense,
    no_zero_strides,
    pair,
    served_dtype,
)
from plancache.graphspec.classic_ops import conv_output_dims
from plancache.graphspec.graph import GraphSpec, Tensor
from plancache.graphspec.layouts import channels_last, packed, row_major
from plancache.graphspec.schema import ShapeError

OUTPUT_UID = 20
# A training forward's other outputs: what the backward graph reads.
PRE_ACTIVATION_UID = 21
MEAN_UID, INV_VARIANCE_UID, STATS_UID = 21, 22, 21
ACTIVATIONS = ("relu", "gelu", "silu")
# torch.finfo(dtype).eps for the served dtypes: rms_norm's default eps, as torch documents it.
FINFO_EPS = {"half": 2.0**-10, "bfloat16": 2.0**-7}


@dataclass(frozen=True)
class Constant:
    """A tensor the plan reads that the call does not pass (a norm's epsilon,
    a missing weight, the query lengths of a decode): made once per geometry."""

    uid: int
    shape: Dims
    value: float
    dtype: str
    on_host: bool = False  # a pass-by-value scalar lives on the CPU


@dataclass(frozen=True)
class Output:
    """A tensor the plan writes that the call allocates (as torch's function would)."""

    uid: int
    shape: Dims
    stride: Dims
    dtype: str


@dataclass(frozen=True)
class Request:
    """What a geometry asks plancache for, and how a call binds to it: the
    caller's tensors by uid (`inputs`, in the call's order), the outputs it
    allocates (the first is the function's result; a training forward's
    others are what its backward needs), the constants made once."""

    function: str
    spec: GraphSpec
    inputs: tuple[int, ...]
    outputs: tuple[Output, ...]
    constants: tuple[Constant, ...] = ()


def _request(
    function: str,
    g: GraphSpec,
    inputs: Sequence[int],
    out: Dims,
    stride: Dims,
    dtype: str,
    constants: Sequence[Constant] = (),
    extra: Sequence[Output] = (),
) -> Request:
    """A request whose first output is the function's result (uid OUTPUT_UID)."""
    return Request(
        function, g, tuple(inputs), (Output(OUTPUT_UID, tuple(out), tuple(stride), dtype), *extra), tuple(constants)
    )


def _graph(function: str, dtype: str) -> GraphSpec:
    return GraphSpec(
        name=f"plancache.functional.{function}",
        io_data_type=dtype,
        intermediate_data_type="float",
        compute_data_type="float",
    )


def _finish(y: Tensor, stride: Sequence[int] | None = None) -> None:
    y.set_output(True).set_name("output").set_uid(OUTPUT_UID)
    if stride is not None:
        y.set_stride(stride)


def _row_stride(size: int, stride: int, inner: int) -> int:
    """The stride of a matrix's rows: its own, or for a single row (any
    value addresses it) the packed one."""
    return stride if size != 1 and stride else max(inner, 1)


def activation(g: GraphSpec, y: Tensor, name: str | None) -> Tensor:
    if name is None:
        return y
    if name == "silu":
        return g.swish(y, swish_beta=1.0)  # type: ignore[no-any-return]
    return getattr(g, name)(y)  # type: ignore[no-any-return]  # relu, gelu (erf: torch's default)


# ---- matrices ---------------------------------------------------------------


def linear(x: Geo, w: Geo, bias: Geo | None, act: str | None, *, training: bool = False) -> Request:
    """`training`: a GELU's or SiLU's input (the pre-activation) is an output
    too (uid PRE_ACTIVATION_UID), which its backward needs; a ReLU's backward reads its output."""
    dt = served_dtype(x, w, bias)
    if len(w.shape) != 2:
        raise Unserved(f"weight must be 2-D (out_features, in_features), got dims {w.shape}")
    n, k = w.shape
    if not x.shape or x.shape[-1] != k:
        raise Unserved(f"input dims {x.shape} do not end with weight's in_features ({k})")
    if bias is not None and bias.shape != (n,):
        raise Unserved(f"bias must have dims ({n},), got {bias.shape}")
    for t in (x, w, bias):
        if t is not None:
            no_zero_strides(t)
    m, sm = collapse(x.shape[:-1], x.stride[:-1], "input's leading dims")
    g = _graph("linear", dt)
    a = g.tensor([1, m, k], [m * k, _row_stride(m, sm, k * x.stride[-1]), x.stride[-1]], name="input", uid=1)
    b = g.tensor([1, k, n], [k * n, w.stride[1], w.stride[0]], name="weight", uid=2)  # weight.T: the strides swapped
    y = g.matmul(a, b)
    if bias is not None:
        y = g.bias(y, g.tensor([1, 1, n], [n, n, bias.stride[0]], name="bias", uid=3))
    out = (*x.shape[:-1], n)
    extra: tuple[Output, ...] = ()
    if training and act in ("gelu", "silu"):
        y.set_output(True).set_name("pre_activation").set_uid(PRE_ACTIVATION_UID).set_data_type(dt)
        extra = (Output(PRE_ACTIVATION_UID, out, row_major(out), dt),)
    _finish(activation(g, y, act))
    return _request("linear", g, (1, 2) if bias is None else (1, 2, 3), out, row_major(out), dt, extra=extra)


def _broadcast(a: Dims, b: Dims) -> Dims:
    """torch's batch broadcasting (right-aligned, each dim equal or 1)."""
    width = max(len(a), len(b))
    a, b = (1,) * (width - len(a)) + a, (1,) * (width - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            raise Unserved(f"batch dims {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def matmul(a: Geo, b: Geo) -> Request:
    dt = served_dtype(a, b)
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise Unserved("a 1-D operand (torch.matmul's vector rules)")
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise Unserved(f"input's columns ({k}) are not other's rows ({k2})")
    no_zero_strides(a)
    no_zero_strides(b)
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    out = (*_broadcast(batch_a, batch_b), m, n)
    sa, sb = a.stride[-2:], b.stride[-2:]
    if all(d == 1 for d in batch_b):  # one B: A's batch and rows are one matrix
        rows, s_rows = collapse(a.shape[:-1], a.stride[:-1], "input's batch and row dims")
        a_dims, a_strides = [1, rows, k], [rows * k, _row_stride(rows, s_rows, k * sa[1]), sa[1]]
        b_dims, b_strides = [1, k, n], [k * n, *sb]
    elif batch_a == batch_b:
        count, s_a = collapse(batch_a, a.stride[:-2], "input's batch dims")
        _, s_b = collapse(batch_b, b.stride[:-2], "other's batch dims")
        a_dims, a_strides = [count, m, k], [s_a or m * k, *sa]
        b_dims, b_strides = [count, k, n], [s_b or k * n, *sb]
    elif all(d == 1 for d in batch_a):  # one A, broadcast over B's batch
        count, s_b = collapse(batch_b, b.stride[:-2], "other's batch dims")
        a_dims, a_strides = [1, m, k], [m * k, *sa]
        b_dims, b_strides = [count, k, n], [s_b or k * n, *sb]
    else:
        raise Unserved(f"batch dims {batch_a} and {batch_b} broadcast other than over a single matrix")
    g = _graph("matmul", dt)
    _finish(
        g.matmul(g.tensor(a_dims, a_strides, name="input", uid=1), g.tensor(b_dims, b_strides, name="other", uid=2))
    )
    return _request("matmul", g, (1, 2), out, row_major(out), dt)


# ---- convolution --------------------------------------------------------------


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


def conv2d(
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
    g = _graph("conv2d", dt)
    y = g.conv_fprop(
        g.tensor(x.shape, x.stride, name="input", uid=1), g.tensor(w.shape, w.stride, name="weight", uid=2), **attrs
    )
    if bias is not None:
        y = g.bias(y, g.tensor([1, out_channels, 1, 1], name="bias", uid=3))
    if relu:
        y = g.relu(y)
    _finish(y, layout)
    return _request("conv2d", g, (1, 2) if bias is None else (1, 2, 3), out, layout, dt)


# ---- normalization --------------------------------------------------------------


def normalized(shape: Any) -> Dims:
    if isinstance(shape, int) and not isinstance(shape, bool):
        return (shape,)
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise Unserved(f"normalized_shape must be an int or a sequence of ints, got {shape!r}") from None


def _norm(
    function: str, x: Geo, shape: Dims, params: Sequence[tuple[str, Geo | None, float]], eps: float, training: bool
) -> Request:
    """layer_norm and rms_norm: x seen as [rows, hidden, 1, 1] (the layout
    of examples/generate.py's norms), the parameters as [1, hidden, 1, 1];
    a missing parameter is a constant (ones, zeros) made once."""
    dt = served_dtype(x, *(p for _, p, _ in params), allowed=("float",))
    if not shape or len(shape) > len(x.shape) or x.shape[len(x.shape) - len(shape) :] != shape:
        raise Unserved(f"input dims {x.shape} do not end with normalized_shape {shape}")
    rows, s_rows = collapse(x.shape[: -len(shape)], x.stride[: -len(shape)], "input's leading dims")
    hidden, s_hidden = collapse(shape, x.stride[-len(shape) :], "input's normalized dims")
    if s_hidden not in (0, 1):
        raise Unserved(f"input's normalized dims are not contiguous (strides {x.stride})")
    g = _graph(function, dt)
    inputs, constants = [1], []
    tensors = [g.tensor([rows, hidden, 1, 1], [_row_stride(rows, s_rows, hidden), 1, 1, 1], name="input", uid=1)]
    # A missing parameter takes the type of the one given (a float32 weight, say), else the input's.
    fill_dtype = next((p.dtype for _, p, _ in params if p is not None and p.dtype is not None), dt)
    for uid, (name, p, fill) in enumerate(params, start=2):
        if p is None:
            constants.append(Constant(uid, (1, hidden, 1, 1), fill, fill_dtype))
        else:
            if p.shape != shape:
                raise Unserved(f"{name} must have dims {shape} (normalized_shape), got {p.shape}")
            if not is_dense(p):
                raise Unserved(f"{name} is not contiguous (strides {p.stride})")
            inputs.append(uid)
        tensors.append(
            g.tensor([1, hidden, 1, 1], data_type=p.dtype if p is not None else fill_dtype, name=name, uid=uid)
        )
    epsilon = g.scalar(float(eps), name="epsilon", uid=10)
    constants.append(Constant(10, (1, 1, 1, 1), float(eps), "float", on_host=True))
    phase = "TRAINING" if training else "INFERENCE"
    if function == "layer_norm":
        y, *stats = g.layernorm(tensors[0], tensors[1], tensors[2], epsilon, norm_forward_phase=phase)
    else:
        y, *stats = g.rmsnorm(tensors[0], tensors[1], epsilon, norm_forward_phase=phase)
    assert y is not None
    _finish(y)
    extra: list[Output] = []
    if training:  # the row statistics the backward reads, float32 [rows, 1, 1, 1]
        for t, (name, uid) in zip(
            stats, (("mean", MEAN_UID), ("inv_variance", INV_VARIANCE_UID))[-len(stats) :], strict=True
        ):
            assert t is not None
            t.set_output(True).set_name(name).set_uid(uid).set_data_type("float")
            extra.append(Output(uid, (rows, 1, 1, 1), (1, 1, 1, 1), "float"))
    return _request(function, g, inputs, x.shape, x.stride, dt, constants, extra)


def layer_norm(
    x: Geo, shape: Any, weight: Geo | None, bias: Geo | None, eps: float, *, training: bool = False
) -> Request:
    """`training`: the rows' mean and inverse deviation are outputs too (the backward's)."""
    return _norm("layer_norm", x, normalized(shape), (("weight", weight, 1.0), ("bias", bias, 0.0)), eps, training)


def rms_norm(x: Geo, shape: Any, weight: Geo | None, eps: float | None, *, training: bool = False) -> Request:
    return _norm("rms_norm", x, normalized(shape), (("weight", weight, 1.0),), rms_eps(x, eps), training)


def rms_eps(x: Geo, eps: float | None) -> float:
    return FINFO_EPS.get(x.dtype or "", 2.0**-10) if eps is None else eps


def batch_norm(
    x: Geo,
    running_mean: Geo | None,
    running_var: Geo | None,
    weight: Geo | None,
    bias: Geo | None,
    *,
    training: bool,
    momentum: float,
    eps: float,
) -> Request:
    """torch.nn.functional.batch_norm of a 4-D float16/bfloat16 input with
    float32 per-channel tensors (torch's own mixed precision for a half
    model's BatchNorm2d), the output in the input's layout.

    Training: cuDNN's batchnorm node; the batch's mean and inv_variance are
    outputs (the backward's, uids 21, 22), and the next running statistics
    are written over the caller's running_mean and running_var (uids 23, 24
    bound to the same tensors as 4, 5: the frontend's own test_batchnorm does
    so, and the update is torch's: unbiased variance, `momentum`).
    Evaluation: batchnorm_inference, its inv_variance (uid 6) computed by the call."""
    dt = served_dtype(x)
    if len(x.shape) != 4:
        raise Unserved(f"input dims {x.shape}: cuDNN's batchnorm takes 4-D (N, C, H, W) inputs")
    no_zero_strides(x)
    channels = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and (t.shape != (channels,) or t.dtype != "float" or not is_dense(t)):
            raise Unserved(
                f"{name} must be a contiguous float32 ({channels},) tensor, got {t.dtype_text} dims {t.shape}"
            )
    if (running_mean is None) != (running_var is None):
        raise Unserved("running_mean and running_var go together")
    if not training and running_mean is None:
        raise Unserved("evaluation without running statistics")
    params = [1, channels, 1, 1]
    layout = dense_like(x.shape, x.stride)
    g = _graph("batch_norm", dt)
    xt = g.tensor(x.shape, x.stride, name="input", uid=1)
    inputs, constants = [1], []
    ports = []
    for name, given, fill, uid in (("weight", weight, 1.0, 2), ("bias", bias, 0.0, 3)):
        ports.append(g.tensor(params, data_type="float", name=name, uid=uid))
        if given is None:
            constants.append(Constant(uid, tuple(params), fill, "float"))
        else:
            inputs.append(uid)
    extra: list[Output] = []
    if training:
        running: dict[str, Any] = {}
        if running_mean is not None:
            running = {
                "in_running_mean": g.tensor(params, data_type="float", name="running_mean", uid=4),
                "in_running_var": g.tensor(params, data_type="float", name="running_var", uid=5),
                "momentum": g.scalar(float(momentum), name="momentum", uid=11),
            }
            constants.append(Constant(11, (1, 1, 1, 1), float(momentum), "float", on_host=True))
        y, mean, inv_var, next_mean, next_var = g.node(
            "batchnorm",
            input=xt,
            scale=ports[0],
            bias=ports[1],
            epsilon=g.scalar(float(eps), name="epsilon", uid=10),
            **running,
        )
        constants.append(Constant(10, (1, 1, 1, 1), float(eps), "float", on_host=True))
        for made, name, uid in ((mean, "mean", MEAN_UID), (inv_var, "inv_variance", INV_VARIANCE_UID)):
            assert made is not None
            made.set_output(True).set_name(name).set_uid(uid).set_data_type("float")
            extra.append(Output(uid, tuple(params), row_major(params), "float"))
        if running_mean is not None:
            for made, name, uid in ((next_mean, "next_running_mean", 23), (next_var, "next_running_var", 24)):
                assert made is not None
                made.set_output(True).set_name(name).set_uid(uid).set_data_type("float")
            inputs += [4, 5, 23, 24]
    else:
        mean_t = g.tensor(params, data_type="float", name="running_mean", uid=4)
        inv_t = g.tensor(params, data_type="float", name="inv_variance", uid=6)
        y = g.batchnorm_inference(xt, mean_t, inv_t, ports[0], ports[1])
        inputs += [4, 6]
    assert y is not None
    _finish(y, layout)
    return _request("batch_norm", g, inputs, x.shape, layout, dt, constants, extra)


# ---- attention -----------------------------------------------------------------


def _lengths(
    g: GraphSpec, lengths: Geo | None, batch: int, full: int, name: str, uid: int
) -> tuple[Tensor, Constant | None]:
    """Per-sequence lengths as cuDNN takes them ([b, 1, 1, 1] int32); a
    missing side is the full length, a constant."""
    if lengths is not None:
        if lengths.shape not in ((batch,), (batch, 1, 1, 1)):
            raise InvalidRequest(f"{name} must have dims ({batch},) (one length per sequence), got {lengths.shape}")
        if lengths.dtype != "int32":
            raise Unserved(f"{name} is {lengths.dtype_text}: cuDNN takes int32 lengths")
        if not is_dense(lengths):
            raise Unserved(f"{name} is not contiguous")
    t = g.tensor([batch, 1, 1, 1], data_type="int32", name=name, uid=uid)
    return t, (Constant(uid, (batch, 1, 1, 1), float(full), "int32") if lengths is None else None)


def _bias(mask: Geo, batch: int, heads: int, s_q: int, s_kv: int) -> tuple[list[int], list[int]]:
    """torch's attn_mask (broadcast to [b, h, s_q, s_kv]) as cuDNN's bias:
    dims [1|b, 1|h, s_q, s_kv]; an expanded batch or head dim (stride 0) is 1."""
    if len(mask.shape) > 4:
        raise Unserved(f"attn_mask has {len(mask.shape)} dims")
    pad = 4 - len(mask.shape)
    dims, strides = [1] * pad + list(mask.shape), [0] * pad + list(mask.stride)
    for axis, full in ((0, batch), (1, heads)):
        if strides[axis] == 0:
            dims[axis] = 1
        if dims[axis] not in (1, full):
            raise Unserved(f"attn_mask dims {mask.shape} do not broadcast to ({batch}, {heads}, {s_q}, {s_kv})")
    if dims[2:] != [s_q, s_kv] or 0 in strides[2:]:
        raise Unserved(
            f"attn_mask dims {mask.shape}: cuDNN's bias covers every query and key (no broadcasting over them)"
        )
    if dims[1] == 1:  # a broadcast dim: any stride addresses it; the packed one
        strides[1] = strides[2] * dims[2]
    if dims[0] == 1:
        strides[0] = strides[1] * dims[1]
    return dims, strides


@dataclass(frozen=True)
class Attention:
    """An SDPA call's options, as its forward and backward graphs share them."""

    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    window: int | None
    alibi: bool


# SDPA's ports: the call's tensors, then what a training forward saves and its backward reads.
Q_UID, K_UID, V_UID, BIAS_UID, SEQ_Q_UID, SEQ_KV_UID, SEED_UID, OFFSET_UID, O_UID, D_O_UID, SAVED_STATS_UID = (
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    11,
    12,
)
D_Q_UID, D_K_UID, D_V_UID, D_BIAS_UID = 20, 21, 22, 23
DROPOUT_SEED = "dropout_seed"  # the name of the int64 seed tensor a call with dropout passes after its own


def _attention(
    function: str,
    q: Geo,
    k: Geo,
    v: Geo,
    mask: Geo | None,
    seq_q: Geo | None,
    seq_kv: Geo | None,
    options: Attention,
) -> tuple[GraphSpec, dict[str, Any], list[int], list[Constant], str]:
    """The graph, the sdpa node's ports and attributes, the call's uids and
    the constants: what a forward and its backward both declare."""
    if mask is not None and mask.dtype in ("boolean", None):
        raise Unserved(
            f"attn_mask is {mask.dtype_text}: a boolean mask stays with torch (cuDNN takes an additive bias)"
        )
    dt = served_dtype(q, k, v, mask)
    if any(len(t.shape) != 4 for t in (q, k, v)):
        raise Unserved("query, key and value must be 4-D (batch, heads, sequence, head dim)")
    (b, h, s_q, e), (bk, hk, s_kv, ek), (bv, hv, s_v, _) = q.shape, k.shape, v.shape
    if bk != b or bv != b or ek != e or s_v != s_kv or hv != hk:
        raise Unserved(f"query {q.shape}, key {k.shape} and value {v.shape} do not go together")
    if hk != h and (not options.enable_gqa or h % hk):
        raise Unserved(
            f"query has {h} heads, key and value {hk} (grouped-query attention needs enable_gqa=True and a divisor)"
        )
    if options.is_causal and mask is not None:
        raise Unserved("attn_mask with is_causal=True")
    for t in (q, k, v):
        no_zero_strides(t)
    g = _graph(function, dt)
    ports: dict[str, Any] = {
        "q": g.tensor(q.shape, q.stride, name="query", uid=Q_UID),
        "k": g.tensor(k.shape, k.stride, name="key", uid=K_UID),
        "v": g.tensor(v.shape, v.stride, name="value", uid=V_UID),
    }
    inputs, constants = [Q_UID, K_UID, V_UID], []
    ports["attn_scale"] = options.scale if options.scale is not None else 1 / math.sqrt(e)
    ports["use_causal_mask"], ports["use_alibi_mask"] = options.is_causal, options.alibi
    if options.window is not None:
        ports["sliding_window_length"] = options.window
    if mask is not None:
        dims, strides = _bias(mask, b, h, s_q, s_kv)
        ports["bias"] = g.tensor(dims, strides, name="attn_mask", uid=BIAS_UID)
        inputs.append(BIAS_UID)
    if seq_q is not None or seq_kv is not None:
        for port, given, full, uid in (("seq_len_q", seq_q, s_q, SEQ_Q_UID), ("seq_len_kv", seq_kv, s_kv, SEQ_KV_UID)):
            ports[port], made = _lengths(g, given, b, full, port, uid)
            inputs += [uid] if made is None else []
            constants += [made] if made is not None else []
        ports["use_padding_mask"] = True
    if options.dropout_p:
        if not 0.0 < options.dropout_p < 1.0:
            raise InvalidRequest(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got {options.dropout_p}")
        # Philox: a seed each call draws from torch's generator (passed after the call's tensors), offset 0.
        seed = g.tensor([1, 1, 1, 1], data_type="int64", name=DROPOUT_SEED, uid=SEED_UID)
        offset = g.tensor([1, 1, 1, 1], data_type="int64", name="dropout_offset", uid=OFFSET_UID)
        ports["dropout"] = (options.dropout_p, seed, offset)
        inputs.append(SEED_UID)
        constants.append(Constant(OFFSET_UID, (1, 1, 1, 1), 0.0, "int64"))
    return g, ports, inputs, constants, dt


def sdpa(
    q: Geo,
    k: Geo,
    v: Geo,
    mask: Geo | None,
    seq_q: Geo | None,
    seq_kv: Geo | None,
    options: Attention,
    *,
    training: bool = False,
) -> Request:
    """`training`: the softmax statistics ([b, h, s_q, 1] float32) are an output too: the backward's."""
    g, ports, inputs, constants, dt = _attention("scaled_dot_product_attention", q, k, v, mask, seq_q, seq_kv, options)
    o, stats = g.sdpa(**ports, generate_stats=training)
    assert o is not None
    _finish(o)
    out = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    extra: tuple[Output, ...] = ()
    if training:
        assert stats is not None
        stats.set_output(True).set_name("stats").set_uid(STATS_UID).set_data_type("float")
        extra = (Output(STATS_UID, (*out[:3], 1), row_major((*out[:3], 1)), "float"),)
    return _request("scaled_dot_product_attention", g, inputs, out, row_major(out), dt, constants, extra)


def sdpa_backward(
    q: Geo,
    k: Geo,
    v: Geo,
    mask: Geo | None,
    seq_q: Geo | None,
    seq_kv: Geo | None,
    options: Attention,
    *,
    mask_grad: bool,
) -> Request:
    """The forward's backward: its q, k, v (and mask, lengths, seed), its
    output O and statistics, and dO (O's layout) give dQ, dK, dV in their
    inputs' dims and dense strides of the same order (a q sliced out of a
    fused projection gets a gradient of its own size), and dBias with `mask_grad`.
    The call's uids: the forward's inputs, then O, dO, the statistics."""
    g, ports, inputs, constants, dt = _attention(
        "scaled_dot_product_attention.backward", q, k, v, mask, seq_q, seq_kv, options
    )
    out = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    stats_dims = (*out[:3], 1)
    o = g.tensor(out, row_major(out), name="o", uid=O_UID)
    d_o = g.tensor(out, row_major(out), name="dO", uid=D_O_UID)
    stats = g.tensor(stats_dims, row_major(stats_dims), data_type="float", name="stats", uid=SAVED_STATS_UID)
    if mask_grad:
        assert mask is not None
        if mask.shape[:2] not in ((1, q.shape[1]),) or len(mask.shape) != 4:
            raise Unserved(f"attn_mask dims {mask.shape}: cuDNN's dBias is [1, heads, s_q, s_kv]")
        ports["dBias"] = g.tensor(mask.shape, dense_like(mask.shape, mask.stride), name="dBias", uid=D_BIAS_UID)
    grads = g.sdpa_backward(o=o, dO=d_o, stats=stats, **ports)
    outputs = []
    for t, geo_, name, uid in zip(grads, (q, k, v), ("dQ", "dK", "dV"), (D_Q_UID, D_K_UID, D_V_UID), strict=True):
        assert t is not None
        stride = dense_like(geo_.shape, geo_.stride)
        t.set_output(True).set_name(name).set_uid(uid).set_stride(stride)
        outputs.append(Output(uid, geo_.shape, stride, dt))
    if mask_grad:
        assert mask is not None
        outputs.append(Output(D_BIAS_UID, mask.shape, dense_like(mask.shape, mask.stride), dt))
    return Request(
        "scaled_dot_product_attention.backward",
        g,
        (*inputs, O_UID, D_O_UID, SAVED_STATS_UID),
        tuple(outputs),
        tuple(constants),
    )


def dense_like(shape: Sequence[int], stride: Sequence[int]) -> Dims:
    """Dense strides with `stride`'s order of axes (slowest first; ties keep
    the axes' order): a view's gradient has the view's layout, packed."""
    order = sorted(range(len(shape)), key=lambda axis: (-stride[axis], axis))
    rank = [0] * len(shape)
    for fastest_last, axis in enumerate(order):
        rank[axis] = len(shape) - 1 - fastest_last
    return packed(shape, rank)


def paged_decode(
    q: Geo,
    k_cache: Geo,
    v_cache: Geo,
    k_table: Geo,
    v_table: Geo,
    lengths: Geo,
    *,
    scale: float | None,
    max_seq_len: int | None,
) -> Request:
    """One query token per sequence over page pools [pages, heads, page size,
    head dim] and page tables [b, pages per sequence] (examples/generate.py's
    sdpa_paged_decode_bf16, at the call's sizes)."""
    if len(q.shape) != 4 or q.shape[2] != 1:
        raise InvalidRequest(
            f"paged_decode_attention: query must be [batch, heads, 1, head_dim] (one token per sequence), got dims {q.shape}"
        )
    b, h, _, d = q.shape
    for name, pool in (("key_cache", k_cache), ("value_cache", v_cache)):
        if len(pool.shape) != 4 or pool.shape[3] != d or h % max(pool.shape[1], 1) or pool.shape != k_cache.shape:
            raise InvalidRequest(
                f"paged_decode_attention: {name} must be [pages, kv_heads, page_size, {d}] with kv_heads dividing {h}, got dims {pool.shape}"
            )
    pages_per_seq = 0
    for name, table in (("page_table", k_table), ("value_page_table", v_table)):
        if (
            len(table.shape) not in (2, 4)
            or table.shape[0] != b
            or (len(table.shape) == 4 and (table.shape[1], table.shape[3]) != (1, 1))
        ):
            raise InvalidRequest(
                f"paged_decode_attention: {name} must be [{b}, pages per sequence], got dims {table.shape}"
            )
        pages_per_seq = table.shape[-2] if len(table.shape) == 4 else table.shape[1]
        if table.dtype != "int32":
            raise Unserved(f"{name} is {table.dtype_text}: cuDNN takes int32 page tables")
        if not is_dense(table):
            raise Unserved(f"{name} is not contiguous")
    if v_table.shape != k_table.shape:
        raise InvalidRequest(
            f"paged_decode_attention: value_page_table dims {v_table.shape} differ from page_table's {k_table.shape}"
        )
    capacity = pages_per_seq * k_cache.shape[2]
    longest = capacity if max_seq_len is None else max_seq_len
    if not 1 <= longest <= capacity:
        raise InvalidRequest(
            f"paged_decode_attention: max_seq_len {longest} is not in 1..{capacity} (pages per sequence x page size)"
        )
    dt = served_dtype(q, k_cache, v_cache)
    for t in (q, k_cache, v_cache):
        no_zero_strides(t)
    g = _graph("paged_decode_attention", dt)
    table_dims = [b, 1, pages_per_seq, 1]
    seq_q, made_q = _lengths(g, None, b, 1, "seq_len_q", 6)
    seq_kv, _ = _lengths(g, lengths, b, capacity, "seq_lens", 7)
    o, _ = g.sdpa(
        g.tensor(q.shape, q.stride, name="query", uid=1),
        g.tensor(k_cache.shape, k_cache.stride, name="key_cache", uid=2),
        g.tensor(v_cache.shape, v_cache.stride, name="value_cache", uid=3),
        attn_scale=scale if scale is not None else 1 / math.sqrt(d),
        use_padding_mask=True,
        seq_len_q=seq_q,
        seq_len_kv=seq_kv,
        paged_attention_max_seq_len_kv=longest,
        paged_attention_k_table=g.tensor(table_dims, data_type="int32", name="page_table", uid=4),
        paged_attention_v_table=g.tensor(table_dims, data_type="int32", name="value_page_table", uid=5),
    )
    assert o is not None and made_q is not None
    _finish(o)
    out = (b, h, 1, d)
    return _request("paged_decode_attention", g, (1, 2, 3, 4, 5, 7), out, row_major(out), dt, (made_q,))

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
from plancache.functional._geometry import Dims, Geo, Unserved, collapse, is_channels_last, is_dense, no_zero_strides, pair, served_dtype
from plancache.spec.classic_ops import conv_output_dims
from plancache.spec.graph import GraphSpec, Tensor
from plancache.spec.layouts import channels_last, row_major
from plancache.spec.schema import ShapeError

OUTPUT_UID = 20
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
class Request:
    """What a geometry asks plancache for, and how a call binds to it."""

    function: str
    spec: GraphSpec
    inputs: tuple[int, ...]  # the uid of each tensor the call passes, in the call's order
    out_shape: Dims
    out_stride: Dims
    out_dtype: str
    constants: tuple[Constant, ...] = ()
    output: int = OUTPUT_UID


def _graph(function: str, dtype: str) -> GraphSpec:
    return GraphSpec(name=f"plancache.functional.{function}", io_data_type=dtype, intermediate_data_type="float", compute_data_type="float")


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


def linear(x: Geo, w: Geo, bias: Geo | None, act: str | None) -> Request:
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
    _finish(activation(g, y, act))
    out = (*x.shape[:-1], n)
    return Request("linear", g, (1, 2) if bias is None else (1, 2, 3), out, row_major(out), dt)


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
    _finish(g.matmul(g.tensor(a_dims, a_strides, name="input", uid=1), g.tensor(b_dims, b_strides, name="other", uid=2)))
    return Request("matmul", g, (1, 2), out, row_major(out), dt)


# ---- convolution --------------------------------------------------------------


def _conv_padding(padding: Any, stride: tuple[int, int], dilation: tuple[int, int], kernel: Dims) -> dict[str, tuple[int, ...]]:
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


def conv2d(x: Geo, w: Geo, bias: Geo | None, stride: Any, padding: Any, dilation: Any, groups: Any, relu: bool) -> Request:
    dt = served_dtype(x, w, bias)
    if groups != 1:
        raise Unserved("a grouped convolution (groups != 1)")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise Unserved(f"input {x.shape} and weight {w.shape} must be 4-D (torch's unbatched 3-D input stays with torch)")
    if x.shape[1] != w.shape[1]:
        raise Unserved(f"input has {x.shape[1]} channels, weight expects {w.shape[1]}")
    out_channels = w.shape[0]
    if bias is not None and (bias.shape != (out_channels,) or (out_channels > 1 and bias.stride != (1,))):
        raise Unserved(f"bias must be a contiguous ({out_channels},) tensor, got dims {bias.shape} strides {bias.stride}")
    no_zero_strides(x)
    no_zero_strides(w)
    steps, dilations = pair(stride, "stride"), pair(dilation, "dilation")
    attrs: dict[str, tuple[int, ...]] = {**_conv_padding(padding, steps, dilations, w.shape[2:]), "stride": steps, "dilation": dilations}
    try:
        out = conv_output_dims(x.shape, w.shape, attrs)
    except ShapeError as e:
        raise Unserved(str(e)) from None
    # torch's conv output takes the channels-last format when an operand has it.
    layout = channels_last(out) if is_channels_last(x.shape, x.stride) or is_channels_last(w.shape, w.stride) else row_major(out)
    g = _graph("conv2d", dt)
    y = g.conv_fprop(g.tensor(x.shape, x.stride, name="input", uid=1), g.tensor(w.shape, w.stride, name="weight", uid=2), **attrs)
    if bias is not None:
        y = g.bias(y, g.tensor([1, out_channels, 1, 1], name="bias", uid=3))
    if relu:
        y = g.relu(y)
    _finish(y, layout)
    return Request("conv2d", g, (1, 2) if bias is None else (1, 2, 3), out, layout, dt)


# ---- normalization --------------------------------------------------------------


def normalized(shape: Any) -> Dims:
    if isinstance(shape, int) and not isinstance(shape, bool):
        return (shape,)
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise Unserved(f"normalized_shape must be an int or a sequence of ints, got {shape!r}") from None


def _norm(function: str, x: Geo, shape: Dims, params: Sequence[tuple[str, Geo | None, float]], eps: float) -> Request:
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
        tensors.append(g.tensor([1, hidden, 1, 1], data_type=p.dtype if p is not None else fill_dtype, name=name, uid=uid))
    epsilon = g.scalar(float(eps), name="epsilon", uid=10)
    constants.append(Constant(10, (1, 1, 1, 1), float(eps), "float", on_host=True))
    if function == "layer_norm":
        y, *_ = g.layernorm(tensors[0], tensors[1], tensors[2], epsilon, norm_forward_phase="INFERENCE")
    else:
        y, *_ = g.rmsnorm(tensors[0], tensors[1], epsilon, norm_forward_phase="INFERENCE")
    assert y is not None
    _finish(y)
    return Request(function, g, tuple(inputs), x.shape, x.stride, dt, tuple(constants))


def layer_norm(x: Geo, shape: Any, weight: Geo | None, bias: Geo | None, eps: float) -> Request:
    return _norm("layer_norm", x, normalized(shape), (("weight", weight, 1.0), ("bias", bias, 0.0)), eps)


def rms_norm(x: Geo, shape: Any, weight: Geo | None, eps: float | None) -> Request:
    if eps is None:
        eps = FINFO_EPS.get(x.dtype or "", 2.0**-10)
    return _norm("rms_norm", x, normalized(shape), (("weight", weight, 1.0),), eps)


# ---- attention -----------------------------------------------------------------


def _lengths(g: GraphSpec, lengths: Geo | None, batch: int, full: int, name: str, uid: int) -> tuple[Tensor, Constant | None]:
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
        raise Unserved(f"attn_mask dims {mask.shape}: cuDNN's bias covers every query and key (no broadcasting over them)")
    if dims[1] == 1:  # a broadcast dim: any stride addresses it; the packed one
        strides[1] = strides[2] * dims[2]
    if dims[0] == 1:
        strides[0] = strides[1] * dims[1]
    return dims, strides


def sdpa(
    q: Geo, k: Geo, v: Geo, mask: Geo | None, seq_q: Geo | None, seq_kv: Geo | None, *,
    dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool, window: int | None, alibi: bool,
) -> Request:  # fmt: skip
    if mask is not None and mask.dtype in ("boolean", None):
        raise Unserved(f"attn_mask is {mask.dtype_text}: a boolean mask stays with torch (cuDNN takes an additive bias)")
    dt = served_dtype(q, k, v, mask)
    if dropout_p:
        raise Unserved("dropout (cuDNN's random stream is not torch's)")
    if any(len(t.shape) != 4 for t in (q, k, v)):
        raise Unserved("query, key and value must be 4-D (batch, heads, sequence, head dim)")
    (b, h, s_q, e), (bk, hk, s_kv, ek), (bv, hv, s_v, ev) = q.shape, k.shape, v.shape
    if bk != b or bv != b or ek != e or s_v != s_kv or hv != hk:
        raise Unserved(f"query {q.shape}, key {k.shape} and value {v.shape} do not go together")
    if hk != h and (not enable_gqa or h % hk):
        raise Unserved(f"query has {h} heads, key and value {hk} (grouped-query attention needs enable_gqa=True and a divisor)")
    if is_causal and mask is not None:
        raise Unserved("attn_mask with is_causal=True")
    for t in (q, k, v):
        no_zero_strides(t)
    g = _graph("scaled_dot_product_attention", dt)
    tensors = {"q": g.tensor(q.shape, q.stride, name="query", uid=1), "k": g.tensor(k.shape, k.stride, name="key", uid=2),
               "v": g.tensor(v.shape, v.stride, name="value", uid=3)}  # fmt: skip
    inputs, constants = [1, 2, 3], []
    attrs: dict[str, Any] = {"attn_scale": scale if scale is not None else 1 / math.sqrt(e), "use_causal_mask": is_causal, "use_alibi_mask": alibi}
    if window is not None:
        attrs["sliding_window_length"] = window
    if mask is not None:
        dims, strides = _bias(mask, b, h, s_q, s_kv)
        tensors["bias"] = g.tensor(dims, strides, name="attn_mask", uid=4)
        inputs.append(4)
    if seq_q is not None or seq_kv is not None:
        for port, given, full, uid in (("seq_len_q", seq_q, s_q, 5), ("seq_len_kv", seq_kv, s_kv, 6)):
            tensors[port], made = _lengths(g, given, b, full, port, uid)
            inputs += [uid] if made is None else []
            constants += [made] if made is not None else []
        attrs["use_padding_mask"] = True
    o, _ = g.sdpa(**tensors, **attrs)
    assert o is not None
    _finish(o)
    out = (b, h, s_q, ev)
    return Request("scaled_dot_product_attention", g, tuple(inputs), out, row_major(out), dt, tuple(constants))


def paged_decode(q: Geo, k_cache: Geo, v_cache: Geo, k_table: Geo, v_table: Geo, lengths: Geo, *, scale: float | None, max_seq_len: int | None) -> Request:
    """One query token per sequence over page pools [pages, heads, page size,
    head dim] and page tables [b, pages per sequence] (examples/generate.py's
    sdpa_paged_decode_bf16, at the call's sizes)."""
    if len(q.shape) != 4 or q.shape[2] != 1:
        raise InvalidRequest(f"paged_decode_attention: query must be [batch, heads, 1, head_dim] (one token per sequence), got dims {q.shape}")
    b, h, _, d = q.shape
    for name, pool in (("key_cache", k_cache), ("value_cache", v_cache)):
        if len(pool.shape) != 4 or pool.shape[3] != d or h % max(pool.shape[1], 1) or pool.shape != k_cache.shape:
            raise InvalidRequest(f"paged_decode_attention: {name} must be [pages, kv_heads, page_size, {d}] with kv_heads dividing {h}, got dims {pool.shape}")
    pages_per_seq = 0
    for name, table in (("page_table", k_table), ("value_page_table", v_table)):
        if len(table.shape) not in (2, 4) or table.shape[0] != b or (len(table.shape) == 4 and (table.shape[1], table.shape[3]) != (1, 1)):
            raise InvalidRequest(f"paged_decode_attention: {name} must be [{b}, pages per sequence], got dims {table.shape}")
        pages_per_seq = table.shape[-2] if len(table.shape) == 4 else table.shape[1]
        if table.dtype != "int32":
            raise Unserved(f"{name} is {table.dtype_text}: cuDNN takes int32 page tables")
        if not is_dense(table):
            raise Unserved(f"{name} is not contiguous")
    if v_table.shape != k_table.shape:
        raise InvalidRequest(f"paged_decode_attention: value_page_table dims {v_table.shape} differ from page_table's {k_table.shape}")
    capacity = pages_per_seq * k_cache.shape[2]
    longest = capacity if max_seq_len is None else max_seq_len
    if not 1 <= longest <= capacity:
        raise InvalidRequest(f"paged_decode_attention: max_seq_len {longest} is not in 1..{capacity} (pages per sequence x page size)")
    dt = served_dtype(q, k_cache, v_cache)
    for t in (q, k_cache, v_cache):
        no_zero_strides(t)
    g = _graph("paged_decode_attention", dt)
    table_dims = [b, 1, pages_per_seq, 1]
    seq_q, made_q = _lengths(g, None, b, 1, "seq_len_q", 6)
    seq_kv, _ = _lengths(g, lengths, b, capacity, "seq_lens", 7)
    o, _ = g.sdpa(
        g.tensor(q.shape, q.stride, name="query", uid=1), g.tensor(k_cache.shape, k_cache.stride, name="key_cache", uid=2),
        g.tensor(v_cache.shape, v_cache.stride, name="value_cache", uid=3), attn_scale=scale if scale is not None else 1 / math.sqrt(d),
        use_padding_mask=True, seq_len_q=seq_q, seq_len_kv=seq_kv, paged_attention_max_seq_len_kv=longest,
        paged_attention_k_table=g.tensor(table_dims, data_type="int32", name="page_table", uid=4),
        paged_attention_v_table=g.tensor(table_dims, data_type="int32", name="value_page_table", uid=5),
    )  # fmt: skip
    assert o is not None and made_q is not None
    _finish(o)
    out = (b, h, 1, d)
    return Request("paged_decode_attention", g, (1, 2, 3, 4, 5, 7), out, row_major(out), dt, (made_q,))

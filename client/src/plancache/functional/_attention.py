"""scaled_dot_product_attention: cuDNN's SDPA forward and backward, with the options torch lacks.

The module's order is every operator module's (plancache.functional.
_linear says it): signature, call, forward and backward specs (one graph
builder for both: they declare the same ports), rule, torch's function,
written out in float32 for the options torch lacks (padding lengths, a
sliding window, ALiBi: _attention_common's masked attention).
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plancache.errors import InvalidRequest
from plancache.frontdoors.buckets import BUCKETS, pad_sequence
from plancache.functional import _modes, _tensor_ops
from plancache.functional._attention_common import length_port, masked_attention
from plancache.functional._autograd import Rule, needed
from plancache.functional._first_call import first_call
from plancache.functional._geometry import Dims, Geo, Unserved, no_zero_strides, served_dtype, tensor_key
from plancache.functional._op_call import OpCall
from plancache.functional._requests import Constant, Output, Request, dense_like, finish, graph, request
from plancache.functional._signature import Bound, Signature, Slot
from plancache.functional._table import TABLE, Served
from plancache.functional._tensor_ops import torch_module
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.layouts import row_major

DROPOUT_SEED = "dropout_seed"  # the int64 seed tensor a call with dropout passes after its own
SDPA = Signature(
    "scaled_dot_product_attention",
    "SDPA",
    Slot("query", 1, saved=True),
    Slot("key", 2, saved=True),
    Slot("value", 3, saved=True),
    Slot("attn_mask", 4, optional=True, saved=True),
    Slot("seq_len_q", 5, optional=True, saved=True),
    Slot("seq_len_kv", 6, optional=True, saved=True),
    Slot(DROPOUT_SEED, 7, optional=True, saved=True, to_torch=False),
)
# What else the graphs bind: the dropout's offset (a constant), a training forward's softmax statistics
# (STATS_UID), and the backward's O, dO, saved statistics and gradients.
OFFSET_UID, STATS_UID, O_UID, D_O_UID, SAVED_STATS_UID = 8, 21, 9, 11, 12
D_Q_UID, D_K_UID, D_V_UID, D_BIAS_UID = 20, 21, 22, 23
_grad_on, _compiling = _modes.install(globals())


# ---- the call --------------------------------------------------------------------------------


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    seq_len_q: Any = None,
    seq_len_kv: Any = None,
    sliding_window: int | None = None,
    alibi: bool = False,
) -> Any:
    """torch.nn.functional.scaled_dot_product_attention, query/key/value of 4
    dims [batch, heads, sequence, head dim] (any strides: BHSD or a BSHD
    view), plus what torch lacks (keyword-only):

    - `seq_len_q`, `seq_len_kv`: int32 tensors of one length per sequence
      (padding): keys past a sequence's length are masked; rows past its
      query length are unspecified (cuDNN leaves them);
    - `sliding_window`: query i attends to keys j with i - window < j;
    - `alibi`: cuDNN's ALiBi bias (slope of head h times key - query
      position), with `is_causal=True`.

    `attn_mask` as torch takes it; a float mask is cuDNN's bias (dims
    broadcasting to [batch, heads, queries, keys] over batch and heads); a
    boolean one is turned into that bias as torch reads it
    (boolean_mask_as_bias: a query that sees no key gives 0, as torch's).
    Dropout is cuDNN's (Philox, its seed drawn
    from torch's CUDA generator each call: torch.manual_seed reproduces it,
    but the mask is not the one torch's own dropout would draw).

    Differentiable: cuDNN's SDPA backward with the forward's options and
    softmax statistics, dBias when attn_mask requires grad."""
    unattended = None  # a boolean mask's rows of queries that see no key
    if attn_mask is not None and not is_causal and _servable(query) and _boolean(attn_mask) and not _compiling():
        attn_mask, unattended = _mask_bias_of(attn_mask, query, key)
    if BUCKETS.functions and is_causal and not dropout_p and not alibi and sliding_window is None:
        plain = attn_mask is None and seq_len_q is None and seq_len_kv is None
        padded = pad_sequence(query, key, value) if plain else None
        if padded is not None:  # keys after every real one: no real query sees them (causal)
            q, k, v, length = padded
            return _sdpa(q, k, v, None, 0.0, True, scale, enable_gqa, None, None, None, False)[:, :, :length]
    out = _sdpa(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        seq_len_q,
        seq_len_kv,
        sliding_window,
        alibi,
    )
    return out if unattended is None else out.masked_fill(unattended, 0.0)


def boolean_mask_as_bias(mask: Any, query: Any, key: Any) -> tuple[Any, Any]:
    """torch's boolean attn_mask (True: the query attends to the key) as cuDNN's additive bias, read as torch
    reads it: -inf where a key is masked out (torch's own conversion), over every query and key ([1|batch,
    1|heads, queries, keys]: cuDNN's bias does not broadcast over them). A query that sees no key gets torch's
    answer, 0 (its safe softmax; -inf over a whole row would be NaN): its row of the bias is 0, finite, and the
    caller zeroes its output rows where `unattended` ([..., queries, 1]) says so, which zeroes their gradient too.
    Returns (bias, unattended)."""
    torch = torch_module()
    unattended = ~mask.any(dim=-1, keepdim=True)
    blocked = ~(mask | unattended)  # masked out, in a row that sees some key
    shape = torch.broadcast_shapes(blocked.shape, (query.shape[-2], key.shape[-2]))
    bias = torch.zeros(shape, dtype=query.dtype, device=query.device).masked_fill_(blocked, float("-inf"))
    return bias, unattended


def _boolean(mask: Any) -> bool:
    return getattr(mask, "dtype", None) is torch_module().bool


def _servable(query: Any) -> bool:
    """A CUDA tensor of a dtype served (torch imported only for one: a process without torch has none)."""
    if getattr(query, "is_cuda", False) is not True:
        return False
    torch = torch_module()
    return query.dtype in (torch.float16, torch.bfloat16)


# The last boolean mask's bias, reused while that mask lives unchanged: a model makes one mask a forward and
# hands it to every layer. The weak reference drops the bias with the mask (no memory kept past it).
_last_mask: tuple[Any, int, Any, tuple[int, ...], tuple[int, ...], Any, Any] | None = None


def _forget_mask(_: Any) -> None:
    global _last_mask
    _last_mask = None


def _mask_bias_of(mask: Any, query: Any, key: Any) -> tuple[Any, Any]:
    global _last_mask
    try:
        version = mask._version
    except RuntimeError:  # an inference tensor (torch.inference_mode) keeps no version: made afresh each call
        return boolean_mask_as_bias(mask, query, key)
    last = _last_mask
    wanted = (query.dtype, tuple(query.shape), tuple(key.shape))
    if last is not None and last[0]() is mask and last[1] == version and last[2:5] == wanted:
        return last[5], last[6]
    bias, unattended = boolean_mask_as_bias(mask, query, key)
    _last_mask = (weakref.ref(mask, _forget_mask), version, *wanted, bias, unattended)
    return bias, unattended


def _sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    seq_len_q: Any,
    seq_len_kv: Any,
    sliding_window: int | None,
    alibi: bool,
    *,
    op: OpCall | None = None,
) -> Any:
    """scaled_dot_product_attention without bucketing (`op`: a torch operator's call)."""
    if _compiling():
        return torch_scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            seq_len_q=seq_len_q,
            seq_len_kv=seq_len_kv,
            sliding_window=sliding_window,
            alibi=alibi,
        )
    try:
        grad = (
            op.train
            if op is not None
            else _grad_on()
            and (
                query.requires_grad
                or key.requires_grad
                or value.requires_grad
                or (attn_mask is not None and attn_mask.requires_grad)
            )
        )
        geometry = (
            "sdpa",
            query.shape,
            query.stride(),
            query.dtype,
            query.get_device(),
            key.shape,
            key.stride(),
            key.dtype,
            key.get_device(),
            value.shape,
            value.stride(),
            value.dtype,
            value.get_device(),
            tensor_key(attn_mask),
            tensor_key(seq_len_q),
            tensor_key(seq_len_kv),
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            sliding_window,
            alibi,
            grad,
        )
    except (AttributeError, TypeError):
        return torch_scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if attn_mask is None and seq_len_q is None and seq_len_kv is None:
        tensors: tuple[Any, ...] = (query, key, value)
    else:
        tensors = tuple(t for t in (query, key, value, attn_mask, seq_len_q, seq_len_kv) if t is not None)
    if dropout_p:
        tensors = (*tensors, _tensor_ops.dropout_seed(query.device))
    entry = TABLE.get(geometry)
    if entry is not None:
        return entry(tensors) if op is None else op.take(entry, tensors)
    if alibi and not is_causal:
        raise InvalidRequest(
            "scaled_dot_product_attention: alibi=True needs is_causal=True (cuDNN's ALiBi masks keys after the query)"
        )
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1
    ):
        raise InvalidRequest(
            f"scaled_dot_product_attention: sliding_window must be a positive int, got {sliding_window!r}"
        )
    bound = SDPA.bind(
        tensors,
        query=query,
        key=key,
        value=value,
        attn_mask=attn_mask,
        seq_len_q=seq_len_q,
        seq_len_kv=seq_len_kv,
        dropout_seed=tensors[-1] if dropout_p else None,
    )
    options = Attention(dropout_p, is_causal, scale, enable_gqa, sliding_window, alibi)

    def forward() -> Request:
        return sdpa_request(_geos(bound), options, training=grad)

    fallback = bound.fallback(
        torch_scaled_dot_product_attention,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
        sliding_window=sliding_window,
        alibi=alibi,
    )
    # Dropout draws from torch's generator: a race would run the draw again, and change the program's.
    rule = functools.partial(sdpa_rule, bound, options)
    return first_call(bound, geometry, forward, fallback, grad, rule, op, raced=not dropout_p)


# query, key, value, attn_mask, seq_len_q, seq_len_kv: what the forward's and the backward's graphs read
Geos = tuple[Geo, Geo, Geo, Geo | None, Geo | None, Geo | None]


def _geos(bound: Bound) -> Geos:
    q, k, v = bound.geo("query"), bound.geo("key"), bound.geo("value")
    return q, k, v, bound.geo_or_none("attn_mask"), bound.geo_or_none("seq_len_q"), bound.geo_or_none("seq_len_kv")


# ---- the graphs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attention:
    """An SDPA call's options, as its forward and backward graphs share them."""

    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    window: int | None
    alibi: bool


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


def _attention(
    function: str, geos: Geos, options: Attention
) -> tuple[GraphSpec, dict[str, Any], tuple[int, ...], list[Constant], str, Dims]:
    """The graph, the sdpa node's ports and attributes, the call's uids, the
    constants and the output's dims: what a forward and its backward both declare."""
    q, k, v, mask, seq_q, seq_kv = geos
    if mask is not None and mask.dtype in ("boolean", None):
        raise Unserved(
            f"attn_mask is {mask.dtype_text}: cuDNN takes an additive bias (plancache.functional makes one of a "
            "boolean mask of a CUDA float16 or bfloat16 call without is_causal)"
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
    g = graph(function, dt)
    ports: dict[str, Any] = {
        "q": SDPA.tensor(g, "query", q.shape, q.stride),
        "k": SDPA.tensor(g, "key", k.shape, k.stride),
        "v": SDPA.tensor(g, "value", v.shape, v.stride),
    }
    constants = []
    ports["attn_scale"] = options.scale if options.scale is not None else 1 / math.sqrt(e)
    ports["use_causal_mask"], ports["use_alibi_mask"] = options.is_causal, options.alibi
    if options.window is not None:
        ports["sliding_window_length"] = options.window
    if mask is not None:
        dims, strides = _bias(mask, b, h, s_q, s_kv)
        ports["bias"] = SDPA.tensor(g, "attn_mask", dims, strides)
    if seq_q is not None or seq_kv is not None:
        for port, given, full in (("seq_len_q", seq_q, s_q), ("seq_len_kv", seq_kv, s_kv)):
            ports[port], made = length_port(g, given, b, full, port, SDPA.uid(port))
            constants += [made] if made is not None else []
        ports["use_padding_mask"] = True
    if options.dropout_p:
        if not 0.0 < options.dropout_p < 1.0:
            raise InvalidRequest(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got {options.dropout_p}")
        # Philox: a seed each call draws from torch's generator (passed after the call's tensors), offset 0.
        seed = SDPA.tensor(g, DROPOUT_SEED, [1, 1, 1, 1], data_type="int64")
        offset = g.tensor([1, 1, 1, 1], data_type="int64", name="dropout_offset", uid=OFFSET_UID)
        ports["dropout"] = (options.dropout_p, seed, offset)
        constants.append(Constant(OFFSET_UID, (1, 1, 1, 1), 0.0, "int64"))
    seeded = True if options.dropout_p else None
    inputs = SDPA.uids(query=q, key=k, value=v, attn_mask=mask, seq_len_q=seq_q, seq_len_kv=seq_kv, dropout_seed=seeded)
    return g, ports, inputs, constants, dt, (b, h, s_q, v.shape[3])


def sdpa_request(geos: Geos, options: Attention, *, training: bool = False) -> Request:
    """`training`: the softmax statistics ([b, h, s_q, 1] float32) are an output too: the backward's."""
    g, ports, inputs, constants, dt, out = _attention(SDPA.function, geos, options)
    o, stats = g.sdpa(**ports, generate_stats=training)
    assert o is not None
    finish(o)
    extra: tuple[Output, ...] = ()
    if training:
        assert stats is not None
        stats.set_output(True).set_name("stats").set_uid(STATS_UID).set_data_type("float")
        extra = (Output(STATS_UID, (*out[:3], 1), row_major((*out[:3], 1)), "float"),)
    return request(SDPA.function, g, inputs, out, row_major(out), dt, constants, extra)


def sdpa_backward_request(geos: Geos, options: Attention, *, mask_grad: bool) -> Request:
    """The forward's backward: its q, k, v (and mask, lengths, seed), its
    output O and statistics, and dO (O's layout) give dQ, dK, dV in their
    inputs' dims and dense strides of the same order (a q sliced out of a
    fused projection gets a gradient of its own size), and dBias with `mask_grad`.
    The call's uids: the forward's inputs, then O, dO, the statistics."""
    function = f"{SDPA.function}.backward"
    g, ports, inputs, constants, dt, out = _attention(function, geos, options)
    q, k, v, mask = geos[:4]
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
    return Request(function, g, (*inputs, O_UID, D_O_UID, SAVED_STATS_UID), tuple(outputs), tuple(constants))


# ---- the backward rule -----------------------------------------------------------------------


def sdpa_rule(bound: Bound, options: Attention, forward: Request) -> Rule:
    """sdpa_backward with the forward's options, inputs, output and statistics."""
    mask = bound.tensor("attn_mask")
    mask_grad = mask is not None and bool(mask.requires_grad)
    backward = sdpa_backward_request(_geos(bound), options, mask_grad=mask_grad)
    out = forward.outputs[0]
    at_q, at_k, at_v, at_mask = (bound.index(n) for n in ("query", "key", "value", "attn_mask"))
    assert at_q is not None and at_k is not None and at_v is not None
    count = len(bound.tensors)

    def run(
        p: dict[str, Served], inputs: list[Any], saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]
    ) -> tuple[Any, ...]:
        o, stats = saved
        outs = p["backward"].outputs((*inputs, o, grad, stats))  # every input is saved: the call's order
        grads: list[Any] = [None] * count
        for at, index in ((at_q, 0), (at_k, 1), (at_v, 2)):
            grads[at] = outs[index] if needs[at] else None
        if mask_grad and needed(needs, at_mask):
            assert at_mask is not None
            grads[at_mask] = outs[3]
        return tuple(grads)

    return Rule({"backward": backward}, bound.saved, (0, 1), run, count, out.shape, out.stride)


# ---- torch's --------------------------------------------------------------------------------


def torch_scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    seq_len_q: Any = None,
    seq_len_kv: Any = None,
    sliding_window: int | None = None,
    alibi: bool = False,
) -> Any:
    """torch's function, or with the options it lacks, the same attention in
    float32 with the masks written out (rows past a sequence's length: any)."""
    torch = torch_module()
    if seq_len_q is None and seq_len_kv is None and sliding_window is None and not alibi:
        gqa = {"enable_gqa": True} if enable_gqa else {}
        # scale and enable_gqa are keyword-only in torch (2.11: "takes from 3 to 6 positional arguments").
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **gqa
        )
    s_q, s_kv, heads = query.shape[-2], key.shape[-2], query.shape[-3]
    i = torch.arange(s_q, device=query.device).view(s_q, 1)
    j = torch.arange(s_kv, device=query.device).view(1, s_kv)
    allowed = torch.ones(s_q, s_kv, dtype=torch.bool, device=query.device)
    if is_causal:
        allowed &= j <= i
    if sliding_window is not None:
        allowed &= j > i - sliding_window
    allowed = allowed.view(1, 1, s_q, s_kv)
    if seq_len_kv is not None:
        allowed = allowed & (j.view(1, 1, 1, s_kv) < seq_len_kv.reshape(-1, 1, 1, 1))
    bias = torch.zeros((), device=query.device)
    if alibi:
        slopes = torch.tensor(alibi_slopes(heads), device=query.device).view(1, heads, 1, 1)
        bias = slopes * (j - i).float().view(1, 1, s_q, s_kv)
    if attn_mask is not None:
        bias = bias + attn_mask.float()
    return masked_attention(query, key, value, allowed, bias, scale, dropout_p, enable_gqa)


def alibi_slopes(heads: int) -> list[float]:
    """cuDNN's ALiBi slopes (cudnn_frontend_utils.h get_alibi_slope): for a
    power of two h, head i (from 1) gets 2^(-8i/h); otherwise the odd
    multiples of half a step fill the heads past the largest power of two."""
    n = 1 << int(math.log2(heads))
    steps = [float(i + 1) for i in range(n)] + [(i + 1) * 0.5 for i in range(0, 2 * (heads - n), 2)]
    return [2.0 ** (-8.0 * s / n) for s in steps]

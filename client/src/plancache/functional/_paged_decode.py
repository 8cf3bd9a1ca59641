"""paged_decode_attention: one decode step of attention over a paged KV cache (inference only).

The module's order is every operator module's (plancache.functional.
_linear says it): signature, call, forward spec, torch's function. There
is no served backward: with autograd, torch's function runs it. The graph
is examples/generate.py's sdpa_paged_decode_bf16 at the call's sizes;
torch's function gathers each sequence's pages and attends to its first
seq_lens tokens (float32, plancache.functional._attention_common's
masked attention).
"""

from __future__ import annotations

import math
from typing import Any

from plancache.errors import InvalidRequest
from plancache.functional import _modes
from plancache.functional._attention_common import length_port, masked_attention
from plancache.functional._first_call import first_call
from plancache.functional._geometry import Geo, Unserved, is_dense, no_zero_strides, served_dtype, tensor_key
from plancache.functional._requests import Request, finish, graph, request
from plancache.functional._signature import Signature, Slot
from plancache.functional._table import TABLE
from plancache.functional._tensor_ops import torch_module
from plancache.graphspec.layouts import row_major

PAGED_DECODE = Signature(
    "paged_decode_attention",
    "SDPA",
    Slot("query", 1),
    Slot("key_cache", 2),
    Slot("value_cache", 3),
    Slot("page_table", 4),
    Slot("value_page_table", 5),  # page_table when the call gives none
    Slot("seq_lens", 7),
)
SEQ_LEN_Q_UID = 6  # a constant: one query token per sequence
_grad_on, _compiling = _modes.install(globals())


def paged_decode_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    page_table: Any,
    seq_lens: Any,
    *,
    scale: float | None = None,
    max_seq_len: int | None = None,
    value_page_table: Any = None,
) -> Any:
    """One decode step of attention over a paged KV cache (inference: with
    autograd, torch's function runs it).

    query [batch, heads, 1, head_dim]; key_cache and value_cache page pools
    [pages, kv_heads, page_size, head_dim] (kv_heads dividing heads:
    grouped-query attention); page_table [batch, pages per sequence] int32,
    the pages of each sequence in order (value_page_table: another table for
    the values, default the same); seq_lens [batch] int32, each sequence's
    length in tokens (the new token included). `scale` defaults to
    1/sqrt(head_dim); `max_seq_len` (the longest length a call may carry)
    defaults to pages per sequence x page size. Returns [batch, heads, 1, head_dim]."""
    if _compiling():
        return torch_paged_decode_attention(
            query,
            key_cache,
            value_cache,
            page_table,
            seq_lens,
            scale=scale,
            max_seq_len=max_seq_len,
            value_page_table=value_page_table,
        )
    v_table = page_table if value_page_table is None else value_page_table
    try:
        grad = _grad_on() and (query.requires_grad or key_cache.requires_grad or value_cache.requires_grad)
        geometry = (
            "paged_decode",
            query.shape,
            query.stride(),
            query.dtype,
            query.get_device(),
            key_cache.shape,
            key_cache.stride(),
            key_cache.dtype,
            key_cache.get_device(),
            value_cache.shape,
            value_cache.stride(),
            value_cache.dtype,
            value_cache.get_device(),
            tensor_key(page_table),
            tensor_key(v_table),
            tensor_key(seq_lens),
            scale,
            max_seq_len,
            grad,
        )
    except (AttributeError, TypeError) as e:
        raise InvalidRequest(f"paged_decode_attention: every tensor argument must be a tensor ({e})") from None
    tensors = (query, key_cache, value_cache, page_table, v_table, seq_lens)
    entry = TABLE.get(geometry)
    if entry is not None:
        return entry(tensors)
    bound = PAGED_DECODE.bind(
        tensors,
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        page_table=page_table,
        value_page_table=v_table,
        seq_lens=seq_lens,
    )

    def forward() -> Request:
        q, k_cache, v_cache, k_table, v_table, lengths = (bound.geo(name) for name in bound.names)
        return paged_decode_request(
            q, k_cache, v_cache, k_table, v_table, lengths, scale=scale, max_seq_len=max_seq_len
        )

    fallback = bound.fallback(torch_paged_decode_attention, scale=scale, max_seq_len=max_seq_len)
    return first_call(bound, geometry, forward, fallback, grad)


# ---- the forward graph -----------------------------------------------------------------------


def paged_decode_request(
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
            "paged_decode_attention: query must be [batch, heads, 1, head_dim] (one token per sequence), "
            f"got dims {q.shape}"
        )
    b, h, _, d = q.shape
    for name, pool in (("key_cache", k_cache), ("value_cache", v_cache)):
        if len(pool.shape) != 4 or pool.shape[3] != d or h % max(pool.shape[1], 1) or pool.shape != k_cache.shape:
            raise InvalidRequest(
                f"paged_decode_attention: {name} must be [pages, kv_heads, page_size, {d}] "
                f"with kv_heads dividing {h}, got dims {pool.shape}"
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
    g = graph(PAGED_DECODE.function, dt)
    table_dims = [b, 1, pages_per_seq, 1]
    seq_q, made_q = length_port(g, None, b, 1, "seq_len_q", SEQ_LEN_Q_UID)
    seq_kv, _ = length_port(g, lengths, b, capacity, "seq_lens", PAGED_DECODE.uid("seq_lens"))
    o, _ = g.sdpa(
        PAGED_DECODE.tensor(g, "query", q.shape, q.stride),
        PAGED_DECODE.tensor(g, "key_cache", k_cache.shape, k_cache.stride),
        PAGED_DECODE.tensor(g, "value_cache", v_cache.shape, v_cache.stride),
        attn_scale=scale if scale is not None else 1 / math.sqrt(d),
        use_padding_mask=True,
        seq_len_q=seq_q,
        seq_len_kv=seq_kv,
        paged_attention_max_seq_len_kv=longest,
        paged_attention_k_table=PAGED_DECODE.tensor(g, "page_table", table_dims, data_type="int32"),
        paged_attention_v_table=PAGED_DECODE.tensor(g, "value_page_table", table_dims, data_type="int32"),
    )
    assert o is not None and made_q is not None
    finish(o)
    out = (b, h, 1, d)
    inputs = PAGED_DECODE.uids(
        query=q, key_cache=k_cache, value_cache=v_cache, page_table=k_table, value_page_table=v_table, seq_lens=lengths
    )
    return request(PAGED_DECODE.function, g, inputs, out, row_major(out), dt, (made_q,))


# ---- torch's --------------------------------------------------------------------------------


def torch_paged_decode_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    page_table: Any,
    seq_lens: Any,
    *,
    scale: float | None = None,
    max_seq_len: int | None = None,
    value_page_table: Any = None,
) -> Any:
    """Each sequence's pages gathered in page-table order, its first
    seq_lens[i] tokens attended to (float32)."""
    torch = torch_module()
    b, kv_heads, d = query.shape[0], key_cache.shape[1], key_cache.shape[3]

    def gathered(pool: Any, table: Any) -> Any:
        pages = pool[table.reshape(b, -1).long()]  # [b, pages per sequence, kv heads, page, d]
        return pages.permute(0, 2, 1, 3, 4).reshape(b, kv_heads, -1, d)

    k = gathered(key_cache, page_table)
    v = gathered(value_cache, value_page_table if value_page_table is not None else page_table)
    limit = seq_lens.reshape(b, 1, 1, 1)
    if max_seq_len is not None:
        limit = limit.clamp(max=max_seq_len)
    allowed = torch.arange(k.shape[2], device=query.device).view(1, 1, 1, -1) < limit
    return masked_attention(query, k, v, allowed, torch.zeros((), device=query.device), scale, 0.0, True)

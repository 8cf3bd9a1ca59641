"""The SDPA family's classic rules: forward (with paged caches, bias, ALiBi,
dropout, ragged sequences), FP8 forward and backward. Each checks what cuDNN
needs of the shapes, measured on the H200 (docs/gpu-runs/), so a spec cuDNN
would refuse is refused before anything is allocated on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

from plancache.graphspec.schema import (
    AttrKind,
    AttrSchema,
    AttrValue,
    Dims,
    OpSchema,
    ShapeError,
    declared_or,
    fixed,
    need_rank,
)

_F = AttrSchema(AttrKind.FLOAT)


_SDPA_ATTRS = {
    "attn_scale": _F,
    "use_causal_mask": AttrSchema(AttrKind.BOOL, default=False),
    "use_causal_mask_bottom_right": AttrSchema(AttrKind.BOOL, default=False),
    "use_padding_mask": AttrSchema(AttrKind.BOOL, default=False),
    "sliding_window_length": AttrSchema(AttrKind.INT),
    "use_alibi_mask": AttrSchema(AttrKind.BOOL, default=False),
}
# Paged KV cache (forward): k and v are page pools [pages, h, page size, d];
# per-sequence page tables [b, 1, pages per sequence, 1] (int32) index them.
PAGED_PORTS = ("paged_attention_k_table", "paged_attention_v_table")
_PAGED_ATTRS = {"paged_attention_max_seq_len_kv": AttrSchema(AttrKind.INT)}
# Philox dropout: the frontend's dropout=(probability, seed, offset) tuple as an
# attribute and two integer [1, 1, 1, 1] tensors (the backward must get the
# forward's seed and offset to drop the same elements).
_DROPOUT_PORTS = ("dropout_seed", "dropout_offset")
# Packed (ragged) sequences: token totals bounding the packed Q and K/V.
_RAGGED_ATTRS = {"max_total_seq_len_q": AttrSchema(AttrKind.INT), "max_total_seq_len_kv": AttrSchema(AttrKind.INT)}
_TRAINING_ATTRS = {"dropout_probability": _F, **_RAGGED_ATTRS}


def _sdpa_common(ins: Mapping[str, Dims], attrs: Mapping[str, AttrValue]) -> None:
    q, k, v = ins["q"], ins["k"], ins["v"]
    for port in ("q", "k", "v"):
        need_rank(port, ins[port], rank=4)
    paged = _sdpa_paged(ins, attrs)
    if not paged and not (q[0] == k[0] == v[0]):
        raise ShapeError(f"q {list(q)}, k {list(k)} and v {list(v)} must share the batch dim (axis 0)")
    if k[1] != v[1] or k[1] < 1 or q[1] % k[1] != 0:
        raise ShapeError(f"heads: k and v must have the same head count dividing q's (q {q[1]}, k {k[1]}, v {v[1]})")
    if k[2] != v[2]:
        raise ShapeError(
            f"k {list(k)} and v {list(v)} must have the same {'page size' if paged else 'sequence length'} (axis 2)"
        )
    if q[3] != k[3]:
        raise ShapeError(f"q {list(q)} and k {list(k)} must have the same head dim (axis 3)")
    padded = bool(attrs.get("use_padding_mask"))
    for port in ("seq_len_q", "seq_len_kv"):
        if padded and port not in ins:
            raise ShapeError(f"use_padding_mask needs input {port!r} (per-batch lengths, dims [b,1,1,1])")
        if port in ins and tuple(ins[port]) != (q[0], 1, 1, 1):
            raise ShapeError(f"input {port!r} must have dims [{q[0]}, 1, 1, 1], got {list(ins[port])}")


def _sdpa_paged(ins: Mapping[str, Dims], attrs: Mapping[str, AttrValue]) -> bool:
    """Check a paged KV cache's page tables; whether the graph is paged."""
    q, k = ins["q"], ins["k"]
    given = [p for p in PAGED_PORTS if p in ins]
    max_kv = attrs.get("paged_attention_max_seq_len_kv")
    if (
        not given
    ):  # paged_attention_max_seq_len_kv alone is accepted (and unused) by the frontend, as its FP8 tests give it
        return False
    if len(given) != 2:
        raise ShapeError("a paged KV cache needs both paged_attention_k_table and paged_attention_v_table")
    # The frontend takes a paged cache without its longest length ("optional, but recommended") and
    # without the padding mask (test_flexible_sdpa masks in a score modifier): so does plancache.
    if max_kv is not None and (not isinstance(max_kv, int) or max_kv < 1):
        raise ShapeError("paged_attention_max_seq_len_kv must be a positive number of tokens")
    for port in PAGED_PORTS:
        table = ins[port]
        if len(table) != 4 or table[0] != q[0] or table[1] != 1 or table[3] != 1:
            raise ShapeError(f"input {port!r} must have dims [{q[0]}, 1, pages per sequence, 1], got {list(table)}")
        if isinstance(max_kv, int) and table[2] * k[2] < max_kv:
            raise ShapeError(
                f"input {port!r}: {table[2]} pages of {k[2]} tokens hold "
                f"fewer than paged_attention_max_seq_len_kv = {max_kv}"
            )
    return True


def _sdpa_bias(ins: Mapping[str, Dims]) -> None:
    if "bias" not in ins:
        return
    q, k, bias = ins["q"], ins["k"], ins["bias"]
    s_kv = k[2]
    if len(bias) != 4 or bias[0] not in (1, q[0]) or bias[1] not in (1, q[1]) or bias[2] != q[2] or bias[3] != s_kv:
        raise ShapeError(f"input 'bias' must have dims [1 or {q[0]}, 1 or {q[1]}, {q[2]}, {s_kv}], got {list(bias)}")


def _sdpa_dropout(ins: Mapping[str, Dims], attrs: Mapping[str, AttrValue]) -> None:
    given = [p for p in _DROPOUT_PORTS if p in ins]
    probability = attrs.get("dropout_probability")
    if not given and probability is None:
        return
    if len(given) != 2 or probability is None:
        raise ShapeError(
            "dropout needs dropout_probability with both dropout_seed "
            "and dropout_offset (the frontend's dropout=(p, seed, offset))"
        )
    assert isinstance(probability, float)
    if not 0.0 < probability < 1.0:
        raise ShapeError(f"dropout_probability must be in (0, 1), got {probability}")
    for port in _DROPOUT_PORTS:
        if tuple(ins[port]) != (1, 1, 1, 1):
            raise ShapeError(f"input {port!r} must have dims [1, 1, 1, 1], got {list(ins[port])}")


def _sdpa_outputs(attrs: Mapping[str, AttrValue], _ports: frozenset[str]) -> tuple[str, ...]:
    return ("O", "Stats") if attrs.get("generate_stats") else ("O",)


def _is_inference(attrs: dict[str, AttrValue]) -> None:
    """The frontend's classic switch for the softmax stats (its rule: stats
    when generate_stats says so, else when not is_inference): the catalog's
    spelling is generate_stats, so both spellings are one graph and one key."""
    inference = attrs.pop("is_inference", None)
    if inference is not None and "generate_stats" not in attrs:
        attrs["generate_stats"] = not inference


def _sdpa_alibi(attrs: Mapping[str, AttrValue]) -> None:
    if attrs.get("use_alibi_mask") and not (attrs.get("use_causal_mask") or attrs.get("use_causal_mask_bottom_right")):
        raise ShapeError("use_alibi_mask needs use_causal_mask (cuDNN: ALiBi needs a right bound of 0)")


def _sdpa_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    _sdpa_common(ins, attrs)
    if "bias" in ins and _sdpa_paged(ins, attrs):
        raise ShapeError("a bias tensor with a paged KV cache is not supported")
    _sdpa_bias(ins)
    _sdpa_alibi(attrs)
    _sdpa_dropout(ins, attrs)
    q, v = ins["q"], ins["v"]
    result = {"O": declared_or(outs.get("O"), (*q[:3], v[3]), "O")}
    if attrs.get("generate_stats"):
        result["Stats"] = declared_or(outs.get("Stats"), (*q[:3], 1), "Stats")
    return result


# FP8 SDPA forward: per-tensor dequantization scales of q, k, v and the
# softmax output S, the quantization scales of S and O (all [1, 1, 1, 1], float).
_FP8_SCALES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")


def _sdpa_fp8_outputs(attrs: Mapping[str, AttrValue], _ports: frozenset[str]) -> tuple[str, ...]:
    return ("O", "Stats", "Amax_S", "Amax_O") if attrs.get("generate_stats") else ("O", "Amax_S", "Amax_O")


def _sdpa_fp8_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    for port in _FP8_SCALES:
        if tuple(ins[port]) != (1, 1, 1, 1):
            raise ShapeError(
                f"input {port!r} must have dims [1, 1, 1, 1] (one scale per tensor), got {list(ins[port])}"
            )
    result = _sdpa_infer({p: d for p, d in ins.items() if p not in _FP8_SCALES}, outs, attrs)
    for amax in ("Amax_S", "Amax_O"):
        result[amax] = declared_or(outs.get(amax), (1, 1, 1, 1), amax)
    return result


def _sdpa_backward_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    _sdpa_common(ins, attrs)
    q, v = ins["q"], ins["v"]
    expected = {"o": (*q[:3], v[3]), "dO": (*q[:3], v[3]), "stats": (*q[:3], 1)}
    for port, dims in expected.items():
        if tuple(ins[port]) != dims:
            raise ShapeError(f"input {port!r} must have dims {list(dims)}, got {list(ins[port])}")
    _sdpa_bias(ins)
    _sdpa_alibi(attrs)
    _sdpa_dropout(ins, attrs)
    grads = {
        grad: declared_or(outs.get(grad), ins[port], grad) for port, grad in (("q", "dQ"), ("k", "dK"), ("v", "dV"))
    }
    if "dBias" in outs:
        if "bias" not in ins:
            raise ShapeError("output 'dBias' (the bias gradient) needs input 'bias'")
        grads["dBias"] = declared_or(outs["dBias"], ins["bias"], "dBias")
    return grads


# What _sdpa_outputs and _sdpa_fp8_outputs decide, as data (the published catalog).
_STATS_PRESENCE = {"Stats": {"param_truthy": "generate_stats"}}


def attention_ops() -> list[OpSchema]:
    return [
        OpSchema(
            "sdpa",
            "sdpa",
            ("q", "k", "v"),
            ("seq_len_q", "seq_len_kv", "bias", *PAGED_PORTS, *_DROPOUT_PORTS),
            _sdpa_outputs,
            ("O", "Stats"),
            {
                **_SDPA_ATTRS,
                "generate_stats": AttrSchema(AttrKind.BOOL, default=False),
                **_PAGED_ATTRS,
                **_TRAINING_ATTRS,
            },
            _sdpa_infer,
            integer_bounds={"seq_len_q": ("q", 2), "seq_len_kv": ("k", 2)},
            index_bounds={"paged_attention_k_table": ("k", 0), "paged_attention_v_table": ("v", 0)},
            integer_inputs=_DROPOUT_PORTS,
            ragged_ports=("q", "k", "v", "O", "Stats", "score_max", "score_sum_exp", *PAGED_PORTS),
            prepare=_is_inference,
            output_presence=_STATS_PRESENCE,
        ),
        OpSchema(
            "sdpa_fp8",
            "sdpa",
            ("q", "k", "v", *_FP8_SCALES),
            ("seq_len_q", "seq_len_kv", *PAGED_PORTS),
            _sdpa_fp8_outputs,
            ("O", "Stats", "Amax_S", "Amax_O"),
            {**_SDPA_ATTRS, "generate_stats": AttrSchema(AttrKind.BOOL, default=False), **_PAGED_ATTRS},
            _sdpa_fp8_infer,
            integer_bounds={"seq_len_q": ("q", 2), "seq_len_kv": ("k", 2)},
            index_bounds={"paged_attention_k_table": ("k", 0), "paged_attention_v_table": ("v", 0)},
            prepare=_is_inference,
            output_presence=_STATS_PRESENCE,
        ),
        OpSchema(
            "sdpa_backward",
            "sdpa_backward",
            ("q", "k", "v", "o", "dO", "stats"),
            ("seq_len_q", "seq_len_kv", "bias", *_DROPOUT_PORTS),
            fixed("dQ", "dK", "dV"),
            ("dQ", "dK", "dV"),
            {**_SDPA_ATTRS, **_TRAINING_ATTRS},
            _sdpa_backward_infer,
            integer_bounds={"seq_len_q": ("q", 2), "seq_len_kv": ("k", 2)},
            integer_inputs=_DROPOUT_PORTS,
            optional_outputs=("dBias",),
            ragged_ports=("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV"),
        ),
    ]

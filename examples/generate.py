"""One example spec per op family, written as JSON next to this file.

    python examples/generate.py        # rewrite examples/*.json

These builders are the single source of the examples: a unit test checks
that the JSON files match them, and the GPU tests compile every one of them
through a server and check the results against torch (tests/gpu).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client" / "src"))

from plancache import GraphSpec
from plancache.graphspec.graph import Tensor


def nhwc(n: int, c: int, h: int, w: int) -> list[int]:
    """Channels-last strides for logical NCHW dims."""
    return [h * w * c, 1, w * c, c]


def matmul_fp16() -> GraphSpec:
    """The walkthrough's batched matmul: 8x256x512 @ 8x512x256."""
    g = GraphSpec(name="matmul_fp16", io_data_type="half")
    a = g.tensor([8, 256, 512], name="A", uid=1)
    b = g.tensor([8, 512, 256], name="B", uid=2)
    g.matmul(a, b).set_output(True).set_name("C").set_uid(3)
    return g


def matmul_bias_relu_bf16() -> GraphSpec:
    g = GraphSpec(name="matmul_bias_relu_bf16", io_data_type="bfloat16")
    a = g.tensor([1, 512, 1024], name="A", uid=1)
    b = g.tensor([1, 1024, 768], name="B", uid=2)
    bias = g.tensor([1, 1, 768], name="bias", uid=3)
    y = g.relu(g.bias(g.matmul(a, b), bias))
    y.set_output(True).set_name("Y").set_uid(4)
    return g


def conv_bias_relu_fp16() -> GraphSpec:
    """A ResNet-50 stage-1 3x3 convolution, channels-last, fused with bias and ReLU."""
    g = GraphSpec(name="conv_bias_relu_fp16", io_data_type="half")
    x = g.tensor([16, 64, 56, 56], nhwc(16, 64, 56, 56), name="x", uid=1)
    w = g.tensor([64, 64, 3, 3], nhwc(64, 64, 3, 3), name="w", uid=2)
    bias = g.tensor([1, 64, 1, 1], name="bias", uid=3)
    y = g.relu(g.bias(g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]), bias))
    y.set_output(True).set_name("y").set_uid(4).set_stride(nhwc(16, 64, 56, 56))
    return g


def conv_dgrad_fp16() -> GraphSpec:
    g = GraphSpec(name="conv_dgrad_fp16", io_data_type="half")
    dy = g.tensor([16, 64, 28, 28], nhwc(16, 64, 28, 28), name="dy", uid=1)
    w = g.tensor([64, 32, 3, 3], nhwc(64, 32, 3, 3), name="w", uid=2)
    dx = g.conv_dgrad(dy, w, padding=[1, 1], stride=[2, 2], dilation=[1, 1])
    dx.set_output(True).set_name("dx").set_uid(3).set_dim([16, 32, 56, 56]).set_stride(nhwc(16, 32, 56, 56))
    return g


def conv_wgrad_fp16() -> GraphSpec:
    g = GraphSpec(name="conv_wgrad_fp16", io_data_type="half")
    x = g.tensor([16, 32, 56, 56], nhwc(16, 32, 56, 56), name="x", uid=1)
    dy = g.tensor([16, 64, 28, 28], nhwc(16, 64, 28, 28), name="dy", uid=2)
    dw = g.conv_wgrad(x, dy, padding=[1, 1], stride=[2, 2], dilation=[1, 1])
    dw.set_output(True).set_name("dw").set_uid(3).set_dim([64, 32, 3, 3]).set_stride(nhwc(64, 32, 3, 3))
    return g


def _qkv(g: GraphSpec, b: int, h: int, s: int, d: int) -> tuple[object, ...]:
    return tuple(g.tensor([b, h, s, d], name=n, uid=uid) for n, uid in (("q", 11), ("k", 12), ("v", 13)))


def _training_outputs(o: Tensor | None, stats: Tensor | None) -> None:
    """A training forward's O (uid 14) and fp32 softmax stats (uid 15)."""
    assert o is not None and stats is not None
    o.set_output(True).set_name("o").set_uid(14)
    stats.set_output(True).set_name("stats").set_uid(15).set_data_type("float")


def _backward_inputs(g: GraphSpec, b: int, h: int, s: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """A backward's forward output o (uid 14), its gradient dO (16) and the stats (15)."""
    return (
        g.tensor([b, h, s, d], name="o", uid=14),
        g.tensor([b, h, s, d], name="dO", uid=16),
        g.tensor([b, h, s, 1], name="stats", uid=15, data_type="float"),
    )


def _gradients(grads: list[Tensor | None], stride: list[int] | None = None, offsets: Tensor | None = None) -> None:
    """dQ, dK, dV as outputs (uids 21-23); packed ones with their strides and offsets."""
    for t, name, uid in zip(grads, ("dQ", "dK", "dV"), (21, 22, 23), strict=True):
        assert t is not None
        t.set_output(True).set_name(name).set_uid(uid)
        if stride is not None and offsets is not None:
            t.set_stride(stride).set_ragged_offset(offsets)


def sdpa_causal_fp16() -> GraphSpec:
    """The walkthrough's causal SDPA: b4 h16 s1024 d64."""
    g = GraphSpec(name="sdpa_causal_fp16", io_data_type="half")
    q, k, v = _qkv(g, 4, 16, 1024, 64)
    o, _ = g.sdpa(q, k, v, attn_scale=1 / math.sqrt(64), use_causal_mask=True)
    assert o is not None
    o.set_output(True).set_name("o").set_uid(14)
    return g


def sdpa_stats_bf16() -> GraphSpec:
    """Training forward: causal, head dim 128, with the softmax stats output."""
    g = GraphSpec(name="sdpa_stats_bf16", io_data_type="bfloat16")
    q, k, v = _qkv(g, 2, 8, 512, 128)
    _training_outputs(*g.sdpa(q, k, v, attn_scale=1 / math.sqrt(128), use_causal_mask=True, generate_stats=True))
    return g


def sdpa_padding_fp16() -> GraphSpec:
    """Padding mask: per-batch sequence lengths for queries and keys."""
    g = GraphSpec(name="sdpa_padding_fp16", io_data_type="half")
    q, k, v = _qkv(g, 2, 8, 256, 64)
    seq_q = g.tensor([2, 1, 1, 1], name="seq_len_q", uid=16, data_type="int32")
    seq_kv = g.tensor([2, 1, 1, 1], name="seq_len_kv", uid=17, data_type="int32")
    o, _ = g.sdpa(q, k, v, seq_len_q=seq_q, seq_len_kv=seq_kv, use_padding_mask=True, attn_scale=0.125)
    assert o is not None
    o.set_output(True).set_name("o").set_uid(14)
    return g


def sdpa_backward_bf16() -> GraphSpec:
    g = GraphSpec(name="sdpa_backward_bf16", io_data_type="bfloat16")
    q, k, v = _qkv(g, 2, 8, 512, 128)
    o = g.tensor([2, 8, 512, 128], name="o", uid=14)
    d_o = g.tensor([2, 8, 512, 128], name="dO", uid=15)
    stats = g.tensor([2, 8, 512, 1], name="stats", uid=16, data_type="float")
    _gradients(g.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=1 / math.sqrt(128), use_causal_mask=True))
    return g


def _paged_decode(
    g: GraphSpec, uids: tuple[int, int, int, int], s_q: int = 1
) -> tuple[list[Tensor], dict[str, object]]:
    """A decode step's q (b 8, h 8, s_q query tokens, d 128) and 64-token page
    pools (1024 tokens per sequence at most), and the paged-cache keywords:
    the k and v page tables and the q and kv lengths, with these uids."""
    b, h, d, page, max_kv = 8, 8, 128, 64, 1024
    pages = b * max_kv // page
    qkv = [
        g.tensor(dim, name=n, uid=u)
        for n, u, dim in (
            ("q", 11, [b, h, s_q, d]),
            ("k_cache", 12, [pages, h, page, d]),
            ("v_cache", 13, [pages, h, page, d]),
        )
    ]
    dims = ([b, 1, max_kv // page, 1],) * 2 + ([b, 1, 1, 1],) * 2
    k_table, v_table, seq_q, seq_kv = (
        g.tensor(dim, name=n, uid=u, data_type="int32")
        for n, u, dim in zip(("k_page_table", "v_page_table", "seq_len_q", "seq_len_kv"), uids, dims, strict=True)
    )
    paging: dict[str, object] = {
        "attn_scale": 1 / math.sqrt(d),
        "use_padding_mask": True,
        "seq_len_q": seq_q,
        "seq_len_kv": seq_kv,
        "paged_attention_k_table": k_table,
        "paged_attention_v_table": v_table,
        "paged_attention_max_seq_len_kv": max_kv,
    }
    return qkv, paging


def _fp8_attention(g: GraphSpec, q: Tensor, k: Tensor, v: Tensor, **kwargs: object) -> GraphSpec:
    """sdpa_fp8 with unit-shaped scales (uids 20-25), O (14) and the amax of S and O (15, 16)."""
    scales = {
        n: g.tensor([1, 1, 1, 1], name=n, uid=20 + i, data_type="float")
        for i, n in enumerate(("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"))
    }
    o, _, amax_s, amax_o = g.sdpa_fp8(q, k, v, **kwargs, **scales)
    assert o is not None and amax_s is not None and amax_o is not None
    o.set_output(True).set_name("o").set_uid(14)
    amax_s.set_output(True).set_name("amax_s").set_uid(15).set_data_type("float")
    amax_o.set_output(True).set_name("amax_o").set_uid(16).set_data_type("float")
    return g


def sdpa_paged_decode_bf16() -> GraphSpec:
    """A decode step over a paged KV cache: one query token per sequence,
    keys and values in a pool of 64-token pages, a page table per sequence."""
    g = GraphSpec(name="sdpa_paged_decode_bf16", io_data_type="bfloat16")
    qkv, paging = _paged_decode(g, (15, 16, 17, 18))
    o, _ = g.sdpa(*qkv, **paging)
    assert o is not None
    o.set_output(True).set_name("o").set_uid(14)
    return g


def sdpa_paged_chunk_causal_bf16() -> GraphSpec:
    """Chunked prefill (or speculative decoding) over a paged KV cache: up to
    64 new query tokens per sequence attend to its cached tokens and to the
    new ones before them: bottom-right causal, with the padding mask."""
    g = GraphSpec(name="sdpa_paged_chunk_causal_bf16", io_data_type="bfloat16")
    qkv, paging = _paged_decode(g, (15, 16, 17, 18), s_q=64)
    o, _ = g.sdpa(*qkv, **paging, use_causal_mask_bottom_right=True)
    assert o is not None
    o.set_output(True).set_name("o").set_uid(14)
    return g


def sdpa_bias_bf16() -> GraphSpec:
    """An additive attention bias per head (a relative-position table, say)."""
    g = GraphSpec(name="sdpa_bias_bf16", io_data_type="bfloat16")
    q, k, v = _qkv(g, 2, 8, 256, 64)
    bias = g.tensor([1, 8, 256, 256], name="bias", uid=15)
    o, _ = g.sdpa(q, k, v, attn_scale=0.125, bias=bias)
    assert o is not None
    o.set_output(True).set_name("o").set_uid(14)
    return g


def sdpa_alibi_bf16() -> GraphSpec:
    """ALiBi: a per-head linear penalty on distance, with the causal mask."""
    g = GraphSpec(name="sdpa_alibi_bf16", io_data_type="bfloat16")
    q, k, v = _qkv(g, 2, 8, 512, 64)
    o, _ = g.sdpa(q, k, v, attn_scale=0.125, use_alibi_mask=True, use_causal_mask=True)
    assert o is not None
    o.set_output(True).set_name("o").set_uid(14)
    return g


def _thd(b: int, h: int, s: int, d: int) -> list[int]:
    """Strides of a packed (THD: tokens, heads, head dim) buffer seen as [b, h, s, d]."""
    return [s * h * d, d, h * d, 1]


def _ragged_qkv(
    g: GraphSpec, b: int, h: int, s: int, d: int, offsets: Tensor, names: tuple[tuple[str, int], ...]
) -> list[Tensor]:
    return [g.tensor([b, h, s, d], _thd(b, h, s, d), name=n, uid=u, ragged_offset=offsets) for n, u in names]


def sdpa_ragged_prefill_bf16() -> GraphSpec:
    """Packed prefill: sequences of mixed lengths back to back in one THD
    buffer (no padding), each start given by the ragged offsets, causal."""
    g = GraphSpec(name="sdpa_ragged_prefill_bf16", io_data_type="bfloat16")
    b, h, s, d = 4, 8, 512, 128
    offsets = g.tensor([b + 1, 1, 1, 1], name="token_offsets", uid=19, data_type="int32")
    q, k, v = _ragged_qkv(g, b, h, s, d, offsets, (("q", 11), ("k", 12), ("v", 13)))
    seq_q = g.tensor([b, 1, 1, 1], name="seq_len_q", uid=17, data_type="int32")
    seq_kv = g.tensor([b, 1, 1, 1], name="seq_len_kv", uid=18, data_type="int32")
    o, _ = g.sdpa(
        q,
        k,
        v,
        attn_scale=1 / math.sqrt(d),
        use_causal_mask=True,
        use_padding_mask=True,
        seq_len_q=seq_q,
        seq_len_kv=seq_kv,
    )
    assert o is not None
    o.set_output(True).set_name("o").set_uid(14).set_stride(_thd(b, h, s, d)).set_ragged_offset(offsets)
    return g


def sdpa_backward_ragged_bf16() -> GraphSpec:
    """The packed prefill's backward: q, k, v, o, dO and the gradients ragged;
    at most 1024 tokens in all (the workspace bound)."""
    g = GraphSpec(name="sdpa_backward_ragged_bf16", io_data_type="bfloat16")
    b, h, s, d = 4, 8, 512, 128
    offsets = g.tensor([b + 1, 1, 1, 1], name="token_offsets", uid=19, data_type="int32")
    q, k, v, o, d_o = _ragged_qkv(g, b, h, s, d, offsets, (("q", 11), ("k", 12), ("v", 13), ("o", 14), ("dO", 15)))
    stats = g.tensor([b, h, s, 1], name="stats", uid=16, data_type="float")
    seq_q = g.tensor([b, 1, 1, 1], name="seq_len_q", uid=17, data_type="int32")
    seq_kv = g.tensor([b, 1, 1, 1], name="seq_len_kv", uid=18, data_type="int32")
    grads = g.sdpa_backward(
        q,
        k,
        v,
        o,
        d_o,
        stats,
        attn_scale=1 / math.sqrt(d),
        use_causal_mask=True,
        use_padding_mask=True,
        seq_len_q=seq_q,
        seq_len_kv=seq_kv,
        max_total_seq_len_q=1024,
        max_total_seq_len_kv=1024,
    )
    _gradients(grads, _thd(b, h, s, d), offsets)
    return g


def _dropout(g: GraphSpec) -> tuple[Tensor, Tensor]:
    return (
        g.tensor([1, 1, 1, 1], name="dropout_seed", uid=31, data_type="int64"),
        g.tensor([1, 1, 1, 1], name="dropout_offset", uid=32, data_type="int64"),
    )


def sdpa_dropout_bf16() -> GraphSpec:
    """Training forward with attention dropout (p 0.1; Philox seed and offset
    tensors, which the backward must be given again). s = d = 128: the GPU
    test reads the drawn mask back through an identity V."""
    g = GraphSpec(name="sdpa_dropout_bf16", io_data_type="bfloat16")
    q, k, v = _qkv(g, 2, 8, 128, 128)
    seed, offset = _dropout(g)
    _training_outputs(*g.sdpa(q, k, v, attn_scale=1 / math.sqrt(128), generate_stats=True, dropout=(0.1, seed, offset)))
    return g


def sdpa_backward_dropout_bf16() -> GraphSpec:
    """sdpa_dropout_bf16's backward: the same probability, seed and offset."""
    g = GraphSpec(name="sdpa_backward_dropout_bf16", io_data_type="bfloat16")
    q, k, v = _qkv(g, 2, 8, 128, 128)
    o, d_o, stats = _backward_inputs(g, 2, 8, 128, 128)
    seed, offset = _dropout(g)
    _gradients(g.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=1 / math.sqrt(128), dropout=(0.1, seed, offset)))
    return g


def sdpa_backward_bias_bf16() -> GraphSpec:
    """Backward through an attention bias, with the bias gradient (dBias)."""
    g = GraphSpec(name="sdpa_backward_bias_bf16", io_data_type="bfloat16")
    q, k, v = _qkv(g, 2, 8, 256, 64)
    o, d_o, stats = _backward_inputs(g, 2, 8, 256, 64)
    bias = g.tensor([1, 8, 256, 256], name="bias", uid=17)
    d_bias = g.tensor([1, 8, 256, 256], name="dBias", uid=24)
    _gradients(g.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=0.125, bias=bias, dBias=d_bias))
    return g


def sdpa_fp8_paged_decode() -> GraphSpec:
    """FP8 decode over a paged KV cache (e4m3 pages and O). Refused by cuDNN
    9.19 on Hopper (sm_90): a one-token query goes to its sm80 engine, which
    takes FP16/BF16 only (docs/gpu-runs/2026-11-30-h200-run18.md); kept, with
    a strict expected failure in tests/gpu, for the GPUs and versions that
    build it."""
    g = GraphSpec(name="sdpa_fp8_paged_decode", io_data_type="fp8_e4m3")
    qkv, paging = _paged_decode(g, (31, 32, 33, 34))
    return _fp8_attention(g, *qkv, **paging)


def sdpa_fp8_causal() -> GraphSpec:
    """FP8 (e4m3) attention: per-tensor descales of q, k, v and S, scales of
    S and O, and the amax of S and O for the next step's scales."""
    g = GraphSpec(name="sdpa_fp8_causal", io_data_type="fp8_e4m3")
    q, k, v = (g.tensor([2, 4, 256, 128], name=n, uid=u) for n, u in (("q", 11), ("k", 12), ("v", 13)))
    return _fp8_attention(g, q, k, v, attn_scale=1 / math.sqrt(128), use_causal_mask=True)


def matmul_fp8_scaled_bf16() -> GraphSpec:
    """FP8 (e4m3) matmul with per-tensor dequantization scales, bf16 out;
    B column-major, as FP8 GEMMs want it."""
    g = GraphSpec(name="matmul_fp8_scaled_bf16", io_data_type="bfloat16")
    a = g.tensor([1, 1024, 2048], name="A", uid=1, data_type="fp8_e4m3")
    b = g.tensor([1, 2048, 512], name="B", uid=2, data_type="fp8_e4m3", stride=[2048 * 512, 1, 2048])
    scale_a = g.tensor([1, 1, 1], name="scale_a", uid=3, data_type="float")
    scale_b = g.tensor([1, 1, 1], name="scale_b", uid=4, data_type="float")
    c = g.mul(g.mul(g.matmul(a, b), scale_a), scale_b)
    c.set_output(True).set_name("C").set_uid(5)
    return g


def _fp8_matmul_bias(g: GraphSpec, m: int, k: int, n: int, activation: str) -> Tensor:
    """C (uid 5) = activation(A @ B × scale_a × scale_b + bias): e4m3 A (uid 1),
    column-major e4m3 B (2), fp32 scales (3, 4), a bias row (6) in the output type."""
    a = g.tensor([1, m, k], name="A", uid=1, data_type="fp8_e4m3")
    b = g.tensor([1, k, n], name="B", uid=2, data_type="fp8_e4m3", stride=[k * n, 1, k])
    scale_a = g.tensor([1, 1, 1], name="scale_a", uid=3, data_type="float")
    scale_b = g.tensor([1, 1, 1], name="scale_b", uid=4, data_type="float")
    bias = g.tensor([1, 1, n], name="bias", uid=6)
    c: Tensor = getattr(g, activation)(g.add(g.mul(g.mul(g.matmul(a, b), scale_a), scale_b), bias))
    c.set_output(True).set_name("C").set_uid(5)
    return c


def matmul_fp8_bias_gelu_amax_bf16() -> GraphSpec:
    """FP8 matmul with its epilogue fused: dequantization scales, a bias row,
    GELU, bf16 out, and the output's amax (for the next layer's FP8 scale)."""
    g = GraphSpec(name="matmul_fp8_bias_gelu_amax_bf16", io_data_type="bfloat16")
    c = _fp8_matmul_bias(g, 1024, 2048, 1024, "gelu")
    amax = g.reduction(c, mode="AMAX")
    amax.set_output(True).set_name("amax").set_uid(7).set_dim([1, 1, 1]).set_data_type("float")
    return g


def matmul_fp8_bias_relu_fp16() -> GraphSpec:
    """FP8 matmul, scales, bias and ReLU fused, fp16 out."""
    g = GraphSpec(name="matmul_fp8_bias_relu_fp16", io_data_type="half")
    _fp8_matmul_bias(g, 2048, 1024, 1024, "relu")
    return g


def _norm_inputs(g: GraphSpec, rows: int, hidden: int, bias: bool) -> list[object]:
    x = g.tensor([rows, hidden, 1, 1], name="x", uid=1)
    scale = g.tensor([1, hidden, 1, 1], name="scale", uid=2, data_type="float")
    out = [x, scale]
    if bias:
        out.append(g.tensor([1, hidden, 1, 1], name="bias", uid=3, data_type="float"))
    out.append(g.scalar(1e-5, name="epsilon", uid=4))
    return out


def layernorm_training_fp16() -> GraphSpec:
    g = GraphSpec(name="layernorm_training_fp16", io_data_type="half")
    x, scale, bias, eps = _norm_inputs(g, 2048, 1024, bias=True)
    y, mean, inv_var = g.layernorm(x, scale, bias, eps, norm_forward_phase="TRAINING")  # type: ignore[arg-type]
    assert y is not None and mean is not None and inv_var is not None
    y.set_output(True).set_name("y").set_uid(5)
    mean.set_output(True).set_name("mean").set_uid(6).set_data_type("float")
    inv_var.set_output(True).set_name("inv_var").set_uid(7).set_data_type("float")
    return g


def layernorm_inference_bf16() -> GraphSpec:
    g = GraphSpec(name="layernorm_inference_bf16", io_data_type="bfloat16")
    x, scale, bias, eps = _norm_inputs(g, 1024, 2048, bias=True)
    y, _, _ = g.layernorm(x, scale, bias, eps, norm_forward_phase="INFERENCE")  # type: ignore[arg-type]
    assert y is not None
    y.set_output(True).set_name("y").set_uid(5)
    return g


def rmsnorm_training_bf16() -> GraphSpec:
    g = GraphSpec(name="rmsnorm_training_bf16", io_data_type="bfloat16")
    x, scale, eps = _norm_inputs(g, 2048, 4096, bias=False)
    y, inv_var = g.rmsnorm(x, scale, eps, norm_forward_phase="TRAINING")  # type: ignore[arg-type]
    assert y is not None and inv_var is not None
    y.set_output(True).set_name("y").set_uid(5)
    inv_var.set_output(True).set_name("inv_var").set_uid(7).set_data_type("float")
    return g


def rmsnorm_inference_fp16() -> GraphSpec:
    g = GraphSpec(name="rmsnorm_inference_fp16", io_data_type="half")
    x, scale, eps = _norm_inputs(g, 2048, 4096, bias=False)
    y, _ = g.rmsnorm(x, scale, eps, norm_forward_phase="INFERENCE")  # type: ignore[arg-type]
    assert y is not None
    y.set_output(True).set_name("y").set_uid(5)
    return g


def batchnorm_inference_fp16() -> GraphSpec:
    g = GraphSpec(name="batchnorm_inference_fp16", io_data_type="half")
    x = g.tensor([16, 64, 32, 32], nhwc(16, 64, 32, 32), name="x", uid=1)
    stats = [
        g.tensor([1, 64, 1, 1], name=n, uid=uid, data_type="float")
        for n, uid in (("mean", 2), ("inv_variance", 3), ("scale", 4), ("bias", 5))
    ]
    y = g.batchnorm_inference(x, *stats)
    y.set_output(True).set_name("y").set_uid(6).set_stride(nhwc(16, 64, 32, 32))
    return g


def pointwise_binary_fp16() -> GraphSpec:
    """((x + y) * y - x) / den, then bias and scale.

    Full-size operands: in a graph of pointwise ops only, cuDNN computes
    broadcast inputs wrongly, and the compiler refuses them (see
    plancache_server/worker/compiler/defects.py); matmul_bias_relu_bf16 and
    conv_bias_relu_fp16 show broadcasting where it is right."""
    g = GraphSpec(name="pointwise_binary_fp16", io_data_type="half")
    x = g.tensor([4, 256, 512], name="x", uid=1)
    y = g.tensor([4, 256, 512], name="y", uid=2)
    den = g.tensor([4, 256, 512], name="den", uid=3)
    bias = g.tensor([4, 256, 512], name="bias", uid=4)
    scale = g.tensor([4, 256, 512], name="scale", uid=5)
    t = g.div(g.sub(g.mul(g.add(x, y), y), x), den)
    out = g.scale(g.bias(t, bias), scale)
    out.set_output(True).set_name("out").set_uid(6)
    return g


def pointwise_unary_fp16() -> GraphSpec:
    """swish(sigmoid(tanh(gelu(relu(x)))))."""
    g = GraphSpec(name="pointwise_unary_fp16", io_data_type="half")
    x = g.tensor([4, 256, 512], name="x", uid=1)
    out = g.swish(g.sigmoid(g.tanh(g.gelu(g.relu(x)))))
    out.set_output(True).set_name("out").set_uid(2)
    return g


def reduction_sum_fp32() -> GraphSpec:
    g = GraphSpec(name="reduction_sum_fp32", io_data_type="float")
    x = g.tensor([256, 1024], name="x", uid=1)
    g.reduction(x, mode="ADD").set_output(True).set_name("sum").set_uid(2).set_dim([256, 1])
    return g


# ---- the frontend's other ops: results whose dims cuDNN infers (docs/canonical-form.md) ----


def _row_stats(g: GraphSpec, rows: int, uids: tuple[int, int] | tuple[int]) -> list[Tensor]:
    """A norm's saved fp32 statistics per row ([rows, 1, 1, 1]): mean (if two uids) and inv_variance."""
    names = ("mean", "inv_variance")[-len(uids) :]
    return [g.tensor([rows, 1, 1, 1], name=n, uid=u, data_type="float") for n, u in zip(names, uids, strict=True)]


def _gradients_out(
    grads: list[Tensor | None], uids: tuple[int, int, int], data_types: tuple[str | None, ...] = (None, None, None)
) -> None:
    """DX, DScale, DBias as outputs with these uids (and data types, where given)."""
    for t, name, uid, data_type in zip(grads, ("DX", "DScale", "DBias"), uids, data_types, strict=True):
        assert t is not None
        t.set_output(True).set_name(name).set_uid(uid)
        if data_type is not None:
            t.set_data_type(data_type)


def layernorm_backward_fp16() -> GraphSpec:
    """test_layernorm's backward: the forward's input, scale, mean and inv_variance and dY give DX, DScale, DBias."""
    g = GraphSpec(name="layernorm_backward_fp16", io_data_type="half")
    dy = g.tensor([2048, 1024, 1, 1], name="dY", uid=1)
    x = g.tensor([2048, 1024, 1, 1], name="x", uid=2)
    scale = g.tensor([1, 1024, 1, 1], name="scale", uid=3)
    mean, inv_var = _row_stats(g, 2048, (4, 5))
    _gradients_out(
        g.node("layernorm_backward", grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_var), (6, 7, 8)
    )
    return g


def rmsnorm_backward_bf16() -> GraphSpec:
    """test_rmsnorm's backward with the bias gradient (has_dbias): DX, DScale, DBias."""
    g = GraphSpec(name="rmsnorm_backward_bf16", io_data_type="bfloat16")
    dy = g.tensor([2048, 1024, 1, 1], name="dY", uid=1)
    x = g.tensor([2048, 1024, 1, 1], name="x", uid=2)
    scale = g.tensor([1, 1024, 1, 1], name="scale", uid=3)
    (inv_var,) = _row_stats(g, 2048, (5,))
    _gradients_out(
        g.node("rmsnorm_backward", grad=dy, input=x, scale=scale, inv_variance=inv_var, has_dbias=True), (6, 7, 8)
    )
    return g


def _channel_params(g: GraphSpec, c: int, names: tuple[str, ...], first_uid: int) -> list[Tensor]:
    """fp32 per-channel tensors [1, c, 1, 1] (scale, bias, running statistics ...)."""
    return [g.tensor([1, c, 1, 1], name=n, uid=first_uid + i, data_type="float") for i, n in enumerate(names)]


def batchnorm_training_fp16() -> GraphSpec:
    """test_batchnorm's forward training with running statistics (epsilon, momentum pass-by-value), then ReLU."""
    # Outputs ReLU(Y), the batch's mean and inv_variance, the next running mean and variance (fp32, [1, C, 1, 1]).
    g = GraphSpec(name="batchnorm_training_fp16", io_data_type="half")
    x = g.tensor([4, 16, 56, 56], nhwc(4, 16, 56, 56), name="x", uid=1)
    scale, bias, running_mean, running_var = _channel_params(g, 16, ("scale", "bias", "running_mean", "running_var"), 2)
    epsilon = g.scalar(1e-3, name="epsilon", uid=6)
    momentum = g.scalar(0.1, name="momentum", uid=7)
    y, mean, inv_var, next_mean, next_var = g.node(
        "batchnorm",
        input=x,
        scale=scale,
        bias=bias,
        in_running_mean=running_mean,
        in_running_var=running_var,
        epsilon=epsilon,
        momentum=momentum,
    )
    assert y is not None
    g.relu(y).set_output(True).set_name("y").set_uid(8)
    for t, name, uid in (
        (mean, "mean", 9),
        (inv_var, "inv_variance", 10),
        (next_mean, "next_running_mean", 11),
        (next_var, "next_running_var", 12),
    ):
        assert t is not None
        t.set_output(True).set_name(name).set_uid(uid).set_data_type("float")
    return g


def batchnorm_backward_fp16() -> GraphSpec:
    """test_batchnorm's DBN on its own: dY, x and the saved statistics give DX and fp32 DScale, DBias."""
    g = GraphSpec(name="batchnorm_backward_fp16", io_data_type="half")
    dy = g.tensor([4, 16, 56, 56], nhwc(4, 16, 56, 56), name="dY", uid=1)
    x = g.tensor([4, 16, 56, 56], nhwc(4, 16, 56, 56), name="x", uid=2)
    scale, mean, inv_var = _channel_params(g, 16, ("scale", "mean", "inv_variance"), 3)
    grads = g.node("batchnorm_backward", grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_var)
    _gradients_out(grads, (6, 7, 8), (None, "float", "float"))
    return g


def instancenorm_training_fp16() -> GraphSpec:
    """test_instancenorm's forward: statistics per image and channel over H x W, channels-last."""
    g = GraphSpec(name="instancenorm_training_fp16", io_data_type="half")
    x = g.tensor([16, 32, 64, 64], nhwc(16, 32, 64, 64), name="x", uid=1)
    scale = g.tensor([1, 32, 1, 1], name="scale", uid=2)
    bias = g.tensor([1, 32, 1, 1], name="bias", uid=3)
    epsilon = g.scalar(1e-5, name="epsilon", uid=4)
    y, mean, inv_var = g.node(
        "instancenorm", input=x, scale=scale, bias=bias, epsilon=epsilon, norm_forward_phase="TRAINING"
    )
    assert y is not None and mean is not None and inv_var is not None
    y.set_output(True).set_name("y").set_uid(5)
    mean.set_output(True).set_name("mean").set_uid(6).set_data_type("float")
    inv_var.set_output(True).set_name("inv_variance").set_uid(7).set_data_type("float")
    return g


def _adaln_inputs(g: GraphSpec, b: int, s: int, d: int) -> tuple[Tensor, Tensor]:
    """x [b, s, d] and its per-sample scale [b, 1, d] (uids 2 and 3)."""
    return g.tensor([b, s, d], name="x", uid=2), g.tensor([b, 1, d], name="scale", uid=3)


def adalayernorm_training_fp16() -> GraphSpec:
    """The adaptive layernorm sample (27): layernorm over d with a scale and bias per sample, training."""
    g = GraphSpec(name="adalayernorm_training_fp16", io_data_type="half")
    x, scale = _adaln_inputs(g, 4, 1024, 768)
    bias = g.tensor([4, 1, 768], name="bias", uid=4)
    epsilon = g.tensor([1, 1, 1], [1, 1, 1], "float", name="epsilon", uid=5, is_pass_by_value=True, scalar_value=1e-3)
    y, mean, inv_var = g.node(
        "adalayernorm", input=x, scale=scale, bias=bias, epsilon=epsilon, norm_forward_phase="TRAINING"
    )
    assert y is not None and mean is not None and inv_var is not None
    y.set_output(True).set_name("y").set_uid(6)
    mean.set_output(True).set_name("mean").set_uid(7).set_data_type("float")
    inv_var.set_output(True).set_name("inv_variance").set_uid(8).set_data_type("float")
    return g


def adalayernorm_backward_fp16() -> GraphSpec:
    """The adaptive layernorm sample's backward: DX, and DScale, DBias per sample."""
    g = GraphSpec(name="adalayernorm_backward_fp16", io_data_type="half")
    dy = g.tensor([4, 1024, 768], name="dY", uid=1)
    x, scale = _adaln_inputs(g, 4, 1024, 768)
    mean, inv_var = (
        g.tensor([4, 1024, 1], name=n, uid=u, data_type="float") for n, u in (("mean", 4), ("inv_variance", 5))
    )
    _gradients_out(
        g.node("adalayernorm_backward", grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_var), (6, 7, 8)
    )
    return g


def conv_genstats_fp16() -> GraphSpec:
    """test_conv_genstats: scale, bias, ReLU, a 3x3 convolution, and genstats' per-channel sum and sum of squares."""
    g = GraphSpec(name="conv_genstats_fp16", io_data_type="half", intermediate_data_type="half")
    x = g.tensor([4, 32, 32, 32], nhwc(4, 32, 32, 32), name="x", uid=1)
    w = g.tensor([64, 32, 3, 3], nhwc(64, 32, 3, 3), name="w", uid=2)
    scale = g.tensor([1, 32, 1, 1], nhwc(1, 32, 1, 1), name="scale", uid=3)
    bias = g.tensor([1, 32, 1, 1], nhwc(1, 32, 1, 1), name="bias", uid=4)
    y = g.conv_fprop(g.relu(g.bias(g.scale(x, scale), bias)), w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    y.set_output(True).set_name("y").set_uid(5)
    total, squares = g.node("genstats", y)
    assert total is not None and squares is not None
    total.set_output(True).set_name("sum").set_uid(6).set_data_type("float")
    squares.set_output(True).set_name("sq_sum").set_uid(7).set_data_type("float")
    return g


def slice_matmul_bf16() -> GraphSpec:
    """test_slice: a matmul of slices of A and B; needs cuDNN 9.22 (a strict expected failure in tests/gpu)."""
    g = GraphSpec(name="slice_matmul_bf16", io_data_type="bfloat16")
    a = g.tensor([16, 32, 128], name="A", uid=1)
    b = g.tensor([16, 128, 64], name="B", uid=2)
    (a_slice,) = g.node("slice", a, slices=[slice(8, None), slice(16, None), slice(None, None)])
    (b_slice,) = g.node("slice", b, slices=[slice(8, None), slice(None, None), slice(32, None)])
    assert a_slice is not None and b_slice is not None
    g.matmul(a_slice, b_slice).set_output(True).set_name("C").set_uid(3)
    return g


def concatenate_fp16() -> GraphSpec:
    """The frontend's conv + concatenate sample: a 1x1 convolution's output and y0 (in place: in_place_index 1) on channels."""
    # y0's channels of the output are not the op's to write. The frontend's Python graph needs the output's dims
    # (validate: "dims not set"). Without in_place_index, cuDNN 9.19 builds the graph but leaves half the output unwritten.
    g = GraphSpec(name="concatenate_fp16", io_data_type="half")
    n, c, h, w, k = 4, 64, 32, 32, 64
    x = g.tensor([n, c, h, w], nhwc(n, c, h, w), name="x", uid=1)
    weight = g.tensor([k, c, 1, 1], nhwc(k, c, 1, 1), name="w", uid=2)
    y = g.conv_fprop(x, weight, padding=[0, 0], stride=[1, 1], dilation=[1, 1]).set_data_type("half")
    y0 = g.tensor([n, k, h, w], nhwc(n, k, h, w), name="y0", uid=3)
    (out,) = g.node("concatenate", inputs=[y, y0], axis=1, in_place_index=1)
    assert out is not None
    out.set_output(True).set_name("y1").set_uid(4).set_dim([n, 2 * k, h, w]).set_stride(nhwc(n, 2 * k, h, w))
    return g


def reshape_bf16() -> GraphSpec:
    """A view-only reshape, K [1, 384, 256] as K^T [1, 256, 384], into a matmul; no engine on sm_90 with cuDNN 9.19 (strict xfail)."""
    g = GraphSpec(name="reshape_bf16", io_data_type="bfloat16")
    a = g.tensor([1, 512, 256], name="A", uid=1)
    k = g.tensor([1, 384, 256], name="K", uid=2)
    (k_t,) = g.node("reshape", k, reshape_mode="VIEW_ONLY")
    assert k_t is not None
    k_t.set_dim([1, 256, 384]).set_stride([384 * 256, 1, 256]).set_data_type("bfloat16")
    g.matmul(a, k_t).set_output(True).set_name("C").set_uid(3)
    return g


def pointwise_select_fp16() -> GraphSpec:
    """The mask modes: where((gen_index rows >= cols) or x > t, x, y) by cmp_ge, cmp_gt, logical_or and binary_select."""
    # As sample 70 (boolean logic) builds them: comparisons computed in float with boolean results, the logical op in
    # boolean (cuDNN 9.19 refuses int32 or float there). Full-size operands (see pointwise_binary_fp16).
    g = GraphSpec(name="pointwise_select_fp16", io_data_type="half")
    x = g.tensor([4, 256, 512], name="x", uid=1)
    y = g.tensor([4, 256, 512], name="y", uid=2)
    t = g.tensor([4, 256, 512], name="t", uid=3)
    row = g.gen_index(x, axis=1)
    col = g.gen_index(x, axis=2)
    lower = g.cmp_ge(row, col).set_data_type("boolean")
    above = g.cmp_gt(x, t).set_data_type("boolean")
    keep = g.logical_or(lower, above, compute_data_type="boolean").set_data_type("boolean")
    g.binary_select(x, y, keep).set_output(True).set_name("out").set_uid(4)
    return g


def transpose_fp32() -> GraphSpec:
    """The frontend's membound transpose sample, [2, 3, 4] permuted (2, 0, 1); needs cuDNN 9.22 (strict xfail in tests/gpu)."""
    g = GraphSpec(name="transpose_fp32", io_data_type="float")
    x = g.tensor([2, 3, 4], name="x", uid=1)
    (y,) = g.node("transpose", x, permutation=[2, 0, 1])
    assert y is not None
    y.set_output(True).set_name("y").set_uid(2)
    return g


def apply_rope_fp16() -> GraphSpec:
    """test_apply_rope: RoPE as pointwise ops on strided views of q, y1 = x1 cos1 - x2 sin1, y2 = x2 cos2 + x1 sin2."""
    # The rope op itself needs cuDNN 9.24. q [64, 1024, 128]: its first 32 features rotated; cos and sin fp32 [1, 1024, 16], broadcast.
    g = GraphSpec(name="apply_rope_fp16", io_data_type="half")
    bh, t, hs, half = 64, 1024, 128, 16
    q_view, table_view = [t * hs, hs, 1], [t * 2 * half, 2 * half, 1]
    x1, x2 = (g.tensor([bh, t, half], q_view, name=n, uid=u) for n, u in (("x1", 1), ("x2", 2)))
    cos1, cos2, sin1, sin2 = (
        g.tensor([1, t, half], table_view, "float", name=n, uid=u)
        for n, u in (("cos1", 3), ("cos2", 4), ("sin1", 5), ("sin2", 6))
    )
    g.sub(g.mul(x1, cos1), g.mul(x2, sin1)).set_output(True).set_name("y1").set_uid(7).set_stride(q_view)
    g.add(g.mul(x2, cos2), g.mul(x1, sin2)).set_output(True).set_name("y2").set_uid(8).set_stride(q_view)
    return g


def moe_grouped_matmul_bf16() -> GraphSpec:
    """test_moe_grouped_matmul's forward, smaller: tokens grouped by expert (int32 offsets), each times its expert's weight."""
    # Tokens [1, 512, 256], 4 experts' column-major weights [256, 256]; the output's dims are cuDNN's.
    g = GraphSpec(name="moe_grouped_matmul_bf16", io_data_type="bfloat16")
    experts, tokens, hidden, n = 4, 512, 256, 256
    token = g.tensor([1, tokens, hidden], name="token", uid=1)
    weight = g.tensor([experts, hidden, n], [hidden * n, 1, hidden], name="weight", uid=2)
    offsets = g.tensor([experts, 1, 1], [1, 1, 1], "int32", name="first_token_offset", uid=3)
    (out,) = g.node("moe_grouped_matmul", token, weight, offsets, mode="NONE")
    assert out is not None
    out.set_output(True).set_name("out").set_uid(4)
    return g


EXAMPLES: dict[str, Callable[[], GraphSpec]] = {
    f.__name__: f
    for f in (
        matmul_fp16,
        matmul_bias_relu_bf16,
        conv_bias_relu_fp16,
        conv_dgrad_fp16,
        conv_wgrad_fp16,
        sdpa_causal_fp16,
        sdpa_stats_bf16,
        sdpa_padding_fp16,
        sdpa_backward_bf16,
        sdpa_paged_decode_bf16,
        sdpa_paged_chunk_causal_bf16,
        sdpa_bias_bf16,
        sdpa_alibi_bf16,
        sdpa_ragged_prefill_bf16,
        sdpa_backward_ragged_bf16,
        sdpa_dropout_bf16,
        sdpa_backward_dropout_bf16,
        sdpa_backward_bias_bf16,
        sdpa_fp8_causal,
        sdpa_fp8_paged_decode,
        matmul_fp8_scaled_bf16,
        matmul_fp8_bias_gelu_amax_bf16,
        matmul_fp8_bias_relu_fp16,
        layernorm_training_fp16,
        layernorm_inference_bf16,
        rmsnorm_training_bf16,
        rmsnorm_inference_fp16,
        batchnorm_inference_fp16,
        pointwise_binary_fp16,
        pointwise_unary_fp16,
        reduction_sum_fp32,
        layernorm_backward_fp16,
        rmsnorm_backward_bf16,
        batchnorm_training_fp16,
        batchnorm_backward_fp16,
        instancenorm_training_fp16,
        adalayernorm_training_fp16,
        adalayernorm_backward_fp16,
        conv_genstats_fp16,
        slice_matmul_bf16,
        concatenate_fp16,
        reshape_bf16,
        transpose_fp32,
        pointwise_select_fp16,
        apply_rope_fp16,
        moe_grouped_matmul_bf16,
    )
}

EXAMPLES_DIR = Path(__file__).resolve().parent


def render(name: str) -> str:
    return EXAMPLES[name]().to_json() + "\n"


def main() -> None:
    for name in EXAMPLES:
        (EXAMPLES_DIR / f"{name}.json").write_text(render(name))
        print(f"wrote examples/{name}.json")


if __name__ == "__main__":
    main()

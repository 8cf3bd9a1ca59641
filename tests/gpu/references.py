"""torch references for every example in examples/, and their input rules.

`prepare(case, t)` fills inputs that must be consistent with others (sdpa
backward's o and stats, sequence lengths); `reference(case, t)` returns the
expected outputs by tensor name, in float32, NaN where the op leaves the
value unspecified (padded query rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Tensors = dict[str, torch.Tensor]

# Inputs that must be positive (denominators, inverse variances).
POSITIVE = {"pointwise_binary_fp16": {"den"}, "batchnorm_inference_fp16": {"inv_variance"}, "matmul_fp8_scaled_bf16": {"scale_a", "scale_b"}}


def _f(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _causal_mask(s_q: int, s_kv: int, device: torch.device) -> torch.Tensor:
    return torch.ones(s_q, s_kv, dtype=torch.bool, device=device).tril()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.einsum("bhqd,bhkd->bhqk", _f(q), _f(k)) * scale
    if causal:
        scores = scores.masked_fill(~_causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    stats = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1), _f(v)), stats


def _prepare_sdpa_backward(t: Tensors) -> None:
    o, stats = _attention(t["q"], t["k"], t["v"], 1 / math.sqrt(128), causal=True)
    t["o"].copy_(o)
    t["stats"].copy_(stats)


def _prepare_padding(t: Tensors) -> None:
    t["seq_len_q"].copy_(torch.tensor([256, 200], dtype=torch.int32).view(2, 1, 1, 1))
    t["seq_len_kv"].copy_(torch.tensor([256, 150], dtype=torch.int32).view(2, 1, 1, 1))


def _prepare_paged(t: Tensors) -> None:
    """Each sequence its own pages, in shuffled order; lengths up to the maximum."""
    b, pages_per_seq = t["k_page_table"].shape[0], t["k_page_table"].shape[2]
    table = torch.randperm(b * pages_per_seq, device=t["q"].device, dtype=torch.int32).view(b, 1, pages_per_seq, 1)
    t["k_page_table"].copy_(table)
    t["v_page_table"].copy_(table)
    t["seq_len_q"].fill_(1)
    max_kv = pages_per_seq * t["k_cache"].shape[2]
    lengths = torch.linspace(1, max_kv, b).round().to(torch.int32).view(b, 1, 1, 1)  # 1 .. max: a page boundary and a full table
    t["seq_len_kv"].copy_(lengths)


def _prepare_unit_scales(t: Tensors) -> None:
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        t[name].fill_(1.0)


PREPARE: dict[str, Callable[[Tensors], None]] = {
    "sdpa_fp8_causal": _prepare_unit_scales,
    "sdpa_backward_bf16": _prepare_sdpa_backward,
    "sdpa_padding_fp16": _prepare_padding,
    "sdpa_paged_decode_bf16": _prepare_paged,
}


def prepare(case: str, t: Tensors) -> None:
    if case in PREPARE:
        PREPARE[case](t)


def _sdpa_padding(t: Tensors) -> Tensors:
    q, k, v = t["q"], t["k"], t["v"]
    out = torch.full(q.shape, float("nan"), device=q.device)
    for b in range(q.shape[0]):
        lq, lkv = int(t["seq_len_q"][b]), int(t["seq_len_kv"][b])
        o, _ = _attention(q[b : b + 1, :, :lq], k[b : b + 1, :, :lkv], v[b : b + 1, :, :lkv], 0.125, causal=False)
        out[b, :, :lq] = o[0]
    return {"o": out}


def _sdpa_paged(t: Tensors) -> Tensors:
    """Attention over each sequence's pages, gathered in page-table order."""
    q, kc, vc = t["q"], t["k_cache"], t["v_cache"]
    b, h, d = q.shape[0], q.shape[1], q.shape[3]
    out = torch.empty(q.shape, device=q.device)
    for i in range(b):
        n = int(t["seq_len_kv"][i])
        k_i = kc[t["k_page_table"][i, 0, :, 0].long()].permute(1, 0, 2, 3).reshape(1, h, -1, d)[:, :, :n]
        v_i = vc[t["v_page_table"][i, 0, :, 0].long()].permute(1, 0, 2, 3).reshape(1, h, -1, d)[:, :, :n]
        out[i] = _attention(q[i : i + 1], k_i, v_i, 1 / math.sqrt(d), causal=False)[0][0]
    return {"o": out}


def _sdpa_with_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, bias: torch.Tensor, causal: bool) -> torch.Tensor:
    scores = torch.einsum("bhqd,bhkd->bhqk", _f(q), _f(k)) * scale + bias
    if causal:
        scores = scores.masked_fill(~_causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1), _f(v))


def _alibi_bias(heads: int, s: int, device: torch.device) -> torch.Tensor:
    """ALiBi (Press et al.): head i (1-based) of H adds slope 2^(-8i/H) × (key - query) position."""
    slopes = torch.tensor([2 ** (-8 * (i + 1) / heads) for i in range(heads)], device=device).view(1, heads, 1, 1)
    pos = torch.arange(s, device=device)
    return slopes * (pos.view(1, 1, 1, s) - pos.view(1, 1, s, 1)).float()


def _sdpa_fp8(t: Tensors) -> Tensors:
    o = _attention(t["q"], t["k"], t["v"], 1 / math.sqrt(128), causal=True)[0]
    return {"o": o, "amax_o": o.abs().max().view(1, 1, 1, 1)}


def _sdpa_backward(t: Tensors) -> Tensors:
    q, k, v = (_f(t[n]).requires_grad_(True) for n in ("q", "k", "v"))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(128))
    o.backward(_f(t["dO"]))
    return {"dQ": q.grad, "dK": k.grad, "dV": v.grad}  # type: ignore[dict-item]


def _layernorm(t: Tensors, training: bool) -> Tensors:
    x = _f(t["x"])
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    var = x.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
    inv_var = torch.rsqrt(var + 1e-5)
    y = (x - mean) * inv_var * _f(t["scale"]) + _f(t["bias"])
    return {"y": y, "mean": mean, "inv_var": inv_var} if training else {"y": y}


def _rmsnorm(t: Tensors, training: bool) -> Tensors:
    x = _f(t["x"])
    inv_var = torch.rsqrt(x.pow(2).mean(dim=(1, 2, 3), keepdim=True) + 1e-5)
    y = x * inv_var * _f(t["scale"])
    return {"y": y, "inv_var": inv_var} if training else {"y": y}


REFERENCES: dict[str, Callable[[Tensors], Tensors]] = {
    "matmul_fp16": lambda t: {"C": _f(t["A"]) @ _f(t["B"])},
    "matmul_bias_relu_bf16": lambda t: {"Y": torch.relu(_f(t["A"]) @ _f(t["B"]) + _f(t["bias"]))},
    "conv_bias_relu_fp16": lambda t: {"y": torch.relu(F.conv2d(_f(t["x"]), _f(t["w"]), padding=1) + _f(t["bias"]))},
    "conv_dgrad_fp16": lambda t: {"dx": torch.nn.grad.conv2d_input((16, 32, 56, 56), _f(t["w"]), _f(t["dy"]), stride=2, padding=1)},
    "conv_wgrad_fp16": lambda t: {"dw": torch.nn.grad.conv2d_weight(_f(t["x"]), (64, 32, 3, 3), _f(t["dy"]), stride=2, padding=1)},
    "sdpa_causal_fp16": lambda t: {"o": _attention(t["q"], t["k"], t["v"], 0.125, causal=True)[0]},
    "sdpa_stats_bf16": lambda t: dict(zip(("o", "stats"), _attention(t["q"], t["k"], t["v"], 1 / math.sqrt(128), causal=True), strict=True)),
    "sdpa_padding_fp16": _sdpa_padding,
    "sdpa_backward_bf16": _sdpa_backward,
    "sdpa_paged_decode_bf16": _sdpa_paged,
    "sdpa_bias_bf16": lambda t: {"o": _sdpa_with_bias(t["q"], t["k"], t["v"], 0.125, _f(t["bias"]), causal=False)},
    "sdpa_alibi_bf16": lambda t: {"o": _sdpa_with_bias(t["q"], t["k"], t["v"], 0.125, _alibi_bias(8, 512, t["q"].device), causal=True)},
    # O and amax(O) against attention over the dequantized (unit-scale) inputs.
    "sdpa_fp8_causal": _sdpa_fp8,
    "matmul_fp8_scaled_bf16": lambda t: {"C": (_f(t["A"]) @ _f(t["B"])) * _f(t["scale_a"]) * _f(t["scale_b"])},
    "layernorm_training_fp16": lambda t: _layernorm(t, training=True),
    "layernorm_inference_bf16": lambda t: _layernorm(t, training=False),
    "rmsnorm_training_bf16": lambda t: _rmsnorm(t, training=True),
    "rmsnorm_inference_fp16": lambda t: _rmsnorm(t, training=False),
    "batchnorm_inference_fp16": lambda t: {"y": (_f(t["x"]) - _f(t["mean"])) * _f(t["inv_variance"]) * _f(t["scale"]) + _f(t["bias"])},
    "pointwise_binary_fp16": lambda t: {"out": ((((_f(t["x"]) + _f(t["y"])) * _f(t["y"]) - _f(t["x"])) / _f(t["den"])) + _f(t["bias"])) * _f(t["scale"])},
    "pointwise_unary_fp16": lambda t: {"out": F.silu(torch.sigmoid(torch.tanh(F.gelu(torch.relu(_f(t["x"]))))))},
    "reduction_sum_fp32": lambda t: {"sum": _f(t["x"]).sum(dim=1, keepdim=True)},
}


# Stated tolerances where the output type cannot hold the 1e-2 the others meet:
# FP8 attention rounds P and O to e4m3 (3 mantissa bits: up to 6.25% per value).
TOLERANCES = {"sdpa_fp8_causal": 6e-2}


def reference(case: str, t: Tensors) -> Tensors:
    return REFERENCES[case](t)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """‖a − e‖ / ‖e‖ over the specified elements; NaN in `actual` there fails."""
    actual, expected = actual.float(), expected.float()
    specified = ~torch.isnan(expected)
    a, e = actual[specified], expected[specified]
    unwritten = int(torch.isnan(a).sum())
    rel = float((a - e).norm() / e.norm().clamp_min(1e-30)) if unwritten == 0 else float("inf")
    return {"rel_err": rel, "nan_in_output": unwritten, "elements": int(specified.sum())}

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
POSITIVE = {"pointwise_binary_fp16": {"den"}, "batchnorm_inference_fp16": {"inv_variance"}}


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


PREPARE: dict[str, Callable[[Tensors], None]] = {
    "sdpa_backward_bf16": _prepare_sdpa_backward,
    "sdpa_padding_fp16": _prepare_padding,
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
    "layernorm_training_fp16": lambda t: _layernorm(t, training=True),
    "layernorm_inference_bf16": lambda t: _layernorm(t, training=False),
    "rmsnorm_training_bf16": lambda t: _rmsnorm(t, training=True),
    "rmsnorm_inference_fp16": lambda t: _rmsnorm(t, training=False),
    "batchnorm_inference_fp16": lambda t: {"y": (_f(t["x"]) - _f(t["mean"])) * _f(t["inv_variance"]) * _f(t["scale"]) + _f(t["bias"])},
    "pointwise_binary_fp16": lambda t: {"out": ((((_f(t["x"]) + _f(t["y"])) * _f(t["y"]) - _f(t["x"])) / _f(t["den"])) + _f(t["bias"])) * _f(t["scale"])},
    "pointwise_unary_fp16": lambda t: {"out": F.silu(torch.sigmoid(torch.tanh(F.gelu(torch.relu(_f(t["x"]))))))},
    "reduction_sum_fp32": lambda t: {"sum": _f(t["x"]).sum(dim=1, keepdim=True)},
}


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

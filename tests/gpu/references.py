"""torch references for every example in examples/, and their input rules.

`prepare(case, t, run)` fills inputs that must be consistent with others (sdpa
backward's o and stats, sequence lengths, ragged offsets); `reference(case, t,
run)` returns the expected outputs by tensor name, in float32, NaN where the
op leaves the value unspecified (padded query rows, packed tokens past the
last sequence). `run` executes the plan under test on other tensors: dropout's
references read the mask cuDNN's Philox generator drew through it (an
identity V, or an identity dO, turns the output into the dropped
probabilities), then check every element against torch with that mask.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Tensors = dict[str, torch.Tensor]
Run = Callable[[Tensors], None]


@dataclass(frozen=True)
class Measured:
    """A statistic of the run checked beside the outputs (dropout's drop rate)."""

    value: float
    expected: float
    tolerance: float  # relative


# Inputs that must be positive (denominators, inverse variances).
_SCALES = {"scale_a", "scale_b"}
POSITIVE = {
    "pointwise_binary_fp16": {"den"},
    "batchnorm_inference_fp16": {"inv_variance"},
    "matmul_fp8_scaled_bf16": _SCALES,
    "matmul_fp8_bias_gelu_amax_bf16": _SCALES,
    "matmul_fp8_bias_relu_fp16": _SCALES,
}


def _f(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _causal_mask(s_q: int, s_kv: int, device: torch.device) -> torch.Tensor:
    return torch.ones(s_q, s_kv, dtype=torch.bool, device=device).tril()


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
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
    lengths = (
        torch.linspace(1, max_kv, b).round().to(torch.int32).view(b, 1, 1, 1)
    )  # 1 .. max: a page boundary and a full table
    t["seq_len_kv"].copy_(lengths)


def _prepare_paged_chunk(t: Tensors) -> None:
    """Shuffled pages; 1..64 new query tokens per sequence, 64..1024 tokens in all."""
    _prepare_paged(t)
    b, s_q = t["q"].shape[0], t["q"].shape[2]
    max_kv = t["k_page_table"].shape[2] * t["k_cache"].shape[2]
    t["seq_len_q"].copy_(torch.linspace(1, s_q, b).round().to(torch.int32).view(b, 1, 1, 1))
    t["seq_len_kv"].copy_(torch.linspace(s_q, max_kv, b).round().to(torch.int32).view(b, 1, 1, 1))


def _sdpa_paged_chunk(t: Tensors) -> Tensors:
    """Each sequence's new tokens over its gathered pages; query j of lq sees
    the keys up to lkv - lq + j (bottom-right causal); padded rows unspecified."""
    q, kc, vc = _f(t["q"]), _f(t["k_cache"]), _f(t["v_cache"])
    b, h, d = q.shape[0], q.shape[1], q.shape[3]
    out = torch.full(q.shape, float("nan"), device=q.device)
    for i in range(b):
        lq, lkv = int(t["seq_len_q"][i]), int(t["seq_len_kv"][i])
        k_i = kc[t["k_page_table"][i, 0, :, 0].long()].permute(1, 0, 2, 3).reshape(h, -1, d)[:, :lkv]
        v_i = vc[t["v_page_table"][i, 0, :, 0].long()].permute(1, 0, 2, 3).reshape(h, -1, d)[:, :lkv]
        scores = torch.einsum("hqd,hkd->hqk", q[i, :, :lq], k_i) / math.sqrt(d)
        visible = torch.arange(lkv, device=q.device).view(1, lkv) <= (lkv - lq) + torch.arange(
            lq, device=q.device
        ).view(lq, 1)
        out[i, :, :lq] = torch.einsum(
            "hqk,hkd->hqd", torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1), v_i
        )
    return {"o": out}


def _prepare_unit_scales(t: Tensors) -> None:
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        t[name].fill_(1.0)


# ---- ragged (packed THD) sequences ------------------------------------------

RAGGED_LENGTHS = [512, 100, 37, 300]  # a full-length sequence, short ones, one odd; 949 tokens (backward bound: 1024)


def _prepare_ragged(t: Tensors) -> None:
    """Sequences back to back in the packed buffers; offsets in elements."""
    _, h, d = t["q"].shape
    starts = torch.tensor([0, *torch.tensor(RAGGED_LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    t["token_offsets"].copy_((starts * h * d).view(-1, 1, 1, 1))
    lengths = torch.tensor(RAGGED_LENGTHS, dtype=torch.int32).view(-1, 1, 1, 1)
    t["seq_len_q"].copy_(lengths)
    t["seq_len_kv"].copy_(lengths)


def _sequences() -> list[slice]:
    """Each sequence's tokens in the packed buffers."""
    starts = [0, *torch.tensor(RAGGED_LENGTHS).cumsum(0).tolist()]
    return [slice(a, b) for a, b in itertools.pairwise(starts)]


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    """One sequence's packed [tokens, h, d] slice as [1, h, tokens, d]."""
    return x.permute(1, 0, 2).unsqueeze(0)


def _packed(x: torch.Tensor) -> torch.Tensor:
    return x[0].permute(1, 0, 2)


def _sdpa_ragged(t: Tensors) -> Tensors:
    d = t["q"].shape[2]
    out = torch.full(t["o"].shape, float("nan"), device=t["q"].device)
    for seq in _sequences():
        out[seq] = _packed(
            _attention(_bhsd(t["q"][seq]), _bhsd(t["k"][seq]), _bhsd(t["v"][seq]), 1 / math.sqrt(d), causal=True)[0]
        )
    return {"o": out}


def _prepare_ragged_backward(t: Tensors) -> None:
    _prepare_ragged(t)
    d = t["q"].shape[2]
    for i, seq in enumerate(_sequences()):
        o, stats = _attention(_bhsd(t["q"][seq]), _bhsd(t["k"][seq]), _bhsd(t["v"][seq]), 1 / math.sqrt(d), causal=True)
        t["o"][seq] = _packed(o)
        t["stats"][i, :, : seq.stop - seq.start] = stats[0]


def _sdpa_backward_ragged(t: Tensors) -> Tensors:
    d = t["q"].shape[2]
    grads = {name: torch.full(t["q"].shape, float("nan"), device=t["q"].device) for name in ("dQ", "dK", "dV")}
    for seq in _sequences():
        q, k, v = (_bhsd(_f(t[n][seq])).requires_grad_(True) for n in ("q", "k", "v"))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(d))
        o.backward(_bhsd(_f(t["dO"][seq])))
        for name, x in (("dQ", q), ("dK", k), ("dV", v)):
            assert x.grad is not None
            grads[name][seq] = _packed(x.grad)
    return grads


# ---- dropout -----------------------------------------------------------------

DROPOUT_P = 0.1


def _dropout_mask_forward(t: Tensors, run: Run) -> torch.Tensor:
    """The kept (1) and dropped (0) scores of this seed and offset: with V the
    identity (s_kv = d), O is the dropped and rescaled probabilities."""
    b, h, s, d = t["v"].shape
    assert s == d, "the identity-V probe needs s_kv == d"
    probe = {name: x.clone() for name, x in t.items()}
    probe["v"] = torch.eye(s, device=t["v"].device, dtype=t["v"].dtype).expand(b, h, s, d).contiguous()
    run(probe)
    return (probe["o"].float() != 0).float()


def _dropout_mask_backward(t: Tensors, run: Run) -> torch.Tensor:
    """The same, read from the backward: with dO the identity (s_q = d),
    dV is the transposed dropped and rescaled probabilities."""
    b, h, s, d = t["dO"].shape
    assert s == d, "the identity-dO probe needs s_q == d"
    probe = {name: x.clone() for name, x in t.items()}
    probe["dO"] = torch.eye(s, device=t["dO"].device, dtype=t["dO"].dtype).expand(b, h, s, d).contiguous()
    run(probe)
    return (probe["dV"].float().transpose(-1, -2) != 0).float()


def _dropped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1) * mask / (1 - DROPOUT_P), v)


def _sdpa_dropout(t: Tensors, run: Run) -> dict[str, Any]:
    mask = _dropout_mask_forward(t, run)
    q, k, v = _f(t["q"]), _f(t["k"]), _f(t["v"])
    stats = torch.logsumexp(torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1]), dim=-1, keepdim=True)
    return {"o": _dropped_attention(q, k, v, mask), "stats": stats, **_drop_rate(mask)}


def _drop_rate(mask: torch.Tensor) -> dict[str, Measured]:
    """The fraction of scores dropped: p within 5% (262,144 draws; GPU run
    18 measured 0.0989 to 0.1027 over 14 executions, about 1% of p apart)."""
    return {"drop_rate": Measured(1 - float(mask.mean()), DROPOUT_P, 5e-2)}


def _prepare_backward_dropout(t: Tensors, run: Run) -> None:
    """o and stats from the forward with this seed and offset's mask."""
    q, k, v = _f(t["q"]), _f(t["k"]), _f(t["v"])
    t["stats"].copy_(
        torch.logsumexp(torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1]), dim=-1, keepdim=True)
    )
    t["o"].copy_(_dropped_attention(q, k, v, _dropout_mask_backward(t, run)))


def _sdpa_backward_dropout(t: Tensors, run: Run) -> dict[str, Any]:
    mask = _dropout_mask_backward(t, run)
    q, k, v = (_f(t[n]).requires_grad_(True) for n in ("q", "k", "v"))
    _dropped_attention(q, k, v, mask).backward(_f(t["dO"]))
    return {"dQ": q.grad, "dK": k.grad, "dV": v.grad, **_drop_rate(mask)}  # type: ignore[dict-item]


# ---- bias gradient -------------------------------------------------------------


def _prepare_backward_bias(t: Tensors) -> None:
    scores = torch.einsum("bhqd,bhkd->bhqk", _f(t["q"]), _f(t["k"])) * 0.125 + _f(t["bias"])
    t["stats"].copy_(torch.logsumexp(scores, dim=-1, keepdim=True))
    t["o"].copy_(torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1), _f(t["v"])))


def _sdpa_backward_bias(t: Tensors) -> Tensors:
    q, k, v, bias = (_f(t[n]).requires_grad_(True) for n in ("q", "k", "v", "bias"))
    _sdpa_with_bias(q, k, v, 0.125, bias, causal=False).backward(_f(t["dO"]))
    return {"dQ": q.grad, "dK": k.grad, "dV": v.grad, "dBias": bias.grad}  # type: ignore[dict-item]


def _prepare_fp8_paged(t: Tensors) -> None:
    _prepare_paged(t)
    _prepare_unit_scales(t)


def _sdpa_fp8_paged(t: Tensors) -> Tensors:
    o = _sdpa_paged({n: _f(x) if x.is_floating_point() else x for n, x in t.items()})["o"]
    return {"o": o, "amax_o": o.abs().max().view(1, 1, 1, 1)}


def _matmul_fp8_epilogue(t: Tensors, activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    return activation((_f(t["A"]) @ _f(t["B"])) * _f(t["scale_a"]) * _f(t["scale_b"]) + _f(t["bias"]))


def _matmul_fp8_gelu_amax(t: Tensors) -> Tensors:
    c = _matmul_fp8_epilogue(t, F.gelu)
    return {"C": c, "amax": c.abs().max().view(1, 1, 1)}


# ---- norms' backward, batchnorm, instancenorm, adaptive layernorm --------------
# Float64 inside; the saved statistics a backward reads are made consistent
# with its x by `prepare` (as a forward would have saved them), so that the
# closed forms below are the exact gradients.


def _d(t: torch.Tensor) -> torch.Tensor:
    return t.double()


def _stats(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and inverse standard deviation (biased variance + eps) over `dims`, kept."""
    x = _d(x)
    return x.mean(dim=dims, keepdim=True), torch.rsqrt(x.var(dim=dims, keepdim=True, unbiased=False) + eps)


def _prepare_saved_stats(dims: tuple[int, ...], eps: float, mean: bool = True) -> Callable[[Tensors], None]:
    """A backward's saved statistics of its x (what the training forward wrote)."""

    def prepare(t: Tensors) -> None:
        mu, inv = _stats(t["x"], dims, eps)
        if mean:
            t["mean"].copy_(mu.view(t["mean"].shape))
        else:  # RMSNorm: inv_variance is 1 / sqrt(mean(x^2) + eps)
            inv = torch.rsqrt(_d(t["x"]).pow(2).mean(dim=dims, keepdim=True) + eps)
        t["inv_variance"].copy_(inv.view(t["inv_variance"].shape))

    return prepare


def _norm_backward(t: Tensors, dims: tuple[int, ...], param_dims: tuple[int, ...], rms: bool = False) -> Tensors:
    """DX, DScale, DBias of y = xhat * scale (+ bias), the statistics over `dims`.

    xhat = (x - mean) * inv_std (x * inv_rms for RMSNorm) and g = dY * scale:
    DX = inv_std * (g - mean(g) - xhat * mean(g * xhat)) over `dims` (no mean(g) term for RMSNorm),
    DScale = sum(dY * xhat) and DBias = sum(dY) over `param_dims` (the axes scale is broadcast on)."""
    x, dy, scale, inv = _d(t["x"]), _d(t["dY"]), _d(t["scale"]), _d(t["inv_variance"])
    xhat = x * inv if rms else (x - _d(t["mean"])) * inv
    g = dy * scale
    centred = g - xhat * (g * xhat).mean(dim=dims, keepdim=True)
    dx = inv * (centred if rms else centred - g.mean(dim=dims, keepdim=True))
    dscale = (dy * xhat).sum(dim=param_dims, keepdim=True)
    return {"DX": dx.float(), "DScale": dscale.float(), "DBias": dy.sum(dim=param_dims, keepdim=True).float()}


BN_EPSILON, BN_MOMENTUM = 1e-3, 0.1


def _batchnorm_training(t: Tensors) -> Tensors:
    """Batch statistics over (N, H, W); Y = ReLU(xhat * scale + bias). The
    running variance is updated with the unbiased variance, as torch's
    batch_norm does (cuDNN's factor n/(n-1) is 1.00008 here, far inside the
    tolerance either way; the frontend's test does not compare them)."""
    x = _d(t["x"])
    mean, inv = _stats(x, (0, 2, 3), BN_EPSILON)
    y = torch.relu((x - mean) * inv * _d(t["scale"]) + _d(t["bias"]))
    count = x.numel() // x.shape[1]
    unbiased = x.var(dim=(0, 2, 3), keepdim=True, unbiased=False) * count / (count - 1)
    return {
        "y": y.float(),
        "mean": mean.float(),
        "inv_variance": inv.float(),
        "next_running_mean": ((1 - BN_MOMENTUM) * _d(t["running_mean"]) + BN_MOMENTUM * mean).float(),
        "next_running_var": ((1 - BN_MOMENTUM) * _d(t["running_var"]) + BN_MOMENTUM * unbiased).float(),
    }


def _instancenorm_training(t: Tensors) -> Tensors:
    x = _d(t["x"])
    mean, inv = _stats(x, (2, 3), 1e-5)
    return {
        "y": ((x - mean) * inv * _d(t["scale"]) + _d(t["bias"])).float(),
        "mean": mean.float(),
        "inv_variance": inv.float(),
    }


def _adalayernorm_training(t: Tensors) -> Tensors:
    """Layernorm over the last axis, then each sample's own scale and bias ([b, 1, d])."""
    x = _d(t["x"])
    mean, inv = _stats(x, (2,), 1e-3)
    return {
        "y": ((x - mean) * inv * _d(t["scale"]) + _d(t["bias"])).float(),
        "mean": mean.float(),
        "inv_variance": inv.float(),
    }


def _conv_genstats(t: Tensors) -> Tensors:
    """Y = conv(ReLU(x * scale + bias)) (the prologue's result in half, the
    graph's intermediate type); SUM and SQ_SUM of Y per output channel."""
    prologue = torch.relu(_f(t["x"]) * _f(t["scale"]) + _f(t["bias"])).half().float()
    y = F.conv2d(prologue, _f(t["w"]), padding=1)
    return {"y": y, "sum": y.sum(dim=(0, 2, 3), keepdim=True), "sq_sum": y.pow(2).sum(dim=(0, 2, 3), keepdim=True)}


def _concatenate_in_place(t: Tensors) -> Tensors:
    """Channels 0..k-1: the convolution; k..2k-1 are y0's, in place in the
    output's buffer (in_place_index 1): not the op's to write, unspecified here."""
    y = F.conv2d(_f(t["x"]), _f(t["w"]))
    return {"y1": torch.cat([y, torch.full_like(y, float("nan"))], dim=1)}


def _pointwise_select(t: Tensors) -> Tensors:
    """where(row >= col or x > t, x, y) with row, col the indices on axes 1 and 2."""
    x = _f(t["x"])
    rows = torch.arange(x.shape[1], device=x.device).view(1, -1, 1)
    cols = torch.arange(x.shape[2], device=x.device).view(1, 1, -1)
    return {"out": torch.where((rows >= cols) | (x > _f(t["t"])), x, _f(t["y"]))}


MOE_FIRST_TOKEN = [0, 100, 230, 400]  # uneven groups of 100, 130, 170 and 112 tokens (512 in all)


def _prepare_moe(t: Tensors) -> None:
    t["first_token_offset"].copy_(torch.tensor(MOE_FIRST_TOKEN, dtype=torch.int32).view(-1, 1, 1))


def _moe_grouped_matmul(t: Tensors) -> Tensors:
    """Expert e's tokens (rows first_token_offset[e] up to the next expert's, or the end) times its weight [hidden, n]."""
    token, weight = _f(t["token"]), _f(t["weight"])
    out = torch.empty(1, token.shape[1], weight.shape[2], device=token.device)
    bounds = [*MOE_FIRST_TOKEN, token.shape[1]]
    for e, (start, end) in enumerate(itertools.pairwise(bounds)):
        out[0, start:end] = token[0, start:end] @ weight[e]
    return {"out": out}


PREPARE: dict[str, Callable[[Tensors], None]] = {
    "sdpa_fp8_causal": _prepare_unit_scales,
    "sdpa_fp8_paged_decode": _prepare_fp8_paged,
    "sdpa_backward_bf16": _prepare_sdpa_backward,
    "sdpa_padding_fp16": _prepare_padding,
    "sdpa_paged_decode_bf16": _prepare_paged,
    "sdpa_paged_chunk_causal_bf16": _prepare_paged_chunk,
    "sdpa_ragged_prefill_bf16": _prepare_ragged,
    "sdpa_backward_ragged_bf16": _prepare_ragged_backward,
    "sdpa_backward_bias_bf16": _prepare_backward_bias,
    "layernorm_backward_fp16": _prepare_saved_stats((1, 2, 3), 1e-5),
    "rmsnorm_backward_bf16": _prepare_saved_stats((1, 2, 3), 1e-5, mean=False),
    "batchnorm_backward_fp16": _prepare_saved_stats((0, 2, 3), BN_EPSILON),
    "adalayernorm_backward_fp16": _prepare_saved_stats((2,), 1e-3),
    "moe_grouped_matmul_bf16": _prepare_moe,
}
PREPARE_WITH_PLAN: dict[str, Callable[[Tensors, Run], None]] = {
    "sdpa_backward_dropout_bf16": _prepare_backward_dropout,
}


def prepare(case: str, t: Tensors, run: Run) -> None:
    if case in PREPARE:
        PREPARE[case](t)
    if case in PREPARE_WITH_PLAN:
        PREPARE_WITH_PLAN[case](t, run)


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


def _sdpa_with_bias(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, bias: torch.Tensor, causal: bool
) -> torch.Tensor:
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
    "conv_dgrad_fp16": lambda t: {
        "dx": torch.nn.grad.conv2d_input((16, 32, 56, 56), _f(t["w"]), _f(t["dy"]), stride=2, padding=1)
    },
    "conv_wgrad_fp16": lambda t: {
        "dw": torch.nn.grad.conv2d_weight(_f(t["x"]), (64, 32, 3, 3), _f(t["dy"]), stride=2, padding=1)
    },
    "sdpa_causal_fp16": lambda t: {"o": _attention(t["q"], t["k"], t["v"], 0.125, causal=True)[0]},
    "sdpa_stats_bf16": lambda t: dict(
        zip(("o", "stats"), _attention(t["q"], t["k"], t["v"], 1 / math.sqrt(128), causal=True), strict=True)
    ),
    "sdpa_padding_fp16": _sdpa_padding,
    "sdpa_backward_bf16": _sdpa_backward,
    "sdpa_paged_decode_bf16": _sdpa_paged,
    "sdpa_bias_bf16": lambda t: {"o": _sdpa_with_bias(t["q"], t["k"], t["v"], 0.125, _f(t["bias"]), causal=False)},
    "sdpa_alibi_bf16": lambda t: {
        "o": _sdpa_with_bias(t["q"], t["k"], t["v"], 0.125, _alibi_bias(8, 512, t["q"].device), causal=True)
    },
    # O and amax(O) against attention over the dequantized (unit-scale) inputs.
    "sdpa_fp8_causal": _sdpa_fp8,
    "matmul_fp8_scaled_bf16": lambda t: {"C": (_f(t["A"]) @ _f(t["B"])) * _f(t["scale_a"]) * _f(t["scale_b"])},
    "sdpa_ragged_prefill_bf16": _sdpa_ragged,
    "sdpa_backward_ragged_bf16": _sdpa_backward_ragged,
    "sdpa_backward_bias_bf16": _sdpa_backward_bias,
    "sdpa_fp8_paged_decode": _sdpa_fp8_paged,
    "sdpa_paged_chunk_causal_bf16": _sdpa_paged_chunk,
    "matmul_fp8_bias_gelu_amax_bf16": _matmul_fp8_gelu_amax,
    "matmul_fp8_bias_relu_fp16": lambda t: {"C": _matmul_fp8_epilogue(t, torch.relu)},
    "layernorm_training_fp16": lambda t: _layernorm(t, training=True),
    "layernorm_inference_bf16": lambda t: _layernorm(t, training=False),
    "rmsnorm_training_bf16": lambda t: _rmsnorm(t, training=True),
    "rmsnorm_inference_fp16": lambda t: _rmsnorm(t, training=False),
    "batchnorm_inference_fp16": lambda t: {
        "y": (_f(t["x"]) - _f(t["mean"])) * _f(t["inv_variance"]) * _f(t["scale"]) + _f(t["bias"])
    },
    "pointwise_binary_fp16": lambda t: {
        "out": ((((_f(t["x"]) + _f(t["y"])) * _f(t["y"]) - _f(t["x"])) / _f(t["den"])) + _f(t["bias"])) * _f(t["scale"])
    },
    "pointwise_unary_fp16": lambda t: {"out": F.silu(torch.sigmoid(torch.tanh(F.gelu(torch.relu(_f(t["x"]))))))},
    "reduction_sum_fp32": lambda t: {"sum": _f(t["x"]).sum(dim=1, keepdim=True)},
    "layernorm_backward_fp16": lambda t: _norm_backward(t, dims=(1, 2, 3), param_dims=(0,)),
    "rmsnorm_backward_bf16": lambda t: _norm_backward(t, dims=(1, 2, 3), param_dims=(0,), rms=True),
    "batchnorm_training_fp16": _batchnorm_training,
    "batchnorm_backward_fp16": lambda t: _norm_backward(t, dims=(0, 2, 3), param_dims=(0, 2, 3)),
    "instancenorm_training_fp16": _instancenorm_training,
    "adalayernorm_training_fp16": _adalayernorm_training,
    "adalayernorm_backward_fp16": lambda t: _norm_backward(t, dims=(2,), param_dims=(1,)),
    "conv_genstats_fp16": _conv_genstats,
    "slice_matmul_bf16": lambda t: {"C": _f(t["A"])[8:, 16:, :] @ _f(t["B"])[8:, :, 32:]},
    "concatenate_fp16": _concatenate_in_place,
    "reshape_bf16": lambda t: {"C": _f(t["A"]) @ _f(t["K"]).transpose(1, 2)},
    "pointwise_select_fp16": _pointwise_select,
    "transpose_fp32": lambda t: {"y": _f(t["x"]).permute(2, 0, 1)},
    "apply_rope_fp16": lambda t: {
        "y1": _f(t["x1"]) * t["cos1"] - _f(t["x2"]) * t["sin1"],
        "y2": _f(t["x2"]) * t["cos2"] + _f(t["x1"]) * t["sin2"],
    },
    "moe_grouped_matmul_bf16": _moe_grouped_matmul,
}


# Stated tolerances where the output type cannot hold the 1e-2 the others meet:
# FP8 attention rounds P and O to e4m3 (3 mantissa bits: up to 6.25% per value).
TOLERANCES = {"sdpa_fp8_causal": 6e-2, "sdpa_fp8_paged_decode": 6e-2}
REFERENCES_WITH_PLAN: dict[str, Callable[[Tensors, Run], dict[str, Any]]] = {
    "sdpa_dropout_bf16": _sdpa_dropout,
    "sdpa_backward_dropout_bf16": _sdpa_backward_dropout,
}


def reference(case: str, t: Tensors, run: Run) -> dict[str, torch.Tensor | Measured]:
    if case in REFERENCES_WITH_PLAN:
        return REFERENCES_WITH_PLAN[case](t, run)
    return REFERENCES[case](t)


def check_measured(m: Measured) -> dict[str, Any]:
    return {
        "rel_err": abs(m.value - m.expected) / m.expected,
        "measured": m.value,
        "expected": m.expected,
        "nan_in_output": 0,
        "elements": 1,
        "tolerance": m.tolerance,
    }


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """‖a − e‖ / ‖e‖ over the specified elements; NaN in `actual` there fails."""
    actual, expected = actual.float(), expected.float()
    specified = ~torch.isnan(expected)
    a, e = actual[specified], expected[specified]
    unwritten = int(torch.isnan(a).sum())
    rel = float((a - e).norm() / e.norm().clamp_min(1e-30)) if unwritten == 0 else float("inf")
    return {"rel_err": rel, "nan_in_output": unwritten, "elements": int(specified.sum())}

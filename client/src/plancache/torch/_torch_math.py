"""torch's own forward and backward for plancache's operators: what runs a geometry plancache does not serve.

An operator's outputs have one layout whatever runs it (its fake
implementation says it: plancache.torch._ops), and a training forward's
saved outputs have one meaning: what a served forward writes (a norm's row
mean and inverse deviation, attention's log-sum-exp, a pre-activation). So
torch's forward here writes them too, and torch's backward here reads them:
a forward torch ran may meet a backward a plan runs (its plans came back
between the two) and the other way round, and both give the same gradients.

The backward is written out (torch's backward kernels, or the math in
float32) because an operator runs below autograd: torch.autograd.grad
cannot be called from inside one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def rows_of(x: Tensor, normalized_shape: Sequence[int]) -> Any:
    """The rows a norm normalizes: x's elements over one row's (a SymInt where the size is traced dynamic)."""
    return x.numel() // math.prod(normalized_shape)


def stats_dtype(x: Tensor) -> torch.dtype:
    """What saved statistics and float math are kept in: float32 (float64 for a float64 input)."""
    return torch.promote_types(x.dtype, torch.float32)


def acc(t: Tensor) -> Tensor:
    """`t` in the type its math runs in (float32; float64 stays)."""
    return t.to(stats_dtype(t))


def in_layout_of(t: Tensor, ref: Tensor) -> Tensor:
    """`t` in the layout torch.empty_like(ref) has (ref's strides where they
    are dense, contiguous where not): `t` itself, or a copy."""
    if t.stride() == ref.stride():
        return t
    like = torch.empty_like(ref, dtype=t.dtype)
    return t if like.stride() == t.stride() else like.copy_(t)


def contiguous_in(t: Tensor, memory_format: torch.memory_format) -> Tensor:
    return t if t.is_contiguous(memory_format=memory_format) else t.contiguous(memory_format=memory_format)


# ---- norms ----------------------------------------------------------------------------------------


def layer_norm_train(
    x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """out, the rows' mean and inverse deviation (float32 [rows, 1, 1, 1]), as cuDNN's training forward writes them."""
    out, mean, rstd = torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
    rows = rows_of(x, normalized_shape)
    return (
        in_layout_of(out, x),
        mean.to(stats_dtype(x)).reshape(rows, 1, 1, 1).contiguous(),
        rstd.to(stats_dtype(x)).reshape(rows, 1, 1, 1).contiguous(),
    )


def layer_norm_backward(
    grad: Tensor,
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """torch's layer_norm backward kernel, from the saved statistics."""
    stats = (*x.shape[: x.dim() - len(normalized_shape)], *(1,) * len(normalized_shape))
    mask = [needs[0], weight is not None and needs[1], bias is not None and needs[2]]
    # The statistics' type torch's own forward gives: float32 on CUDA (float64 for float64), the input's on the CPU.
    dtype = x.dtype if x.device.type == "cpu" else stats_dtype(x)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        grad.contiguous(),
        x,
        list(normalized_shape),
        mean.view(stats).to(dtype),
        rstd.view(stats).to(dtype),
        weight,
        bias,
        mask,
    )
    return dx, dw, db


def rms_eps(x: Tensor, eps: float | None) -> float:
    """rms_norm's eps; None is torch.finfo(x.dtype).eps, as torch documents it."""
    return torch.finfo(x.dtype).eps if eps is None else eps


def rms_norm_train(
    x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None
) -> tuple[Tensor, Tensor]:
    """out and the rows' inverse root mean square (float32 [rows, 1, 1, 1])."""
    out = F.rms_norm(x, list(normalized_shape), weight, eps)
    eps = rms_eps(x, eps)
    rows = rows_of(x, normalized_shape)
    rstd = torch.rsqrt(acc(x).reshape(rows, -1).pow(2).mean(1) + eps)
    return in_layout_of(out, x), rstd.reshape(rows, 1, 1, 1)


def rms_norm_backward(
    grad: Tensor, x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, rstd: Tensor, needs: Sequence[bool]
) -> tuple[Tensor | None, Tensor | None]:
    """dX = r (g' - x̂ mean(g' x̂)), g' = g w; dW = sum over rows of g x̂ (float32, then the operands' types)."""
    rows = rows_of(x, normalized_shape)
    r = rstd.reshape(rows, 1)
    x_hat = acc(x).reshape(rows, -1) * r
    g = acc(grad).reshape(rows, -1)
    g_scaled = g * acc(weight).reshape(1, -1) if weight is not None else g
    dx = None
    if needs[0]:
        dx = (r * (g_scaled - x_hat * (g_scaled * x_hat).mean(1, keepdim=True))).to(x.dtype).reshape(x.shape)
    dw = None
    if weight is not None and needs[1]:
        dw = (g * x_hat).sum(0).to(weight.dtype).reshape(weight.shape)
    return dx, dw


# ---- linear ---------------------------------------------------------------------------------------

ACTIVATIONS = ("relu", "gelu", "silu")


def saves_pre_activation(activation: str | None) -> bool:
    """Whether a training forward writes the pre-activation (GELU's and SiLU's backward read it; ReLU's its output)."""
    return activation in ("gelu", "silu")


def activate(y: Tensor, activation: str | None) -> Tensor:
    if activation is None:
        return y
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "silu":
        return F.silu(y)
    raise ValueError(f"linear: activation {activation!r} is not one of None, {', '.join(map(repr, ACTIVATIONS))}")


def linear_train(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None, train: bool) -> list[Tensor]:
    """The result (and the pre-activation a GELU's or SiLU's training forward saves), row-major."""
    pre = F.linear(x, weight, bias)
    out = activate(pre, activation).contiguous()
    return [out, pre.contiguous()] if train and saves_pre_activation(activation) else [out]


def activation_backward(grad: Tensor, saved: Tensor, activation: str) -> Tensor:
    """dZ from dY: a ReLU's from its output, a GELU's (erf) or SiLU's from the pre-activation; float32 math."""
    g, z = acc(grad), acc(saved)
    if activation == "relu":
        return (g * (z > 0)).to(grad.dtype)
    if activation == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        return (g * (cdf + z * pdf)).to(grad.dtype)
    s = torch.sigmoid(z)
    return (g * (s * (1.0 + z * (1.0 - s)))).to(grad.dtype)


def linear_backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    activation: str | None,
    saved: Sequence[Tensor],
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """dZ = act'(Z) dY, dX = dZ W, dW = dZᵀ X, dBias = the rows' sum of dZ."""
    dz = grad
    if activation is not None:
        dz = activation_backward(grad, saved[1] if saves_pre_activation(activation) else saved[0], activation)
    n, k = weight.shape
    rows = dz.reshape(-1, n)
    dx = (rows @ weight).reshape(x.shape) if needs[0] else None
    dw = (rows.t() @ x.reshape(-1, k)).to(weight.dtype) if needs[1] else None
    db = rows.sum(0, dtype=stats_dtype(rows)).to(bias.dtype) if bias is not None and needs[2] else None
    return dx, dw, db


# ---- attention ------------------------------------------------------------------------------------


def _heads_like(t: Tensor, heads: int) -> Tensor:
    """k or v repeated to the query's heads (grouped-query attention)."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def _scores(
    q: Tensor, k: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None
) -> tuple[Tensor, float]:
    """The scaled, masked attention scores in float32 (float64 for float64) [b, h, s_q, s_kv]."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (acc(q) @ acc(_heads_like(k, q.shape[1])).transpose(-2, -1)) * s
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + acc(attn_mask)
        )
    if is_causal:
        s_q, s_kv = scores.shape[-2:]
        causal = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device).tril()  # torch's: from the top left
        scores = scores.masked_fill(~causal, float("-inf"))
    return scores, s


def sdpa_train(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    train: bool,
) -> list[Tensor]:
    """O (row-major [b, h, s_q, d_v]) and, training, the rows' log-sum-exp of
    the scaled scores (float32 [b, h, s_q, 1]: what cuDNN's forward writes as its statistics)."""
    gqa = {"enable_gqa": True} if enable_gqa else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask, 0.0, is_causal, scale=scale, **gqa).contiguous()
    if not train:
        return [out]
    scores, _ = _scores(q, k, attn_mask, is_causal, scale)
    return [out, torch.logsumexp(scores, dim=-1, keepdim=True).contiguous()]


def sdpa_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    out: Tensor,
    lse: Tensor,
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Attention's backward in float32 from the saved O and log-sum-exp:
    P = exp(S - lse), dV = Pᵀ dO, dS = P (dO Vᵀ - rowsum(dO O)), dQ = s dS K, dK = s dSᵀ Q
    (summed over a group's heads for grouped-query attention)."""
    heads = q.shape[1]
    scores, s = _scores(q, k, attn_mask, is_causal, scale)
    p = torch.exp(scores - acc(lse))
    d_o = acc(grad)
    v_full = acc(_heads_like(v, heads))
    d_s = p * (d_o @ v_full.transpose(-2, -1) - (d_o * acc(out)).sum(-1, keepdim=True))

    def grouped(t: Tensor, like: Tensor) -> Tensor:
        if like.shape[1] != heads:
            t = t.reshape(t.shape[0], like.shape[1], heads // like.shape[1], *t.shape[2:]).sum(2)
        return in_layout_of(t.to(like.dtype), like)

    dq = in_layout_of((s * (d_s @ acc(_heads_like(k, heads)))).to(q.dtype), q) if needs[0] else None
    dk = grouped(s * (d_s.transpose(-2, -1) @ acc(q)), k) if needs[1] else None
    dv = grouped(p.transpose(-2, -1) @ d_o, v) if needs[2] else None
    return dq, dk, dv


# ---- conv2d ---------------------------------------------------------------------------------------


def conv_memory_format(x: Tensor, weight: Tensor) -> torch.memory_format:
    """channels-last when an operand is (as torch's convolution chooses), contiguous otherwise."""
    for t in (x, weight):
        if not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
            return torch.channels_last
    return torch.contiguous_format


def conv2d_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    relu: bool,
) -> Tensor:
    y = F.conv2d(x, weight, bias, list(stride), list(padding), list(dilation), groups)
    return contiguous_in(torch.relu(y) if relu else y, conv_memory_format(x, weight))


def conv2d_backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    relu: bool,
    out: Tensor,
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """torch's convolution backward kernel (a ReLU's backward first, from the output)."""
    dy = activation_backward(grad, out, "relu") if relu else grad
    mask = [needs[0], needs[1], bias is not None and needs[2]]
    dx, dw, db = torch.ops.aten.convolution_backward(
        dy,
        x,
        weight,
        None if bias is None else list(bias.shape),
        list(stride),
        list(padding),
        list(dilation),
        False,
        [0, 0],
        groups,
        mask,
    )
    return (
        None if dx is None else in_layout_of(dx, x),
        None if dw is None else in_layout_of(dw, weight),
        db,
    )


def batch_norm_train(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    momentum: float,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torch's training batch norm, functional: the result, the batch's mean and inverse deviation per channel
    (what cuDNN's batchnorm writes), and the next running mean and variance (unbiased), the arguments
    untouched."""
    out, mean, inv, next_mean, next_var = torch.ops.aten._native_batch_norm_legit_functional(
        x, weight, bias, running_mean, running_var, True, momentum, eps
    )
    dtype = stats_dtype(x)
    return in_layout_of(out, x), mean.to(dtype), inv.to(dtype), next_mean, next_var


def batch_norm_backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    inv_variance: Tensor,
    eps: float,
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """torch's batch norm backward kernel, from the batch's saved mean and inverse deviation."""
    mask = [needs[0], weight is not None and needs[1], bias is not None and needs[2]]
    dx, dw, db = torch.ops.aten.native_batch_norm_backward(
        grad, x, weight, None, None, mean, inv_variance, True, eps, mask
    )
    return (
        None if dx is None else in_layout_of(dx, x),
        None if dw is None or weight is None else dw.to(weight.dtype),
        None if db is None or bias is None else db.to(bias.dtype),
    )

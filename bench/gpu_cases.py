"""The GPU benchmark's cases: a spec for plancache and the same computation
through torch, on the same tensors.

Each case builds its GraphSpec and, given the bound tensors by name, a
zero-argument torch callable doing the same work (its own outputs, so both
can be timed side by side).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from examples.generate import nhwc
from plancache import GraphSpec

TorchFactory = Callable[[dict[str, object]], Callable[[], object]]


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    spec: Callable[[], GraphSpec]
    torch_fn: TorchFactory


def _matmul(name: str, b: int, m: int, k: int, n: int, dtype: str, epilogue: str = "") -> Case:
    def spec() -> GraphSpec:
        g = GraphSpec(name=name, io_data_type=dtype)
        a = g.tensor([b, m, k], name="A", uid=1)
        w = g.tensor([b, k, n], name="B", uid=2)
        c = g.matmul(a, w)
        if epilogue == "bias_gelu":
            c = g.gelu(g.bias(c, g.tensor([1, 1, n], name="bias", uid=4)))
        c.set_output(True).set_name("C").set_uid(3)
        return g

    def torch_fn(t: dict[str, object]) -> Callable[[], object]:
        import torch
        import torch.nn.functional as F

        a, w = t["A"], t["B"]
        if epilogue == "bias_gelu":
            bias = t["bias"]
            return lambda: F.gelu(torch.matmul(a, w) + bias)  # type: ignore[operator]
        return lambda: torch.matmul(a, w)  # type: ignore[arg-type]

    return Case(name, "matmul", spec, torch_fn)


def _sdpa(name: str, b: int, h: int, s: int, d: int, dtype: str, backward: bool = False) -> Case:
    scale = 1 / math.sqrt(d)

    def spec() -> GraphSpec:
        g = GraphSpec(name=name, io_data_type=dtype)
        q, k, v = (g.tensor([b, h, s, d], name=n, uid=u) for n, u in (("q", 11), ("k", 12), ("v", 13)))
        if not backward:
            o, _ = g.sdpa(q, k, v, attn_scale=scale, use_causal_mask=True)
            assert o is not None
            o.set_output(True).set_name("o").set_uid(14)
            return g
        o = g.tensor([b, h, s, d], name="o", uid=14)
        d_o = g.tensor([b, h, s, d], name="dO", uid=15)
        stats = g.tensor([b, h, s, 1], name="stats", uid=16, data_type="float")
        grads = g.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=scale, use_causal_mask=True)
        for t, n, u in zip(grads, ("dQ", "dK", "dV"), (21, 22, 23), strict=True):
            assert t is not None
            t.set_output(True).set_name(n).set_uid(u)
        return g

    def torch_fn(t: dict[str, object]) -> Callable[[], object]:
        import torch
        import torch.nn.functional as F

        q, k, v = (t[n] for n in ("q", "k", "v"))
        if not backward:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # type: ignore[arg-type]
        qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))  # type: ignore[attr-defined]
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scale)
        d_o = t["dO"]
        return lambda: torch.autograd.grad(out, (qg, kg, vg), d_o, retain_graph=True)

    return Case(name, "sdpa_backward" if backward else "sdpa", spec, torch_fn)


def _conv(name: str, n: int, c: int, hw: int, k: int, r: int) -> Case:
    pad = r // 2

    def spec() -> GraphSpec:
        g = GraphSpec(name=name, io_data_type="half")
        x = g.tensor([n, c, hw, hw], nhwc(n, c, hw, hw), name="x", uid=1)
        w = g.tensor([k, c, r, r], nhwc(k, c, r, r), name="w", uid=2)
        bias = g.tensor([1, k, 1, 1], name="bias", uid=3)
        y = g.relu(g.bias(g.conv_fprop(x, w, padding=[pad, pad]), bias))
        y.set_output(True).set_name("y").set_uid(4).set_stride(nhwc(n, k, hw, hw))
        return g

    def torch_fn(t: dict[str, object]) -> Callable[[], object]:
        import torch
        import torch.nn.functional as F

        x, w, bias = t["x"], t["w"], t["bias"]
        return lambda: torch.relu(F.conv2d(x, w, padding=pad) + bias)  # type: ignore[arg-type,operator]

    return Case(name, "conv", spec, torch_fn)


def _norm(name: str, kind: str, rows: int, hidden: int) -> Case:
    def spec() -> GraphSpec:
        g = GraphSpec(name=name, io_data_type="bfloat16")
        x = g.tensor([rows, hidden, 1, 1], name="x", uid=1)
        scale = g.tensor([1, hidden, 1, 1], name="scale", uid=2)
        eps = g.scalar(1e-5, name="epsilon", uid=4)
        if kind == "layernorm":
            bias = g.tensor([1, hidden, 1, 1], name="bias", uid=3)
            y, _, _ = g.layernorm(x, scale, bias, eps, norm_forward_phase="INFERENCE")
        else:
            y, _ = g.rmsnorm(x, scale, eps, norm_forward_phase="INFERENCE")
        assert y is not None
        y.set_output(True).set_name("y").set_uid(5)
        return g

    def torch_fn(t: dict[str, object]) -> Callable[[], object]:
        import torch.nn.functional as F

        x = t["x"].view(rows, hidden)  # type: ignore[attr-defined]
        weight = t["scale"].view(hidden)  # type: ignore[attr-defined]
        if kind == "layernorm":
            bias = t["bias"].view(hidden)  # type: ignore[attr-defined]
            return lambda: F.layer_norm(x, (hidden,), weight, bias, 1e-5)
        return lambda: F.rms_norm(x, (hidden,), weight, 1e-5)

    return Case(name, kind, spec, torch_fn)


CASES: dict[str, Case] = {
    c.name: c
    for c in (
        _matmul("mm_4096_fp16", 1, 4096, 4096, 4096, "half"),
        _matmul("mm_4096_bf16", 1, 4096, 4096, 4096, "bfloat16"),
        _matmul("mm_8192x1024x4096_bf16", 1, 8192, 4096, 1024, "bfloat16"),
        _matmul("bmm_heads_64x1024x128x1024_fp16", 64, 1024, 128, 1024, "half"),
        _matmul("mm_bias_gelu_4096_fp16", 1, 4096, 4096, 4096, "half", epilogue="bias_gelu"),
        _sdpa("sdpa_fwd_b4h16s1k_d64_fp16", 4, 16, 1024, 64, "half"),
        _sdpa("sdpa_fwd_b2h16s4k_d128_bf16", 2, 16, 4096, 128, "bfloat16"),
        _sdpa("sdpa_fwd_b1h16s8k_d128_bf16", 1, 16, 8192, 128, "bfloat16"),
        _sdpa("sdpa_bwd_b4h16s1k_d64_fp16", 4, 16, 1024, 64, "half", backward=True),
        _sdpa("sdpa_bwd_b2h16s4k_d128_bf16", 2, 16, 4096, 128, "bfloat16", backward=True),
        _sdpa("sdpa_bwd_b1h16s8k_d128_bf16", 1, 16, 8192, 128, "bfloat16", backward=True),
        _conv("conv_r50_3x3_64_56_n32", 32, 64, 56, 64, 3),
        _conv("conv_r50_1x1_256to64_56_n32", 32, 256, 56, 64, 1),
        _conv("conv_r50_3x3_128_28_n32", 32, 128, 28, 128, 3),
        _conv("conv_r50_3x3_256_14_n32", 32, 256, 14, 256, 3),
        _conv("conv_r50_3x3_512_7_n32", 32, 512, 7, 512, 3),
        _norm("layernorm_8192x4096_bf16", "layernorm", 8192, 4096),
        _norm("rmsnorm_8192x4096_bf16", "rmsnorm", 8192, 4096),
    )
}

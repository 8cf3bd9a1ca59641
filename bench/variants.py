"""Benchmark rows for the attention and precision variants (issue 16), on one GPU.

Each case is built through plancache's compiler in this process (autotuned,
the plan a fleet node would fetch) and timed from CUDA-graph replays (GPU
time, median of 5 interleaved rounds) against the best torch path on the
same data:

- paged decode step: batch 64, one query token, KV up to 4096 tokens in
  64-token pages (bf16, 32 heads, d 128), every sequence at full length.
  torch has no paged attention: its paths are gathering the pages into a
  contiguous cache then SDPA (what a torch user runs), and SDPA over an
  already contiguous cache (a floor that ignores paging);
- the same decode step in FP8 (e4m3 query and pages, unit scales, e4m3 O).
  torch has no FP8 attention: its path dequantizes the pages to bf16,
  gathers and runs SDPA. cuDNN 9.19 refuses FP8 decode on Hopper (GPU run
  18): the row then records the refusal;
- packed prefill: 8 sequences of mixed lengths, 16,384 tokens in one THD
  buffer (bf16, 32 heads, d 128, causal) through ragged offsets, against
  torch's varlen flash attention on the same packed buffers and against SDPA
  per sequence;
- FP8 matmul 4096^3 (e4m3 in, per-tensor scales, bf16 out) against
  torch._scaled_mm.

    python bench/variants.py --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402


def _paged_step(g: Any, b: int, h: int, d: int, page: int, max_kv: int) -> tuple[list[Any], dict[str, Any]]:
    """A decode step's q and page pools, and the paged-cache keywords (tables, lengths)."""
    pages = b * max_kv // page
    q = g.tensor([b, h, 1, d], name="q", uid=1)
    k = g.tensor([pages, h, page, d], name="k_cache", uid=2)
    v = g.tensor([pages, h, page, d], name="v_cache", uid=3)
    tables = [
        g.tensor([b, 1, max_kv // page, 1], name=n, uid=u, data_type="int32")
        for n, u in (("k_page_table", 4), ("v_page_table", 5))
    ]
    lengths = [
        g.tensor([b, 1, 1, 1], name=n, uid=u, data_type="int32") for n, u in (("seq_len_q", 6), ("seq_len_kv", 7))
    ]
    paging = {
        "attn_scale": 1 / math.sqrt(d),
        "use_padding_mask": True,
        "seq_len_q": lengths[0],
        "seq_len_kv": lengths[1],
        "paged_attention_k_table": tables[0],
        "paged_attention_v_table": tables[1],
        "paged_attention_max_seq_len_kv": max_kv,
    }
    return [q, k, v], paging


def paged_decode_spec(b: int, h: int, d: int, page: int, max_kv: int) -> Any:
    from plancache import GraphSpec

    g = GraphSpec(name="paged_decode", io_data_type="bfloat16")
    qkv, paging = _paged_step(g, b, h, d, page, max_kv)
    o, _ = g.sdpa(*qkv, **paging)
    o.set_output(True).set_name("o").set_uid(8)
    return g


def fp8_paged_decode_spec(b: int, h: int, d: int, page: int, max_kv: int) -> Any:
    from plancache import GraphSpec

    g = GraphSpec(name="fp8_paged_decode", io_data_type="fp8_e4m3")
    qkv, paging = _paged_step(g, b, h, d, page, max_kv)
    scales = {n: g.tensor([1, 1, 1, 1], name=n, uid=20 + i, data_type="float") for i, n in enumerate(FP8_SCALES)}
    o, _, amax_s, amax_o = g.sdpa_fp8(*qkv, **paging, **scales)
    o.set_output(True).set_name("o").set_uid(8)
    amax_s.set_output(True).set_name("amax_s").set_uid(9).set_data_type("float")
    amax_o.set_output(True).set_name("amax_o").set_uid(10).set_data_type("float")
    return g


CASE_LABELS = {"fp8_paged_case": "paged decode b64 h32 d128, 4k KV in 64-token pages, FP8 e4m3 (O e4m3)"}
FP8_SCALES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
PREFILL_LENGTHS = [4096, 2048, 3000, 1500, 800, 2500, 1200, 1240]  # 16,384 tokens


def packed_prefill_spec(lengths: list[int], h: int, d: int) -> Any:
    from plancache import GraphSpec

    g = GraphSpec(name="packed_prefill", io_data_type="bfloat16")
    b, s = len(lengths), max(lengths)
    thd = [s * h * d, d, h * d, 1]
    offsets = g.tensor([b + 1, 1, 1, 1], name="token_offsets", uid=9, data_type="int32")
    q, k, v = (
        g.tensor([b, h, s, d], thd, name=n, uid=u, ragged_offset=offsets) for n, u in (("q", 1), ("k", 2), ("v", 3))
    )
    sq = g.tensor([b, 1, 1, 1], name="seq_len_q", uid=6, data_type="int32")
    skv = g.tensor([b, 1, 1, 1], name="seq_len_kv", uid=7, data_type="int32")
    o, _ = g.sdpa(
        q, k, v, attn_scale=1 / math.sqrt(d), use_causal_mask=True, use_padding_mask=True, seq_len_q=sq, seq_len_kv=skv
    )
    o.set_output(True).set_name("o").set_uid(8).set_stride(thd).set_ragged_offset(offsets)
    return g


def fp8_matmul_spec(n: int) -> Any:
    from plancache import GraphSpec

    g = GraphSpec(name="fp8_matmul", io_data_type="bfloat16")
    a = g.tensor([1, n, n], name="A", uid=1, data_type="fp8_e4m3")
    b = g.tensor([1, n, n], name="B", uid=2, data_type="fp8_e4m3", stride=[n * n, 1, n])
    sa = g.tensor([1, 1, 1], name="scale_a", uid=3, data_type="float")
    sb = g.tensor([1, 1, 1], name="scale_b", uid=4, data_type="float")
    g.mul(g.mul(g.matmul(a, b), sa), sb).set_output(True).set_name("C").set_uid(5)
    return g


def build(compiler: Any, spec: Any) -> Any:
    from bench.gpu_exec import build_spec_plan

    return build_spec_plan(compiler, spec, autotune=True)


def paged_case(compiler: Any) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    b, h, d, page, max_kv = 64, 32, 128, 64, 4096
    plan = build(compiler, paged_decode_spec(b, h, d, page, max_kv))
    pages_per_seq = max_kv // page
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(b * pages_per_seq, h, page, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(b * pages_per_seq, device="cuda", dtype=torch.int32).view(b, 1, pages_per_seq, 1)
    full = torch.full((b, 1, 1, 1), max_kv, device="cuda", dtype=torch.int32)
    o = torch.empty_like(q)
    tensors = {
        "q": q,
        "k_cache": kc,
        "v_cache": vc,
        "k_page_table": table,
        "v_page_table": table,
        "seq_len_q": torch.ones_like(full),
        "seq_len_kv": full,
        "o": o,
    }
    run = plan.bind(tensors)
    flat = table.view(-1).long()

    def gathered() -> torch.Tensor:
        k = kc.index_select(0, flat).view(b, pages_per_seq, h, page, d).permute(0, 2, 1, 3, 4).reshape(b, h, max_kv, d)
        v = vc.index_select(0, flat).view(b, pages_per_seq, h, page, d).permute(0, 2, 1, 3, 4).reshape(b, h, max_kv, d)
        return F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(d))

    k_contig = (
        kc.index_select(0, flat)
        .view(b, pages_per_seq, h, page, d)
        .permute(0, 2, 1, 3, 4)
        .reshape(b, h, max_kv, d)
        .contiguous()
    )
    v_contig = (
        vc.index_select(0, flat)
        .view(b, pages_per_seq, h, page, d)
        .permute(0, 2, 1, 3, 4)
        .reshape(b, h, max_kv, d)
        .contiguous()
    )
    run()
    torch.cuda.synchronize()
    err = float((o.float() - gathered().float()).norm() / gathered().float().norm())
    paths = {
        "plancache paged plan": run,
        "torch: gather pages + SDPA": gathered,
        "torch: SDPA on a contiguous cache (floor)": lambda: F.scaled_dot_product_attention(
            q, k_contig, v_contig, scale=1 / math.sqrt(d)
        ),
    }
    return {"case": "paged decode b64 h32 d128, 4k KV in 64-token pages, bf16", "rel_err_vs_torch": err, **timed(paths)}


def fp8_paged_case(compiler: Any) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    b, h, d, page, max_kv = 64, 32, 128, 64, 4096
    plan = build(compiler, fp8_paged_decode_spec(b, h, d, page, max_kv))
    pages_per_seq = max_kv // page
    e4m3 = torch.float8_e4m3fn
    q = torch.randn(b, h, 1, d, device="cuda").to(e4m3)
    kc = torch.randn(b * pages_per_seq, h, page, d, device="cuda").to(e4m3)
    vc = torch.randn(b * pages_per_seq, h, page, d, device="cuda").to(e4m3)
    table = torch.randperm(b * pages_per_seq, device="cuda", dtype=torch.int32).view(b, 1, pages_per_seq, 1)
    full = torch.full((b, 1, 1, 1), max_kv, device="cuda", dtype=torch.int32)
    o = torch.empty(b, h, 1, d, device="cuda", dtype=e4m3)
    one = torch.ones(1, 1, 1, 1, device="cuda")
    tensors = {
        "q": q,
        "k_cache": kc,
        "v_cache": vc,
        "k_page_table": table,
        "v_page_table": table,
        "seq_len_q": torch.ones_like(full),
        "seq_len_kv": full,
        "o": o,
        "amax_s": torch.zeros_like(one),
        "amax_o": torch.zeros_like(one),
        **{n: one for n in FP8_SCALES},
    }
    run = plan.bind(tensors)
    flat = table.view(-1).long()

    def dequantized_gathered() -> torch.Tensor:
        k = (
            kc.index_select(0, flat)
            .to(torch.bfloat16)
            .view(b, pages_per_seq, h, page, d)
            .permute(0, 2, 1, 3, 4)
            .reshape(b, h, max_kv, d)
        )
        v = (
            vc.index_select(0, flat)
            .to(torch.bfloat16)
            .view(b, pages_per_seq, h, page, d)
            .permute(0, 2, 1, 3, 4)
            .reshape(b, h, max_kv, d)
        )
        return F.scaled_dot_product_attention(q.to(torch.bfloat16), k, v, scale=1 / math.sqrt(d))

    k16 = (
        kc.index_select(0, flat)
        .to(torch.bfloat16)
        .view(b, pages_per_seq, h, page, d)
        .permute(0, 2, 1, 3, 4)
        .reshape(b, h, max_kv, d)
        .contiguous()
    )
    v16 = (
        vc.index_select(0, flat)
        .to(torch.bfloat16)
        .view(b, pages_per_seq, h, page, d)
        .permute(0, 2, 1, 3, 4)
        .reshape(b, h, max_kv, d)
        .contiguous()
    )
    q16 = q.to(torch.bfloat16)
    run()
    torch.cuda.synchronize()
    ref = dequantized_gathered().float()
    err = float((o.float() - ref).norm() / ref.norm())
    paths = {
        "plancache FP8 paged plan": run,
        "torch: dequantize + gather pages + SDPA (bf16)": dequantized_gathered,
        "torch: SDPA on a contiguous bf16 cache (floor)": lambda: F.scaled_dot_product_attention(
            q16, k16, v16, scale=1 / math.sqrt(d)
        ),
    }
    return {"case": CASE_LABELS["fp8_paged_case"], "rel_err_vs_torch": err, **timed(paths)}


def packed_prefill_case(compiler: Any) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    h, d, lengths = 32, 128, PREFILL_LENGTHS
    b, tokens = len(lengths), sum(lengths)
    plan = build(compiler, packed_prefill_spec(lengths, h, d))
    q, k, v = (torch.randn(tokens, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    seq = torch.tensor(lengths, device="cuda", dtype=torch.int32).view(b, 1, 1, 1)
    run = plan.bind(
        {
            "q": q,
            "k": k,
            "v": v,
            "o": o,
            "token_offsets": (cu * h * d).view(b + 1, 1, 1, 1),
            "seq_len_q": seq,
            "seq_len_kv": seq,
        }
    )
    scale = 1 / math.sqrt(d)
    starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    # Each sequence copied out as contiguous [1, h, n, d] (outside the timing): SDPA's flash path at its best.
    views = [
        tuple(x[a:e].transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
        for a, e in itertools.pairwise(starts)
    ]

    def per_sequence() -> list[torch.Tensor]:
        return [F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale) for qi, ki, vi in views]

    paths: dict[str, Any] = {"plancache packed (ragged) plan": run, "torch: SDPA per sequence": per_sequence}
    varlen = _torch_varlen(q, k, v, cu, max(lengths), scale)
    if varlen is not None:
        paths["torch: varlen flash attention (packed)"] = varlen
    run()
    torch.cuda.synchronize()
    ref = torch.cat([x[0].transpose(0, 1) for x in per_sequence()]).float()
    err = float((o.float() - ref).norm() / ref.norm())
    return {
        "case": f"packed prefill, {b} sequences of {min(lengths)}-{max(lengths)} tokens, {tokens:,} in all, h32 d128 bf16 causal",
        "rel_err_vs_torch": err,
        **timed(paths),
    }


def _torch_varlen(q: Any, k: Any, v: Any, cu: Any, longest: int, scale: float) -> Any:
    """torch's packed-sequence attention (flash varlen), whichever form this torch has."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    for causal in ({"is_causal": True}, {"window_size": (-1, 0)}):
        try:
            varlen_attn(q, k, v, cu, cu, longest, longest, scale=scale, **causal)
            return lambda: varlen_attn(q, k, v, cu, cu, longest, longest, scale=scale, **causal)
        except TypeError:
            continue
    return None


def fp8_case(compiler: Any) -> dict[str, Any]:
    import torch

    n = 4096
    plan = build(compiler, fp8_matmul_spec(n))
    a = (torch.randn(1, n, n, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(1, n, n, device="cuda") * 0.5).to(torch.float8_e4m3fn).transpose(1, 2)  # column-major
    sa, sb = torch.full((1, 1, 1), 0.5, device="cuda"), torch.full((1, 1, 1), 2.0, device="cuda")
    c = torch.empty(1, n, n, device="cuda", dtype=torch.bfloat16)
    run = plan.bind({"A": a, "B": b, "scale_a": sa, "scale_b": sb, "C": c})
    sa0, sb0 = sa.view(()), sb.view(())

    def scaled_mm() -> torch.Tensor:
        return torch._scaled_mm(a[0], b[0], scale_a=sa0, scale_b=sb0, out_dtype=torch.bfloat16)

    run()
    torch.cuda.synchronize()
    ref = scaled_mm().float()
    err = float((c[0].float() - ref).norm() / ref.norm())
    return {
        "case": "FP8 e4m3 matmul 4096^3, per-tensor scales, bf16 out",
        "rel_err_vs_torch": err,
        **timed({"plancache FP8 plan": run, "torch._scaled_mm": scaled_mm}),
    }


def timed(paths: dict[str, Any], rounds: int = 5) -> dict[str, Any]:
    from tests.support.gpu_timing import gpu_ms

    samples: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(rounds):  # interleaved: the machine is shared
        for name, fn in paths.items():
            samples[name].append(gpu_ms(fn)[0])
    return {"ms": {p: statistics.median(s) for p, s in samples.items()}, "samples_ms": samples}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    import torch

    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    torch.cuda.init()
    compiler = CudnnCompiler(0)
    rows, errors = [], {}
    for fn in (paged_case, fp8_paged_case, packed_prefill_case, fp8_case):
        try:
            rows.append(fn(compiler))
            print(
                rows[-1]["case"],
                {k: round(v, 4) for k, v in rows[-1]["ms"].items()},
                "rel err",
                rows[-1]["rel_err_vs_torch"],
                flush=True,
            )
        except Exception as e:  # a failed case (cuDNN refusing it on this GPU) is reported, not the run
            errors[CASE_LABELS.get(fn.__name__, fn.__name__)] = f"{type(e).__name__}: {e}"
            print(fn.__name__, "failed:", errors[CASE_LABELS.get(fn.__name__, fn.__name__)][:2000], flush=True)
    print(table(["case", "path", "GPU ms"], [[r["case"], p, ms] for r in rows for p, ms in r["ms"].items()]))
    write_json(args.out / "variants.json", {"rows": rows, "errors": errors, "device": torch.cuda.get_device_name(0)})
    fig, axes = figure(max(len(rows), 1))
    for ax, r in zip(axes, rows, strict=False):
        ax.barh(list(r["ms"]), list(r["ms"].values()))
        ax.set_xlabel("GPU ms per call (CUDA-graph replays, median)"), ax.set_title(r["case"], fontsize=8)
    save(fig, args.out / "variants.png")


if __name__ == "__main__":
    main()

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
- FP8 matmul 4096^3 (e4m3 in, per-tensor scales, bf16 out) against
  torch._scaled_mm.

    python bench/variants.py --out DIR
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402


def paged_decode_spec(b: int, h: int, d: int, page: int, max_kv: int) -> Any:
    from plancache import GraphSpec

    g = GraphSpec(name="paged_decode", io_data_type="bfloat16")
    pages = b * max_kv // page
    q = g.tensor([b, h, 1, d], name="q", uid=1)
    k = g.tensor([pages, h, page, d], name="k_cache", uid=2)
    v = g.tensor([pages, h, page, d], name="v_cache", uid=3)
    tk = g.tensor([b, 1, max_kv // page, 1], name="k_page_table", uid=4, data_type="int32")
    tv = g.tensor([b, 1, max_kv // page, 1], name="v_page_table", uid=5, data_type="int32")
    sq = g.tensor([b, 1, 1, 1], name="seq_len_q", uid=6, data_type="int32")
    skv = g.tensor([b, 1, 1, 1], name="seq_len_kv", uid=7, data_type="int32")
    o, _ = g.sdpa(q, k, v, attn_scale=1 / math.sqrt(d), use_padding_mask=True, seq_len_q=sq, seq_len_kv=skv,
                  paged_attention_k_table=tk, paged_attention_v_table=tv, paged_attention_max_seq_len_kv=max_kv)  # fmt: skip
    o.set_output(True).set_name("o").set_uid(8)
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
    from bench.gpu_cases import Case
    from bench.gpu_exec import build_plan

    return build_plan(compiler, Case(spec.name, "variant", lambda: spec, lambda t: lambda: None), autotune=True)


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
    tensors = {"q": q, "k_cache": kc, "v_cache": vc, "k_page_table": table, "v_page_table": table, "seq_len_q": torch.ones_like(full),
               "seq_len_kv": full, "o": o}  # fmt: skip
    run = plan.bind(tensors)
    flat = table.view(-1).long()

    def gathered() -> torch.Tensor:
        k = kc.index_select(0, flat).view(b, pages_per_seq, h, page, d).permute(0, 2, 1, 3, 4).reshape(b, h, max_kv, d)
        v = vc.index_select(0, flat).view(b, pages_per_seq, h, page, d).permute(0, 2, 1, 3, 4).reshape(b, h, max_kv, d)
        return F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(d))

    k_contig = kc.index_select(0, flat).view(b, pages_per_seq, h, page, d).permute(0, 2, 1, 3, 4).reshape(b, h, max_kv, d).contiguous()
    v_contig = vc.index_select(0, flat).view(b, pages_per_seq, h, page, d).permute(0, 2, 1, 3, 4).reshape(b, h, max_kv, d).contiguous()
    run()
    torch.cuda.synchronize()
    err = float((o.float() - gathered().float()).norm() / gathered().float().norm())
    paths = {"plancache paged plan": run, "torch: gather pages + SDPA": gathered,
             "torch: SDPA on a contiguous cache (floor)": lambda: F.scaled_dot_product_attention(q, k_contig, v_contig, scale=1 / math.sqrt(d))}  # fmt: skip
    return {"case": "paged decode b64 h32 d128, 4k KV in 64-token pages, bf16", "rel_err_vs_torch": err, **timed(paths)}


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
    return {"case": "FP8 e4m3 matmul 4096^3, per-tensor scales, bf16 out", "rel_err_vs_torch": err,
            **timed({"plancache FP8 plan": run, "torch._scaled_mm": scaled_mm})}  # fmt: skip


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

    from plancache_server.compiler.cudnn import CudnnCompiler

    torch.cuda.init()
    compiler = CudnnCompiler(0)
    rows, errors = [], {}
    for fn in (paged_case, fp8_case):
        try:
            rows.append(fn(compiler))
            print(rows[-1]["case"], {k: round(v, 4) for k, v in rows[-1]["ms"].items()}, "rel err", rows[-1]["rel_err_vs_torch"], flush=True)
        except Exception as e:  # a failed case is reported, not the run
            errors[fn.__name__] = f"{type(e).__name__}: {e}"
            print(fn.__name__, "failed:", errors[fn.__name__], flush=True)
    print(table(["case", "path", "GPU ms"], [[r["case"], p, ms] for r in rows for p, ms in r["ms"].items()]))
    write_json(args.out / "variants.json", {"rows": rows, "errors": errors, "device": torch.cuda.get_device_name(0)})
    fig, axes = figure(max(len(rows), 1))
    for ax, r in zip(axes, rows, strict=False):
        ax.barh(list(r["ms"]), list(r["ms"].values()))
        ax.set_xlabel("GPU ms per call (CUDA-graph replays, median)"), ax.set_title(r["case"], fontsize=8)
    save(fig, args.out / "variants.png")


if __name__ == "__main__":
    main()

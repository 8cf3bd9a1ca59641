"""Does a norm's kernel cache get slower the more sizes use it? (GPU run 33, issue 43)

In bench/families.py's sweep (run 33) a worker's rms_norm members, built from
one kernel cache per build process (plancache.frontend_graph.kernel_caches),
took 0.08 s at first and 0.3-0.38 s some fifty builds later, falling back to
0.08 s only when a size needed a new kernel. This probe builds one layout's
sizes in one process, the way a worker's build process does (graph, plan
list, plan 0, serialize), and times each phase of each build: with one cache
for every size, with a fresh cache every `--renew` builds, and without a
cache (static, a few sizes). Prints a summary; writes
DIR/kernel_cache_growth.json.

    python3 scripts/kernel_cache_growth_probe.py --out DIR [--sizes 120] [--renew 8,16]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client" / "src"), str(REPO / "server" / "src"), str(REPO)]

from dynamic_shapes_probe import rms_norm_spec  # noqa: E402  (this directory: the same graph that probe builds)


def build_once(rows: int, handle: Any, cache: Any) -> dict[str, float]:
    import dataclasses

    import cudnn

    from plancache.frontend_graph.build import build_pygraph
    from plancache.frontend_graph.plan_list import make_plan_list
    from plancache.graphspec.validation import normalize
    from plancache.keys.options import CompileOptions

    spec = normalize(rms_norm_spec(rows))
    if cache is not None:
        spec = dataclasses.replace(spec, is_dynamic_shape_enabled=True, kernel_cache=True)
    times: dict[str, float] = {"rows": rows}
    began = time.perf_counter()
    g = build_pygraph(spec, cudnn, handle=handle, kernel_cache=cache)
    times["graph_ms"] = (time.perf_counter() - began) * 1e3
    began = time.perf_counter()
    make_plan_list(g, cudnn, CompileOptions(), "probe")
    times["plan_list_ms"] = (time.perf_counter() - began) * 1e3
    began = time.perf_counter()
    g.build_plan_at_index(0)
    times["plan_ms"] = (time.perf_counter() - began) * 1e3
    began = time.perf_counter()
    blob = bytes(g.serialize(as_bytes=True))
    times["serialize_ms"] = (time.perf_counter() - began) * 1e3
    times["blob_bytes"] = len(blob)
    times["total_ms"] = times["graph_ms"] + times["plan_list_ms"] + times["plan_ms"] + times["serialize_ms"]
    return times


def run(sizes: list[int], handle: Any, renew: int | None) -> list[dict[str, float]]:
    """`renew`: a fresh cache every that many builds; 0: no cache; None: one cache for all."""
    import cudnn

    rows: list[dict[str, float]] = []
    cache = None
    for i, n in enumerate(sizes):
        if renew != 0 and (cache is None or (renew and i % renew == 0)):
            cache = cudnn.create_kernel_cache()
        rows.append(build_once(n, handle, cache if renew != 0 else None))
    return rows


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    quarter = max(1, len(rows) // 4)
    return {
        "builds": len(rows),
        "median_total_ms": statistics.median(r["total_ms"] for r in rows),
        "mean_total_ms": statistics.mean(r["total_ms"] for r in rows),
        "first_quarter_median_ms": statistics.median(r["total_ms"] for r in rows[:quarter]),
        "last_quarter_median_ms": statistics.median(r["total_ms"] for r in rows[-quarter:]),
        "last_quarter_phases_ms": {
            k: statistics.median(r[k] for r in rows[-quarter:])
            for k in ("graph_ms", "plan_list_ms", "plan_ms", "serialize_ms")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--sizes", type=int, default=120)
    parser.add_argument("--renew", default="8,16", help="fresh-cache periods to try besides one cache and none")
    args = parser.parse_args()
    import cudnn
    import torch

    torch.cuda.init()
    handle = cudnn.create_handle()
    sizes = random.Random(43).sample(range(1, 400), args.sizes)
    result: dict[str, Any] = {"sizes": sizes, "graph": "rms_norm [N,1024] bf16, inference", "studies": {}}
    studies: list[tuple[str, list[int], int | None]] = [("one cache", sizes, None)]
    studies += [(f"fresh cache every {k}", sizes, int(k)) for k in args.renew.split(",") if k]
    studies.append(("no cache (static)", sizes[:6], 0))
    for name, these, renew in studies:
        rows = run(these, handle, renew)
        result["studies"][name] = {"summary": summary(rows), "rows": rows}
        print(name, json.dumps(result["studies"][name]["summary"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel_cache_growth.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

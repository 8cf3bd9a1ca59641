"""Where a heuristic build's time goes, engine by engine (issues 41 and 43).

A miss costs the node (or the worker building a family's member) the build
of the first plan of the graph's list that builds. For norms that is
hundreds of milliseconds where a linear's is ten (GPU run 31: an rms_norm
member 0.26-0.44 s). This probe asks, for the graphs plancache.functional
makes (norms, linear, conv, SDPA; forward, training forward and backward),
for every entry of the plan list (up to --max-plans): its behavior notes
(RUNTIME_COMPILATION: NVRTC at build time), its build time in this process,
and its GPU time; so that the question "would a first plan without runtime
compilation make misses cheap, and at what GPU cost" has figures.

The graphs are recorded from plancache.functional's own calls (a recording
stand-in client in front of the worker's compiler, this process); each list
is then built entry by entry with the worker's compiler (`_build`: a build
and a serialize, as a worker does) and the built ones timed as the
autotuner times them.

    python3 scripts/build_time_probe.py --out DIR     # DIR/build_time_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class RecordingClient:
    """STAND-IN client: records each graph plancache.functional asks for, then builds it here (heuristic)."""

    hedge = False

    def __init__(self, compiler: Any) -> None:
        from bench.gpu_exec import InProcessClient

        self.inner = InProcessClient(compiler)
        self.specs: list[tuple[str, Any]] = []
        self.label = ""

    def compile(self, spec: Any, target: Any = None, options: Any = None, **kwargs: Any) -> Any:
        from plancache.keys.query import PlanQuery

        graph = spec.spec if isinstance(spec, PlanQuery) else spec
        self.specs.append((self.label, graph))
        return self.inner.compile(spec, target, options, **kwargs)

    def close(self) -> None:
        pass


def record(client: RecordingClient, rows: list[int]) -> None:
    import torch
    import torch.nn.functional as F

    import plancache.functional as pf

    def r(*shape: int, grad: bool = False) -> Any:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)

    for n in rows:
        client.label = f"rms_norm+linear rows {n} (families sweep)"
        x, w, lin = r(n, 1024), (1 + 0.1 * r(1024)), r(1024, 1024) / 32
        pf.linear(pf.rms_norm(x, (1024,), w, 1e-5), lin)
    client.label = "training: rms_norm, layer_norm, linear+gelu, sdpa (batch 2, seq 320, hidden 768)"
    x = r(2, 320, 768, grad=True)
    w, b = r(768, grad=True), r(768, grad=True)
    up = (r(3072, 768) / 28).requires_grad_()
    h = pf.rms_norm(x, (768,), w, 1e-5) + pf.layer_norm(x, (768,), w, b, 1e-5)
    y = pf.linear(h, up, activation="gelu")
    q = r(2, 12, 320, 64, grad=True)
    o = pf.scaled_dot_product_attention(q, q, q, is_causal=True)
    (y.float().sum() + o.float().sum()).backward()
    client.label = "conv 3x3 64ch 56x56 n8 fp16 NHWC (inference)"
    xc = torch.randn(8, 64, 56, 56, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    wc = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        pf.conv2d(xc, wc, None, (1, 1), (1, 1), (1, 1), 1)
    torch.cuda.synchronize()
    del F


def probe_graph(compiler: Any, label: str, spec: Any, max_plans: int) -> dict[str, Any]:
    from plancache.keys.options import CompileOptions
    from plancache.keys.query import PlanQuery
    from plancache_server.worker.compiler.plan_list import describe

    query = PlanQuery.of(spec, compiler.target, CompileOptions())
    started = time.perf_counter()
    g = compiler._make_plans(query)
    planning_s = time.perf_counter() - started
    count = int(g.get_execution_plan_count())
    entries, built = [], []
    for i in range(min(count, max_plans)):
        record = describe(g, i)
        plan = compiler._build(g, i, spec)
        entries.append(
            {
                "index": i,
                "name": record.plan_name,
                "engine": record.engine_id,
                "notes": list(record.behavior_notes),
                "built": plan.built,
                "build_s": plan.seconds,
                "error": plan.error,
            }
        )
        if plan.built:
            built.append(plan)
    try:
        for result in compiler.time_plans(query, built):
            for e in entries:
                if e["index"] == result.index:
                    e["gpu_ms"] = result.median_ms
    except Exception as e:  # timing is the second question; the build times stand
        entries.append({"timing_error": f"{type(e).__name__}: {e}"[:500]})
    ops = sorted({n.op for n in spec.nodes})
    return {"label": label, "ops": ops, "plans": count, "planning_s": planning_s, "entries": entries}


def summary(graph: dict[str, Any]) -> dict[str, Any]:
    entries = [e for e in graph["entries"] if "index" in e]
    first = next((e for e in entries if e["built"]), None)
    first_plain = next((e for e in entries if e["built"] and "RUNTIME_COMPILATION" not in e["notes"]), None)
    timed = [e["gpu_ms"] for e in entries if e.get("gpu_ms") is not None]
    best = min(timed, default=None)
    return {
        "ops": graph["ops"],
        "first": None if first is None else (first["index"], round(first["build_s"], 4), first.get("gpu_ms")),
        "first_without_rtc": None
        if first_plain is None
        else (first_plain["index"], round(first_plain["build_s"], 4), first_plain.get("gpu_ms")),
        "best_gpu_ms": best,
        "rtc_entries": sum("RUNTIME_COMPILATION" in e["notes"] for e in entries),
        "entries": len(entries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", default="10,74,179")
    parser.add_argument("--max-plans", type=int, default=10)
    parser.add_argument("--time-limit", type=float, default=240.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    import plancache.functional as pf
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    started = time.perf_counter()
    compiler = CudnnCompiler(0)
    client = RecordingClient(compiler)
    pf.configure(client, target=compiler.target)  # type: ignore[arg-type]
    record(client, [int(r) for r in args.rows.split(",")])
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "graphs": [], "skipped": []}
    seen: set[str] = set()
    for label, spec in client.specs:
        digest = spec.spec_hash()
        if digest in seen:
            continue
        seen.add(digest)
        if time.perf_counter() - started > args.time_limit:
            result["skipped"].append(label)
            continue
        try:
            graph = probe_graph(compiler, label, spec, args.max_plans)
        except Exception as e:
            graph = {"label": label, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
        else:
            graph["summary"] = summary(graph)
        result["graphs"].append(graph)
        print(label, graph.get("summary", graph.get("error")), flush=True)
    result["seconds"] = time.perf_counter() - started
    (args.out / "build_time_probe.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()

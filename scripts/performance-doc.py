#!/usr/bin/env python3
"""Writes docs/performance.md from bench/results/*.json (the current figures).

python3 scripts/performance-doc.py
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.markdown import with_contents  # noqa: E402

# The figures in brief, as the README had them (written by hand: update them with the sections below).
SUMMARY = (
    "## In short\n\n"
    "On a 2-core machine a stored 75 KB plan is served at 0.91x the latency of a bare gRPC echo plus a Redis GET, and at "
    "0.83x (16 clients) and 0.99x (64 clients) the throughput of a thread-pool echo server (0.88x and 0.92x an asyncio "
    "one); 64 concurrent compiles of one missing key build once; a fresh process reads a plan from its disk cache in "
    "0.06 ms; one streamed prefetch moves 2.3x the plans per second of one call per plan. A rollout herd of 1,000 nodes "
    "each needing the same 13 missing plans (one worker, 1 s builds): one build per key, no errors, every node has its "
    "plans 0.3 s after the last build; a reader of a stored plan meanwhile sees p99 12 ms (17.5 s on the thread-pool "
    "gateway of before); a 2,000-call burst ends with no CANCELLED (`make herd`). On an H200, every op family compiles, "
    "deserializes in a separate process and matches torch (fp16/bf16 relative error ≤ 2.5e-3; standalone "
    "`batchnorm_inference` excepted: cuDNN 9.19 has no engine for it on sm_90); a fresh process is ready to execute "
    "18–213x faster than the server's build + autotune (median 37-44x; 557x once the process has loaded its first plan); "
    "autotuned plans are never slower than heuristic plan 0, and plans run at a median 0.83-0.85x torch's time. Two GPU "
    "workers build 1.89x as many plans per second as one. A first node of a new model on an H200 (13 graphs, nothing "
    "stored, empty JIT cache; GPU run 19): one `compile()` per graph has every graph running 1.14x after building them "
    "itself would (1.18x with a 50 ms layer between graphs, 1.33x from 4 processes against 4 local ones), one prefetch "
    "with `compile_missing` 0.39x, and every plan is tuned and stored 0.35-0.40x the time of a plain local autotune "
    "loop. An upgrade rehearsal (`make upgrade`, CPU, stand-in compiler): with warming, 90% of the old target's hits "
    "are covered for the new one 17.7 s after its worker appears (43.5 s without, from the nodes' own misses) and nodes "
    "starting after the top 100 specs' build time get 100% hits (88% without). `plancache.functional` calls cost "
    "1.7-1.9x the frontend's own execute in host time (they allocate their output, as torch's do), and a 4-layer "
    "decoder step written with them runs in 0.72x torch eager's GPU time. `make bench` runs the CPU part; "
    "`scripts/gpu-check.sh` and `scripts/multi-gpu-check.sh` the GPU tests and benchmarks.\n"
)
RESULTS = ROOT / "bench" / "results"
# Other runs of bench/herd.py kept beside herd.json, shown in its comparison table.
# The docs/gpu-runs/ record of the start-up and autotuning figures.
STARTUP_RUN = "2026-12-01-h200-run19.md"
HEDGE_RUN = "2026-12-01-h200-run21.md"
# bench/startup.py's hedged paths: (row label, ratio key with the hedge, ratio key without it).
HEDGE_ROWS = (
    (
        "first-compile (one compile() per graph) / local-heuristic",
        "first_compile_hedge_over_local",
        "first_compile_over_local",
    ),
    (
        "first-lazy (50 ms after each graph) / local-heuristic + 13 × 50 ms",
        "first_lazy_hedge_over_local_lazy",
        "first_lazy_over_local_lazy",
    ),
    (
        "first-compile-4proc / local-heuristic-4proc",
        "first_4proc_hedge_over_local_4proc",
        "first_4proc_over_local_4proc",
    ),
    (
        "first-dropin (frontend program, one line changed) / local-program",
        "first_dropin_hedge_over_local_program",
        "first_dropin_over_local_program",
    ),
    (
        "first-functional (decode step) / local-functional",
        "first_functional_hedge_over_local_functional",
        "first_functional_over_local_functional",
    ),
)
EXEC_RUN = "2026-11-30-h200-run13.md"
# The docs/gpu-runs/ record of bench/training.py's figures (issue 30).
TRAINING_RUN = "2026-12-01-h200-run23.md"
FAMILIES_RUN = "2026-12-01-h200-run24.md"
HERD_EXTRA = {
    "asynchronous gateway, nodes as equals": "herd_nodes_at_nice0.json",
    "asynchronous gateway, 300 nodes": "herd_300_nodes.json",
    "hedged clients beside plain ones (issue 29; one run)": "herd_hedged.json",
}


def yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def cpu_section(cpu: dict) -> list[str]:
    s = cpu["summary"]
    out = [
        "## CPU (`make bench`; plans from the stand-in compiler, 75 KB)\n",
        f"Machine: {cpu['machine']['cpus']} cores, Python {cpu['machine']['python']}, loopback. Servers are separate processes; the load "
        "generator is one process of threads (it shares the two cores). Floors: bare gRPC servers answering GetPlan with the same bytes "
        "(`bench/echo_server.py`): `echo` on grpc's thread pool (64 threads, the target), `echo_aio` on grpc.aio with uvloop (what the "
        "gateway is built on); plus one raw redis-py GET of the same 75 KB blob for latency.\n",
        "| clients | path | p50 ms | p50 range | p99 ms | req/s |",
        "|---|---|---|---|---|---|",
    ]
    for clients, by in cpu["hit_path"].items():
        for name, m in by.items():
            out.append(
                f"| {clients} | {name} | {m['p50_ms']['median']:.3f} | {m['p50_ms']['min']:.3f}–{m['p50_ms']['max']:.3f} | {m['p99_ms']['median']:.3f} | {m['rps']['median']:,.0f} |"
            )
    sf, cc = cpu["startup_fetch"], cpu["client_cache_hit"]
    out += [
        "",
        "| row | measure | value | target | met |",
        "|---|---|---|---|---|",
        f"| 1 | hit p50 / floor (thread-pool echo + Redis GET), 1 client | {s['hit_p50_over_floor']:.2f} | ≤ 1.0 | {yes(s['hit_p50_over_floor'] <= 1.0)} |",
        f"| 1 | hit p50 / floor (asyncio echo + Redis GET) | {s['hit_p50_over_floor_aio']:.2f} | — | — |",
        f"| 1 | same, gateway memory cache off | {s['hit_p50_over_floor_no_memory_cache']:.2f} | — | — |",
    ]
    for level, value in s["throughput_over_echo"].items():
        out += [
            f"| 1 | throughput / thread-pool echo, {level} clients | {value:.2f} | ≥ 1.0 | {yes(value >= 1.0)} |",
            f"| 1 | throughput / asyncio echo, {level} clients | {s['throughput_over_echo_aio'][level]:.2f} | — | — |",
            f"| 1 | same, memory cache off (/ thread-pool echo) | {s['throughput_over_echo_no_memory_cache'][level]:.2f} | — | — |",
        ]
    out += [
        f"| 2 | client disk cache hit in a fresh process, per plan (median over {cc['plans']} plans; first plan {cc['first_plan_ms']['median']:.2f} ms; import {cc['import_s']['median'] * 1e3:.0f} ms) | {s['client_cache_hit_ms']:.3f} ms | < 0.3 ms | {yes(s['client_cache_hit_ms'] < 0.3)} |",
        f"| 3 | builds for one missing key, 64 concurrent Compile calls, 1 s build, per round | {s['coalescing_builds']} | 1 | {yes(all(b == 1 for b in s['coalescing_builds']))} |",
        f"| 3 | waiters' latency / builder's (median of rounds' p50; worst waiter) | {s['waiters_over_builder_p50']:.3f}; {s['waiters_over_builder_max']:.3f} | < 1.05 | {yes(s['waiters_over_builder_p50'] < 1.05)} |",
        f"| 4 | start-up fetch of {sf['plans']} plans: one GetPlan per plan | {sf['per_call_sequential_plans_per_s']['median']:,.0f} plans/s (8 threads: {sf['per_call_8_threads_plans_per_s']['median']:,.0f}) | — | — |",
        f"| 4 | the same, one streamed Prefetch call | {sf['streamed_plans_per_s']['median']:,.0f} plans/s ({s['streamed_over_per_call']:.2f}x) | — | — |",
        "",
        "The gateway is one asyncio event loop (grpc.aio, uvloop). A hit from its memory cache awaits nothing: parse, check the token, "
        "look up, count, and answer with the response bytes serialized once per plan (5.6 µs of Python per hit, measured in isolation). "
        "Before the asynchronous gateway the same benchmark read 0.79x the thread-pool echo's throughput at 16 clients and 0.67x at 64 "
        "(stop 8). What stays below 1.0x is the event loop itself: on two cores shared with the load generator, the thread-pool echo spends "
        "its C-core work on several threads while one loop thread does ours; per call our server spent about as much CPU as the "
        "thread-pool echo (180-220 µs against 145-230 µs in interleaved runs) and ~30 µs more than the asyncio echo. The rows with "
        "the memory cache off show the Redis-on-every-hit path.\n",
    ]
    return out


def gpu_section(gpu: dict) -> list[str]:
    g = gpu["summary"]
    rows = [r for r in gpu["rows"] if "tuned_ms" in r]
    warm = [(r["build_s"] + r["autotune_s"]) / (r["fetch_s"] + r["deserialize_again_s"]) for r in rows]
    out = [
        "## GPU (`scripts/gpu-check.sh` → `bench/gpu_bench.py`; NVIDIA H200, cuDNN 9.19, frontend 1.32, torch 2.11; "
        "[docs/gpu-runs/2026-11-30-h200-run10.md](gpu-runs/2026-11-30-h200-run10.md))\n",
        "One plancache server with a real cuDNN worker builds and autotunes every case (and, for row 6, builds it again without "
        "autotuning: heuristic plan 0). Each case is then fetched by a **fresh client process**, which, after its imports and cuDNN "
        "handle (which load cuBLASLt: 0.3–0.45 s, a cost a local build pays too), times request → deserialized plan, deserializes the "
        "blob a second time, and times the autotuned plan, plan 0 and torch on the same tensors, interleaved, 5 rounds, from CUDA-graph "
        "replays (eager only where torch's backward cannot be captured).\n",
        "| case | plans | build+tune s | fetch ms | first deser ms | deser again ms | build/ready cold | build/ready warm | tuned ms | plan 0 ms | gain | torch ms | plan/torch | blob KB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, w in zip(rows, warm, strict=True):
        b = r["build_s"] + r["autotune_s"]
        out.append(
            f"| {r['case']} | {r['plans']} | {b:.2f} | {r['fetch_s'] * 1e3:.1f} | {r['deserialize_s'] * 1e3:.1f} | {r['deserialize_again_s'] * 1e3:.1f} | "
            f"{r['build_over_ready']:.0f}x | {w:.0f}x | {r['tuned_ms']:.4f} | {r['plan0_ms']:.4f} | {r['autotune_gain']:.2f} | {r['torch_ms']:.4f} | "
            f"{r['plan_over_torch']:.2f} | {r['blob_bytes'] / 1024:.1f} |"
        )
    out += [
        "",
        "| row | measure | value | target | met |",
        "|---|---|---|---|---|",
        f"| 5 | build+autotune / fresh-process fetch+deserialize, median | {g['build_over_ready_median']:.0f}x (min {g['build_over_ready_min']:.0f}x) | ≥ 100x | {yes(g['build_over_ready_median'] >= 100)} |",
        f"| 5 | same with the deserialize a warm process pays (its 2nd plan onwards), median | {statistics.median(warm):.0f}x (min {min(warm):.0f}x) | — | — |",
        f"| 6 | autotune gain (plan 0 time / chosen time), median; max | {g['autotune_gain_median']:.3f}; {g['autotune_gain_max']:.2f} | never slower beyond noise | {yes(not g['slower_than_plan0_beyond_noise'])} |",
        f"| 7 | plan / torch, median | {g['plan_over_torch_median']:.2f} | ≤ 1.0; every case > 1.1 explained | {yes(g['plan_over_torch_median'] <= 1.0)}; cases > 1.1: {len(g['above_1_1_vs_torch'])} |",
        "| 8 | plan size and deserialize time | table above | — | — |",
        "",
        "Reading it:",
        "- **Row 5 misses its target in a fresh process.** The first deserialize in a process costs 26–142 ms against 0.6–28 ms for the "
        "next one: CUDA loads each kernel module lazily on first use (the same matmul engine read 26 ms in fp16 and 142 ms in bf16; "
        "convolutions 42–141 ms). A local build pays those loads too (inside its 2.6–15 s), so in a process that loads several plans "
        "the warm figure is the relevant one. The server's build times also vary with what the machine has cached (SDPA builds: "
        "0.7–2.6 s here, 2.9 s in the first measurements), which is why the SDPA cases sit lowest.",
        "- **Autotuning** gains little on these shapes: cuDNN's heuristics already rank well on an H200; the exceptions are fused "
        "epilogues and norms (mm+bias+gelu 1.15x, layernorm 1.46x). Timing from CUDA-graph replays was necessary: eager launch loops "
        "measured ~15 µs of host time for every matmul candidate and picked a plan twice as slow as plan 0 (run 1).",
        "- **Versus torch**: matmuls and SDPA forward match torch (which runs the same cuBLASLt/cuDNN kernels); fused conv+bias+relu is "
        "1.3–2.1x faster than torch's unfused ops, SDPA backward 1.1–1.4x (torch's backward is timed eagerly: its autograd call cannot "
        "be captured, so its host overhead is included), norms 1.2–1.6x.\n",
    ]
    return out


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:,.0f} ms"


def _x(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}x"


STARTUP_PATHS = (
    "local-heuristic",
    "local-heuristic-4proc",
    "local-autotuned",
    "first-compile",
    "first-lazy",
    "first-compile-4proc",
    "first-prefetch",
    "fetch",
    "prefetch",
    "background",
    "floor",
)
FIRST_PATHS = ("first-compile", "first-lazy", "first-compile-4proc", "first-prefetch")


def startup_section(st: dict, run_record: str) -> list[str]:
    """bench/results/startup.json (bench/startup.py)."""
    s, t = st["summary"], st["targets"]
    lazy_ms = st.get("config", {}).get("lazy_s", 0.05) * 1e3
    out = [
        f"## Start-up on the H200 (`scripts/gpu-check.sh` → `bench/startup.py`; [{run_record}](gpu-runs/{run_record}))\n",
        "A fresh node runs 13 graphs (a transformer layer at sequence 512 and 2048 in bf16: QKV matmul, causal SDPA, output "
        "matmul+bias, MLP up matmul+bias+gelu, MLP down matmul+bias; three ResNet 3x3 conv+bias+relu at batch 32, fp16 NHWC). Every "
        "path is a **fresh process** (or four); its clock starts after imports, the CUDA context, the cuDNN handle and the input tensors "
        "(a node needs them with or without plancache) and stops when every graph has produced its first output. *Empty* JIT cache: "
        "`CUDA_CACHE_DISABLE=1`, as in a fresh container (for the worker too); *warm*: a filled `CUDA_CACHE_PATH`.",
        "",
        "- Without plancache: `local-heuristic` builds each graph's first plan in the node; `local-autotuned` builds every candidate "
        "and times each 3 times in a plain loop; `local-heuristic-4proc`: 4 processes of one node build their shares (graphs i, i+4, "
        "...) side by side.",
        "- First node (nothing stored; a **fresh worker process** for each path, so fresh build processes, with the same JIT cache "
        "state; the nodes start when every build process is ready): `first-compile`, one `client.compile(spec)` per graph in order, "
        f"each plan run as it returns (docs/client.md's first example); `first-lazy`, the same with a {lazy_ms:.0f} ms sleep (the model's "
        "layer) after each graph; `first-compile-4proc`, 4 processes of one node, one compile per graph of their shares, started "
        "together (each sets up, then waits for a common go; the time is the last one's end); `first-prefetch`, one Prefetch with "
        "compile_missing, each plan run as it arrives. *Tuned stored*: from the same start, until the last of the 13 stored plans "
        "is the tuned one (the benchmark reads Redis).",
        "- Stored plans: `fetch` (one GetPlan per plan), `prefetch` (one streamed Prefetch), `background` "
        "(`prefetch_in_background(load=True)` during a simulated 2 s weight load), `floor` (the frontend's own deserialize of the "
        "same blobs read from a local file).",
        "",
        "| path | empty JIT cache | tuned stored | warm JIT cache | tuned stored |",
        "|---|---|---|---|---|",
    ]
    for p in STARTUP_PATHS:
        cells = []
        for jit in ("cold", "warm"):
            v, n = s[jit]["median_s"].get(p), s[jit]["n"].get(p, 0)
            tuned = (s[jit].get("tuned_all_s") or {}).get(p) if isinstance(s[jit].get("tuned_all_s"), dict) else None
            cells += [f"{_ms(v)} (n={n})" if v is not None else "—", _ms(tuned) if p in FIRST_PATHS else ""]
        out.append(f"| {p} | {' | '.join(cells)} |")
    out += ["", "| measure | empty JIT cache | warm JIT cache | target | met |", "|---|---|---|---|---|"]

    def row(name: str, key: str, shown: str, fmt: object = _x, value_of: object = None) -> None:
        values = [(value_of or (lambda d: d.get(key)))(s[jit]) for jit in ("cold", "warm")]  # type: ignore[operator]
        met = [s[jit].get("met", {}).get(key) for jit in ("cold", "warm")]
        cells = ["—" if m is None else yes(m) for m in met]
        out.append(f"| {name} | {fmt(values[0])} | {fmt(values[1])} | {shown} | {cells[0]} / {cells[1]} |")  # type: ignore[operator]

    stored = f"≥ {t['stored_vs_local_cold']:g}x / ≥ {t['stored_vs_local_warm']:g}x"
    row("local heuristic build / fetch (one GetPlan per plan)", "local_over_fetch", stored)
    row("local heuristic build / streamed prefetch", "local_over_prefetch", stored)
    row("fetch / raw deserialize floor", "fetch_over_floor", f"≤ {t['stored_vs_floor']:g}x", lambda v: _x(v, 2))
    row("prefetch / raw deserialize floor", "prefetch_over_floor", f"≤ {t['stored_vs_floor']:g}x", lambda v: _x(v, 2))
    row(
        "first-compile / local heuristic build",
        "first_compile_over_local",
        f"≤ {t.get('first_compile_vs_local', 1.2):g}x",
        lambda v: _x(v, 2),
    )
    row(
        f"first-lazy / (local heuristic build + 13 × {lazy_ms:.0f} ms)",
        "first_lazy_over_local_lazy",
        f"≤ {t.get('first_lazy_vs_local_lazy', 1.2):g}x",
        lambda v: _x(v, 2),
    )
    row(
        "first-compile-4proc / local-heuristic-4proc",
        "first_4proc_over_local_4proc",
        f"≤ {t.get('first_4proc_vs_local_4proc', 1.2):g}x",
        lambda v: _x(v, 2),
    )
    row(
        "first-prefetch / local heuristic build",
        "first_prefetch_over_local",
        f"≤ {t.get('first_prefetch_vs_local', 0.6):g}x",
        lambda v: _x(v, 2),
    )
    for p in FIRST_PATHS:
        row(
            f"{p}: every plan tuned and stored / local autotune loop",
            f"tuned_over_local_autotune/{p}",
            f"≤ {t.get('tuned_vs_local_autotune', 0.5):g}x",
            lambda v: _x(v, 2),
            lambda d, p=p: (
                (d.get("tuned_over_local_autotune") or {}).get(p)
                if isinstance(d.get("tuned_over_local_autotune"), dict)
                else None
            ),
        )
    row(
        "background prefetch: time added after the 2 s foreground",
        "background_after_foreground_s",
        f"≤ {t['background_critical_path_s'] * 1e3:g} ms",
        lambda v: "—" if v is None else f"{v * 1e3:.0f} ms",
    )
    row(
        "GPU memory of the worker and its build processes (growth of the GPU's use; nvidia-smi per process)",
        "pool",
        "—",
        _pool,
    )
    if st.get("skipped"):
        out.append(f"\nSkipped for lack of time: {', '.join(st['skipped'])}.")
    if s.get("errors"):
        out.append("\nRuns that failed: " + "; ".join(e.splitlines()[-1][:200] for e in s["errors"] if e.strip()))
    out += ["", "When each graph became runnable (s from the clock's start; the tuned plan stored):", ""]
    out += _first_graphs(st)
    out += [
        "",
        "Reading it: `first-lazy`'s bound is the local build plus the same 13 sleeps: the local build is sequential too, so with the "
        "sleeps it would take exactly that. The tuned-stored figures compare the server's parallel autotuning (candidates built in the "
        "worker's build processes, timed one at a time on its GPU) with a node autotuning alone in a plain loop.",
        "",
        "![start-up paths](../bench/results/startup.png)",
        "",
        "![when each graph became runnable](../bench/results/startup_timeline.png)",
        "",
    ]
    return out


MISS_RUN = "2026-12-02-h200-run27.md"
PHASE_ROWS = (
    ("query", "keying the graph (`Client._query`: normalize, JCS, hash)"),
    ("first_ask", 'the first Compile, answered "building" by the caller\'s claimed key'),
    ("race_start", "starting the race's thread and its follow-up Compile"),
    ("settle", "settling the race (who won, counted)"),
    ("verify", "checking a plan answers its question (the race's thread)"),
    ("local_build", "the node's own build"),
)


def _phase_medians(startup: dict, path: str, phase: str) -> list[float]:
    found = []
    for r in startup["runs"]:
        ph = r.get("phases") if r.get("path") == path else None
        if isinstance(ph, dict) and phase in ph:
            found.append(ph[phase]["median_ms"])
    return found


def _span(values: list[float], unit: str = "", digits: int = 2) -> str:
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}{unit}" if lo == hi else f"{lo:.{digits}f}-{hi:.{digits}f}{unit}"


def _totals(startup: dict, path: str) -> list[float]:
    return [r["total_s"] for r in startup["runs"] if r.get("path") == path and "total_s" in r and "error" not in r]


def _fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def miss_section(shared: dict, split: dict | None, workload: dict | None, training: dict | None) -> list[str]:
    """Issue 41: a hedged miss's fixed cost per piece, its paired ratios, and start-up from a workload's record."""
    out = [
        "## A miss's fixed cost and start-up with nothing configured (issue 41; `bench/startup.py --study "
        f"hedge-paired|workload`, `bench/training.py --startup`; [{MISS_RUN}](gpu-runs/{MISS_RUN}))\n",
        "Warm JIT cache, fresh processes, medians of adjacent pairs (`paired` in the JSON); node and service on the same "
        "16 CPUs unless said. Results: `bench/results/startup_miss_shared.json`, `startup_miss_split.json`, "
        "`startup_workload.json`, `training_startup_workload.json` (`*_timeline.png`: when each graph became runnable); "
        "before the changes, under cProfile (every figure inflated, ratios only indicative): "
        "`startup_miss_before_profiled.json`.\n",
        "Per graph, what a hedged miss costs the node (`BENCH_MISS_PHASES=1`; the range of the medians of the 13 graphs "
        "over the runs):\n",
        "| piece | ms |",
        "|---|---|",
    ]
    for phase, label in PHASE_ROWS:
        out.append(f"| {label} | {_span(_phase_medians(shared, 'first-compile+hedge', phase))} |")
    out.append("")
    rows = [("shared CPUs", shared)] + ([("split CPUs (node 0-7, service 8-15)", split)] if split else [])
    out += [
        "| first-compile+hedge, 13 graphs | local-heuristic s | hedged s | paired ratio | target |",
        "|---|---|---|---|---|",
    ]
    for name, data in rows:
        paired = data["summary"]["warm"].get("paired", {}).get("first_compile_hedge_over_local")
        local = ", ".join(f"{v:.2f}" for v in _totals(data, "local-heuristic"))
        hedged = ", ".join(f"{v:.2f}" for v in _totals(data, "first-compile+hedge"))
        out.append(f"| {name} | {local} | {hedged} | **{_fmt(paired, 2)}x** | ≤ 1.05x |")
    out.append("")
    if workload is not None:
        w = workload["summary"]["warm"]
        out += [
            "Every plan stored, no manifest written by anyone: the workload's record streams them.\n",
            "| path | plancache s | without s | paired ratio | target |",
            "|---|---|---|---|---|",
            f"| drop-in program, 13 graphs all runnable (`stored-dropin` / `local-program`) | "
            f"{', '.join(f'{v:.2f}' for v in _totals(workload, 'stored-dropin'))} | "
            f"{', '.join(f'{v:.2f}' for v in _totals(workload, 'local-program'))} | "
            f"**{_fmt(w.get('stored_dropin_over_local_program'), 2)}x** | ≤ 0.3x |",
        ]
        failed = [r for r in workload["runs"] if r.get("path") == "stored-functional" and "error" in r]
        if failed:
            out.append(
                f"| decode step (`stored-functional` / `torch-step`) | failed ({len(failed)} of {len(failed)} runs) | "
                f"{', '.join(f'{v:.2f}' for v in _totals(workload, 'torch-step'))} | n/a | ≤ 0.6x |"
            )
    if training is not None and "startup" in training:
        for model, entry in training["startup"].get("summary", {}).items():
            steps = entry.get("first_step_s", {})
            out.append(
                f"| functional training first step, {model} (`stored, workload record` / torch) | "
                f"{_fmt(steps.get('stored, workload record'), 3)} | {_fmt(steps.get('torch'), 3)} | "
                f"**{_fmt(entry.get('workload_over_torch'), 2)}x** (a manifest: {_fmt(entry.get('prefetched_over_torch'), 2)}x; "
                f"stored, nothing streamed: {_fmt(entry.get('stored_over_torch'), 2)}x) | ≤ 0.6x |"
            )
    out += [
        "",
        "The training figures were measured with the stream deserializing on its thread; the decode step failed in both "
        'its runs that way (its first torch op: "operation would make the legacy stream depend on a capturing blocking '
        "stream\"), so the stream now deserializes nothing on its thread (each plan at its first use, on the caller's): "
        "that default is not measured yet. The drop-in's remaining time is the program's own `validate()` (frontend "
        "1.32 imports its Python heuristics there) and one deserialize per graph.\n",
    ]
    return out


def hedge_section(split: dict, shared: dict | None, hits: dict | None, run_record: str) -> list[str]:
    """bench/results/startup_hedge.json (bench/startup.py --study hedge-paired --split-cpus, cold and warm merged),
    startup_hedge_shared_cpus.json (--study hedge, cold, CPUs shared), hedge_hits.json (bench/hedge_hits.py, CPU)."""
    target = split["targets"].get("hedged_vs_local", 1.05)
    out = [
        f"## Hedged misses (issue 29; `bench/startup.py --study hedge-paired`; [{run_record}](gpu-runs/{run_record}))\n",
        "On a miss a hedged client builds the plan itself too, on the caller's thread, while the service builds it, and runs whichever "
        'is ready first (`plan.source == "local"` when its own build won); the service\'s plan takes over at a later call. The start-up '
        "benchmark's 13 graphs (above), each first-node path with the hedge on, beside its local equivalent (the node building the same "
        "graphs itself). `hedge-paired`: each hedged first node runs right after its local equivalent, the pairs twice, medians (the "
        "machine drifts by more than 5 % between identical runs minutes apart: local-program took 1.84 s and 2.43 s, warm). "
        "`--split-cpus`: the node processes on CPUs 0-7, Redis, the server and its worker on CPUs 8-15 (the GPU shared), as a service "
        "on a host of its own; `shared`: one run of each (`--study hedge`), every process on all 16 CPUs. Measured at 8e34d50 (split) and "
        "da68845 (shared), when a hedged compile was a server stream read by a thread; the hit path then moved to one unary Compile "
        "(c5277e4, below), which changes a miss's protocol from one stream to two unary calls (a round trip, ~1 ms, against builds of "
        "0.1-1 s per graph) and was not measured on the GPU again (the session's GPU time was spent).",
        "",
        "| path | split CPUs, empty JIT | split CPUs, warm JIT | shared CPUs, empty JIT (n=1) | without the hedge, shared, empty JIT | target |",
        "|---|---|---|---|---|---|",
    ]
    for label, hedged_key, plain_key in HEDGE_ROWS:
        cells = []
        for jit in ("cold", "warm"):
            value = split["summary"][jit].get(hedged_key)
            cells.append("—" if value is None else f"{value:.2f}x {'' if value <= target else '(**over**)'}".strip())
        sh = shared["summary"]["cold"] if shared else {}
        cells.append("—" if sh.get(hedged_key) is None else f"{sh[hedged_key]:.2f}x")
        cells.append("—" if sh.get(plain_key) is None else f"{sh[plain_key]:.2f}x")
        out.append(f"| {label} | {' | '.join(cells)} | ≤ {target:g}x |")
    runs = {jit: split["summary"][jit]["n"] for jit in ("cold", "warm")}
    out += [
        "",
        f"Runs per path (split): empty JIT {', '.join(f'{p} {n}' for p, n in runs['cold'].items() if n)}; warm JIT "
        f"{', '.join(f'{p} {n}' for p, n in runs['warm'].items() if n)}.",
        "",
        "| measure | empty JIT (split) | warm JIT (split) | empty JIT (shared) |",
        "|---|---|---|---|",
    ]
    for jit_label, key in (
        (
            "hit-compile with the hedge / without (every plan stored; no local build may start)",
            "hit_hedge_over_no_hedge",
        ),
    ):
        values = [split["summary"][j].get(key) for j in ("cold", "warm")] + [
            shared["summary"]["cold"].get(key) if shared else None
        ]
        out.append(f"| {jit_label} | {' | '.join('—' if v is None else f'{v:.2f}x' for v in values)} |")
    builds = [split["summary"][j].get("hit_hedge_builds_nothing") for j in ("cold", "warm")] + [
        shared["summary"]["cold"].get("hit_hedge_builds_nothing") if shared else None
    ]
    out.append(f"| every hedged hit a hit, no race | {' | '.join('—' if b is None else yes(b) for b in builds)} |")
    for name in ("first-compile", "first-dropin", "first-compile-4proc", "first-functional"):
        costs = (shared or {}).get("summary", {}).get("cold", {}).get("hedge_costs", {}).get(name) or {}
        if costs.get("cpu_s_added") is not None:
            out.append(
                f"| {name}: host CPU s the hedge adds (hedged − unhedged node; the local build's own: {costs['cpu_s_local']:.2f} s) | — | — | "
                f"+{costs['cpu_s_added']:.2f} s |"
            )
            out.append(
                f"| {name}: GPU MiB the hedge adds (nvidia-smi, per process) | — | — | {costs['gpu_mib_added']:+.0f} MiB |"
            )
    races: dict[str, dict[str, int]] = {}
    for study in (split["summary"]["cold"], split["summary"]["warm"], *([shared["summary"]["cold"]] if shared else [])):
        for path, r in (study.get("races") or {}).items():
            if path.endswith("+hedge"):
                total = races.setdefault(
                    path, {k: 0 for k in ("local_won", "service_won", "local_failed", "service_failed", "replaced")}
                )
                for k in total:
                    total[k] += r.get(k, 0)
    out += [
        "",
        "Races over these runs (graphs): "
        + "; ".join(
            f"{p}: {r['local_won']} local first, {r['service_won']} service first, {r['replaced']} taken over later"
            for p, r in races.items()
        )
        + ".",
    ]
    if hits:
        h = hits["p50_ms"]
        out += [
            "",
            f"The hit path on the CPU (`bench/hedge_hits.py`, {hits['machine']['cpus']} cores, loopback, a real server and Redis, stored 75 KB plans, "
            f"no disk cache; {hits['config']['rounds']} rounds of {hits['config']['calls']} `compile()` calls per mode, the two modes back to back, "
            f"p50 per round): hedge off {h['hedge off']['median']:.3f} ms, hedge on {h['hedge on']['median']:.3f} ms (medians); the rounds' "
            f"ratios' median **{hits['hedge_on_over_off']:.3f}x** "
            f"(target ≤ {hits['target']:g}x: {yes(hits['met'])}); local builds started by hits: {hits['local_builds']}. The first design (a "
            "server stream per compile and a thread to read it) measured 1.52x here and was dropped: a hedged compile is one unary Compile "
            "with `answer_miss_at_once`, as a hit always was.",
            "",
            "![hit path with and without the hedge](../bench/results/hedge_hits.png)",
        ]
    out += [
        "",
        "Reading it: with the service on its own CPUs, one compile() per graph and the lazy path are within 1.05x of the node's own "
        "build with an empty and a warm JIT cache; the drop-in program is at 1.04x empty and 1.08x warm; 4 processes of one node at "
        "1.0505x empty (shown 1.05x, just over) and 1.09x warm; the decode step at 1.38x empty (one run) and 1.01x warm. With every "
        "process on the same 16 CPUs, the worker's 8 build processes build and autotune the same graphs on the node's cores: "
        "first-compile stays at 1.04x, the others reach 1.09-1.29x (and 1.15-1.53x without the hedge). Single runs of identical local "
        "builds differ by up to 35 % on this machine (local-program: 1.84 s and 2.43 s warm; local-heuristic: 6.46 s and 8.47 s "
        "empty), so with two runs a ratio within about ±0.1 of 1 is not resolved from the noise.",
        "",
        "![when each graph became runnable, hedged and local](../bench/results/startup_hedge_timeline.png)",
        "",
        "![hedged paths, medians](../bench/results/startup_hedge.png)",
        "",
    ]
    return out


def _pool(pool: dict | None) -> str:
    if not pool:
        return "—"
    growth = f"{pool['device_growth_mib']:,.0f} MiB" if pool.get("device_growth_mib") is not None else "—"
    seen = (
        f"{pool['mib']:,.0f} MiB in {pool['processes']} processes" if pool.get("processes") else "processes not listed"
    )
    return f"{growth} ({pool['build_processes']} build processes + the worker; {seen})"


def _first_graphs(st: dict) -> list[str]:
    """Per graph and JIT state: runnable / tuned times of each first-* path and local-heuristic's, from the first run of each."""
    runs = st.get("runs", [])
    shown = [("local-heuristic", "local"), *((p, p.removeprefix("first-")) for p in FIRST_PATHS)]
    columns = [
        (jit, path, label)
        for jit in ("cold", "warm")
        for path, label in shown
        if any(r["jit"] == jit and r["path"] == path and r.get("runnable_s") for r in runs)
    ]
    if not columns:
        return ["(no per-graph times in this run)"]
    first = {
        (jit, path): next(r for r in runs if r["jit"] == jit and r["path"] == path and r.get("runnable_s"))
        for jit, path, _ in columns
    }
    names = st.get("graph_names") or [f"graph {i}" for i in range(len(next(iter(first.values()))["runnable_s"]))]
    out = [
        "| graph | "
        + " | ".join(f"{'empty' if jit == 'cold' else 'warm'}: {label}" for jit, _, label in columns)
        + " |",
        "|---|" + "---|" * len(columns),
    ]
    for i, name in enumerate(names):
        cells = []
        for jit, path, _ in columns:
            r = first[(jit, path)]
            ready, tuned = r["runnable_s"][i], (r.get("tuned_s") or [None] * len(names))[i]
            cells.append(("—" if ready is None else f"{ready:.2f}") + ("" if tuned is None else f" / {tuned:.1f}"))
        out.append(f"| {name} | {' | '.join(cells)} |")
    return out


def report_hits_section(rh: dict) -> list[str]:
    """bench/results/report_hits.json (bench/report_hits.py, CPU): the hit path with the fleet reports on and off."""
    p = rh["p50_us"]
    rows = "\n".join(
        f"| {path} | {modes['reporting off']['median']:,.1f} | {modes['reporting on']['median']:,.1f} | {rh['on_over_off'][path]:.3f}x | "
        f"{modes['reporting on']['median'] / modes['reporting off']['median']:.3f}x |"
        for path, modes in p.items()
    )
    return [
        "## Reporting to the service on the hit path (issue 32; `bench/report_hits.py`, CPU)\n",
        "Clients count each graph (served, from the disk cache, built locally and why) and send the counts in the background "
        "(ReportFirstUses). Off here means no counting and no report (the hit path before issue 32); on is as shipped, with reports "
        f"every {rh['config']['report_interval_s']:g} s so they go out during the measurement. {rh['machine']['cpus']} cores (shared with "
        f"other work), loopback, a real server and Redis, stored 75 KB plans; {rh['config']['rounds']} rounds of {rh['config']['calls']} "
        "`compile()` calls per path and mode, the two modes back to back (the order alternating), p50 per round; the figure is the "
        "median of the rounds' ratios.\n",
        "| hit path | off, p50 µs | on, p50 µs | on / off (median of the rounds' ratios) | ratio of the medians |",
        "|---|---|---|---|---|",
        rows,
        "",
        f"Target ≤ {rh['target']:g}x on both paths (the rounds' ratios): {yes(rh['met'])}. Graphs counted with reporting on: "
        f"{rh['graphs_counted_on']:,}. The machine is shared: rounds of one mode range widely (see the JSON), so the ratio of the "
        "medians can stray further from 1 than the paired rounds do; it is shown for that reason.",
        "",
        "![the hit path with reporting on and off](../bench/results/report_hits.png)",
        "",
    ]


def autotune_section(at: dict, run_record: str) -> list[str]:
    """bench/results/autotune.json (bench/autotune.py)."""
    s = at["summary"]
    rows = [r for r in at["rows"] if "screened_over_exhaustive" in r]
    out = [
        f"## Autotuning cost (`bench/autotune.py`; [{run_record}](gpu-runs/{run_record}))\n",
        "Per graph, every candidate is built once and serialized (as the worker's build processes do), then deserialized and timed "
        "by the `screened` strategy (the default: one eager launch, then a "
        "CUDA graph of up to 10 launches (~0.2 ms) replayed once as a screen, and precise adaptive replays of the candidates within 25% "
        "of the best screen; a candidate that cannot be captured is timed eagerly and never screened out) and by "
        "the `exhaustive` one (every candidate precisely: the product before), in that order in one process, so the screen pays each "
        "candidate's first execution (kernel loading) and the exhaustive pass does not. The picks and cuDNN's heuristic plan are then "
        "timed again side by side (CUDA-graph replays, interleaved, median of 5).\n",
        "| graph | candidates | build all s | screened ms/candidate | exhaustive ms/candidate | timed precisely | picks (screened/exhaustive) | screened pick / exhaustive pick | tuned / heuristic |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['graph']} | {r['candidates']} | {r['build_all_s']:.2f} | {r['screened']['ms_per_candidate']:.1f} | {r['exhaustive']['ms_per_candidate']:.1f} | "
            f"{r['screened']['precisely_timed']} | {r['screened']['chosen']}/{r['exhaustive']['chosen']} | {r['screened_over_exhaustive']:.3f} | "
            f"{r.get('tuned_over_heuristic', float('nan')):.3f} |"
        )
    med = s["ms_per_candidate_median"]
    out += [
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| cost per candidate, median (screened) | {med['screened']:.1f} ms (exhaustive {med['exhaustive']:.1f} ms) | ≤ {s['target_ms_per_candidate']:g} ms | {yes(med['screened'] <= s['target_ms_per_candidate'])} |",
        f"| screened pick's time / exhaustive pick's, worst graph | {s['screened_over_exhaustive_max']:.3f} | ≤ 1.02 on every graph | {yes(not s['beyond_2_percent'])} |",
        f"| tuned plan slower than the heuristic one beyond noise (5%) | {len(s['tuned_slower_than_heuristic_beyond_noise'])} graphs | none | {yes(not s['tuned_slower_than_heuristic_beyond_noise'])} |",
        "",
    ]
    for p in s.get("pool_builds") or []:
        out.append(
            f"- Every candidate of {p['graph']} ({p['candidates']}) built by {p['processes']} build process(es), started before the clock: "
            f"{p['seconds']:.2f} s"
            + (f" ({p['speedup']:.2f}x one process)" if p.get("speedup") and p["processes"] > 1 else "")
            + "."
        )
    for p in s.get("parallel_builds") or []:  # runs before the build pool: threads
        if "error" in p:
            out.append(f"- Building {p['graph']}'s candidates from {p['thread_count']} threads failed: {p['error']}")
        else:
            out.append(
                f"- Parallel candidate builds, {p['graph']}: one by one {p['sequential_s']:.2f} s; from {p['thread_count']} threads "
                f"{p['threads_s']:.2f} s ({p['speedup']:.2f}x)."
            )
    out += ["", "![autotuning cost](../bench/results/autotune.png)", ""]
    return out


def exec_section(ge: dict, run_record: str) -> list[str]:
    """bench/results/gpu_exec.json (bench/gpu_exec.py)."""
    s, rows = ge["summary"], ge["rows"]
    paths = ("previous", "execute", "bound", "replay", "raw", "torch")
    out = [
        f"## Executing plans on the node (`bench/gpu_exec.py`; [{run_record}](gpu-runs/{run_record}))\n",
        "One process, one H200; each plan built there (heuristic plan) and run on the same tensors six ways, interleaved, 5 rounds, "
        "medians: `previous` = `Plan.execute` as it was before (tables rebuilt, dtypes looked up and the stream set on every call, a "
        "workspace per plan), `execute` = `Plan.execute` now (every tensor still checked), `bound` = `plan.bind(tensors)()`, "
        "`replay` = `plan.capture(tensors)()` (CUDA graph), `raw` = the frontend's own `graph.execute` on the same blob, `torch` = "
        "the same computation in eager torch. Host µs: the first 32 back-to-back calls from an idle GPU (the cost of issuing a call); "
        "stream µs: CUDA events around the whole batch (the larger of the host's and the GPU's pace).\n",
        "| case | "
        + " | ".join(f"{p} host µs" for p in paths)
        + " | bound / raw | replay / torch | GPU µs per call (replay) |",
        "|---|" + "---|" * (len(paths) + 3),
    ]
    for r in rows:
        h = r["host_us"]
        out.append(
            f"| {r['case']} | "
            + " | ".join(f"{h[p]:.1f}" for p in paths)
            + f" | {r['bound_over_raw_host']:.2f} | {r['replay_over_torch_host']:.2f} | {r['stream_us']['replay']:.1f} |"
        )
    seed, mem = s.get("seed") or {}, s.get("memory") or {}
    out += [
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| bound call / raw frontend execute, host, median over cases (worst) | {s['bound_over_raw_host_median']:.2f}x "
        f"({s['bound_over_raw_host_max']:.2f}x) | ≤ 1.1x | {yes(not s['bound_over_raw_beyond_target'])} |",
    ]
    if seed:
        out.append(
            f"| seed matmul: replay / torch.bmm, host | {seed['replay_over_torch_host']:.2f}x ({seed['host_us']['replay']:.1f} µs vs "
            f"{seed['host_us']['torch']:.1f} µs) | ≤ 0.5x | {yes(seed['replay_over_torch_host'] <= 0.5)} |"
        )
        out.append(
            f"| seed matmul: bound / raw, host | {seed['bound_over_raw_host']:.2f}x | ≤ 1.1x | {yes(seed['bound_over_raw_host'] <= 1.1)} |"
        )
    out.append(
        f"| Plan.execute now / before, host, median over cases | {s['execute_over_previous_host_median']:.2f}x | cheaper | "
        f"{yes(s['execute_over_previous_host_median'] < 1)} |"
    )
    if mem:
        out.append(
            f"| GPU memory for {mem['plans']} plans' workspaces ({mem['distinct_graphs']} graphs): one per plan → shared per stream | "
            f"{mem['one_per_plan_allocated_bytes'] / 2**20:,.0f} MiB → {mem['shared_allocated_bytes'] / 2**20:,.1f} MiB | — | — |"
        )
    if s.get("bound_over_raw_beyond_target"):
        out.append(
            f"\nCases past 1.1x: {', '.join(f'{k} {v}x' for k, v in s['bound_over_raw_beyond_target'].items())}."
        )
    if ge.get("errors"):
        out.append("\nCases that failed: " + "; ".join(f"{k}: {v[:200]}" for k, v in ge["errors"].items()))
    out += ["", "![execution cost](../bench/results/gpu_exec.png)", ""]
    return out


def multi_gpu_section(mg: dict) -> list[str]:
    return [
        "## Two GPUs (`scripts/multi-gpu-check.sh` → `bench/multi_gpu.py`; 2 × H200; "
        "[docs/gpu-runs/2026-11-29-h200x2-run5.md](gpu-runs/2026-11-29-h200x2-run5.md))\n",
        "Eight distinct specs compiled at once by a fresh server with one worker (`--gpus 0`) or two (`--gpus 0,1`) on an empty Redis; "
        "a discarded warm-up phase, then 2, 1, 2 GPUs alternating.\n",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| wall time, 1 GPU (measured phases) | {', '.join(f'{w:.1f} s' for w in mg['one_gpu_wall_s'])} | — | — |",
        f"| wall time, 2 GPUs | {', '.join(f'{w:.1f} s' for w in mg['two_gpus_wall_s'])} | — | — |",
        f"| compile throughput, 2 GPUs / 1 | {mg['throughput_ratio']:.2f}x | ≥ 1.8x | {yes(mg['throughput_ratio'] >= 1.8)} |",
        f"| builds on different GPUs overlapping in time, per 2-GPU phase | {mg['overlapping_build_pairs']} | — | — |",
        "",
    ]


def _summary_row(v: dict, measure: str) -> tuple[object, object]:
    """(value, met) of one measure of a variant's summary table."""
    for name, value, _target, met in v["summary"]:
        if name.startswith(measure):
            return value, met
    return "—", "—"


def variants_section(va: dict) -> list[str]:
    """bench/results/variants.json (bench/variants.py)."""
    out = [
        "## Attention and precision variants (`bench/variants.py`; [2026-11-30-h200-run18.md](gpu-runs/2026-11-30-h200-run18.md))\n",
        "Each plan built and autotuned through plancache's compiler, then timed from CUDA-graph replays (GPU time, median of 5 "
        "interleaved rounds) beside the best torch path on the same data. torch has no paged attention: a torch user gathers the pages "
        "into a contiguous cache and runs SDPA; SDPA over an already contiguous cache is shown as a floor that ignores paging. "
        "Packed prefill: torch's varlen flash attention reads the same packed buffers; SDPA per sequence runs on contiguous copies "
        "made outside the timing (its best case).\n",
        "| case | path | GPU ms | relative error vs torch |",
        "|---|---|---|---|",
    ]
    for r in va["rows"]:
        for i, (path, ms) in enumerate(r["ms"].items()):
            out.append(
                f"| {r['case'] if i == 0 else ''} | {path} | {ms:.3f} | {r['rel_err_vs_torch']:.1e} |"
                if i == 0
                else f"| | {path} | {ms:.3f} | |"
            )
    for case, error in va.get("errors", {}).items():
        out.append(
            f"| {case} | refused by cuDNN on this GPU: {error.split(':')[0]} (the reason: the GPU run's record) | — | — |"
        )
    out += ["", "![variants](../bench/results/variants.png)", ""]
    return out


def store_overhead_section(so: dict) -> list[str]:
    """bench/results/store_overhead.json (bench/store_overhead.py, CPU machine)."""
    out = [
        f"## Store overhead per plan (`bench/store_overhead.py`; this 2-core CPU machine, Redis {so['redis_version']})\n",
        "Signed plans with metadata like a real build's (13 candidates, 4 tensors, knobs) written through the worker's store: the plan "
        "hash (blob, metadata, signature with the signed metadata bytes, size), the spec index, the last-use index and the per-target "
        f"counters. Redis `used_memory` growth over the plans, median of {so['repeats']} fresh servers.\n",
        "| plan | plans | overhead per plan | Redis memory / blob bytes | MEMORY USAGE of one plan hash |",
        "|---|---|---|---|---|",
    ]
    for r in so["rows"]:
        out.append(
            f"| {r['plan']} | {r['plans']:,} | {r['overhead_per_plan'] / 1024:,.1f} KiB | {r['ratio']:.2f} | {r['memory_usage_of_one_plan_hash'] / 1024:,.1f} KiB |"
        )
    out += [
        "",
        "Small plans cost about 3.5 KiB beyond their blob (the metadata is held twice, as fields and as the signed bytes, plus two index "
        "entries); a 5 MiB blob lands in a larger allocator size class (26% over). `--store-max-mb` counts the bytes of each plan's "
        "fields (blob, metadata, signature): give Redis that much memory again as headroom for small plans.",
        "",
        "![store overhead](../bench/results/store_overhead.png)",
        "",
    ]
    return out


def herd_section(herd: dict, baseline: dict | None = None, extra: dict[str, dict] | None = None) -> list[str]:
    """bench/results/herd.json (bench/herd.py); `baseline`: the same benchmark on the old server;
    `extra`: other runs of it (label -> results) shown in one comparison table."""
    c, m = herd["config"], herd["machine"]
    out = [
        "## Rollout herd (`make herd`)\n",
        f"Machine: {m['cpus']} cores, Python {m['python']}, grpcio {m['grpcio']}, loopback; {c['build_seconds']} s stand-in builds, signed plans.",
        f"{c['nodes']} simulated nodes (coroutines on grpc.aio in {c['processes']} client processes at nice {c.get('client_nice', 0)}, each node its own "
        "channel and TCP connection, each plan decoded and checked (sha256, signature) as plancache.Client does) start at one instant and each needs "
        f"the same {c['plans']} plans, none stored yet, from one gateway with ONE compile worker: by one Prefetch call (`prefetch`), by one "
        f"Compile call per plan in a random order (`compile`), or as {c['burst']} simultaneous Compile calls of one new spec (`burst`). "
        f"Meanwhile a probe process fetches an already stored plan every {c['probe_interval'] * 1e3:g} ms (open loop), {c['idle_seconds']:g} s "
        "before the herd (idle) and during it; builds per key come from the stand-in's build log. The nodes run at a lower CPU priority "
        "because they stand for other machines; the runs below at nice 0 show them as the server's equals on the same two cores.\n",
    ]
    if herd.get("note"):
        out.append(f"Note: {herd['note']}\n")
    out += ["| variant | measure | value | target | met |", "|---|---|---|---|---|"]
    for name, v in herd["variants"].items():
        for i, (measure, value, target, met) in enumerate(v["summary"]):
            shown = f"{value:.3g}" if isinstance(value, float) else str(value)
            ok = yes(met) if isinstance(met, bool) else "—"
            out.append(
                f"| {name if i == 0 else ''} | {measure} | {shown} | {'—' if target == '-' else target} | {ok} |"
            )
    if herd.get("skipped"):
        out.append(f"\nSkipped for lack of time: {', '.join(herd['skipped'])}.")
    runs = {"thread-pool gateway (before, aa36b05)": baseline} if baseline else {}
    runs |= {"asynchronous gateway": herd, **(extra or {})}
    out += [
        "",
        "Side by side (same machine, same benchmark and harness — the before row ran this bench/herd.py against the gateway of "
        "commit aa36b05 — each run with its own idle probe):\n",
        "| run | variant | errors | last node after last build (s) | probe p99 idle → during (ms) | probe max during (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for label, run in runs.items():
        if run is None:
            continue
        for name, v in run["variants"].items():
            probe = v["probe"]
            out.append(
                f"| {label} ({run['config']['nodes']} nodes, nice {run['config'].get('client_nice', 0)}) | {name} | {v['errors_total']} | "
                f"{v['last_done_minus_last_build_s']:.2f} | {probe['idle']['p99_ms']:.1f} → {probe['during']['p99_ms']:.1f} | {probe['during']['max_ms']:.0f} |"
            )
    out += [
        "",
        "![probe latency during the herd](../bench/results/herd.png)",
        "",
        "What the targets say, on this machine: every key built once, no errors and no CANCELLED in any variant; with Prefetch every node "
        "had its plans within 0.3 s of the last build's end at 1,000 nodes (0.14 s at 300, target 1 s); the probe's p99 stayed under "
        "20 ms at 1,000 nodes with the nodes at nice 10, and under twice its idle p99 in the burst, but not during the 13 s herds (idle "
        "p99 3.7-4.5 ms, during 8.7-12.4 ms); with the nodes at nice 0 it read 23-29 ms: on two cores the simulated fleet's own CPU "
        "(each plan decoded and verified) is what a probe competes with. One Compile per plan in sequence leaves each node its remaining "
        "plans to fetch one call at a time after the last build: 2.6 s at 1,000 nodes (0.79 s at 300), the clients' own pace.\n",
        'Reproduce: `make herd` (writes `bench/results/herd.json` and `.png`; `make herd ARGS="--nodes 300"` for a smaller herd, '
        '`ARGS="--client-nice 0"` for nodes as the server\'s equals); `python bench/herd.py --quick --out DIR` for a short run.\n',
    ]
    return out


def _secs(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f} s"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def functional_section(fu: dict, run_record: str) -> list[str]:
    """bench/results/functional.json (bench/functional.py)."""
    s, d = fu["summary"], fu["decode_step"]
    target = fu.get("targets", {}).get("over_raw", 1.2)
    out = [
        f"## Torch-style functions (`bench/functional.py`; [{run_record}](gpu-runs/{run_record}))\n",
        "Host µs per call of each `plancache.functional` function after its first call (the plan found in the per-process table, "
        "the caller's tensors packed by uid, the output allocated as torch's functions do), against the frontend's own execute of the "
        "same plan (`raw`; `raw+alloc` with the same output allocation) and torch's own call; median of 5 interleaved samples.\n",
        "| case | functional | raw | raw + alloc | torch | over raw | over raw + alloc | over torch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    over_alloc = []
    for r in fu["rows"]:
        h = r["host_us"]
        over_alloc.append(h["functional"] / h["raw+alloc"])
        out.append(
            f"| {r['case']} | {h['functional']:.1f} | {h['raw']:.1f} | {h['raw+alloc']:.1f} | {h['torch']:.1f} | {r['over_raw']:.2f}x | {over_alloc[-1]:.2f}x | {r['over_torch']:.2f}x |"
        )
    gpu = d["gpu_ms"]
    out += [
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| host time per call / raw execute, median (worst) | {s['over_raw_median']:.2f}x ({s['over_raw_max']:.2f}x) | — (issue 24's target, ≤ {target:g}x) | — |",
        f"| host time per call / (raw execute + the output's allocation), median (worst) | {statistics.median(over_alloc):.2f}x ({max(over_alloc):.2f}x) | "
        f"≤ {target:g}x (issue 30) | {yes(max(over_alloc) <= target)} |",
        f"| decode step ({d['config']['layers']} layers, batch {d['config']['batch']}, paged KV), GPU ms: functions eager / torch eager | "
        f"{gpu['functional eager']:.2f} / {gpu['torch eager']:.2f} | no slower than torch eager | {yes(gpu['functional eager'] <= gpu['torch eager'])} |",
        f"| the same step replayed as one CUDA graph: functions / torch | {gpu['functional captured']:.2f} / {gpu['torch captured']:.2f} ms | — | — |",
        f"| decode step's output against torch eager ({d['dtype']}) | relative error {d['rel_err_vs_torch']:.2e} | — | — |",
        "",
        "![functions](../bench/results/functional.png)",
        "",
    ]
    return out


def _num(value: object, digits: int = 1, suffix: str = "") -> str:
    """A figure of a JSON that may lack it (a case that failed): "—" for None or NaN."""
    if not isinstance(value, int | float) or math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}{suffix}"


def _sci(value: object) -> str:
    return _num(value) if _num(value) == "—" else f"{value:.1e}"


def _last_line(text: object, limit: int = 200) -> str:
    """The last non-empty line of an error text (a traceback's exception), shortened."""
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return lines[-1][:limit] if lines else "—"


TRAINING_STEP_VARIANTS = ("functional eager", "torch eager", "functional captured", "torch captured")
TRAINING_HOST_PATHS = ("functional", "raw", "raw+alloc", "raw ordered", "raw ordered+alloc", "torch")


def training_section(tr: dict, run_record: str) -> list[str]:
    """bench/results/training.json (bench/training.py): training steps, per-function costs with and without autograd, start-up."""
    steps, rows, s = tr.get("steps") or {}, tr.get("functions") or [], tr.get("summary") or {}
    target = (tr.get("targets") or {}).get("over_raw_alloc", 1.2)
    out = [
        f"## Training steps (`bench/training.py`; [{run_record}](gpu-runs/{run_record}))\n",
        "plancache.functional with autograd (issue 30): a function called on a tensor that requires grad runs a served training-forward "
        "plan inside a torch.autograd.Function whose backward runs served backward plans. Plans built in the benchmark's process by the "
        f"worker's compiler ({'autotuned: what the service serves once tuned' if (tr.get('config') or {}).get('autotune') else 'heuristic plan'}), "
        "as `bench/functional.py` does. Two models, written once and run with plancache.functional and "
        "with torch eager from the same parameters, AdamW (capturable) in both: a pre-norm transformer block (RMSNorm, QKV linear, causal "
        "SDPA, output linear, residual; RMSNorm, linear + GELU, linear, residual; batch 8, sequence 512, hidden 1024, 16 heads, MLP 4096, "
        "bf16) and a ResNet basic block (conv3x3, batch norm in training, ReLU, conv3x3, batch norm, residual, ReLU; 32x64x56x56 "
        "channels-last bf16, float32 batch norm parameters). GPU ms per step: CUDA events around 10 steps, median of the interleaved rounds; "
        "*captured*: the whole step (forward, backward, optimizer) replayed as one CUDA graph. Errors: the first step's loss, and the worst "
        "gradient (max |ours - torch| / max |torch|), against torch eager.\n",
        "| model | functional eager | torch eager | functional captured | torch captured | eager: functional / torch | captured: functional / torch | loss rel. error | worst gradient rel. error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    failures = []
    for model, st in steps.items():
        gpu, ratio = st.get("gpu_ms") or {}, st.get("functional_over_torch") or {}
        cells = [_num(gpu.get(v), 2, " ms") for v in TRAINING_STEP_VARIANTS]
        cells += [
            _num(ratio.get("eager"), 2, "x"),
            _num(ratio.get("captured"), 2, "x"),
            _sci(st.get("loss_rel_err")),
            _sci(st.get("grad_rel_err_max")),
        ]
        out.append(f"| {model} | {' | '.join(cells)} |")
        failures += [f"{model} {what}: {_last_line(text)}" for what, text in (st.get("errors") or {}).items()]
        fallbacks = st.get("torch_fallbacks") or {}
        if fallbacks:
            failures.append(
                f"{model}: torch ran " + ", ".join(f"{name} ({c.get('torch')} calls)" for name, c in fallbacks.items())
            )
    if failures:
        out += ["", "Not measured or not served: " + "; ".join(failures) + "."]
    good = [r for r in rows if "host_us" in r]
    out += [
        "",
        "Per function, at the same sizes: host µs per call after the geometry's first call (the first 32 of N back-to-back calls from an "
        "idle GPU, median of the interleaved samples), without autograd against the frontend's own execute of the same plan on the buffers "
        "the function packed, in its mapping form (`raw`: `graph.execute({uid: tensor}, workspace, handle=)`) and its ordered form "
        "(`raw ordered`: `graph.execute(buffers, workspace, handle=, tensor_uids=)`, what plancache.functional calls), each also with the "
        "outputs allocated as a function must (`+ alloc`), and torch's own call.\n",
        "| case | functional | raw | raw + alloc | raw ordered | ordered + alloc | torch | / (raw + alloc) | / (ordered + alloc) | / torch |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in good:
        h = r["host_us"]
        out.append(
            f"| {r['case']} | {' | '.join(_num(h.get(p)) for p in TRAINING_HOST_PATHS)} | {_num(r.get('over_raw_alloc'), 2, 'x')} | "
            f"{_num(r.get('over_ordered_alloc'), 2, 'x')} | {_num(r.get('over_torch'), 2, 'x')} |"
        )
    for r in rows:
        if "host_us" not in r:
            out.append(f"| {r.get('case', '?')} | failed: {_last_line(r.get('error'))} |" + " |" * 8)
    out += [
        "",
        "With autograd (forward + `torch.autograd.grad` against a fixed dY) host µs per call, and GPU µs per call from a CUDA graph of 20 "
        "calls (the kernels alone), forward and forward + backward, against torch's:\n",
        "| case | fwd + bwd host µs | torch | / torch | GPU µs fwd | torch | GPU µs fwd + bwd | torch | output rel. error | gradient rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in good:
        hg, g, gg = r.get("host_us_grad") or {}, r.get("gpu_us") or {}, r.get("gpu_us_grad") or {}
        cells = [
            _num(hg.get("functional")),
            _num(hg.get("torch")),
            _num(r.get("grad_over_torch"), 2, "x"),
            _num(g.get("functional")),
            _num(g.get("torch")),
            _num(gg.get("functional")),
            _num(gg.get("torch")),
            _sci(r.get("rel_err")),
            _sci(r.get("grad_rel_err")),
        ]
        out.append(f"| {r['case']} | {' | '.join(cells)} |")
    partial = [f"{r['case']}: {', '.join(sorted(r['errors']))}" for r in good if r.get("errors")]
    if partial:
        out += ["", "Parts of a case not measured (the JSON has why): " + "; ".join(partial) + "."]
    worst, worst_ordered = s.get("over_raw_alloc_max"), s.get("over_ordered_alloc_max")
    out += [
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| host time per call / (raw + alloc), median (worst) | {_num(s.get('over_raw_alloc_median'), 2, 'x')} ({_num(worst, 2, 'x')}) | ≤ {target:g}x | "
        f"{'—' if _num(worst) == '—' else yes(worst <= target)} |",
        f"| host time per call / (raw ordered + alloc), median (worst) | {_num(s.get('over_ordered_alloc_median'), 2, 'x')} ({_num(worst_ordered, 2, 'x')}) | — | — |",
    ]
    st = tr.get("startup")
    if st and st.get("summary"):
        config = st.get("config") or {}
        out += [
            "",
            f"Start-up (`--startup`): a real deployment (Redis, plancache-server, one GPU worker; JIT cache {config.get('jit', 'inherited')}). Each "
            "path is a fresh process whose clock starts after its imports, the CUDA context and the model, optimizer and batch, and stops "
            "when its first training step (forward, backward, AdamW) is done: plancache.functional with nothing stored (the worker builds "
            f"every plan), with every plan stored (the worker stopped; `Client(server, cache=False)`), with every plan stored and "
            "`pf.prefetch()` of the manifest the first run wrote called right after the imports (the plans fetched and loaded on a "
            "background thread while the process makes its CUDA context and model: docs/functional.md's start-up), and torch eager; medians of "
            f"up to {config.get('repeats', '?')} runs (the first: one run). Of a plancache step, the seconds its first calls spent fetching "
            "plans (with verification) and deserializing them.\n",
            "| model | first step, nothing stored | every plan stored (fetch + deserialize of it) | stored, prefetched | torch eager | stored / torch | prefetched / torch |",
            "|---|---|---|---|---|---|---|",
        ]
        for model, e in st["summary"].items():
            first = e.get("first_step_s") or {}
            phases = [
                r.get("first_step_phases_s") or {}
                for r in st.get("runs", [])
                if r.get("model") == model and r.get("label") == "stored"
            ]
            spent = (
                f" ({_num(phases[0].get('fetch'), 2, ' s')} + {_num(phases[0].get('deserialize'), 2, ' s')})"
                if phases
                else ""
            )
            out.append(
                f"| {model} | {_num(first.get('first (nothing stored)'), 2, ' s')} | {_num(first.get('stored'), 2, ' s')}{spent} | "
                f"{_num(first.get('stored, prefetched'), 2, ' s')} | {_num(first.get('torch'), 2, ' s')} | {_num(e.get('stored_over_torch'), 2, 'x')} | "
                f"{_num(e.get('prefetched_over_torch'), 2, 'x')} |"
            )
        if st.get("skipped"):
            out.append(f"\nSkipped for lack of time: {', '.join(st['skipped'])}.")
    elif st and st.get("error"):
        out += ["", f"Start-up (`--startup`) failed: {_last_line(st['error'])}."]
    out += ["", "![training](../bench/results/training.png)", ""]
    return out


def torch_mode_cost_section(tc: dict) -> list[str]:
    rows = tc["rows"]
    lines = [
        "## plancache.torch's host cost per call (issue 42, item 3; `bench/torch_mode_cost.py`, CPU)\n",
        "What the route itself costs the host, on tiny CPU tensors (the kernels' own time small), on the 2-core "
        f"development machine, torch {tc.get('torch', '?')}: medians of {tc['args']['rounds']} interleaved rounds of "
        f"{tc['args']['calls']:,} calls ([torch_mode_cost.json](../bench/results/torch_mode_cost.json), "
        "[torch_mode_cost.png](../bench/results/torch_mode_cost.png)). Runs on this shared machine differ by up to 2x; "
        "the three runs of its session added 2-9 µs (not routed), 19-35 µs (left to torch) and 11-24 µs (an operator).\n",
        "| per call | plancache µs | torch µs | added µs |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} ({r['what']}) | {r['plancache_us']:.1f} | {r['torch_us']:.1f} | {r['added_us']:.1f} |"
        )
    lines += [
        "",
        "Every torch call a model makes under the mode pays the first rows' cost (a TorchFunctionMode is Python); a "
        "compiled program pays an operator's per plancache operator outside a CUDA graph (under "
        '`mode="reduce-overhead"` none: the graph replays). Defined with `torch.library.custom_op` an operator added '
        "37-48 µs; they are now defined through `torch.library.Library` (the same schema, fake implementation and "
        "autograd) without custom_op's per-call Python wrapper. What a routed call costs on the GPU against torch's "
        "function is for the H200 run (`bench/torch_models.py`), not run yet.\n",
    ]
    return lines


def families_section(fa: dict, run_record: str) -> list[str]:
    """bench/results/families.json (bench/families.py): 50 new shapes in a fresh process, three ways."""
    s, families = fa.get("summary") or {}, fa.get("families") or {}
    out = [
        f"## Shapes that vary: graph families (`bench/families.py`; [{run_record}](gpu-runs/{run_record}))\n",
        "A real deployment (Redis, plancache-server, one H200 worker). A fresh process meets 50 new shapes, bf16, through "
        "plancache.functional: *decode*, a decode step (RMSNorm, query projection, paged decode attention with 16 query heads over 8 KV heads, "
        "MLP up with GELU and down: 5 graphs) at 50 distinct batch sizes of 1..128; *prefill*, causal SDPA [1, 16, S, 128] at 50 distinct "
        "lengths of 16..1024. Each shape's time is to its first execution (the step synchronized). Paths: *local*, the frontend building "
        "each graph in the process (cuDNN's heuristic plan; it also serializes and reloads it, 1-4 ms); *plancache*, today's (one key per "
        "shape, nothing stored: misses, the hedge on); *family*, each graph's family stored first (decode: every batch size 1..128; "
        "prefill: lengths padded to the next multiple of 64 with `pf.set_buckets`, the family the 16 bucket sizes). Every path asks for "
        "heuristic plans (tuning the families' graphs does not fit the run); the family plans' GPU time is compared with the exact "
        "shape's autotuned plan at a few sizes.\n",
        "| workload | path | 50 shapes, total | first shape | median new shape | worst new shape | a known shape |",
        "|---|---|---|---|---|---|---|",
    ]
    for workload, entry in s.items():
        for path in ("local", "plancache", "family"):
            e = entry.get(path)
            if e:
                out.append(
                    f"| {workload} | {path} | {_num(e.get('total_s'), 2, ' s')} | {_num(e.get('first_shape_ms'), 0, ' ms')} | "
                    f"{_num(e.get('median_new_shape_ms'), 1, ' ms')} | {_num(e.get('max_new_shape_ms'), 0, ' ms')} | {_num(e.get('known_shape_ms'), 2, ' ms')} |"
                )
    out += [
        "",
        "| workload | local / family (total) | today's plancache / family | family: ms per new graph (median) | new shapes ≤ 20 ms per graph | "
        "family plan / exact tuned plan (GPU) | padding waste | family built on the worker |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload, entry in s.items():
        ratios = entry.get("family_over_tuned") or []
        within = (
            f"{entry.get('family_new_shapes_within_target')} of {entry.get('family_new_shapes')}"
            if entry.get("family_new_shapes")
            else "—"
        )
        built = families.get(workload) or {}
        out.append(
            f"| {workload} | {_num(entry.get('local_over_family_total'), 1, 'x')} | {_num(entry.get('plancache_over_family_total'), 1, 'x')} | "
            f"{_num(entry.get('family_median_ms_per_graph'), 1, ' ms')} | {within} | "
            f"{', '.join(f'{r:.2f}x' for r in ratios) or '—'} | {_num(100 * ((entry.get('buckets') or {}).get('waste') or 0.0), 1, ' %')} | "
            f"{built.get('graphs', '—')} graphs in {_num(built.get('build_s'), 1, ' s')} |"
        )
    out += ["", "![families](../bench/results/families.png)", ""]
    return out


def upgrade_section(up: dict) -> list[str]:
    """bench/results/upgrade.json (bench/upgrade.py)."""
    c, m, s = up["config"], up["machine"], up["summary"]
    plan = (
        "on its own once idle for `--warm-after-idle` " + f"{c['warm_after_idle']:g} s"
        if c.get("plan", "auto") == "auto"
        else "by an operator's `Client.warm` as it appeared"
    )
    out = [
        "## Upgrade rehearsal (`make upgrade`)\n",
        f"Machine: {m['cpus']} cores, Python {m['python']}, loopback; stand-in builds, unsigned plans. A store holds {c['specs']} plans of target A with a "
        f"Zipf hit history (s = {c['zipf']:g}, {s['source_hits']:,} hits in the current hour, rank = spec); then a worker of target B appears and a node of "
        f"B starts every {c['node_interval']:g} s for {c['node_seconds']:g} s, each needing {c['specs_per_node']} distinct specs drawn from the same law "
        "(one Prefetch with compile_missing; a request is a hit when its plan was stored before the node asked). A and B are the stand-in worker's two "
        "targets, as a GPU worker serves them: A = the generic target (compute capability, cuDNN and frontend versions), B = the exact one (device and "
        "SM count); a worker of B warming it from A's history is what a GPU host does after a first node's generic compiles, and the same code path as "
        f"an upgrade's new versions. The run with warming lets the worker plan it {plan} (the product's default path for a new target is the "
        "worker's own, after `--warm-after-idle` idle, 10 s by default); the run without passes `--no-warm`; both are otherwise identical (same draws, fresh Redis, one gateway, one "
        f"stand-in worker with `--build-processes {c['build_processes']}`: one process kept for heuristic plans, one for candidates and warming, where "
        f"this 2-core machine's default is 1). A spec costs {c['build_seconds']:g} s for its heuristic plan and {c['tune_seconds']:g} s for "
        f"{c['candidates'] - 1} more candidates: {s['per_spec_build_s']:.2f} s on one process, {s['top_k_build_s']:.0f} s for the top {s['top_k']}. "
        f"Each run ends {c['max_seconds']:g} s after the worker is up at the latest. Two small runs beside: real misses for A (a Compile of a new spec "
        "for A) on an idle worker, then while a warm build of B is in flight (warming planned by an operator, nothing else running); and warming "
        f"under `--store-max-mb {up['bound']['bound_mb']}` with A's plans filling most of the bound.\n",
        "| measure | value | target | met |",
        "|---|---|---|---|",
    ]
    for measure, value, target, met in up["targets"]:
        out.append(
            f"| {measure} | {value} | {'—' if target == '-' else target} | {yes(met) if isinstance(met, bool) else '—'} |"
        )
    windows = s["hit_rate_by_window"]
    out += [
        "",
        "Nodes' hit rate by when they started (s from the worker of B up):\n",
        "| nodes started | " + " | ".join(f"{t:g}–{t + 10:g} s" for t, _ in windows["with"]) + " |",
        "|---|" + "---|" * len(windows["with"]),
    ]
    for name, rows in windows.items():
        out.append(f"| {name} warming | " + " | ".join(_pct(rate) for _, rate in rows) + " |")
    status, met = up["runs"]["with"].get("warm_status") or {}, s["met"]
    first, after = s.get("first_warm_item_s"), s["hit_rate_after_window"]
    if first is None or first >= c["node_seconds"]:
        planned = (
            f"The worker planned it at {_secs(s['warm_started_s'])}, when it was first idle,"
            if c.get("plan", "auto") == "auto"
            else f"It was planned at {_secs(s['warm_started_s'])},"
        )
        rollout = (
            f"- **Warming did not run during the rollout.** {planned} and took no item before the last node started: the worker was building "
            "the nodes' misses and autotuning them, and warming's lanes come after those. The hit-rate target's window is not met by warming."
        )
    else:
        w, wo = after["with"] or {}, after["without"] or {}
        top = s["top_k_stored_s"]
        rollout = (
            f"- **Warming ran during the rollout**: planned at {_secs(s['warm_started_s'])}, its first items taken at {_secs(first)}; "
            f"A's top {s['top_k']} specs were all stored for B after {_secs(top['with'])} with warming ({_secs(top['without'])} without); "
            f"nodes started from {s['window_start_s']:.1f} s on hit {_pct(w.get('hit_rate'))} of their requests "
            f"({_pct(wo.get('hit_rate'))} without warming)."
        )
    stored = [
        (x["t"], x["stored"])
        for x in up["runs"]["with"]["samples"]
        if first is not None and x["t"] >= first and x["t"] <= c["node_seconds"]
    ]
    pace = (
        (stored[-1][1] - stored[0][1]) / (stored[-1][0] - stored[0][0])
        if len(stored) > 1 and stored[-1][0] > stored[0][0]
        else None
    )
    out += [
        "",
        "![upgrade rehearsal](../bench/results/upgrade.png)",
        "",
        "Reading it:",
        rollout,
        f"- **What `warm --status` said at the end**: {status.get('in_flight', 0)} item(s) in flight, {status.get('built', 0)} built, "
        f"{status.get('skipped', 0)} skipped as already stored, coverage {_pct(status.get('coverage'))}. An item counts as built once its "
        "candidates are tuned, and warming's candidates come after every real tuning: during a rollout its heuristic plans are stored "
        "(the coverage) while the items stay in flight."
        + (
            f" Plans of B were stored at {pace:.1f} per second from warming's first item to the last node (warming's and the nodes' own "
            f"misses together; a spec's heuristic plan costs {c['build_seconds']:.2f} s)."
            if pace is not None
            else ""
        ),
        "- **A real miss for A "
        + (
            "is not delayed by warming**: with two build processes the heuristic plan of a miss goes to the process kept for heuristic plans while "
            "the warm build's candidate runs on the other, so a miss with a warm build in flight took what it takes on an idle worker."
            if met["warming_miss"]
            else "waited past the floor + one candidate with a warm build in flight** (see the table)."
        )
        + " During the rollout a miss for A waits behind the nodes' heuristic builds queued before it, with or without warming.",
        "- **Under `--store-max-mb`** "
        + (
            "warming evicted only plans it had warmed itself (each enters the store's LRU as the least recently used): A's plans and the plans of B "
            "a node had asked for all stayed"
            if met["store_bound"]
            else "warming evicted a plan it had not warmed (see the table)"
        )
        + " (tests/integration/test_warming.py checks the same on the in-process stack).",
        "",
        'Reproduce: `make upgrade` (writes `bench/results/upgrade.json` and `.png`; about 5 minutes here); `make upgrade ARGS="--plan operator"` '
        "plans warming as the worker appears; `--node-seconds`, `--max-seconds`, `--specs`, `--zipf` scale it; `python bench/upgrade.py --quick --out DIR` "
        "for a short run.\n",
    ]
    return out


def main() -> None:
    cpu = json.loads((RESULTS / "cpu_bench.json").read_text())
    gpu = json.loads((RESULTS / "gpu_bench.json").read_text())
    mg = json.loads((RESULTS / "multi_gpu.json").read_text())
    lines = [
        "# Performance\n",
        "Current figures and how to reproduce them. Every ratio is measured side by side in one run (baselines interleaved with what "
        "is measured, medians of repeats, ranges in the JSON). Raw results: `bench/results/`; this page is written from them by "
        "`python3 scripts/performance-doc.py`.\n",
        SUMMARY,
        *cpu_section(cpu),
        *(
            store_overhead_section(json.loads((RESULTS / "store_overhead.json").read_text()))
            if (RESULTS / "store_overhead.json").exists()
            else []
        ),
        *(
            startup_section(json.loads((RESULTS / "startup.json").read_text()), STARTUP_RUN)
            if (RESULTS / "startup.json").exists()
            else []
        ),
        *(
            hedge_section(
                json.loads((RESULTS / "startup_hedge.json").read_text()),
                _optional(RESULTS / "startup_hedge_shared_cpus.json"),
                _optional(RESULTS / "hedge_hits.json"),
                HEDGE_RUN,
            )
            if (RESULTS / "startup_hedge.json").exists()
            else []
        ),
        *(
            miss_section(
                json.loads((RESULTS / "startup_miss_shared.json").read_text()),
                _optional(RESULTS / "startup_miss_split.json"),
                _optional(RESULTS / "startup_workload.json"),
                _optional(RESULTS / "training_startup_workload.json"),
            )
            if (RESULTS / "startup_miss_shared.json").exists()
            else []
        ),
        *(
            report_hits_section(json.loads((RESULTS / "report_hits.json").read_text()))
            if (RESULTS / "report_hits.json").exists()
            else []
        ),
        *(
            autotune_section(json.loads((RESULTS / "autotune.json").read_text()), STARTUP_RUN)
            if (RESULTS / "autotune.json").exists()
            else []
        ),
        *(
            exec_section(json.loads((RESULTS / "gpu_exec.json").read_text()), EXEC_RUN)
            if (RESULTS / "gpu_exec.json").exists()
            else []
        ),
        *(
            variants_section(json.loads((RESULTS / "variants.json").read_text()))
            if (RESULTS / "variants.json").exists()
            else []
        ),
        *(
            functional_section(json.loads((RESULTS / "functional.json").read_text()), TRAINING_RUN)
            if (RESULTS / "functional.json").exists()
            else []
        ),
        *(
            torch_mode_cost_section(json.loads((RESULTS / "torch_mode_cost.json").read_text()))
            if (RESULTS / "torch_mode_cost.json").exists()
            else []
        ),
        *(
            training_section(json.loads((RESULTS / "training.json").read_text()), TRAINING_RUN)
            if (RESULTS / "training.json").exists()
            else []
        ),
        *(
            families_section(json.loads((RESULTS / "families.json").read_text()), FAMILIES_RUN)
            if (RESULTS / "families.json").exists()
            else []
        ),
        *gpu_section(gpu),
        *multi_gpu_section(mg),
        *(
            herd_section(
                json.loads((RESULTS / "herd.json").read_text()),
                _optional(RESULTS / "herd_sync_baseline.json"),
                {label: run for label, path in HERD_EXTRA.items() if (run := _optional(RESULTS / path)) is not None},
            )
            if (RESULTS / "herd.json").exists()
            else []
        ),
        *(
            upgrade_section(json.loads((RESULTS / "upgrade.json").read_text()))
            if (RESULTS / "upgrade.json").exists()
            else []
        ),
        "## Reproduce\n",
        "- CPU: `make bench` (writes `bench/results/cpu_bench.json` and `.png`); `python bench/cpu_bench.py --quick --out DIR` for a short run.",
        "- GPU: on a machine with an NVIDIA GPU, Python 3.12 and torch: `scripts/fetch-gpu-wheels.sh` (where there is internet), then "
        "`OUT=DIR bash scripts/gpu-check.sh` (tests, then the benchmark; results and logs in DIR); `python3 scripts/gpu-report.py DIR` "
        "renders the tables of a docs/gpu-runs/ record. Two GPUs: `OUT=DIR bash scripts/multi-gpu-check.sh`.",
        "- Then copy the JSON/PNG results into `bench/results/` and run `python3 scripts/performance-doc.py`.",
    ]
    (ROOT / "docs" / "performance.md").write_text(with_contents("\n".join(lines) + "\n"))


def _optional(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


if __name__ == "__main__":
    main()

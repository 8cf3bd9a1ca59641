"""The first step of a fresh process with every plan stored: unchanged models under `plancache.torch.mode()`
(or `--plancache-by serve`: `plancache.torch.serve(model)`) against torch alone (issue 42, item 4; bench/torch_models.py measures steady steps in one process).

A real deployment (Redis, plancache-server, one GPU worker, heuristic plans: the worker is stopped once the
first runs built them, as bench/training.py --startup does). For each model of --models and each mode of
--modes (eager; compile: torch.compile(fullgraph=True), plancache.torch.compile for plancache):
- "first (nothing stored)": a fresh process under the mode, every plan a miss (plancache.torch asks for stored
  plans only: torch's function runs each call, traced into the compiled program, while the service builds them),
  then "torch (empty caches)", torch alone: both with inductor's and triton's caches empty (their own
  directories), what a new machine's first process has; the service's builds are waited for after them (one
  mode a run: a mode's first process finds the plans an earlier mode's asked for);
- then --repeats times, alternating: "stored" (a fresh process under the mode, every plan stored; the
  workload record streams them from the first touch, as a fleet node's process gets with nothing set
  but its workload name) and "torch" (a fresh process, torch alone).
Each process prints its imports, set-up (CUDA context, model, batch), first step (compile included where
compiled) and second step; the ratio is the stored first step over torch's, medians of the repeats. Each
process has an empty plan disk cache; the CUDA JIT cache is the machine's (warm after the first runs).

    python3 bench/torch_models_startup.py --out DIR [--models gpt2-256,...] [--modes eager,compile]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402

LABELS = ("first (nothing stored)", "stored", "torch", "torch (empty caches)")
KERNEL_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")  # each process's, set by startup()


def node_main(path: str, model: str, compile_mode: str, server: str, device: str = "cuda", by: str = "mode") -> None:
    """One fresh process (run by startup()): prints one JSON line. `path`: "plancache" (under the mode, or with the
    model's layers served where `by` is "serve", against `server`) or "torch". `device` "cpu": small sizes,
    nothing routed (a check that the code runs)."""
    began = time.perf_counter()
    import torch

    from bench.torch_models import workloads

    stats: Any = None
    trace_races: dict[str, float] | None = None
    context: Any
    if path == "plancache":
        import plancache.functional as pf
        import plancache.torch as pt
        from plancache import Client

        pf.configure(Client(server, cache=False, workload=f"bench-torch-models-{model}-{compile_mode}"))
        context, stats = pt.mode, pt.stats
        trace_races = _timed_trace_races()
    else:
        context = contextlib.nullcontext
    imports_s = time.perf_counter() - began
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.init()
    seq = int(model.split("-")[1]) if "-" in model else 256
    work = workloads(device, [seq], small=device == "cpu")[model]
    torch.manual_seed(0)
    net = work.make()
    batch = work.batch()
    served = path == "plancache" and by == "serve"
    if served:  # the model's layers served, no mode; compiled with torch.compile as torch's is
        net, context = pt.serve(net), contextlib.nullcontext
    # Compiled under the mode: plancache.torch.compile (the mode inside the compiled function, none around it).
    inside = path == "plancache" and compile_mode != "eager" and not served
    run = work.runner(net, compile_mode, pt.compile if inside else None)
    if inside:
        context = contextlib.nullcontext
    recompiles = _recompile_messages() if compile_mode != "eager" else []
    sync()
    setup_s = time.perf_counter() - began - imports_s
    steps = []
    profile = _first_step_profiler()
    for _ in range(2):
        started = time.perf_counter()
        if profile is not None and not steps:
            profile.enable()
        with context():
            out = run(batch)
        sync()
        steps.append(time.perf_counter() - started)
        if profile is not None and len(steps) == 1:
            profile.disable()
    result: dict[str, Any] = {
        "path": path,
        "plancache_by": by,
        "model": model,
        "mode": compile_mode,
        "imports_s": imports_s,
        "setup_s": setup_s,
        "first_step_s": steps[0],
        "second_step_s": steps[1],
        "process_to_first_step_done_s": imports_s + setup_s + steps[0],
        "value": float(out.float().mean()),
    }
    if compile_mode != "eager":
        from torch._dynamo.utils import counters

        # What a slow second step spent: a recompilation says why (GPU run 33: 4.7-8.1 s under plancache).
        result["dynamo"] = {"stats": dict(counters["stats"]), "recompiles": recompiles[:8]}
        # Where a compiled first step went (dynamo's trace, AOT autograd, inductor, ...), summed per phase: what a
        # served model adds to the cold start, phase by phase, against torch's process.
        from torch._dynamo.utils import compilation_time_metrics

        phases = {name: sum(times) for name, times in compilation_time_metrics.items()}
        result["compile_phases_s"] = {name: s for name, s in phases.items() if s >= 0.005}
    if stats is not None:
        import dataclasses

        import plancache

        result["routes"] = {
            name: {
                "routed": s.routed,
                "left": s.left,
                "left_compiled": sorted(s.left_compiled),
                "cudnn": s.cudnn,
                "torch": s.torch,
            }
            for name, s in stats().items()
        }
        result["workload"] = dataclasses.asdict(plancache.workload_stats())
    if trace_races is not None:
        result["trace_races"] = trace_races
    if profile is not None:
        result["first_step_profile"] = _top_functions(profile)
    print(json.dumps(result), flush=True)


def _first_step_profiler() -> Any:
    """PLANCACHE_BENCH_PROFILE=1: a cProfile of the first step (where a process's first step went, by function)."""
    if os.environ.get("PLANCACHE_BENCH_PROFILE") != "1":
        return None
    import cProfile

    return cProfile.Profile()


def _top_functions(profile: Any, count: int = 40) -> list[list[Any]]:
    """The profile's functions by cumulative seconds: [cumulative s, own s, calls, where]."""
    import pstats

    stats = pstats.Stats(profile)
    rows = [
        [
            round(cumulative, 4),
            round(own, 4),
            calls,
            f"{path.rsplit('/', 2)[-1] if '/' in path else path}:{line}:{name}",
        ]
        for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    return sorted(rows, key=lambda r: -r[0])[:count]


def _timed_trace_races() -> dict[str, float]:
    """How many traced calls plancache raced as torch.compile traced them, and the seconds those races took (a
    compiled cold start's share that is plancache's own, GPU run 53: stored 1.22x torch's first step)."""
    from plancache.torch import _mode

    races = {"count": 0, "seconds": 0.0}
    real = _mode._race_traced_call

    def timed(*args: Any) -> Any:
        started = time.perf_counter()
        try:
            return real(*args)
        finally:
            races["count"] += 1
            races["seconds"] += time.perf_counter() - started

    _mode._race_traced_call = timed
    return races


def _recompile_messages() -> list[str]:
    """Dynamo's recompilation reasons in this process, as they are logged (a list that fills)."""
    import logging

    import torch

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if "ecompil" in text and text[:600] not in messages:  # it reaches both loggers
                messages.append(text[:600])

    torch._logging.set_logs(recompiles=True)
    for name in ("torch._dynamo.guards.__recompiles", "torch._dynamo"):
        logging.getLogger(name).addHandler(Keep())
    return messages


def startup(
    out: Path,
    models: list[str],
    modes: list[str],
    repeats: int,
    time_limit: float,
    by: str = "mode",
    cold_pairs: int = 1,
    profile_first_step: bool = False,
) -> dict[str, Any]:
    from bench import startup_deploy as deploy
    from plancache import Client
    from plancache.trust.signing import generate_keypair
    from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
    from tests.support.processes import child_env, server_process, trusting_env, worker_process

    deadline = time.monotonic() + time_limit
    tmp = Path(tempfile.mkdtemp(prefix="plancache-torch-startup-"))
    private_key, public_key = generate_keypair(tmp / "keys")
    result: dict[str, Any] = {
        "config": {
            "models": models,
            "modes": modes,
            "repeats": repeats,
            "time_limit_s": time_limit,
            "by": by,
            "cold_pairs": cold_pairs,
        },
        "runs": [],
        "skipped": [],
    }

    kernel_caches: dict[tuple[str, str], dict[str, str]] = {}

    def node(path: str, model: str, compile_mode: str, label: str, address: str, repeat: int) -> None:
        if time.monotonic() > deadline:
            result["skipped"].append(f"{label}/{model}/{compile_mode}")
            return
        env = {**trusting_env(public_key), "PLANCACHE_CACHE_DIR": tempfile.mkdtemp(prefix="disk-cache-", dir=tmp)}
        # A new machine's first processes: inductor's and triton's caches empty, each its own. The pairs after them
        # use the caches the first plancache process filled (its compiled graph is torch's where torch's functions
        # run every call: GPU run 56's first pair, on the machine's own empty cache, compiled afresh).
        if profile_first_step:
            env["PLANCACHE_BENCH_PROFILE"] = "1"
        if label in (LABELS[0], LABELS[3]):
            caches = {name: tempfile.mkdtemp(prefix=f"{name.lower()}-", dir=tmp) for name in KERNEL_CACHES}
            if label == LABELS[0]:
                kernel_caches[(model, compile_mode)] = caches
        else:
            caches = kernel_caches.get((model, compile_mode), {})
        env.update(caches)
        args = [sys.executable, str(Path(__file__).resolve()), "--node", path, "--model", model]
        args += ["--modes", compile_mode, "--server", address, "--plancache-by", by]
        started = time.monotonic()
        row: dict[str, Any] = {"label": label, "model": model, "mode": compile_mode, "repeat": repeat}
        try:
            left = max(30.0, deadline - time.monotonic() + 60.0)
            proc = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=left, check=False)
            if proc.returncode != 0:
                row["error"] = proc.stderr[-2000:]
            else:
                row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        except Exception as e:  # one process that fails or hangs is reported, the others still run
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
        row["wall_s"] = time.monotonic() - started
        result["runs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)})[:400], flush=True)
        write_json(out / "torch_models_startup.json", result)

    redis = EmbeddedRedis(
        tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    try:
        address = f"127.0.0.1:{free_port()}"
        server_args = ("--gpus", "none", "--signing-key", str(private_key), "--data-dir", str(tmp / "server-data"))
        with server_process(address, redis.url, out / "torch-startup-server.log", *server_args, env=child_env()):
            log = out / "torch-startup-worker.log"
            with worker_process(
                redis.url, log, "--device", "0", "--signing-key", str(private_key), "--no-warm", env=child_env()
            ) as worker:
                target_id, _ = deploy.wait_for_pool(log, worker, address)
                for cold in range(cold_pairs):
                    if cold:  # nothing stored again: every plan the last pair's builds stored, tuned, forgotten
                        result.setdefault("emptied", []).append(deploy.wait_builds_settled(redis.url, tuned=True))
                        with Client(address, cache=False) as admin:
                            admin.admin.invalidate(target=target_id)
                    for compile_mode in modes:
                        for model in models:
                            pair = [("plancache", LABELS[0]), ("torch", LABELS[3])]
                            for path, label in pair if cold % 2 == 0 else pair[::-1]:
                                node(path, model, compile_mode, label, address, -1 - cold)
                # The builds the first processes asked for and did not wait for, stored before the worker stops.
                result["builds_settled"] = deploy.wait_builds_settled(redis.url)
                worker.kill()  # it would tune what it built: the stored plans are the heuristic ones
            for repeat in range(repeats):
                for compile_mode in modes:
                    for model in models:
                        # Alternating which of a pair runs first: inductor's and the OS's caches warm for the second.
                        pair = [("plancache", LABELS[1]), ("torch", LABELS[2])]
                        for path, label in pair if repeat % 2 == 0 else pair[::-1]:
                            node(path, model, compile_mode, label, address, repeat)
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"[:2000]
    finally:
        redis.stop()
    result["summary"] = summarize(result["runs"])
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for row in runs:
        if "first_step_s" not in row:
            continue
        case = summary.setdefault(f"{row['model']}/{row['mode']}", {"first_step_s": {}, "to_first_step_done_s": {}})
        case["first_step_s"].setdefault(row["label"], []).append(row["first_step_s"])
        case["to_first_step_done_s"].setdefault(row["label"], []).append(row["process_to_first_step_done_s"])
    for (model, mode), pair in _pairs(runs).items():
        summary[f"{model}/{mode}"]["pairs"] = [p["stored"] / p["torch"] for p in pair.values() if len(p) == 2]
    for (model, mode), pair in _pairs(runs, cold=True).items():
        cold = [p[LABELS[0]] / p[LABELS[3]] for p in pair.values() if len(p) == 2]
        if cold:
            summary[f"{model}/{mode}"]["cold_pairs"] = cold
            summary[f"{model}/{mode}"]["paired_nothing_stored_over_torch_empty_caches"] = statistics.median(cold)
    for case in summary.values():
        case.setdefault("pairs", [])
        for what in ("first_step_s", "to_first_step_done_s"):
            case[what] = {label: statistics.median(v) for label, v in case[what].items()}
        first = case["first_step_s"]
        if case["pairs"]:
            case["paired_stored_over_torch"] = statistics.median(case["pairs"])
        if "stored" in first and "torch" in first:
            case["stored_over_torch"] = first["stored"] / first["torch"]
        if LABELS[0] in first and "torch" in first:
            case["nothing_stored_over_torch"] = first[LABELS[0]] / first["torch"]
        if LABELS[0] in first and LABELS[3] in first:  # both with inductor's caches empty
            case["nothing_stored_over_torch_empty_caches"] = first[LABELS[0]] / first[LABELS[3]]
    return summary


def _pairs(runs: list[dict[str, Any]], cold: bool = False) -> dict[tuple[str, str], dict[int, dict[str, float]]]:
    """The stored and torch first steps of each repeat (a pair ran back to back), by model and mode; `cold`: the
    nothing-stored and torch first steps with inductor's caches empty (repeats -1, -2, ...)."""
    pairs: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    labels = (LABELS[0], LABELS[3]) if cold else LABELS[1:3]
    for row in runs:
        if "first_step_s" in row and row["label"] in labels and (row.get("repeat", -1) < 0) == cold:
            pair = pairs.setdefault((row["model"], row["mode"]), {}).setdefault(row["repeat"], {})
            pair[row["label"]] = row["first_step_s"]
    return pairs


def report(result: dict[str, Any], out: Path) -> None:
    write_json(out / "torch_models_startup.json", result)
    summary = result["summary"]
    rows = [
        [
            case,
            *(f"{s['first_step_s'].get(label, float('nan')):.2f}" for label in LABELS),
            f"{s.get('stored_over_torch', float('nan')):.2f}",
            f"{s.get('paired_stored_over_torch', float('nan')):.2f} ({len(s.get('pairs', []))} pairs)",
        ]
        for case, s in summary.items()
    ]
    heads = ["model/mode", *(f"{label} s" for label in LABELS), "stored/torch (medians)", "stored/torch (paired)"]
    print(table(heads, rows))
    fig, (ax,) = figure(1)
    names = list(summary)
    width = 0.8 / len(LABELS)
    for i, label in enumerate(LABELS):
        values = [summary[n]["first_step_s"].get(label, 0.0) for n in names]
        ax.bar([x + i * width for x in range(len(names))], values, width, label=label)
    ax.set_xticks([x + width for x in range(len(names))], names, fontsize=7, rotation=20)
    ax.set_ylabel("first step of a fresh process, s (median)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("Fresh process, unchanged models: every plan stored vs torch alone", fontsize=9)
    save(fig, out / "torch_models_startup.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--models", default="resnet50_train,gpt2-256,llama-256")
    parser.add_argument("--modes", default="eager")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--plancache-by",
        choices=("mode", "serve"),
        default="mode",
        help="plancache's processes: plancache.torch.mode() or plancache.torch.serve(model)",
    )
    parser.add_argument(
        "--cold-pairs",
        type=int,
        default=1,
        help="nothing-stored processes, each beside torch's, inductor's caches empty (their order alternating; the "
        "store emptied before each after the first)",
    )
    parser.add_argument(
        "--profile-first-step", action="store_true", help="each process's first step profiled (cProfile's top 40)"
    )
    parser.add_argument("--time-limit", type=float, default=400.0, help="seconds: no new process starts after this")
    parser.add_argument("--node", choices=("plancache", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--server", default="", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node:
        node_main(args.node, args.model, args.modes, args.server, args.device, args.plancache_by)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    result = startup(
        args.out,
        models,
        modes,
        args.repeats,
        args.time_limit,
        args.plancache_by,
        args.cold_pairs,
        args.profile_first_step,
    )
    report(result, args.out)


if __name__ == "__main__":
    main()

"""Per-call cost of executing a plan on the node (issue 13), on one GPU.

For every benchmark case (bench/gpu_cases.py) and the seed's batched matmul,
in one process: the plan is built here with the cuDNN frontend (heuristic
plan: which plan runs does not change what a call costs on the host), then
five ways to run it on the same tensors are timed, interleaved, `--rounds`
rounds, medians:

- `previous`: Plan.execute as it was before (tables rebuilt per call);
- `execute`: `Plan.execute(tensors)`, every tensor checked;
- `bound`: `plan.bind(tensors)()`, checked once;
- `replay`: `plan.capture(tensors)()`, a CUDA-graph replay;
- `raw`: the frontend's own `graph.execute(pack, workspace, handle=)` on the
  same deserialized blob (the floor a bound call is held to);
- `torch`: the same computation through torch (eager).

host µs/call: perf_counter around the first 32 of N back-to-back calls from
an idle GPU (the host's cost of issuing a call, what an inference loop
pays, before the launch queue fills and calls wait for the GPU); stream µs/call:
CUDA events around the same N calls (what the stream spent per call: the
larger of the host's pace and the GPU's). N is sized so the GPU work of one
batch stays ~20 ms (no launch-queue stalls), at least 20.

Then GPU memory for 100 plans (the cases' plans, cycled): one workspace per
plan (what Plan held before) against the shared per-stream workspace.

    python bench/gpu_exec.py --out bench/results
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_cases import CASES, Case, _matmul  # noqa: E402
from bench.report import figure, save, table, write_json  # noqa: E402

SEED = "bmm_seed_8x256x512x256_fp16"
PATHS = ("previous", "execute", "bound", "replay", "raw", "torch")
HOST_CALLS = 32
TARGETS = {"bound_over_raw_host": 1.1, "replay_over_torch_host_seed": 0.5}


def build_plan(compiler: Any, case: Case, autotune: bool = False) -> Any:
    return build_spec_plan(compiler, case.spec(), autotune)


def build_spec_plan(compiler: Any, spec: Any, autotune: bool = False) -> Any:
    """The plan the worker's compiler builds for `spec` (a GraphSpec, or a PlanQuery whose spec is built) here
    (heuristic, or autotuned), as a node would get it."""
    from plancache import Plan
    from plancache.keys.options import CompileOptions
    from plancache.keys.query import PlanQuery
    from plancache_server.worker.verified_job import VerifiedJob, plan_metadata

    if isinstance(spec, PlanQuery):
        spec = spec.spec
    query = PlanQuery.of(spec, compiler.target, CompileOptions(autotune=autotune))
    compiled = list(compiler.compile_phases(query))[-1]
    return Plan(compiled.blob, plan_metadata(VerifiedJob(query), compiled, "bench", compiler.target.to_proto()))


class InProcessClient:
    """STAND-IN for plancache.Client, for the benchmarks that need no server: compiles each graph here
    with the worker's compiler (no server, no Redis); the plan a node would fetch. It takes what the
    front doors pass a client: a GraphSpec, or the PlanQuery plancache.functional makes (its key is
    recorded; the graph is built for this compiler's target)."""

    hedge = False

    def __init__(self, compiler: Any, autotune: bool = False) -> None:
        self.compiler, self.autotune = compiler, autotune
        self.compiled: list[str] = []

    def compile(
        self, spec: Any, target: Any = None, options: Any = None, *, timeout: float | None = None, **_: Any
    ) -> Any:
        from plancache.keys.options import CompileOptions
        from plancache.keys.query import PlanQuery

        graph = spec.spec if isinstance(spec, PlanQuery) else spec
        self.compiled.append(PlanQuery.of(graph, self.compiler.target, CompileOptions(autotune=self.autotune)).key)
        return build_spec_plan(self.compiler, graph, autotune=self.autotune)

    def close(self) -> None:
        pass


def tensors_for(plan: Any) -> dict[str, Any]:
    from bench.gpu_client import bind

    tensors = bind(plan)
    for t in tensors.values():
        if t.isnan().any():
            t.zero_()  # outputs are written anyway; NaN inputs can slow some kernels
    return tensors


def runners(plan: Any, tensors: dict[str, Any], case: Case) -> dict[str, Any]:
    import cudnn
    import torch

    from plancache.run.execution import handle_state, process

    state = handle_state()
    raw_graph = cudnn.pygraph()
    raw_graph.deserialize(state.handle, plan.blob)
    pack = plan._table(process()).full_pack(tensors, state.device)
    workspace = torch.empty(max(1, plan.metadata.workspace_size), device="cuda", dtype=torch.uint8)
    torch_fn = case.torch_fn(tensors)
    bound = plan.bind(tensors)
    captured = plan.capture(tensors)
    state.use(torch.cuda.current_stream().cuda_stream)  # the raw path runs on the handle's stream as it is
    return {
        "previous": previous_execute(plan, tensors),
        "execute": lambda: plan.execute(tensors),
        "bound": bound,
        "replay": captured,
        "raw": lambda: raw_graph.execute(pack, workspace, handle=state.handle),
        "torch": torch_fn,
    }


def time_path(fn: Any, count: int) -> tuple[float, float]:
    """(host µs per call, stream µs per call) over `count` back-to-back calls
    from an idle GPU. Host time is read after the first HOST_CALLS: past a
    depth of launches in flight (~55 for some captured graphs on the H200)
    a launch waits for the GPU, which is the GPU's pace, not the call's cost."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    began = time.perf_counter()
    first = min(count, HOST_CALLS)
    for _ in range(first):
        fn()
    host = time.perf_counter() - began
    for _ in range(count - first):
        fn()
    end.record()
    end.synchronize()
    return host / first * 1e6, start.elapsed_time(end) / count * 1e3


def previous_execute(plan: Any, tensors: dict[str, Any]) -> Any:
    """Plan.execute as it was before issue 13 (kept here to measure against):
    tables rebuilt, every dtype looked up and the stream set on every call,
    a workspace per plan."""
    import cudnn
    import torch

    from plancache import dtypes
    from plancache.gpu.stack import torch_dtype
    from plancache.run.gpu import cudnn_handle

    graph = plan.load()
    workspace = torch.empty(max(1, plan.metadata.workspace_size), device="cuda", dtype=torch.uint8)

    def call() -> None:
        handle = cudnn_handle()
        by_name = {b.name: b for b in plan.metadata.tensors if b.name}
        pack = {}
        for key, value in tensors.items():
            b = by_name[key]
            name = dtypes.from_proto(b.data_type, b.name) or "float"
            if (
                tuple(value.shape) != tuple(b.dim)
                or tuple(value.stride()) != tuple(b.stride)
                or value.dtype != torch_dtype(name)
            ):
                raise ValueError(key)
            pack[b.uid] = value
        for b in plan.metadata.tensors:
            if b.uid not in pack:
                pack[b.uid] = torch.full(
                    tuple(b.dim), b.scalar_value, dtype=torch_dtype(dtypes.from_proto(b.data_type, b.name) or "float")
                )
        cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
        graph.execute(pack, workspace, handle=handle)

    return call


def measure_case(name: str, case: Case, compiler: Any, rounds: int) -> dict[str, Any]:
    import torch

    plan = build_plan(compiler, case)
    tensors = tensors_for(plan)
    paths = runners(plan, tensors, case)
    for fn in paths.values():
        for _ in range(3):
            fn()
    _, gpu_us = time_path(paths["replay"], 10)
    count = max(20, min(2000, int(20_000 / max(gpu_us, 1.0))))
    samples: dict[str, dict[str, list[float]]] = {p: {"host": [], "stream": []} for p in PATHS}
    for _ in range(rounds):  # interleaved: the machine is shared and noisy
        for p in PATHS:
            host, stream = time_path(paths[p], count)
            samples[p]["host"].append(host)
            samples[p]["stream"].append(stream)
    torch.cuda.synchronize()
    medians = {p: {k: statistics.median(v) for k, v in s.items()} for p, s in samples.items()}
    return {
        "case": name,
        "calls_per_sample": count,
        "workspace_bytes": plan.metadata.workspace_size,
        "host_us": {p: medians[p]["host"] for p in PATHS},
        "stream_us": {p: medians[p]["stream"] for p in PATHS},
        "samples": samples,
        "bound_over_raw_host": medians["bound"]["host"] / medians["raw"]["host"],
        "execute_over_raw_host": medians["execute"]["host"] / medians["raw"]["host"],
        "execute_over_previous_host": medians["execute"]["host"] / medians["previous"]["host"],
        "replay_over_torch_host": medians["replay"]["host"] / medians["torch"]["host"],
        "_plan": plan,
        "_tensors": tensors,
    }


def workspace_memory(rows: list[dict[str, Any]], count: int = 100) -> dict[str, Any]:
    """GPU memory held for `count` plans: one workspace each (as before) and shared."""
    import torch

    from plancache import Plan
    from plancache.run.execution import process, workspace_bytes_held

    sources = [(r["_plan"], r["_tensors"]) for r in rows]
    plans = [
        (Plan(sources[i % len(sources)][0].blob, sources[i % len(sources)][0].metadata), sources[i % len(sources)][1])
        for i in range(count)
    ]
    process().workspaces.release()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    private = [torch.empty(max(1, p.metadata.workspace_size), device="cuda", dtype=torch.uint8) for p, _ in plans]
    before = torch.cuda.memory_allocated() - base
    del private
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for plan, tensors in plans:
        plan.execute(tensors)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated() - base
    return {
        "plans": count,
        "distinct_graphs": len(sources),
        "sum_of_workspace_needs_bytes": sum(p.metadata.workspace_size for p, _ in plans),
        "largest_need_bytes": max(p.metadata.workspace_size for p, _ in plans),
        "one_per_plan_allocated_bytes": before,
        "shared_allocated_bytes": after,
        "shared_held_bytes": workspace_bytes_held(),
    }


def report(result: dict[str, Any], out: Path) -> None:
    rows = result["rows"]
    print(
        table(
            [
                "case",
                "previous",
                "execute",
                "bound",
                "replay",
                "raw",
                "torch",
                "bound/raw",
                "replay/torch",
                "GPU µs (replay stream)",
            ],
            [
                [
                    r["case"],
                    *(r["host_us"][p] for p in PATHS),
                    r["bound_over_raw_host"],
                    r["replay_over_torch_host"],
                    r["stream_us"]["replay"],
                ]
                for r in rows
            ],
        )
    )
    print(result["summary"])
    write_json(out / "gpu_exec.json", result)
    fig, (a,) = figure(1)
    width = 0.13
    for i, p in enumerate(PATHS):
        a.bar([j + (i - 2.5) * width for j in range(len(rows))], [r["host_us"][p] for r in rows], width=width, label=p)
    a.set_yscale("log"), a.set_xticks(range(len(rows)), [r["case"] for r in rows], rotation=70, fontsize=6)
    (
        a.set_ylabel("host µs per call (median)"),
        a.set_title("Executing a plan on the node: host cost per call"),
        a.legend(fontsize=7),
    )
    save(fig, out / "gpu_exec.png")


def summarize(rows: list[dict[str, Any]], memory: dict[str, Any]) -> dict[str, Any]:
    seed = next((r for r in rows if r["case"] == SEED), None)
    return {
        "bound_over_raw_host_median": statistics.median(r["bound_over_raw_host"] for r in rows),
        "bound_over_raw_host_max": max(r["bound_over_raw_host"] for r in rows),
        "bound_over_raw_beyond_target": {
            r["case"]: round(r["bound_over_raw_host"], 3)
            for r in rows
            if r["bound_over_raw_host"] > TARGETS["bound_over_raw_host"]
        },
        "execute_over_raw_host_median": statistics.median(r["execute_over_raw_host"] for r in rows),
        "execute_over_previous_host_median": statistics.median(r["execute_over_previous_host"] for r in rows),
        "seed": None
        if seed is None
        else {
            "host_us": seed["host_us"],
            "replay_over_torch_host": seed["replay_over_torch_host"],
            "bound_over_raw_host": seed["bound_over_raw_host"],
        },
        "memory": memory,
        "targets": TARGETS,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", nargs="*", default=[SEED, *CASES])
    args = parser.parse_args()
    import torch

    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    torch.cuda.init()
    compiler = CudnnCompiler(0)
    cases = {SEED: _matmul(SEED, 8, 256, 512, 256, "half"), **CASES}
    rows, errors = [], {}
    for name in args.cases:
        try:
            rows.append(measure_case(name, cases[name], compiler, args.rounds))
            print(name, {p: round(v, 1) for p, v in rows[-1]["host_us"].items()}, flush=True)
        except Exception as e:  # one case's failure is reported, not the run's
            errors[name] = f"{type(e).__name__}: {e}"
            print(name, "failed:", errors[name], flush=True)
    memory = workspace_memory(rows) if rows else {}
    for r in rows:
        del r["_plan"], r["_tensors"]
    result = {
        "rows": rows,
        "errors": errors,
        "summary": summarize(rows, memory) if rows else {},
        "device": torch.cuda.get_device_name(0),
    }
    report(result, args.out)


if __name__ == "__main__":
    main()

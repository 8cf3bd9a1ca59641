"""One node's start-up in a fresh process (run by bench/startup.py).

After its imports, the CUDA context, the cuDNN handle (with cuBLASLt loaded)
and its input tensors (a node needs all of those with or without plancache;
a local build's compiler is made then too), the clock starts; it stops when
every graph of bench/startup_graphs.py has produced its first output (one
synchronize at the end). Paths:

  local-heuristic   build each graph with the frontend, its first plan (what a node does alone)
  local-autotuned   build every candidate, time each 3 times in a plain loop, run the fastest
  fetch             one GetPlan per plan, deserialize, execute
  prefetch          one streamed Prefetch for all plans, then deserialize and execute
  background        prefetch_in_background(load=True) while a simulated weight load runs
                    (--foreground-s of sleep); then execute each plan
  floor             the frontend's own deserialize of the same blobs from a local file, execute
  first-compile     nothing stored: one client.compile(spec) per graph, in order, each plan
                    (provisional or not) executed as soon as it returns
  first-lazy        the same with a --lazy-s "layer" (a sleep) after each graph's execute,
                    the last one's included, before the next compile
  first-prefetch    nothing stored: one Prefetch with compile_missing; each plan is executed
                    as it arrives

With --share I/N the process runs only graphs I, I+N, I+2N ... (one of N
processes of a node; the parent runs them side by side). With --barrier DIR
(the parent's start for processes it runs together, and for first-* paths
whose worker starts meanwhile) the process writes DIR/ready-I after its
set-up, waits for DIR/go, which holds the wall-clock time the parent let
them all go, and that time is its clock's start; every time it reports is
from it, and `end_wall` is the wall-clock time its last output was done.

Per graph (graph order, None for graphs of other shares): `runnable_s`, when
the node held a plan it could run (a local build returned; compile or the
prefetch handed it over), and `output_s`, when its first output was produced
(a CUDA event after its execute, read after the final synchronize). When the
tuned plans were stored is measured by the parent (bench/startup.py).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

IMPORT_STARTED = time.perf_counter()

import cudnn  # noqa: E402
import torch  # noqa: E402

from bench.startup_graphs import read_blobs, startup_graphs  # noqa: E402
from plancache import Client, Manifest, ManifestEntry, Plan  # noqa: E402
from plancache.keys.target import Target  # noqa: E402
from plancache.run.gpu import cudnn_handle, detect_target, torch_dtype  # noqa: E402
from plancache.spec.graph import GraphSpec  # noqa: E402
from plancache.spec.validation import normalize  # noqa: E402

PATHS = ("local-heuristic", "local-autotuned", "fetch", "prefetch", "background", "floor", "first-compile", "first-lazy", "first-prefetch")
BARRIER_POLL_S = 0.001


class Clock:
    """Seconds since the clock's start: this process's start, or the parent's `go` time."""

    def __init__(self, go_wall: float | None = None) -> None:
        now_wall, self._origin = time.time(), time.perf_counter()
        self.go_wall = now_wall if go_wall is None else go_wall
        self._offset = now_wall - self.go_wall  # how late this process saw the go (0 without a barrier)
        self._start_event = torch.cuda.Event(enable_timing=True)
        self._start_event.record()
        self._events: dict[int, torch.cuda.Event] = {}

    def now(self) -> float:
        return self._offset + time.perf_counter() - self._origin

    def output_done(self, index: int) -> None:
        """Marks graph `index`'s output on the stream (read by outputs() after the final synchronize)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events[index] = event

    def outputs(self) -> dict[int, float]:
        return {i: self._offset + self._start_event.elapsed_time(e) / 1e3 for i, e in self._events.items()}


def wait_for_go(barrier: Path, index: int) -> float:
    (barrier / f".ready-{index}").write_text(str(os.getpid()))
    os.replace(barrier / f".ready-{index}", barrier / f"ready-{index}")
    go = barrier / "go"
    while not go.exists():
        time.sleep(BARRIER_POLL_S)
    return float(go.read_text())


def bind(spec: GraphSpec) -> dict[int, torch.Tensor]:
    tensors = {}
    for t in spec.tensors:
        if t.is_virtual:
            continue
        assert t.uid is not None and t.data_type is not None
        x = torch.empty_strided(t.dim, t.stride, dtype=torch_dtype(t.data_type), device="cuda")
        x.fill_(float("nan")) if t.is_output else x.normal_()
        tensors[t.uid] = x
    return tensors


def workspace(size: int) -> torch.Tensor:
    return torch.empty(max(1, size), device="cuda", dtype=torch.uint8)


def local(compiler: object, specs: dict[int, GraphSpec], tensors: dict[int, dict[int, torch.Tensor]], clock: Clock, autotune: bool,
          per_graph: dict[str, dict[int, object]]) -> dict[str, object]:  # fmt: skip
    handle = compiler.handle  # type: ignore[attr-defined]
    candidates = 0
    for index, spec in specs.items():
        bound = tensors[index]
        g = compiler.graph(spec)  # type: ignore[attr-defined]
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        if not autotune:
            g.build_plans()  # the first plan that builds
            per_graph["runnable_s"][index] = clock.now()
            g.execute(bound, workspace(g.get_workspace_size()), handle=handle)
            clock.output_done(index)
            continue
        g.build_plans(cudnn.build_plan_policy.ALL)
        count = g.get_execution_plan_count()
        candidates += count
        ws = workspace(max(_size_at(g, i) for i in range(count)))
        best, best_ms = 0, float("inf")
        for i in range(count):  # the plain loop: each candidate 3 times
            try:
                g.execute_plan_at_index(bound, ws, i, handle=handle)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(3):
                    g.execute_plan_at_index(bound, ws, i, handle=handle)
                end.record()
                end.synchronize()
            except Exception:
                continue
            if start.elapsed_time(end) < best_ms:
                best, best_ms = i, start.elapsed_time(end)
        per_graph["runnable_s"][index] = clock.now()
        g.execute_plan_at_index(bound, ws, best, handle=handle)
        clock.output_done(index)
    return {"candidates": candidates}


def _size_at(g: object, index: int) -> int:
    try:
        return int(g.get_workspace_size_plan_at_index(index))  # type: ignore[attr-defined]
    except Exception:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", choices=PATHS, required=True)
    parser.add_argument("--server", default="")
    parser.add_argument("--blobs", default="", help="floor: a file of length-prefixed plan blobs, in graph order")
    parser.add_argument("--foreground-s", type=float, default=2.0)
    parser.add_argument("--lazy-s", type=float, default=0.05, help="first-lazy: the sleep after each graph's execute")
    parser.add_argument("--share", default="0/1", help="I/N: this process runs graphs I, I+N, ... of the 13")
    parser.add_argument("--barrier", type=Path, help="start together: write ready-I there, wait for its go file")
    args = parser.parse_args()
    imports_s = time.perf_counter() - IMPORT_STARTED
    share, of = (int(x) for x in args.share.split("/"))
    torch.cuda.init()
    handle = cudnn_handle()  # with cuBLASLt: set-up every path pays
    target = detect_target()
    all_specs = [normalize(s) for s in startup_graphs()]
    manifest = Manifest.from_specs(all_specs, target)
    specs = {i: s for i, s in enumerate(all_specs) if i % of == share}
    tensors = {i: bind(s) for i, s in specs.items()}
    compiler = None
    if args.path.startswith("local-"):
        from plancache_server.worker.compiler.cudnn import CudnnCompiler

        compiler = CudnnCompiler(0)  # its own handle
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - IMPORT_STARTED - imports_s
    go = wait_for_go(args.barrier, share) if args.barrier else None
    clock = Clock(go)
    result: dict[str, object] = {"path": args.path, "imports_s": imports_s, "setup_s": setup_s, "graphs": len(all_specs), "share": [share, of],
                                 "indices": sorted(specs), "target": target.id, "keys": [e.key for e in manifest.entries]}  # fmt: skip
    per_graph: dict[str, dict[int, object]] = {"runnable_s": {}, "provisional": {}, "source": {}}
    if compiler is not None:
        result.update(local(compiler, specs, tensors, clock, args.path == "local-autotuned", per_graph))
    elif args.path == "floor":
        blobs = read_blobs(args.blobs)
        for index in specs:
            g = cudnn.pygraph()
            g.deserialize(handle, blobs[index])
            g.execute(tensors[index], workspace(g.get_workspace_size()), handle=handle)
    else:
        with Client(args.server, cache=False) as client:
            run_service_path(args, client, manifest, target, specs, tensors, result, clock, per_graph)
    torch.cuda.synchronize()
    result["total_s"] = clock.now()
    result["end_wall"] = time.time()
    per_graph["output_s"] = clock.outputs()  # type: ignore[assignment]
    for name, values in per_graph.items():
        if values:
            result[name] = [values.get(i) for i in range(len(all_specs))]
    print(json.dumps(result), flush=True)


def run_service_path(
    args: argparse.Namespace, client: Client, manifest: Manifest, target: Target, specs: dict[int, GraphSpec], tensors: dict[int, dict[int, torch.Tensor]],
    result: dict[str, object], clock: Clock, per_graph: dict[str, dict[int, object]],
) -> None:  # fmt: skip
    def ran(index: int, plan: Plan) -> None:
        per_graph["runnable_s"][index] = clock.now()
        per_graph["provisional"][index], per_graph["source"][index] = plan.provisional, plan.source
        plan.execute(tensors[index])
        clock.output_done(index)

    if args.path == "fetch":
        for index in specs:
            key = manifest.entries[index].key
            assert key is not None
            client.get(key).execute(tensors[index])
    elif args.path == "prefetch":
        fetched = client.prefetch(Manifest(entries=[ManifestEntry(key=manifest.entries[i].key) for i in specs]))
        if fetched.errors:
            raise RuntimeError(f"prefetch failed: {fetched.errors}")
        result["fetched_s"] = clock.now()
        for position, index in enumerate(specs):
            fetched.plans[position].execute(tensors[index])
    elif args.path == "background":
        pending = client.prefetch_in_background(Manifest(entries=[ManifestEntry(key=manifest.entries[i].key) for i in specs]), load=True)
        time.sleep(args.foreground_s)  # the node's weight load
        foreground_done = time.perf_counter()
        for position, index in enumerate(specs):
            pending.wait_for(position, timeout=120).execute(tensors[index])
        torch.cuda.synchronize()
        result["after_foreground_s"] = time.perf_counter() - foreground_done
        result["prefetch_done_s"] = (pending.finished_at or time.perf_counter()) - pending.started_at
    elif args.path in ("first-compile", "first-lazy"):
        lazy = args.lazy_s if args.path == "first-lazy" else 0.0
        result["lazy_s"] = lazy
        for index, spec in specs.items():
            ran(index, client.compile(spec, target))
            if lazy:
                time.sleep(lazy)  # the model's layer before it meets its next graph
    elif args.path == "first-prefetch":
        indices = list(specs)
        built = client.prefetch(Manifest.from_specs([specs[i] for i in indices], target), compile_missing=True,
                                on_plan=lambda position, plan: ran(indices[position], plan), timeout=900)  # fmt: skip
        if built.errors:
            raise RuntimeError(f"first node: {built.errors}")
        result["provisional_plans"] = built.provisional


if __name__ == "__main__":
    main()

"""One node's start-up in a fresh process (run by bench/startup.py).

After its imports, the CUDA context, the cuDNN handle (with cuBLASLt loaded)
and its input tensors (a node needs all of those with or without plancache),
the clock starts; it stops when every graph of bench/startup_graphs.py has
produced its first output (one synchronize at the end). Paths:

  local-heuristic   build each graph with the frontend, its first plan (what a node does alone)
  local-autotuned   build every candidate, time each 3 times in a plain loop, run the fastest
  fetch             one GetPlan per plan, deserialize, execute
  prefetch          one streamed Prefetch for all plans, then deserialize and execute
  background        prefetch_in_background(load=True) while a simulated weight load runs
                    (--foreground-s of sleep); then execute each plan
  floor             the frontend's own deserialize of the same blobs from a local file, execute
  first-node        nothing stored: Prefetch with compile_missing; each plan (provisional) is
                    deserialized and executed as it arrives; then the node polls until every
                    stored plan is the autotuned one (tuned_all_s)

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

IMPORT_STARTED = time.perf_counter()

import cudnn  # noqa: E402
import torch  # noqa: E402

from bench.startup_graphs import read_blobs, startup_graphs  # noqa: E402
from plancache import Client, Manifest, ManifestEntry, Plan  # noqa: E402
from plancache.gpu import cudnn_handle, detect_target, torch_dtype  # noqa: E402
from plancache.spec import GraphSpec  # noqa: E402
from plancache.validation import normalize  # noqa: E402

PATHS = ("local-heuristic", "local-autotuned", "fetch", "prefetch", "background", "floor", "first-node")


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


def local(specs: list[GraphSpec], tensors: list[dict[int, torch.Tensor]], autotune: bool) -> dict[str, object]:
    from plancache_server.compiler.cudnn import CudnnCompiler

    compiler = CudnnCompiler(0)  # (its own handle; made before the clock as well)
    handle = compiler.handle
    started = time.perf_counter()
    candidates = 0
    for spec, bound in zip(specs, tensors, strict=True):
        g = compiler.graph(spec)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        if not autotune:
            g.build_plans()  # the first plan that builds
            g.execute(bound, workspace(g.get_workspace_size()), handle=handle)
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
        g.execute_plan_at_index(bound, ws, best, handle=handle)
    return {"clock_started": started, "candidates": candidates}


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
    args = parser.parse_args()
    imports_s = time.perf_counter() - IMPORT_STARTED
    torch.cuda.init()
    handle = cudnn_handle()  # with cuBLASLt: set-up every path pays
    target = detect_target()
    specs = [normalize(s) for s in startup_graphs()]
    manifest = Manifest.from_specs(specs, target)
    tensors = [bind(s) for s in specs]
    torch.cuda.synchronize()
    result: dict[str, object] = {"path": args.path, "imports_s": imports_s, "setup_s": time.perf_counter() - IMPORT_STARTED - imports_s, "graphs": len(specs)}
    started = time.perf_counter()
    if args.path in ("local-heuristic", "local-autotuned"):
        details = local(specs, tensors, autotune=args.path == "local-autotuned")
        started = float(details.pop("clock_started"))  # type: ignore[arg-type]
        result.update(details)
    elif args.path == "floor":
        blobs = read_blobs(args.blobs)
        for blob, bound in zip(blobs, tensors, strict=True):
            g = cudnn.pygraph()
            g.deserialize(handle, blob)
            g.execute(bound, workspace(g.get_workspace_size()), handle=handle)
    else:
        with Client(args.server, cache=False) as client:
            run_service_path(args, client, manifest, tensors, result, started)
    torch.cuda.synchronize()
    result["total_s"] = time.perf_counter() - started
    if args.path == "first-node":
        with Client(args.server, cache=False) as client:
            result["tuned_all_s"] = wait_until_tuned(client, manifest, started)
    print(json.dumps(result), flush=True)


def run_service_path(
    args: argparse.Namespace, client: Client, manifest: Manifest, tensors: list[dict[int, torch.Tensor]], result: dict[str, object], started: float
) -> None:
    if args.path == "fetch":
        for entry, bound in zip(manifest.entries, tensors, strict=True):
            assert entry.key is not None
            client.get(entry.key).execute(bound)
    elif args.path == "prefetch":
        fetched = client.prefetch(Manifest(entries=[ManifestEntry(key=e.key) for e in manifest.entries]))
        if fetched.errors:
            raise RuntimeError(f"prefetch failed: {fetched.errors}")
        result["fetched_s"] = time.perf_counter() - started
        for index, bound in enumerate(tensors):
            fetched.plans[index].execute(bound)
    elif args.path == "background":
        pending = client.prefetch_in_background(Manifest(entries=[ManifestEntry(key=e.key) for e in manifest.entries]), load=True)
        time.sleep(args.foreground_s)  # the node's weight load
        foreground_done = time.perf_counter()
        for index, bound in enumerate(tensors):
            pending.wait_for(index, timeout=120).execute(bound)
        torch.cuda.synchronize()
        result["after_foreground_s"] = time.perf_counter() - foreground_done
        result["prefetch_done_s"] = (pending.finished_at or time.perf_counter()) - pending.started_at
    elif args.path == "first-node":
        arrivals: list[tuple[float, bool, str]] = []

        def run_at_once(index: int, plan: Plan) -> None:
            plan.execute(tensors[index])
            arrivals.append((time.perf_counter() - started, plan.provisional, plan.source))

        built = client.prefetch(manifest, compile_missing=True, on_plan=run_at_once, timeout=900)
        if built.errors:
            raise RuntimeError(f"first node: {built.errors}")
        result.update(arrivals=arrivals, provisional=built.provisional)


def wait_until_tuned(client: Client, manifest: Manifest, started: float) -> float:
    """Seconds from the clock's start until every stored plan is the autotuned one."""
    waiting = {e.key for e in manifest.entries}
    while waiting:
        waiting = {key for key in waiting if key is not None and client.get(key).provisional}
        if waiting:
            time.sleep(0.05)
    return time.perf_counter() - started


if __name__ == "__main__":
    main()

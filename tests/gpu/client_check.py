"""A separate client process: fetch plans by key, deserialize, execute, check.

Run by tests/gpu/test_gpu_examples.py so that the process executing a plan
never built it. For each case it measures the time from request to a
deserialized graph ready to execute (after imports and the cuDNN handle,
which a local build needs too), executes on random inputs with poisoned
outputs, compares with the torch reference, and, where an untuned plan is
given, times the autotuned and the heuristic plan interleaved.

    python -m tests.gpu.client_check --server HOST:PORT --cases cases.json --out results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import traceback
from typing import Any

import torch

from plancache import Client, InvalidRequest, Manifest, ManifestEntry, Plan, dtypes
from plancache.gpu.stack import torch_dtype
from plancache.run.gpu import cudnn_handle
from tests.gpu import references
from tests.support.gpu_timing import gpu_ms


def make_inputs(case: str, plan: Plan) -> dict[str, torch.Tensor]:
    positive = references.POSITIVE.get(case, set())
    tensors: dict[str, torch.Tensor] = {}
    for b in plan.metadata.tensors:
        if b.is_pass_by_value:
            continue  # exercise the scalar_value default
        dtype = torch_dtype(dtypes.from_proto(b.data_type, b.name) or "float")
        if b.HasField("ragged_offset_uid"):  # a packed THD buffer with room for every sequence at full length
            t = torch.empty(b.dim[0] * b.dim[2], b.dim[1], b.dim[3], dtype=dtype, device="cuda")
        else:
            t = torch.empty_strided(tuple(b.dim), tuple(b.stride), dtype=dtype, device="cuda")
        if b.is_output:
            t.fill_(float("nan") if dtype.is_floating_point else -1)  # poison: unwritten shows up
        elif not dtype.is_floating_point:
            t.copy_(torch.randint(1, 8, tuple(t.shape)))
        elif dtype.itemsize == 1:  # fp8: torch cannot draw into it directly
            t.copy_((torch.randn(tuple(t.shape), device="cuda") * 0.5).to(dtype))
        elif b.name in positive:
            t.uniform_(0.5, 1.5)
        else:
            t.normal_()
        tensors[b.name] = t
    references.prepare(case, tensors, _runner(plan))
    return tensors


def _runner(plan: Plan) -> references.Run:
    """The plan itself, for references that must read what only it knows
    (the dropout mask cuDNN's Philox generator draws)."""

    def run(tensors: dict[str, torch.Tensor]) -> None:
        plan.execute(tensors)
        torch.cuda.synchronize()

    return run


def check(case: str, plan: Plan) -> dict[str, Any]:
    tensors = make_inputs(case, plan)
    plan.execute(tensors)
    return compare(case, tensors, plan)


def compare(case: str, tensors: dict[str, torch.Tensor], plan: Plan) -> dict[str, Any]:
    torch.cuda.synchronize()
    expected = references.reference(case, tensors, _runner(plan))
    tolerance = references.TOLERANCES.get(case)
    return {
        name: references.check_measured(value)
        if isinstance(value, references.Measured)
        else {**references.relative_error(tensors[name], value), **({"tolerance": tolerance} if tolerance else {})}
        for name, value in expected.items()
    }


def fast_paths(case: str, plan: Plan) -> dict[str, Any]:
    """The bound call (on its tensors and on new ones of the same geometry)
    and the CUDA-graph replay (on new values written into the captured
    tensors) against torch; and the bad inputs each must refuse."""
    result: dict[str, Any] = {}
    tensors = make_inputs(case, plan)
    bound = plan.bind(tensors)
    bound()
    result["bound_outputs"] = compare(case, tensors, plan)
    others = make_inputs(case, plan)
    bound(others)
    result["rebound_outputs"] = compare(case, others, plan)
    try:
        captured_tensors = make_inputs(case, plan)
        captured = plan.capture(captured_tensors)
        fresh = make_inputs(case, plan)  # new inputs, poisoned outputs: the replay must write them
        for name, t in captured_tensors.items():
            t.copy_(fresh[name])
        captured()
        result["captured_outputs"] = compare(case, captured_tensors, plan)
    except Exception as e:
        result["captured_error"] = f"{type(e).__name__}: {e}"
        return result
    name = next(b.name for b in plan.metadata.tensors if not b.is_pass_by_value and not b.is_output)
    wrong_dtype = torch.float64 if tensors[name].dtype != torch.float64 else torch.float32
    attempts = {
        "bound, another dtype": lambda: bound({name: tensors[name].to(wrong_dtype)}),
        "bound, on the CPU": lambda: bound({name: tensors[name].cpu()}),
        "bound, another shape": lambda: bound({name: torch.zeros(7, device="cuda", dtype=tensors[name].dtype)}),
        "replay, another tensor of the same geometry": lambda: captured({name: captured_tensors[name].clone()}),
        "replay, another dtype": lambda: captured({name: captured_tensors[name].to(wrong_dtype)}),
    }
    refused = {}
    for label, attempt in attempts.items():
        try:
            attempt()
            refused[label] = "accepted"
        except InvalidRequest as e:
            refused[label] = f"InvalidRequest: {e.message}"
        except Exception as e:
            refused[label] = f"{type(e).__name__}: {e}"
    result["bad_inputs"] = refused
    return result


def threads_check(client: Client, cases: list[dict[str, Any]], results: list[dict[str, Any]], rounds: int = 20) -> None:
    """Every case's plan executed from its own thread, all at once (half of
    them on a stream of their own, half on the default stream sharing one
    workspace), plus a second thread on the first plan: each thread's
    outputs against torch."""
    plans = {c["name"]: client.get(c["key"]) for c, r in zip(cases, results, strict=True) if "error" not in r}
    jobs = list(plans.items()) + ([next(iter(plans.items()))] if plans else [])
    start = threading.Barrier(len(jobs))
    outcome: dict[int, dict[str, Any]] = {}

    def run(index: int, case: str, plan: Plan) -> None:
        try:
            stream = torch.cuda.Stream() if index % 2 else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                tensors = make_inputs(case, plan)
                bound = plan.bind(tensors)
                start.wait(timeout=120)
                for i in range(rounds):
                    if i % 2:
                        bound()
                    else:
                        plan.execute(tensors)
                stream.synchronize()
                outcome[index] = {"case": case, "outputs": compare(case, tensors, plan)}
        except Exception as e:
            outcome[index] = {"case": case, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}

    threads = [threading.Thread(target=run, args=(i, case, plan)) for i, (case, plan) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    by_case: dict[str, list[dict[str, Any]]] = {}
    for index in range(len(jobs)):
        entry = outcome.get(index, {"case": jobs[index][0], "error": "thread did not finish"})
        by_case.setdefault(entry["case"], []).append(entry)
    for result in results:
        if result["name"] in by_case:
            result["threads"] = by_case[result["name"]]


def kernel_ms(plan: Plan, tensors: dict[str, torch.Tensor]) -> tuple[float, str]:
    """GPU time per execution from CUDA-graph replays: host overhead (tens of
    microseconds per execute) would otherwise hide the difference between
    two fast plans."""
    return gpu_ms(lambda: plan.execute(tensors))


def run_case(client: Client, case: dict[str, Any]) -> dict[str, Any]:
    name = case["name"]
    result: dict[str, Any] = {"name": name}
    started = time.perf_counter()
    plan = client.get(case["key"])
    fetched = time.perf_counter()
    plan.load()
    ready = time.perf_counter()
    result.update(
        fetch_s=fetched - started, deserialize_s=ready - fetched, ready_s=ready - started, blob_bytes=len(plan.blob)
    )
    again = Plan(plan.blob, plan.metadata)
    started = time.perf_counter()
    again.load()
    result["deserialize_again_s"] = time.perf_counter() - started
    result["outputs"] = check(name, plan)
    try:
        result.update(fast_paths(name, plan))
    except Exception as e:
        result["fast_paths_error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    if case.get("provisional_file"):  # the heuristic plan served while autotuning ran
        with open(case["provisional_file"], "rb") as f:
            provisional = Plan.from_bytes(f.read())
        result.update(
            provisional_name=provisional.metadata.plan_name,
            provisional_is_marked=provisional.provisional,
            provisional_outputs=check(name, provisional),
        )
    if case.get("untuned_key"):
        heuristic = client.get(case["untuned_key"])
        tensors = make_inputs(name, plan)
        tuned_ms, plan0_ms, methods = [], [], set()
        for _ in range(5):  # interleaved: the machine is shared and noisy
            for plan_, times in ((plan, tuned_ms), (heuristic, plan0_ms)):
                ms, method = kernel_ms(plan_, tensors)
                times.append(ms)
                methods.add(method)
        result.update(
            tuned_ms=statistics.median(tuned_ms),
            plan0_ms=statistics.median(plan0_ms),
            timing=sorted(methods),
            plan0_name=heuristic.metadata.plan_name,
            tuned_name=plan.metadata.plan_name,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--prefetch-only",
        action="store_true",
        help="a fresh node: one Prefetch of every key, then each plan executed and checked",
    )
    args = parser.parse_args()
    with open(args.cases) as f:
        cases = json.load(f)
    torch.cuda.init()
    started = time.perf_counter()
    cudnn_handle()  # a local build needs a handle (and cuBLASLt) too: not part of the fetch time
    setup_s = time.perf_counter() - started
    results = []
    if args.prefetch_only:
        with Client(args.server, cache=False) as client, open(args.out, "w") as out:
            json.dump(prefetch_and_check(client, cases), out, indent=1)
        return
    with Client(args.server, cache=False) as client:
        for case in cases:
            try:
                results.append({**run_case(client, case), "handle_setup_s": setup_s})
            except Exception as e:
                results.append(
                    {"name": case["name"], "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                )
            print(json.dumps(results[-1])[:400], flush=True)
        background_check(client, cases, results)
        threads_check(client, cases, results)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


def prefetch_and_check(client: Client, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One streamed Prefetch of every key (never compiles), then each plan executed and compared with torch."""
    fetched = client.prefetch(Manifest(entries=[ManifestEntry(key=c["key"]) for c in cases]))
    results: list[dict[str, Any]] = []
    for i, case in enumerate(cases):
        row: dict[str, Any] = {"name": case["name"], "key": case["key"]}
        if i in fetched.errors:
            row["error"] = f"{type(fetched.errors[i]).__name__}: {fetched.errors[i].message}"
        else:
            plan = fetched.plans[i]
            row.update(source=plan.source, provisional=plan.provisional, built_by=plan.metadata.built_by)
            try:
                row["outputs"] = check(case["name"], plan)
            except Exception as e:
                row.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        results.append(row)
    return results


def background_check(client: Client, cases: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
    """Plans fetched and deserialized on the background prefetch's thread
    (its own cuDNN handle) execute correctly on this one."""
    try:
        pending = client.prefetch_in_background(
            Manifest(entries=[ManifestEntry(key=c["key"]) for c in cases]), load=True
        )
        prefetched = pending.wait(timeout=300)
    except Exception as e:
        for result in results:
            result["background_error"] = f"the background prefetch failed: {type(e).__name__}: {e}"
        return
    for index, (case, result) in enumerate(zip(cases, results, strict=True)):
        plan = prefetched.plans.get(index)
        if plan is None:
            result["background_error"] = str(prefetched.errors.get(index))
            continue
        try:
            result["background_loaded_elsewhere"] = bool(plan._graphs)
            result["background_outputs"] = check(case["name"], plan)
        except Exception as e:
            result["background_error"] = f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    main()

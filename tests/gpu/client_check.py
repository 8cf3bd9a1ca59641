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
import time
import traceback
from typing import Any

import torch

from plancache import Client, Manifest, ManifestEntry, Plan, dtypes
from plancache.gpu import cudnn_handle, torch_dtype
from tests.gpu import references
from tests.support.gpu_timing import gpu_ms


def make_inputs(case: str, plan: Plan) -> dict[str, torch.Tensor]:
    positive = references.POSITIVE.get(case, set())
    tensors: dict[str, torch.Tensor] = {}
    for b in plan.metadata.tensors:
        if b.is_pass_by_value:
            continue  # exercise the scalar_value default
        dtype = torch_dtype(dtypes.from_proto(b.data_type, b.name) or "float")
        t = torch.empty_strided(tuple(b.dim), tuple(b.stride), dtype=dtype, device="cuda")
        if b.is_output:
            t.fill_(float("nan") if dtype.is_floating_point else -1)  # poison: unwritten shows up
        elif not dtype.is_floating_point:
            t.copy_(torch.randint(1, 8, tuple(b.dim)))
        elif b.name in positive:
            t.uniform_(0.5, 1.5)
        else:
            t.normal_()
        tensors[b.name] = t
    references.prepare(case, tensors)
    return tensors


def check(case: str, plan: Plan) -> dict[str, Any]:
    tensors = make_inputs(case, plan)
    plan.execute(tensors)
    torch.cuda.synchronize()
    expected = references.reference(case, tensors)
    return {name: references.relative_error(tensors[name], value) for name, value in expected.items()}


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
    result.update(fetch_s=fetched - started, deserialize_s=ready - fetched, ready_s=ready - started, blob_bytes=len(plan.blob))
    again = Plan(plan.blob, plan.metadata)
    started = time.perf_counter()
    again.load()
    result["deserialize_again_s"] = time.perf_counter() - started
    result["outputs"] = check(name, plan)
    if case.get("provisional_file"):  # the heuristic plan served while autotuning ran
        with open(case["provisional_file"], "rb") as f:
            provisional = Plan.from_bytes(f.read())
        result.update(provisional_name=provisional.metadata.plan_name, provisional_is_marked=provisional.provisional,
                      provisional_outputs=check(name, provisional))  # fmt: skip
    if case.get("untuned_key"):
        heuristic = client.get(case["untuned_key"])
        tensors = make_inputs(name, plan)
        tuned_ms, plan0_ms, methods = [], [], set()
        for _ in range(5):  # interleaved: the machine is shared and noisy
            for plan_, times in ((plan, tuned_ms), (heuristic, plan0_ms)):
                ms, method = kernel_ms(plan_, tensors)
                times.append(ms)
                methods.add(method)
        result.update(tuned_ms=statistics.median(tuned_ms), plan0_ms=statistics.median(plan0_ms), timing=sorted(methods),
                      plan0_name=heuristic.metadata.plan_name, tuned_name=plan.metadata.plan_name)  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.cases) as f:
        cases = json.load(f)
    torch.cuda.init()
    started = time.perf_counter()
    cudnn_handle()  # a local build needs a handle (and cuBLASLt) too: not part of the fetch time
    setup_s = time.perf_counter() - started
    results = []
    with Client(args.server, cache=False) as client:
        for case in cases:
            try:
                results.append({**run_case(client, case), "handle_setup_s": setup_s})
            except Exception as e:
                results.append({"name": case["name"], "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
            print(json.dumps(results[-1])[:400], flush=True)
        background_check(client, cases, results)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


def background_check(client: Client, cases: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
    """Plans fetched and deserialized on the background prefetch's thread
    (its own cuDNN handle) execute correctly on this one."""
    try:
        pending = client.prefetch_in_background(Manifest(entries=[ManifestEntry(key=c["key"]) for c in cases]), load=True)
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
            result["background_loaded_elsewhere"] = plan._graph is not None
            result["background_outputs"] = check(case["name"], plan)
        except Exception as e:
            result["background_error"] = f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    main()

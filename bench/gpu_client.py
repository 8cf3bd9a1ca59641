"""One benchmark case in a fresh client process (run by bench/gpu_bench.py).

After its imports and cuDNN handle (a local build needs those too), it times
request -> deserialized plan, then the autotuned plan, the heuristic plan 0
and torch on the same tensors, interleaved, and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench.gpu_cases import CASES
from plancache import Client, Plan, dtypes
from plancache.gpu.stack import torch_dtype
from plancache.run.gpu import cudnn_handle
from tests.support.gpu_timing import gpu_ms


def bind(plan: Plan) -> dict[str, torch.Tensor]:
    tensors = {}
    for b in plan.metadata.tensors:
        if b.is_pass_by_value:
            continue
        dtype = torch_dtype(dtypes.from_proto(b.data_type, b.name) or "float")
        t = torch.empty_strided(tuple(b.dim), tuple(b.stride), dtype=dtype, device="cuda")
        t.fill_(float("nan")) if b.is_output else t.normal_()
        tensors[b.name] = t
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--case", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--key0", help="the same graph compiled without autotuning")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.cuda.init()
    started = time.perf_counter()
    cudnn_handle()  # with cuBLASLt loaded: set-up a local build pays too
    result: dict[str, object] = {"case": args.case, "handle_setup_s": time.perf_counter() - started}
    with Client(args.server, cache=False) as client:
        started = time.perf_counter()
        plan = client.get(args.key)
        fetched = time.perf_counter()
        plan.load()
        ready = time.perf_counter()
        again = Plan(plan.blob, plan.metadata)
        t0 = time.perf_counter()
        again.load()
        result.update(
            fetch_s=fetched - started,
            deserialize_s=ready - fetched,
            ready_s=ready - started,
            deserialize_again_s=time.perf_counter() - t0,
            blob_bytes=len(plan.blob),
        )
        plan0 = client.get(args.key0) if args.key0 else None
    tensors = bind(plan)
    torch_fn = CASES[args.case].torch_fn(tensors)  # type: ignore[arg-type]
    runs: dict[str, list[float]] = {"tuned": [], "plan0": [], "torch": []}
    methods: dict[str, str] = {}
    for _ in range(args.rounds):  # interleaved: the machine is shared and noisy
        for label, fn in (
            ("tuned", lambda: plan.execute(tensors)),
            ("plan0", plan0 and (lambda: plan0.execute(tensors))),
            ("torch", torch_fn),
        ):
            if fn:
                ms, methods[label] = gpu_ms(fn)
                runs[label].append(ms)
    for label, values in runs.items():
        if values:
            result[f"{label}_ms"] = statistics.median(values)
            result[f"{label}_spread"] = [min(values), max(values)]
    result["timing"] = methods
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

"""Compile throughput with one GPU worker versus two (one machine, 2 GPUs).

The same distinct specs are built twice, each time by a fresh server (and
fresh worker processes) on an empty Redis: first with `--gpus 0`, then with
`--gpus 0,1`. All compiles are issued at once; the wall time until the last
plan is stored is the measure. Reports which worker built what and whether
builds on the two GPUs overlapped in time.

    python3 bench/multi_gpu.py --out DIR     # on a 2-GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_cases import CASES
from bench.report import write_json
from plancache import Client, Plan
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.processes import server_process, signing_public_key, trusting_env, wait_for_workers

DEFAULT_CASES = [
    "mm_4096_fp16",
    "mm_4096_bf16",
    "mm_8192x1024x4096_bf16",
    "bmm_heads_64x1024x128x1024_fp16",
    "conv_r50_3x3_64_56_n32",
    "conv_r50_1x1_256to64_56_n32",
    "conv_r50_3x3_128_28_n32",
    "conv_r50_3x3_256_14_n32",
]


def phase(gpus: str, names: list[str], out: Path) -> dict[str, Any]:
    from plancache.gpu.target import detect_target

    tmp = Path(tempfile.mkdtemp(prefix="plancache-mgpu-"))
    redis = EmbeddedRedis(
        tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    address = f"127.0.0.1:{free_port()}"
    workers = len(gpus.split(","))
    try:
        with server_process(
            address, redis.url, out / f"multi-gpu-server-{workers}.log", "--gpus", gpus, "--data-dir", str(tmp / "data")
        ) as server:
            os.environ.update(trusting_env(signing_public_key(tmp / "data")))
            wait_for_workers(address, count=workers, proc=server)
            target = detect_target().generic()  # any H200 of the machine may build it
            with Client(address, cache=False) as client, ThreadPoolExecutor(len(names)) as pool:
                started = time.perf_counter()
                plans: list[Plan] = list(pool.map(lambda n: client.compile(CASES[n].spec(), target), names))
                wall = time.perf_counter() - started
    finally:
        redis.stop()
    builds = [
        {
            "case": n,
            "worker": p.metadata.built_by,
            "end": p.metadata.created_at,
            "seconds": p.metadata.build_seconds + p.metadata.autotune_seconds,
        }
        for n, p in zip(names, plans, strict=True)
    ]
    return {
        "gpus": gpus,
        "workers": workers,
        "wall_s": wall,
        "builds": builds,
        "build_seconds_sum": sum(b["seconds"] for b in builds),
    }


def overlapping(builds: list[dict[str, Any]]) -> int:
    """Pairs of builds on different workers whose time spans overlap."""
    spans = [(b["end"] - b["seconds"], b["end"], b["worker"]) for b in builds]
    return sum(1 for i, a in enumerate(spans) for b in spans[i + 1 :] if a[2] != b[2] and a[0] < b[1] and b[0] < a[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--cases", nargs="*", default=DEFAULT_CASES)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # A warm-up phase first (discarded): the first processes pay cold disk and
    # library caches that later ones do not; then 2, 1, 2 GPUs alternating.
    warmup = phase("0", args.cases, args.out)
    runs = [phase(gpus, args.cases, args.out) for gpus in ("0,1", "0", "0,1")]
    one = [r for r in runs if r["workers"] == 1]
    two = [r for r in runs if r["workers"] == 2]
    one_wall = sum(r["wall_s"] for r in one) / len(one)
    two_wall = sum(r["wall_s"] for r in two) / len(two)
    result = {
        "warmup_one_gpu_wall_s": warmup["wall_s"],
        "one_gpu_wall_s": [r["wall_s"] for r in one],
        "two_gpus_wall_s": [r["wall_s"] for r in two],
        "throughput_ratio": one_wall / two_wall,
        "target_ratio": 1.8,
        "workers_used_with_two": sorted({b["worker"] for r in two for b in r["builds"]}),
        "overlapping_build_pairs": [overlapping(r["builds"]) for r in two],
        "runs": [warmup, *runs],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    print(
        f"{len(args.cases)} builds: 1 GPU {one_wall:.1f} s, 2 GPUs {two_wall:.1f} s (means after a warm-up); ratio {result['throughput_ratio']:.2f} (target >= 1.8)"
    )
    write_json(args.out / "multi_gpu.json", result)


if __name__ == "__main__":
    main()

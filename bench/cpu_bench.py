"""CPU benchmarks (any machine; plans from the STAND-IN compiler, ~75 KB):
hit path against this machine's floor, coalescing of concurrent compiles,
start-up fetch. Baselines run in the same process, interleaved, repeated.

    make bench                       # writes bench/results/cpu_bench.{json,png}
    python bench/cpu_bench.py --quick --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import redis

from bench.report import figure, percentile, save, spread, table, write_json
from plancache import Client, DiskCache, GraphSpec, Manifest, ManifestEntry, Plan
from plancache.keys.query import PlanQuery
from plancache.trust.signing import Signer
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from plancache_server.store.plans import RedisPlanStore, StoredPlan
from plancache_server.worker.verified_job import VerifiedJob, plan_metadata
from tests.support.processes import REPO, child_env, server_process, wait_for_workers, worker_process
from tests.support.standin import STANDIN_TARGET, StandInCompiler

TARGET = STANDIN_TARGET


def spec_for(i: int) -> GraphSpec:
    g = GraphSpec(io_data_type="half", name=f"bench-{i}")
    a = g.tensor([8, 64 + i, 512], name="A", uid=1)
    b = g.tensor([8, 512, 256], name="B", uid=2)
    g.matmul(a, b).set_output(True).set_uid(3)
    return g


def store_plans(store: RedisPlanStore, count: int, offset: int = 0, signer: Signer | None = None) -> list[StoredPlan]:
    """Plans as a worker would store them, from the stand-in compiler."""
    compiler, plans = StandInCompiler(), []
    for i in range(offset, offset + count):
        query = PlanQuery.of(spec_for(i), TARGET)
        compiled = compiler.compile(query)
        metadata = plan_metadata(VerifiedJob(query), compiled, "bench", TARGET.to_proto())
        plan = StoredPlan(blob=compiled.blob, metadata=metadata, signature=signer.sign(metadata) if signer else None)
        store.put(plan)
        plans.append(plan)
    return plans


def load(call: Callable[[], Any], clients: int, requests_per_client: int) -> dict[str, float]:
    """`clients` threads, each making `requests_per_client` calls back to back."""
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def run() -> None:
        mine = []
        barrier.wait()
        for _ in range(requests_per_client):
            started = time.perf_counter()
            call()
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "rps": len(latencies) / wall,
    }


def hit_path(servers: dict[str, str], redis_url: str, plan: StoredPlan, quick: bool) -> dict[str, Any]:
    """GetPlan of a stored plan on each server in `servers` (name -> address),
    the echo server among them, plus a raw redis-py GET of the same blob."""
    levels = (1, 4) if quick else (1, 16, 64)
    rounds = 2 if quick else 5
    total = 100 if quick else 1500
    channels = {
        name: grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 * 2**20)])
        for name, addr in servers.items()
    }
    stubs = {name: pb_grpc.PlanCacheStub(ch) for name, ch in channels.items()}
    request = pb.GetPlanRequest(ref=pb.PlanRef(key=plan.metadata.key))
    raw = redis.Redis.from_url(redis_url)
    raw.set("bench:blob", plan.blob)
    calls: dict[str, Callable[[], Any]] = {
        name: (lambda stub=stub: stub.GetPlan(request, timeout=30)) for name, stub in stubs.items()
    }
    calls["redis_get"] = lambda: raw.get("bench:blob")
    for call in calls.values():  # warm up connections and caches
        for _ in range(20):
            call()
    results: dict[str, Any] = {}
    for clients in levels:
        per_client = max(total // clients, 10)
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in calls}
        for _ in range(rounds):  # interleaved rounds: the machine is shared and noisy
            for name, call in calls.items():
                if name == "redis_get" and clients != 1:
                    continue
                samples[name].append(load(call, clients, per_client))
        results[str(clients)] = {
            name: {metric: spread([s[metric] for s in runs]) for metric in ("p50_ms", "p99_ms", "rps")}
            for name, runs in samples.items()
            if runs
        }
    for ch in channels.values():
        ch.close()
    raw.close()
    return results


def coalescing(address: str, quick: bool, offset: int) -> dict[str, Any]:
    callers = 8 if quick else 64
    rounds = 2 if quick else 3
    runs = []
    with Client(address, timeout=60, cache=False, allow_unsigned=True) as client:
        for r in range(rounds):
            before = {s.target_id: s for s in client.admin.stats()}.get(TARGET.id)
            spec = spec_for(offset + r)
            barrier = threading.Barrier(callers)

            def call(_: int, spec: GraphSpec = spec, barrier: threading.Barrier = barrier) -> tuple[float, str]:
                barrier.wait()
                started = time.perf_counter()
                plan = client.compile(spec, TARGET)
                return time.perf_counter() - started, plan.source

            with ThreadPoolExecutor(callers) as pool:
                outcomes = list(pool.map(call, range(callers)))
            after = {s.target_id: s for s in client.admin.stats()}[TARGET.id]
            builder = [t for t, source in outcomes if source == "compiled"]
            waiters = [t for t, source in outcomes if source == "joined"]
            runs.append(
                {
                    "builds": after.compiles - (before.compiles if before else 0),
                    "builder_s": builder[0] if builder else float("nan"),
                    "waiters_over_builder_p50": statistics.median(waiters) / builder[0]
                    if builder and waiters
                    else float("nan"),
                    "waiters_over_builder_max": max(waiters) / builder[0] if builder and waiters else float("nan"),
                    "sources": {s: sum(1 for _, x in outcomes if x == s) for s in {x for _, x in outcomes}},
                }
            )
    return {"callers": callers, "runs": runs}


def startup_fetch(address: str, plans: list[StoredPlan], quick: bool) -> dict[str, Any]:
    """One node fetching every plan: one GetPlan per plan (sequential, and 8
    threads) against one streamed Prefetch call, interleaved."""
    keys = [p.metadata.key for p in plans]
    manifest = Manifest(entries=[ManifestEntry(key=k) for k in keys])
    rounds = 2 if quick else 5
    sequential, parallel, streamed = [], [], []
    with Client(address, timeout=60, cache=False, allow_unsigned=True) as client:
        client.get(keys[0])
        for _ in range(rounds):
            started = time.perf_counter()
            for key in keys:
                client.get(key)
            sequential.append(len(keys) / (time.perf_counter() - started))
            started = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(client.get, keys))
            parallel.append(len(keys) / (time.perf_counter() - started))
            started = time.perf_counter()
            result = client.prefetch(manifest)
            assert result.fetched == len(keys), result.errors
            streamed.append(len(keys) / (time.perf_counter() - started))
    return {
        "plans": len(keys),
        "per_call_sequential_plans_per_s": spread(sequential),
        "per_call_8_threads_plans_per_s": spread(parallel),
        "streamed_plans_per_s": spread(streamed),
    }


def client_cache_hit(plans: list[StoredPlan], tmp: Path, quick: bool) -> dict[str, Any]:
    """Row 2: a fresh process reading verified plans from the disk cache."""
    cache = DiskCache(tmp / "node-cache")
    for plan in plans:
        cache.put(Plan(plan.blob, plan.metadata))
    keys_file = tmp / "keys.json"
    keys_file.write_text(json.dumps([p.metadata.key for p in plans]))
    runs = []
    for _ in range(2 if quick else 5):
        out = subprocess.run(
            [sys.executable, str(REPO / "bench" / "cache_reader.py"), str(cache.root), str(keys_file)],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        runs.append(json.loads(out))
    return {
        "plans": len(plans),
        "median_ms_per_plan": spread([r["median_ms"] for r in runs]),
        "first_plan_ms": spread([r["first_ms"] for r in runs]),
        "import_s": spread([r["import_s"] for r in runs]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="a short run (the smoke test)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="plancache-cpu-bench-"))
    redis_server = EmbeddedRedis(tmp / "redis", persist=False).start()
    address, uncached, echo_port, echo_aio_port = (
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
        free_port(),
        free_port(),
    )
    fetch_count = 10 if args.quick else 100
    try:
        plans = store_plans(RedisPlanStore(redis.Redis.from_url(redis_server.url)), fetch_count)
        response = tmp / "response.bin"
        response.write_bytes(pb.GetPlanResponse(plan=plans[0].proto).SerializeToString())
        echoes = [
            subprocess.Popen(
                [sys.executable, str(REPO / "bench" / "echo_server.py"), str(port), str(response), *mode],
                stdout=subprocess.PIPE,
                env=child_env(),
            )
            for port, mode in ((echo_port, []), (echo_aio_port, ["--aio"]))
        ]
        for echo in echoes:
            assert echo.stdout is not None and b"ready" in echo.stdout.readline()
        build_s = "0.2" if args.quick else "1.0"
        env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS=build_s)
        try:
            with (
                server_process(address, redis_server.url, tmp / "server.log", "--gpus", "none"),
                server_process(
                    uncached, redis_server.url, tmp / "server-uncached.log", "--gpus", "none", "--memory-cache-mb", "0"
                ),
                worker_process(
                    redis_server.url,
                    tmp / "worker.log",
                    "--device",
                    "0",
                    "--compiler",
                    "tests.support.standin:factory",
                    "--unsigned",
                    env=env,
                ) as worker,
            ):
                wait_for_workers(address, proc=worker)
                servers = {
                    "plancache": address,
                    "plancache_no_memory_cache": uncached,
                    "echo": f"127.0.0.1:{echo_port}",
                    "echo_aio": f"127.0.0.1:{echo_aio_port}",
                }
                results = {
                    "machine": {"cpus": _cpus(), "python": sys.version.split()[0]},
                    "hit_path": hit_path(servers, redis_server.url, plans[0], args.quick),
                    "coalescing": {**coalescing(address, args.quick, offset=10_000), "build_s": float(build_s)},
                    "startup_fetch": startup_fetch(address, plans, args.quick),
                    "client_cache_hit": client_cache_hit(plans, tmp, args.quick),
                }
        finally:
            for echo in echoes:
                echo.terminate()
                echo.wait(timeout=10)
    finally:
        redis_server.stop()
    results["summary"] = summarize(results)
    print_report(results)
    write_json(args.out / "cpu_bench.json", results)
    plot(results, args.out / "cpu_bench.png")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    hit = results["hit_path"]
    one = hit["1"]
    floor = one["echo"]["p50_ms"]["median"] + one["redis_get"]["p50_ms"]["median"]
    floor_aio = one["echo_aio"]["p50_ms"]["median"] + one["redis_get"]["p50_ms"]["median"]
    runs = results["coalescing"]["runs"]
    levels = [lv for lv in sorted(hit, key=int) if lv != "1"]

    def ratio(level: str, name: str, floor_name: str) -> float:
        return float(hit[level][name]["rps"]["median"] / hit[level][floor_name]["rps"]["median"])

    return {
        "hit_p50_ms": one["plancache"]["p50_ms"]["median"],
        "floor_p50_ms": floor,
        "floor_aio_p50_ms": floor_aio,
        "hit_p50_over_floor": one["plancache"]["p50_ms"]["median"] / floor,
        "hit_p50_over_floor_aio": one["plancache"]["p50_ms"]["median"] / floor_aio,
        "hit_p50_over_floor_no_memory_cache": one["plancache_no_memory_cache"]["p50_ms"]["median"] / floor,
        "target_hit_p50_over_floor": 1.0,
        # Throughput against the thread-pool echo (the target) and the asyncio echo, per level of concurrency.
        "throughput_over_echo": {lv: ratio(lv, "plancache", "echo") for lv in levels},
        "throughput_over_echo_aio": {lv: ratio(lv, "plancache", "echo_aio") for lv in levels},
        "throughput_over_echo_no_memory_cache": {lv: ratio(lv, "plancache_no_memory_cache", "echo") for lv in levels},
        "target_throughput_over_echo": 1.0,
        "coalescing_builds": [r["builds"] for r in runs],
        "waiters_over_builder_p50": statistics.median(r["waiters_over_builder_p50"] for r in runs),
        "waiters_over_builder_max": max(r["waiters_over_builder_max"] for r in runs),
        "target_waiters_over_builder": 1.05,
        "startup_plans_per_s": results["startup_fetch"]["per_call_sequential_plans_per_s"]["median"],
        "startup_streamed_plans_per_s": results["startup_fetch"]["streamed_plans_per_s"]["median"],
        "streamed_over_per_call": results["startup_fetch"]["streamed_plans_per_s"]["median"]
        / results["startup_fetch"]["per_call_sequential_plans_per_s"]["median"],
        "client_cache_hit_ms": results["client_cache_hit"]["median_ms_per_plan"]["median"],
        "target_client_cache_hit_ms": 0.3,
    }


def print_report(results: dict[str, Any]) -> None:
    rows = []
    for clients, by_name in results["hit_path"].items():
        for name, m in by_name.items():
            rows.append(
                [
                    clients,
                    name,
                    m["p50_ms"]["median"],
                    f"{m['p50_ms']['min']:.3g}-{m['p50_ms']['max']:.3g}",
                    m["p99_ms"]["median"],
                    m["rps"]["median"],
                ]
            )
    print(table(["clients", "path", "p50 ms", "p50 range", "p99 ms", "req/s"], rows))
    s = results["summary"]
    print()
    rows: list[list[Any]] = [
        [
            "hit p50 / floor (thread-pool echo + redis GET)",
            s["hit_p50_over_floor"],
            "<= 1.0",
            s["hit_p50_over_floor"] <= 1.0,
        ],
        ["  / floor (asyncio echo + redis GET)", s["hit_p50_over_floor_aio"], "-", "-"],
        ["  same, memory cache off", s["hit_p50_over_floor_no_memory_cache"], "-", "-"],
    ]
    for level, value in s["throughput_over_echo"].items():
        rows.append([f"throughput / thread-pool echo at {level} clients", value, ">= 1.0", value >= 1.0])
        rows.append([f"  / asyncio echo at {level} clients", s["throughput_over_echo_aio"][level], "-", "-"])
        rows.append(
            [
                "  same, memory cache off (/ thread-pool echo)",
                s["throughput_over_echo_no_memory_cache"][level],
                "-",
                "-",
            ]
        )
    rows += [
        [
            "builds for one key, per round",
            str(s["coalescing_builds"]),
            "1",
            all(b == 1 for b in s["coalescing_builds"]),
        ],
        [
            "waiters / builder latency (p50)",
            s["waiters_over_builder_p50"],
            "< 1.05",
            s["waiters_over_builder_p50"] < 1.05,
        ],
        ["waiters / builder latency (max)", s["waiters_over_builder_max"], "-", "-"],
        ["start-up fetch, one call per plan (plans/s)", s["startup_plans_per_s"], "-", "-"],
        ["start-up fetch, one streamed call (plans/s)", s["startup_streamed_plans_per_s"], "-", "-"],
        ["  streamed / one call per plan", s["streamed_over_per_call"], "-", "-"],
        [
            "client disk cache hit, fresh process (ms per plan)",
            s["client_cache_hit_ms"],
            "< 0.3 ms",
            s["client_cache_hit_ms"] < 0.3,
        ],
    ]
    print(table(["measure", "value", "target", "met"], rows))


def plot(results: dict[str, Any], path: Path) -> None:
    fig, (a, b, c) = figure(3)
    hit = results["hit_path"]
    levels = sorted(hit, key=int)
    names = ("plancache", "plancache_no_memory_cache", "echo", "echo_aio")
    width = 0.8 / len(names)
    for offset, name in enumerate(names):
        xs = [i + offset * width for i in range(len(levels))]
        a.bar(xs, [hit[lv][name]["p50_ms"]["median"] for lv in levels], width=width, label=f"{name} p50")
        a.errorbar(
            xs,
            [hit[lv][name]["p50_ms"]["median"] for lv in levels],
            fmt="none",
            ecolor="black",
            yerr=[
                [hit[lv][name]["p50_ms"]["median"] - hit[lv][name]["p50_ms"]["min"] for lv in levels],
                [hit[lv][name]["p50_ms"]["max"] - hit[lv][name]["p50_ms"]["median"] for lv in levels],
            ],
        )
        b.bar(xs, [hit[lv][name]["rps"]["median"] for lv in levels], width=width, label=name)
    a.axhline(
        results["summary"]["floor_p50_ms"], color="red", linestyle="--", label="floor (echo + redis GET, 1 client)"
    )
    for ax, title in ((a, "GetPlan latency p50 (ms), by concurrent clients"), (b, "throughput (req/s)")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(levels))], levels)
        ax.set_title(title)
        ax.legend(fontsize=7)
    runs = results["coalescing"]["runs"]
    c.bar(range(len(runs)), [r["waiters_over_builder_max"] for r in runs], label="max waiter / builder")
    c.bar(range(len(runs)), [r["waiters_over_builder_p50"] for r in runs], label="p50 waiter / builder")
    c.axhline(1.05, color="red", linestyle="--", label="target 1.05")
    c.set_title(
        f"coalescing: {results['coalescing']['callers']} callers, one key, {results['coalescing']['build_s']} s build"
    )
    c.set_ylim(0.9, max(1.1, *(r["waiters_over_builder_max"] for r in runs)) + 0.02)
    c.legend(fontsize=7)
    save(fig, path)


if __name__ == "__main__":
    main()

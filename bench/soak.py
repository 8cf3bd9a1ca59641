"""The service over hours (issue 44; CPU, stand-in compiler): does anything grow?

One plancache-server (gateway and one stand-in worker, a private Redis,
the store bounded by --store-max-mb so that plans come and go) under a
steady mix for --minutes:

- hits: --hit-threads threads fetching 20 stored plans (GetPlan), ~--hit-rate calls a second in all;
- misses: a new graph compiled every --miss-every seconds (stored, so the store turns over);
- prefetches: every 10 s a Prefetch of the 20 stored plans and 5 new ones (compile_missing);
- reports: the clients' background ReportFirstUses (on by default);
- the status page (/ and /status.json) and /metrics read every 5 s.

Every --sample-s seconds: the gateway's and the worker's RSS and open file
descriptors, what the gateway's memory cache of plans holds (its /metrics),
Redis' used memory (and its dataset and overhead parts) and its keys counted
by kind, the job stream's length, the store's plan count, and the hits'
p50/p99 over that window. Every --census-every samples, Redis' memory by key
kind (MEMORY USAGE of every key). The slope of each (least squares over the
second half of the run, per hour) says whether it grows; a growing total is
then attributed to the kind whose keys or bytes grow with it.

    python bench/soak.py --minutes 60 [--out bench/results]

Writes soak.json and soak.png.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis as redis_py

from bench.cpu_bench import TARGET, spec_for
from bench.procs import children
from bench.report import percentile, write_json
from plancache import Client, Manifest
from plancache.errors import PlanCacheError
from plancache_server.store import keys as store_keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.processes import REPO, STANDIN_SERVER_ARGS, child_env, server_process, wait_for_workers


def proc_status(pid: int) -> tuple[float, int]:
    """(RSS MiB, open descriptors) of a process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope over the second half (the warm-up left out), per hour."""
    half = points[len(points) // 2 :]
    if len(half) < 3:
        return None
    xs, ys = [p[0] for p in half], [p[1] for p in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return None if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var * 3600


def key_kind(key: bytes) -> str:
    """A Redis key with what varies taken out: `plancache:{<plan key>}:plan` -> `plancache:{}:plan`,
    `plancache:spec:<hash>` -> `plancache:spec:#`, `...:h123` -> `...:hN`."""
    text = re.sub(r"\{[^}]*\}", "{}", key.decode(errors="replace"))
    text = re.sub(r"[0-9a-f]{16,}", "#", text)
    return re.sub(r"\d+", "N", text)


def redis_census(store: redis_py.Redis, with_bytes: bool) -> tuple[dict[str, int], dict[str, int]]:
    """Keys per kind and, when asked, their bytes (MEMORY USAGE, every key: a few thousand here)."""
    counts: dict[str, int] = {}
    keys_of: dict[str, list[bytes]] = {}
    for key in store.scan_iter(count=1000):
        kind = key_kind(key)
        counts[kind] = counts.get(kind, 0) + 1
        if with_bytes:
            keys_of.setdefault(kind, []).append(key)
    sizes: dict[str, int] = {}
    for kind, keys in keys_of.items():
        pipe = store.pipeline(transaction=False)
        for key in keys:
            pipe.memory_usage(key, samples=0)
        sizes[kind] = sum(int(n or 0) for n in pipe.execute())
    return counts, sizes


def gateway_cache_bytes(metrics_port: int) -> float | None:
    """What the gateway's memory cache counts against --memory-cache-mb, MiB (its /metrics)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("plancache_gateway_memory_cache_bytes "):
            return float(line.rsplit(" ", 1)[1]) / 2**20
    return None


class Load:
    def __init__(self, address: str, metrics_port: int, keys: list[str], args: argparse.Namespace) -> None:
        self.address, self.metrics_port, self.keys, self.args = address, metrics_port, keys, args
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.hits: list[float] = []  # latencies (s) since the last sample
        self.errors: dict[str, int] = {}
        self.counts = {"hits": 0, "misses": 0, "prefetches": 0, "status_reads": 0}

    def _error(self, e: BaseException) -> None:
        with self.lock:
            self.errors[type(e).__name__] = self.errors.get(type(e).__name__, 0) + 1

    def hit_loop(self, n: int) -> None:
        pause = self.args.hit_threads / self.args.hit_rate
        with Client(self.address, cache=False) as client:
            i = n
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    client.get(self.keys[i % len(self.keys)], timeout=10)
                    with self.lock:
                        self.hits.append(time.perf_counter() - started)
                        self.counts["hits"] += 1
                except PlanCacheError as e:
                    self._error(e)
                i += 1
                self.stop.wait(max(0.0, pause - (time.perf_counter() - started)))

    def miss_loop(self) -> None:
        with Client(self.address, cache=False, hedge=False) as client:
            i = 10_000
            while not self.stop.wait(self.args.miss_every):
                try:
                    client.compile(spec_for(i), TARGET, timeout=60)
                    with self.lock:
                        self.counts["misses"] += 1
                except PlanCacheError as e:
                    self._error(e)
                i += 1

    def prefetch_loop(self) -> None:
        with Client(self.address, cache=False, hedge=False) as client:
            i = 40_000  # new graphs (past the misses' 10,000 + one a second)
            while not self.stop.wait(10.0):
                specs = [spec_for(k) for k in range(20)] + [spec_for(i + k) for k in range(5)]
                i += 5
                try:
                    result = client.prefetch(Manifest.from_specs(specs, TARGET), compile_missing=True, timeout=60)
                    with self.lock:
                        self.counts["prefetches"] += 1
                        for error in result.errors.values():
                            self.errors[type(error).__name__] = self.errors.get(type(error).__name__, 0) + 1
                except PlanCacheError as e:
                    self._error(e)

    def status_loop(self) -> None:
        while not self.stop.wait(5.0):
            for path in ("/", "/status.json", "/metrics"):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=10) as r:
                        r.read()
                    with self.lock:
                        self.counts["status_reads"] += 1
                except OSError as e:
                    self._error(e)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.hit_loop, args=(n,), daemon=True) for n in range(self.args.hit_threads)]
        threads += [
            threading.Thread(target=f, daemon=True) for f in (self.miss_loop, self.prefetch_loop, self.status_loop)
        ]
        for t in threads:
            t.start()
        return threads

    def take_hits(self) -> list[float]:
        with self.lock:
            taken, self.hits = self.hits, []
        return taken


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--hit-threads", type=int, default=4)
    parser.add_argument("--hit-rate", type=float, default=200.0, help="GetPlan calls a second, all threads")
    parser.add_argument("--miss-every", type=float, default=1.0)
    parser.add_argument("--store-max-mb", type=int, default=64)
    parser.add_argument("--census-every", type=int, default=30, help="samples between Redis memory censuses")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="plancache-soak-"))
    redis_server = EmbeddedRedis(tmp / "redis", persist=False).start()
    address, metrics_port = f"127.0.0.1:{free_port()}", free_port()
    env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS="0.05", PLANCACHE_ALLOW_UNSIGNED="1")
    samples: list[dict[str, Any]] = []
    try:
        with server_process(
            address,
            redis_server.url,
            tmp / "server.log",
            *STANDIN_SERVER_ARGS,
            "--metrics-port",
            str(metrics_port),
            "--store-max-mb",
            str(args.store_max_mb),
            "--sweep-interval",
            "30",
            env=env,
        ) as server:
            os.environ["PLANCACHE_ALLOW_UNSIGNED"] = "1"
            wait_for_workers(address, proc=server, timeout=60)
            with Client(address, cache=False, hedge=False) as client:
                keys = [client.compile(spec_for(i), TARGET, timeout=120).key for i in range(20)]
            store = redis_py.Redis.from_url(redis_server.url)
            load = Load(address, metrics_port, keys, args)
            load.start()
            started = time.time()
            end = started + args.minutes * 60
            while time.time() < end:
                time.sleep(args.sample_s)
                hits = load.take_hits()
                workers = children(server.pid)
                gateway_rss, gateway_fds = proc_status(server.pid)
                worker_stats = [proc_status(pid) for pid in workers if "worker_main" in _cmdline(pid)]
                memory = store.info("memory")
                census = len(samples) % args.census_every == 0
                key_counts, key_bytes = redis_census(store, with_bytes=census)
                with load.lock:
                    counts, errors = dict(load.counts), dict(load.errors)
                samples.append(
                    {
                        "t_s": time.time() - started,
                        "gateway_rss_mb": gateway_rss,
                        "gateway_fds": gateway_fds,
                        "worker_rss_mb": sum(w[0] for w in worker_stats),
                        "worker_fds": sum(w[1] for w in worker_stats),
                        "gateway_cache_mb": gateway_cache_bytes(metrics_port),
                        "redis_used_mb": memory["used_memory"] / 2**20,
                        "redis_dataset_mb": memory["used_memory_dataset"] / 2**20,
                        "redis_overhead_mb": memory["used_memory_overhead"] / 2**20,
                        "redis_keys": key_counts,
                        "redis_key_bytes": key_bytes if census else None,
                        "job_stream": int(store.xlen(store_keys.job_stream(TARGET))),
                        "stored_plans": int(store.zcard(store_keys.PLAN_INDEX)),
                        "hit_p50_ms": percentile([h * 1000 for h in hits], 50) if hits else None,
                        "hit_p99_ms": percentile([h * 1000 for h in hits], 99) if hits else None,
                        "hits": len(hits),
                        "counts": counts,
                        "errors": errors,
                    }
                )
                print(json.dumps(samples[-1]), flush=True)
            load.stop.set()
    finally:
        redis_server.stop()
    metrics = [
        "gateway_rss_mb",
        "gateway_fds",
        "gateway_cache_mb",
        "worker_rss_mb",
        "worker_fds",
        "redis_used_mb",
        "redis_dataset_mb",
        "redis_overhead_mb",
        "job_stream",
        "hit_p99_ms",
    ]
    slopes = {m: slope_per_hour([(s["t_s"], s[m]) for s in samples if s[m] is not None]) for m in metrics}
    kinds = sorted({kind for s in samples for kind in s["redis_keys"]})
    key_slopes = {kind: slope_per_hour([(s["t_s"], s["redis_keys"].get(kind, 0)) for s in samples]) for kind in kinds}
    censuses = [s for s in samples if s["redis_key_bytes"] is not None]
    byte_slopes = {
        kind: slope_per_hour([(s["t_s"], s["redis_key_bytes"].get(kind, 0) / 2**20) for s in censuses])
        for kind in kinds
    }
    results = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "samples": samples,
        "slopes_per_hour": slopes,
        "redis_key_slopes_per_hour": key_slopes,
        "redis_key_mb_slopes_per_hour": byte_slopes,
    }
    write_json(args.out / "soak.json", results)
    plot(results, args.out / "soak.png")
    print(json.dumps({"slopes_per_hour": slopes, "last": samples[-1] if samples else None}, indent=1))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = results["samples"]
    if not samples:
        return
    minutes = [s["t_s"] / 60 for s in samples]
    panels = [
        ("RSS (MiB)", ["gateway_rss_mb", "gateway_cache_mb", "worker_rss_mb"]),
        ("open descriptors", ["gateway_fds", "worker_fds"]),
        ("Redis memory (MiB)", ["redis_used_mb", "redis_dataset_mb", "redis_overhead_mb"]),
        ("hit latency (ms)", ["hit_p50_ms", "hit_p99_ms"]),
        ("queued jobs", ["job_stream"]),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels)), sharex=True)
    for ax, (title, names) in zip(axes, panels, strict=True):
        for name in names:
            ax.plot(minutes, [s.get(name) if s.get(name) is not None else float("nan") for s in samples], label=name)
        ax.set_ylabel(title, fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("minutes")
    fig.suptitle("plancache soak (CPU, stand-in compiler)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()

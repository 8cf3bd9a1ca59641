"""Upgrade rehearsal (CPU; plans from the STAND-IN compiler, unsigned, loopback):
a store holds --specs plans for target A with a Zipf hit history; a worker of
target B appears; nodes of B start every second, each needing
--specs-per-node specs drawn from the same Zipf law. Run twice on a fresh
Redis each, identical but for warming: with the worker warming B on its own
(`--warm-after-idle`, the product's default path for a new target), and with
`--no-warm`.

A and B are the stand-in worker's two targets: A = the generic target G
(sm_90, cuDNN and frontend versions), B = the exact one E (device, SM count).
A worker of E warms E from G's history: what a GPU host does after a first
node's generic compiles, and the same code path as an upgrade's new versions.

Real processes: one plancache-server (`--gpus none --unsigned`), one stand-in
worker (`--build-processes 2`: one process kept for heuristic plans, one for
candidates and warming; this 2-core machine's default would be 1); the nodes
are threads of this process, a Client each, one Prefetch (compile_missing)
per node: a request is a hit when its plan was stored, a miss when it was built
(or joined) for it. Measured: the share of A's hits covered over time (the
WarmStatus call, and this benchmark's own EXISTS of every spec's plan for B),
each node's hit rate, and real misses for A (a Compile of a new spec for G):
during the rollout, with warming alone running after it, and on an idle
worker (the floor, in the run without warming). A small last run checks the
store bound: warming under --store-max-mb evicts warmed plans only.

    make upgrade                                # writes bench/results/upgrade.{json,png}
    python bench/upgrade.py --quick --out DIR   # a short run (the smoke test)
    python bench/upgrade.py --zipf 1.2 --node-seconds 90
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import redis

from bench.report import figure, percentile, save, table, write_json
from plancache import Client, CompileOptions, GraphSpec, InvalidRequest, Manifest, WarmStatus
from plancache.graphspec import spec_io
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from plancache_server.store.lifecycle import Janitor
from plancache_server.store.plans import RedisPlanStore, StoredPlan
from plancache_server.worker.compiler.base import heuristic_plan
from plancache_server.worker.verified_job import VerifiedJob, plan_metadata
from tests.support.processes import REPO, child_env, server_process, wait_for_workers, worker_process
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET, StandInCompiler

EXACT = STANDIN_TARGET  # B: the target a worker brings
GENERIC = STANDIN_TARGET.generic()  # A: the target whose history warms it
MILESTONES = (0.5, 0.9, 0.99)
HIT_RATE_TARGET = 0.9
FULL = {
    "specs": 500,
    "node_seconds": 60.0,
    "specs_per_node": 20,
    "top_k": 100,
    "tune_seconds": 0.45,
    "candidates": 10,
    "miss_at": "10,30,50",
    "max_seconds": 180.0,
    "bound_specs": 24,
    "bound_mb": 2,
}
QUICK = {
    "specs": 40,
    "node_seconds": 6.0,
    "specs_per_node": 4,
    "top_k": 10,
    "tune_seconds": 0.1,
    "candidates": 3,
    "miss_at": "3",
    "max_seconds": 12.0,
    "bound_specs": 11,
    "bound_mb": 1,
}
OPTIONS = CompileOptions()


# ---- the store of target A --------------------------------------------------


def spec_of(i: int) -> GraphSpec:
    """The i-th most hit spec of A (distinct shapes: names do not make specs distinct)."""
    return matmul_spec(m=32 + 16 * (i % 50), n=64 * (1 + i // 50), name=f"upgrade-{i}")


def miss_spec(j: int) -> GraphSpec:
    """Specs no node and no store has: the real misses for A."""
    return matmul_spec(m=48 + 16 * j, n=96, k=1024, name=f"upgrade-miss-{j}")


def zipf_weights(count: int, s: float) -> np.ndarray:
    w: np.ndarray = np.arange(1, count + 1, dtype=float) ** -s
    return w / w.sum()


def hit_counts(count: int, s: float, total: int) -> list[int]:
    """Each spec's hits in A's history, rank = spec index (every spec hit at least once)."""
    return [max(1, round(total * w)) for w in zipf_weights(count, s)]


def seed_store(redis_url: str, count: int, hits: list[int], bound_mb: int = 0) -> None:
    """A's plans as A's workers would have stored them (each with its spec
    body), and their hits in the current hour's bucket; no build runs."""
    client = redis.Redis.from_url(redis_url)
    store, compiler = RedisPlanStore(client, max_bytes=bound_mb * 2**20), StandInCompiler(target=GENERIC)
    hour = int(time.time() // 3600)
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        query = PlanQuery.of(spec_of(i), GENERIC, OPTIONS)
        normalized, key = query.spec, query.key
        compiled = heuristic_plan(compiler.heuristic(query), provisional=False)
        metadata = plan_metadata(VerifiedJob(query), compiled, "upgrade-seed", GENERIC.to_proto())
        store.put(
            StoredPlan(blob=compiled.blob, metadata=metadata, signature=None),
            spec=spec_io.to_proto(normalized),
            warmed=False,
        )
        pipe.zincrby(keys.plan_hits(hour), hits[i], key)
    pipe.execute()
    client.close()


def key_for(spec: GraphSpec, target: Target) -> str:
    return PlanQuery.of(spec, target, OPTIONS).key


# ---- processes ----------------------------------------------------------------


def worker_env(args: argparse.Namespace, build_log: Path | None = None, tune: bool = True) -> dict[str, str]:
    extra = {"PLANCACHE_STANDIN_BUILD_SECONDS": str(args.build_seconds if tune else 0.01)}
    if build_log is not None:
        extra["PLANCACHE_STANDIN_BUILD_LOG"] = str(build_log)
    if tune:
        extra |= {
            "PLANCACHE_STANDIN_TUNE_SECONDS": str(args.tune_seconds),
            "PLANCACHE_STANDIN_CANDIDATES": str(args.candidates),
        }
    return child_env(**extra)


@contextmanager
def deployment(
    folder: Path,
    count: int,
    hits: list[int],
    args: argparse.Namespace,
    worker_flags: list[str],
    env: dict[str, str],
    bound_mb: int = 0,
) -> Iterator[tuple[str, str, subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """A fresh Redis seeded with A's `count` plans, then a gateway and one
    stand-in worker, ready: (address, redis url, server, worker)."""
    folder.mkdir(parents=True)
    address = f"127.0.0.1:{free_port()}"
    bound = ["--store-max-mb", str(bound_mb)] if bound_mb else []
    flags = [
        "--device",
        "0",
        "--compiler",
        "tests.support.standin:factory",
        "--unsigned",
        "--build-processes",
        str(args.build_processes),
        *bound,
    ]
    redis_server = EmbeddedRedis(folder / "redis", persist=False).start()
    try:
        seed_store(redis_server.url, count, hits, bound_mb)
        with ExitStack() as stack:
            server = stack.enter_context(
                server_process(address, redis_server.url, folder / "server.log", "--gpus", "none", "--unsigned", *bound)
            )
            worker = stack.enter_context(
                worker_process(redis_server.url, folder / "worker.log", *flags, *worker_flags, env=env)
            )
            wait_for_workers(address, proc=worker, timeout=120)
            yield address, redis_server.url, server, worker
    finally:
        redis_server.stop()


def warm_status(client: Client) -> WarmStatus | None:
    try:
        (status,) = client.admin.warm_status(EXACT)
    except InvalidRequest:  # no plan yet
        return None
    return status


def wait_warming(client: Client, until: Callable[[WarmStatus], bool], deadline: float) -> WarmStatus | None:
    """Poll B's warming until `until(status)` or the (monotonic) deadline."""
    status = warm_status(client)
    while time.monotonic() < deadline and not (status is not None and until(status)):
        time.sleep(0.05)
        status = warm_status(client)
    return status


def finished(status: WarmStatus) -> bool:
    return status.state != "active" and not status.in_flight


class Poller:
    """Every `interval` s: the product's WarmStatus of B, and this benchmark's
    own view, which plans of A's specs are stored for B (first seen when)."""

    def __init__(
        self, address: str, redis_url: str, exact_keys: list[str], hits: list[int], t0: float, interval: float
    ) -> None:
        self._client = Client(address, cache=False, allow_unsigned=True, timeout=10)
        self._redis = redis.Redis.from_url(redis_url)
        self._keys, self._hits, self._t0, self._interval = exact_keys, hits, t0, interval
        self.first_stored: list[float | None] = [None] * len(exact_keys)
        self.samples: list[dict[str, Any]] = []
        self.last: WarmStatus | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="upgrade-poller", daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._client.close()
        self._redis.close()

    def sample(self) -> dict[str, Any]:
        t = time.time() - self._t0
        pipe = self._redis.pipeline(transaction=False)
        for key in self._keys:
            pipe.exists(keys.plan(key))
        for i, present in enumerate(pipe.execute()):
            if present and self.first_stored[i] is None:
                self.first_stored[i] = t
        covered = sum(h for h, seen in zip(self._hits, self.first_stored, strict=True) if seen is not None)
        status = warm_status(self._client)  # read after the plans: its coverage is at least this one's
        self.last = status or self.last
        row: dict[str, Any] = {
            "t": round(t, 3),
            "coverage": covered / sum(self._hits),
            "stored": sum(s is not None for s in self.first_stored),
        }
        if status is not None:
            row |= {
                "warm_coverage": status.coverage,
                "built": status.built,
                "skipped": status.skipped,
                "failed": status.failed,
                "in_flight": status.in_flight,
                "state": status.state,
            }
        self.samples.append(row)
        return row

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._interval)


def real_miss(address: str, spec: GraphSpec, kind: str, t0: float, warming: Client | None = None) -> dict[str, Any]:
    """One Compile of a spec nothing has, for A: its latency, and B's warm builds in flight as it was asked."""
    status = warm_status(warming) if warming is not None else None
    with Client(address, cache=False, allow_unsigned=True, compile_timeout=120) as client:
        started = time.time()
        plan = client.compile(spec, GENERIC)
        latency = time.time() - started
    return {
        "kind": kind,
        "at_s": round(started - t0, 3),
        "latency_s": latency,
        "source": plan.source,
        "provisional": plan.provisional,
        "warm_in_flight": status.in_flight if status else 0,
    }


def node(address: str, index: int, draws: list[int], t0: float) -> dict[str, Any]:
    """One node of B: one Prefetch of its specs, building what is missing. A
    request is a hit when its plan was in the store before the node asked: a
    stored plan still being tuned also comes back as `provisional` (as one
    this call built does), so its creation time tells them apart."""
    specs = [spec_of(i) for i in draws]
    with Client(address, cache=False, allow_unsigned=True, compile_timeout=300) as client:
        started = time.time()
        result = client.prefetch(Manifest.from_specs(specs, EXACT), compile_missing=True)
        ended = time.time()
    plans = [result.plans.get(k) for k in range(len(specs))]
    stored = [
        p is not None and (p.source == "hit" or (p.source == "provisional" and p.metadata.created_at < started))
        for p in plans
    ]
    hits = sum(stored)
    return {
        "node": index,
        "start_s": round(started - t0, 3),
        "end_s": round(ended - t0, 3),
        "requests": len(specs),
        "hits": hits,
        "misses": len(specs) - hits - result.failed,
        "errors": result.failed,
        "hit_rate": hits / len(specs),
        "fetched": result.fetched,
        "provisional_hits": sum(
            ok and p is not None and p.source == "provisional" for ok, p in zip(stored, plans, strict=True)
        ),
        "draws": draws,
        "missed_specs": [i for i, ok in zip(draws, stored, strict=True) if not ok],
    }


def at(t0: float, seconds: float, call: Callable[[], Any], out: list[Any]) -> threading.Thread:
    """Run `call` `seconds` after t0 on a thread of its own; its answer (or error) into `out`."""

    def run() -> None:
        time.sleep(max(0.0, t0 + seconds - time.time()))
        try:
            out.append(call())
        except Exception as e:  # recorded: a failed node or probe is a figure, not a crash
            out.append({"error": f"{type(e).__name__}: {e}"})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# ---- the rollout, with and without warming ----------------------------------------


def rollout(
    name: str, warm: bool, args: argparse.Namespace, hits: list[int], draws: list[list[int]], tmp: Path
) -> dict[str, Any]:
    build_log = tmp / f"{name}-builds.jsonl"
    flags = ["--warm-after-idle", str(args.warm_after_idle)] if warm and args.plan == "auto" else ["--no-warm"]
    miss_at = [float(x) for x in args.miss_at.split(",") if x.strip()]
    exact_keys = [key_for(spec_of(i), EXACT) for i in range(args.specs)]
    result: dict[str, Any] = {"warm": warm, "logs": str(tmp / name)}
    with deployment(tmp / name, args.specs, hits, args, flags, worker_env(args, build_log)) as (
        address,
        redis_url,
        server,
        worker,
    ):
        t0 = time.time()  # the worker of B is up: the rollout starts
        if warm and args.plan == "operator":
            with Client(address, cache=False, allow_unsigned=True) as admin:
                admin.warm(EXACT, from_target=GENERIC)
        poller = Poller(address, redis_url, exact_keys, hits, t0, args.poll_interval).start()
        try:
            nodes: list[Any] = []
            misses: list[Any] = []
            probes = [
                at(t0, s, lambda j=j: real_miss(address, miss_spec(j), "rollout", t0), misses)
                for j, s in enumerate(miss_at)
            ]
            count = int(args.node_seconds / args.node_interval)
            threads = [
                at(t0, i * args.node_interval, lambda i=i: node(address, i, draws[i], t0), nodes) for i in range(count)
            ]
            for thread in threads + probes:
                thread.join(timeout=max(1.0, t0 + args.max_seconds + 60 - time.time()))
            result["nodes_done_s"] = time.time() - t0
            while warm and time.time() < t0 + args.max_seconds:  # warming goes on after the rollout
                if poller.last is not None and (poller.last.coverage >= MILESTONES[-1] or finished(poller.last)):
                    break
                time.sleep(args.poll_interval)
            poller.sample()
        finally:
            poller.stop()
        result |= {
            "t0": t0,
            "nodes": sorted(nodes, key=lambda n: n.get("node", -1)),
            "misses": misses,
            "samples": poller.samples,
            "first_stored_s": poller.first_stored,
            "server_alive": server.poll() is None,
            "worker_alive": worker.poll() is None,
            "warm_status": status_dict(poller.last) if poller.last else None,
        }
        result["end_s"] = time.time() - t0
    result["builds"] = len(build_log.read_text().splitlines()) if build_log.exists() else 0
    return result


def status_dict(s: WarmStatus) -> dict[str, Any]:
    return {
        "state": s.state,
        "source": s.source,
        "total": s.total,
        "built": s.built,
        "skipped": s.skipped,
        "failed": s.failed,
        "in_flight": s.in_flight,
        "remaining": s.remaining,
        "coverage": s.coverage,
        "source_hits_24h": s.source_hits_24h,
        "covered_hits_24h": s.covered_hits_24h,
        "created_at": s.created_at,
        "failures": [list(f) for f in s.failures],
    }


# ---- a real miss while warming builds ------------------------------------------------


def miss_check(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Real misses for A on an idle worker (the floor), then while a warm
    build of B is in flight, nothing else running: the delay warming adds.
    Warming planned by an operator: this run is about the delay, not about
    when warming starts. The same builds as the rollout's."""
    count = args.miss_specs
    hits = hit_counts(count, args.zipf, 1000)
    spare = iter(range(len(args.miss_at.split(",")), 10_000))  # other specs than the rollout's misses
    pause = (
        args.build_seconds + args.tune_seconds + 0.37
    )  # the miss's own tuning, then warming again (out of phase with its builds)
    misses: list[dict[str, Any]] = []
    with ExitStack() as stack:
        address, *_ = stack.enter_context(deployment(tmp / "miss", count, hits, args, ["--no-warm"], worker_env(args)))
        client = stack.enter_context(Client(address, cache=False, allow_unsigned=True, timeout=30))
        t0 = time.time()
        for _ in range(args.quiet_misses):
            misses.append(real_miss(address, miss_spec(next(spare)), "idle", t0, client))
            time.sleep(pause)
        client.admin.warm(EXACT, from_target=GENERIC)
        deadline = time.monotonic() + args.max_seconds
        for _ in range(args.quiet_misses):
            status = wait_warming(client, lambda s: s.in_flight > 0 or finished(s), deadline)
            if status is None or not status.in_flight:
                break  # warming over (or out of time) before another warm build began
            time.sleep(args.build_seconds * 1.5)  # into the warm build's candidates
            misses.append(real_miss(address, miss_spec(next(spare)), "warming", t0, client))
            time.sleep(pause)
        status = warm_status(client)
    return {"specs": count, "misses": misses, "warm_status": status_dict(status) if status else None}


# ---- the store bound ----------------------------------------------------------


def bound_check(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Warming E under --store-max-mb with A's plans (served) filling most of
    the bound and two plans of E that a node asked for: warming may evict only
    warmed plans. Quick builds (no tuning); warming planned by an operator."""
    count, hits = args.bound_specs, hit_counts(args.bound_specs, args.zipf, 1000)
    hot = [
        spec_of(i) for i in (count - 1, count - 2)
    ]  # least hit in A's history, asked for by a node of E: served plans
    with deployment(tmp / "bound", count, hits, args, ["--no-warm"], worker_env(args, tune=False), args.bound_mb) as (
        address,
        redis_url,
        _s,
        _w,
    ):
        with Client(address, cache=False, allow_unsigned=True, timeout=30) as client:
            client.prefetch(Manifest.from_specs(hot, EXACT), compile_missing=True)
            client.admin.warm(EXACT, from_target=GENERIC)
            status = wait_warming(client, finished, time.monotonic() + args.max_seconds)
        r = redis.Redis.from_url(redis_url)
        usage = Janitor(r).usage()
        a_kept = sum(bool(r.exists(keys.plan(key_for(spec_of(i), GENERIC)))) for i in range(count))
        hot_kept = sum(bool(r.exists(keys.plan(key_for(s, EXACT)))) for s in hot)
        r.close()
    a, e = usage.get(GENERIC.id), usage.get(EXACT.id)
    stored_bytes = sum(u.stored_bytes for u in usage.values())
    result = {
        "bound_mb": args.bound_mb,
        "a_plans": count,
        "a_kept": a_kept,
        "a_evicted": a.evicted if a else 0,
        "hot_b_plans": len(hot),
        "hot_b_kept": hot_kept,
        "b_stored": e.stored_plans if e else 0,
        "b_evicted": e.evicted if e else 0,
        "stored_bytes": stored_bytes,
        "warm_status": status_dict(status) if status else None,
    }
    result["met"] = (
        a_kept == count
        and hot_kept == len(hot)
        and result["a_evicted"] == 0
        and stored_bytes <= args.bound_mb * 2**20
        and bool(status)
    )
    return result


# ---- figures ------------------------------------------------------------------


def milestones(samples: list[dict[str, Any]], field: str) -> dict[str, float | None]:
    """Seconds from t0 to the first sample at or past each share of A's hits."""
    return {
        f"{q:.0%}": next((s["t"] for s in samples if s.get(field) is not None and s[field] >= q), None)
        for q in MILESTONES
    }


def hit_rate(nodes: list[dict[str, Any]], since: float = float("-inf"), until: float = float("inf")) -> dict[str, Any]:
    chosen = [n for n in nodes if "node" in n and since <= n["start_s"] < until]
    requests, hits = sum(n["requests"] for n in chosen), sum(n["hits"] for n in chosen)
    return {"nodes": len(chosen), "requests": requests, "hits": hits, "hit_rate": hits / requests if requests else None}


def summarize(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    runs, with_ = results["runs"], results["runs"]["with"]
    per_spec_s = args.build_seconds + args.tune_seconds  # one process builds a spec's candidates one by one
    status = with_.get("warm_status") or {}
    warm_start = status["created_at"] - with_["t0"] if status.get("created_at") else None
    top_build_s = args.top_k * per_spec_s
    window = warm_start + top_build_s if warm_start is not None else None
    candidate_s = args.tune_seconds / max(1, args.candidates - 1)
    checked = results["misses"]["misses"]
    idle = [m["latency_s"] for m in checked if m.get("kind") == "idle"]
    warming = [m["latency_s"] for m in checked if m.get("kind") == "warming"]
    floor = percentile(idle, 50) if idle else None
    rollout = {name: [m["latency_s"] for m in run["misses"] if "latency_s" in m] for name, run in runs.items()}
    step = 10.0
    windows = [i * step for i in range(math.ceil(args.node_seconds / step))]
    summary: dict[str, Any] = {
        "source_hits": sum(results["hits"]),
        "per_spec_build_s": per_spec_s,
        "candidate_s": candidate_s,
        "warm_started_s": warm_start,
        # An item is taken (in flight) when its heuristic plan is queued, and counted as built only
        # once its candidates are tuned, which come after every real tuning: "built" stays low
        # during a rollout while warming's heuristic plans are stored (coverage shows them).
        "first_warm_item_s": next(
            (x["t"] for x in with_["samples"] if any(x.get(f) for f in ("in_flight", "built", "skipped", "failed"))),
            None,
        ),
        "top_k": args.top_k,
        "top_k_build_s": top_build_s,
        "window_start_s": window,
        "top_k_stored_s": {
            name: (max(v) if all(x is not None for x in v) else None)
            for name, v in ((n, r["first_stored_s"][: args.top_k]) for n, r in runs.items())
        },
        "coverage_s": {name: milestones(run["samples"], "coverage") for name, run in runs.items()},
        "coverage_s_warm_status": milestones(with_["samples"], "warm_coverage"),
        "coverage_at_nodes_end": {
            name: _at(run["samples"], args.node_seconds, "coverage") for name, run in runs.items()
        },
        "coverage_at_end": {
            name: run["samples"][-1]["coverage"] if run["samples"] else None for name, run in runs.items()
        },
        "hit_rate": {name: hit_rate(run["nodes"]) for name, run in runs.items()},
        "hit_rate_by_window": {
            name: [[t, hit_rate(run["nodes"], t, t + step)["hit_rate"]] for t in windows] for name, run in runs.items()
        },
        "hit_rate_after_window": {
            name: hit_rate(run["nodes"], window) if window is not None else None for name, run in runs.items()
        },
        "node_errors": {
            name: sum(n.get("errors", 0) + ("error" in n) for n in run["nodes"]) for name, run in runs.items()
        },
        "miss_floor_s": floor,
        "miss_bound_s": args.build_seconds + candidate_s,
        "warming_miss_s": warming,
        "warming_miss_bound_s": (floor + candidate_s) if floor is not None else None,
        "rollout_miss_s": rollout,
    }
    after = (summary["hit_rate_after_window"]["with"] or {}).get("hit_rate")
    summary["met"] = {
        "hit_rate_after_window": after is not None and after >= HIT_RATE_TARGET,
        "warming_miss": bool(warming) and floor is not None and max(warming) <= floor + candidate_s,
        "store_bound": results["bound"].get("met"),
    }
    return summary


def _at(samples: list[dict[str, Any]], t: float, field: str) -> float | None:
    before = [s[field] for s in samples if s["t"] <= t and s.get(field) is not None]
    return before[-1] if before else None


def _s(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f} s"


def _ms(values: list[float]) -> str:
    return ", ".join(f"{v * 1e3:.0f}" for v in values) or "—"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def targets(results: dict[str, Any]) -> list[list[Any]]:
    """[measure, value, target, met] rows (the printed table and the doc's)."""
    s, met, c = results["summary"], results["summary"]["met"], results["config"]
    w, wo = s["hit_rate_after_window"]["with"], s["hit_rate_after_window"]["without"]
    cov, bound = s["coverage_s"], results["bound"]
    if s["window_start_s"] is None:
        after = [
            "hit rate of nodes once warming has run for the top {k}'s build time".format(k=s["top_k"]),
            "warming never planned",
            f">= {HIT_RATE_TARGET:.0%}",
            False,
        ]
    else:
        label = (
            f"hit rate of nodes started {s['window_start_s']:.1f} s on "
            f"(warming planned + {s['top_k_build_s']:.0f} s, the top {s['top_k']}'s build time)"
        )
        value = (
            f"{_pct(w['hit_rate'])} / {_pct(wo['hit_rate'])} ({w['requests']} requests)"
            if w["requests"]
            else f"no node started that late (the last at {c['node_seconds'] - c['node_interval']:g} s)"
        )
        after = [label + ": with / without", value, f">= {HIT_RATE_TARGET:.0%} with", met["hit_rate_after_window"]]
    rows: list[list[Any]] = [
        [
            "warming planned / its first items taken (s from the worker of B up)",
            f"{_s(s['warm_started_s'])} / {_s(s['first_warm_item_s'])}",
            "-",
            "-",
        ],
        [
            "time to 50% / 90% / 99% of A's hits stored for B: with warming",
            " / ".join(_s(v) for v in cov["with"].values()),
            "-",
            "-",
        ],
        [
            "the same, without warming (the nodes' own misses)",
            " / ".join(_s(v) for v in cov["without"].values()),
            "-",
            "-",
        ],
        [
            "share of A's hits stored for B when the last node started: with / without",
            " / ".join(_pct(v) for v in s["coverage_at_nodes_end"].values()),
            "-",
            "-",
        ],
        [
            f"top {s['top_k']} specs all stored for B: with / without",
            " / ".join(_s(v) for v in s["top_k_stored_s"].values()),
            "-",
            "-",
        ],
        [
            "hit rate of all node requests: with / without",
            f"{_pct(s['hit_rate']['with']['hit_rate'])} / {_pct(s['hit_rate']['without']['hit_rate'])}",
            "-",
            "-",
        ],
        after,
        [
            "real miss for A, idle worker (floor; ms)",
            _ms(results["misses"] and [m["latency_s"] for m in results["misses"]["misses"] if m["kind"] == "idle"]),
            f"its build: {c['build_seconds'] * 1e3:.0f}",
            "-",
        ],
        [
            "real miss for A, a warm build of B in flight (ms)",
            _ms(s["warming_miss_s"]),
            f"<= floor + one candidate ({(s['warming_miss_bound_s'] or 0) * 1e3:.0f})",
            met["warming_miss"],
        ],
        [
            "real miss for A during the rollout (nodes' misses queued too), with / without warming (ms)",
            f"{_ms(s['rollout_miss_s']['with'])} / {_ms(s['rollout_miss_s']['without'])}",
            "-",
            "-",
        ],
        [
            f"under --store-max-mb {bound['bound_mb']}: A's plans kept / plans of B served kept / warmed plans evicted",
            f"{bound['a_kept']}/{bound['a_plans']} / {bound['hot_b_kept']}/{bound['hot_b_plans']} "
            f"/ {bound['b_evicted']}",
            "all / all / any",
            bound["met"],
        ],
        [
            "node errors: with / without",
            f"{s['node_errors']['with']} / {s['node_errors']['without']}",
            "0",
            s["node_errors"]["with"] + s["node_errors"]["without"] == 0,
        ],
    ]
    for name, run in results["runs"].items():
        if not (run.get("server_alive") and run.get("worker_alive")):
            rows.append([f"server and worker alive after ({name})", "no", "yes", False])
    return rows


COLORS = {"with": "tab:blue", "without": "tab:orange"}
WIDTHS = {"with": 3.5, "without": 1.2}  # the runs' lines can coincide: the wide one stays visible under the thin one


def plot(results: dict[str, Any], path: Path) -> None:
    s, runs, c = results["summary"], results["runs"], results["config"]
    fig, axes = figure(3)
    ax = axes[0]
    for name, run in runs.items():
        nodes = [n for n in run["nodes"] if "node" in n]
        starts, rates = [n["start_s"] for n in nodes], [n["hit_rate"] for n in nodes]
        ax.scatter(starts, rates, s=8, color=COLORS[name], alpha=0.4)
        rolling = [float(np.mean(rates[max(0, i - 4) : i + 1])) for i in range(len(rates))]
        ax.plot(
            starts,
            rolling,
            color=COLORS[name],
            linewidth=WIDTHS[name],
            label=f"{name} warming (5-node mean); all: {_pct(s['hit_rate'][name]['hit_rate'])}",
        )
    if s["window_start_s"] is not None and s["window_start_s"] <= c["node_seconds"]:
        ax.axvline(
            s["window_start_s"], color="green", linestyle="--", label=f"warming planned + top {s['top_k']}'s build time"
        )
    ax.axhline(HIT_RATE_TARGET, color="red", linewidth=0.8, label=f"{HIT_RATE_TARGET:.0%} (target)")
    ax.set_xlabel("node start (s from the worker of B up)")
    ax.set_ylabel("node's hit rate (plans stored before it asked)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(
        f"nodes of B, one a {c['node_interval']:g} s, {c['specs_per_node']} specs each, Zipf s={c['zipf']}", fontsize=9
    )
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[1]
    for name, run in runs.items():
        ax.plot(
            [x["t"] for x in run["samples"]],
            [x["coverage"] for x in run["samples"]],
            color=COLORS[name],
            linewidth=WIDTHS[name],
            label=f"{name} warming",
        )
    warm = [x for x in runs["with"]["samples"] if x.get("warm_coverage") is not None]
    ax.plot(
        [x["t"] for x in warm],
        [x["warm_coverage"] for x in warm],
        color="black",
        linestyle=":",
        label="WarmStatus coverage (once planned)",
    )
    for q in MILESTONES:
        ax.axhline(q, color="grey", linewidth=0.5)
    ax.axvline(c["node_seconds"], color="purple", linestyle="--", label="nodes stop starting")
    if s["warm_started_s"] is not None:
        ax.axvline(s["warm_started_s"], color="green", linestyle="--", label="warming planned")
    ax.set_xlabel("s from the worker of B up")
    ax.set_ylabel("share of A's hits whose plan is stored for B")
    ax.set_title(f"coverage of A's {s['source_hits']:,} hits over {c['specs']} specs", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[2]
    groups = [
        ("idle worker", [m["latency_s"] for m in results["misses"]["misses"] if m["kind"] == "idle"]),
        ("warm build in flight", s["warming_miss_s"]),
        *((f"rollout, {name} warming", s["rollout_miss_s"][name]) for name in runs),
    ]
    for i, (_, values) in enumerate(groups):
        ax.scatter([i] * len(values), [v * 1e3 for v in values], s=20)
    ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=7)
    if s["warming_miss_bound_s"] is not None:
        ax.axhline(
            s["warming_miss_bound_s"] * 1e3,
            color="red",
            linewidth=0.8,
            label="floor + one candidate (target while warming)",
        )
    ax.axhline(s["miss_bound_s"] * 1e3, color="grey", linestyle="--", linewidth=0.8, label="build + one candidate")
    ax.set_ylabel("Compile latency of a new spec for A (ms)")
    ax.set_title("real misses for A", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(
        f"upgrade rehearsal: {s['per_spec_build_s']:.2f} s per spec (heuristic + {c['candidates'] - 1} candidates), "
        f"{c['build_processes']} build processes, {results['machine']['cpus']} cores",
        fontsize=10,
    )
    save(fig, path)


# ---- main -----------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", type=int, help=f"A's stored specs (default {FULL['specs']})")
    parser.add_argument("--zipf", type=float, default=1.1, help="exponent s of the hit law (rank = spec index)")
    parser.add_argument("--total-hits", type=int, default=100_000, help="A's hits in the history")
    parser.add_argument(
        "--node-seconds", type=float, help=f"nodes start during this long (default {FULL['node_seconds']:g})"
    )
    parser.add_argument("--node-interval", type=float, default=1.0, help="seconds between two nodes' starts")
    parser.add_argument("--specs-per-node", type=int, help=f"specs each node needs (default {FULL['specs_per_node']})")
    parser.add_argument(
        "--top-k",
        type=int,
        help="the hit-rate target's window opens when warming has run for the top K's build time "
        f"(default {FULL['top_k']})",
    )
    parser.add_argument("--build-seconds", type=float, default=0.05, help="stand-in heuristic build (s)")
    parser.add_argument(
        "--tune-seconds", type=float, help=f"stand-in candidates' builds together (s; default {FULL['tune_seconds']})"
    )
    parser.add_argument("--candidates", type=int, help=f"candidates per spec (default {FULL['candidates']})")
    parser.add_argument(
        "--build-processes", type=int, default=2, help="the worker's build processes (one is kept for heuristic plans)"
    )
    parser.add_argument(
        "--warm-after-idle", type=float, default=0.5, help="the worker's --warm-after-idle in the run with warming"
    )
    parser.add_argument(
        "--plan",
        choices=("auto", "operator"),
        default="auto",
        help="who plans the warming: the worker on its own when idle (auto), "
        "or an operator's Client.warm as the worker appears",
    )
    parser.add_argument(
        "--miss-at",
        help=f"seconds after the worker is up of the real misses during the rollout (default {FULL['miss_at']})",
    )
    parser.add_argument(
        "--quiet-misses",
        type=int,
        default=3,
        help="real misses on an idle worker, and as many with a warm build in flight",
    )
    parser.add_argument(
        "--miss-specs", type=int, default=30, help="A's plans in the run that times real misses while warming builds"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        help=f"a run ends this long after the worker is up at the latest (default {FULL['max_seconds']:g})",
    )
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument(
        "--bound-specs",
        type=int,
        help=f"A's plans in the store-bound run (default {FULL['bound_specs']}: "
        "with 2 of B, 75 KB each, most of the bound)",
    )
    parser.add_argument(
        "--bound-mb", type=int, help=f"--store-max-mb of the store-bound run (default {FULL['bound_mb']})"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--note", default="", help="stored in the JSON")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="a short run (the smoke test)")
    parser.add_argument(
        "--from-json", type=Path, help="no run: summarize a recorded run's JSON again (its config) into --out"
    )
    args = parser.parse_args()
    if args.from_json is not None:
        results = json.loads(args.from_json.read_text())
        out = args.out
        args = argparse.Namespace(**results["config"], out=out)
        results["summary"] = summarize(results, args)
        results["targets"] = targets(results)
        print(table(["measure", "value", "target", "met"], results["targets"]))
        write_json(args.out / "upgrade.json", results)
        plot(results, args.out / "upgrade.png")
        return
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    results = run(args)
    results["summary"] = summarize(results, args)
    results["targets"] = targets(results)
    print(table(["measure", "value", "target", "met"], results["targets"]))
    write_json(args.out / "upgrade.json", results)
    plot(results, args.out / "upgrade.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="plancache-upgrade-"))
    hits = hit_counts(args.specs, args.zipf, args.total_hits)
    rng = np.random.default_rng(args.seed)
    weights = zipf_weights(args.specs, args.zipf)
    count = int(args.node_seconds / args.node_interval)
    size = min(args.specs_per_node, args.specs)
    draws = [sorted(int(i) for i in rng.choice(args.specs, size=size, replace=False, p=weights)) for _ in range(count)]
    results: dict[str, Any] = {
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"},
        "target_ids": {"A": GENERIC.id, "B": EXACT.id},
        "note": args.note,
        "logs": str(tmp),
        "hits": hits,
        "runs": {},
    }
    for name, warm in (("with", True), ("without", False)):
        print(f"upgrade: the rollout {name} warming ...", file=sys.stderr, flush=True)
        results["runs"][name] = rollout(name, warm, args, hits, draws, tmp)
    print("upgrade: real misses while warming builds ...", file=sys.stderr, flush=True)
    results["misses"] = miss_check(args, tmp)
    print("upgrade: the store bound ...", file=sys.stderr, flush=True)
    results["bound"] = bound_check(args, tmp)
    results["wall_s"] = time.time() - started
    return results


if __name__ == "__main__":
    main()

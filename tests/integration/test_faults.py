"""Faults under load, each reporting its figures (run with -s to see them):
Redis killed and restarted, the gateway and a worker stopped (SIGTERM)
during compiles. Corrupted blobs and metadata, a worker killed mid-build and
a corrupted disk cache are covered in test_service, test_fleet and
test_disk_cache."""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from plancache import Client, DiskCache, PlanCacheError
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import start_stack
from tests.support.operator_view import report
from tests.support.processes import standin_deployment
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_redis_killed_and_restarted_under_load(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=True).start()
    port = redis_server.port
    stack, stop = start_stack(redis_server.url, StandInCompiler(), memory_cache_bytes=0)  # every read goes to Redis
    outcomes: Counter[str] = Counter()
    wrong = 0
    try:
        with Client(stack.address, cache=False, timeout=5) as seeder:
            plans = [seeder.compile(matmul_spec(m=8 * (i + 1)), TARGET) for i in range(10)]
        expected = {p.key: hashlib.sha256(p.blob).hexdigest() for p in plans}
        node_cache = DiskCache(tmp_path / "node-cache")
        with Client(stack.address, cache=node_cache) as node:
            for p in plans:
                node.get(p.key)
        stop_load = threading.Event()
        lock = threading.Lock()

        def load(i: int) -> None:
            nonlocal wrong
            with Client(stack.address, cache=False, timeout=5) as client:
                while not stop_load.is_set():
                    key = plans[i % len(plans)].key
                    try:
                        got = client.get(key)
                        ok = hashlib.sha256(got.blob).hexdigest() == expected[key] and got.key == key
                        with lock:
                            outcomes["ok"] += 1
                            wrong += not ok
                    except PlanCacheError as e:
                        with lock:
                            outcomes[type(e).__name__] += 1

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(load, i) for i in range(8)]
            before = wait_until(lambda: outcomes["ok"] >= 100 and outcomes["ok"], 20, "the load is under way")
            redis_server.kill()
            down_at = time.monotonic()
            time.sleep(2.0)
            during = dict(outcomes)
            # A restarting node with a warm disk cache starts while Redis is down.
            with Client(stack.address, cache=node_cache, timeout=2) as restarting:
                started = [restarting.get(p.key).source for p in plans]
            redis_server = EmbeddedRedis(tmp_path / "redis", persist=True, port=port).start()
            up_at = time.monotonic()
            recovered_after = None
            while time.monotonic() - up_at < 20:
                ok_now = outcomes["ok"]
                time.sleep(0.2)
                if outcomes["ok"] > ok_now:
                    recovered_after = time.monotonic() - up_at
                    break
            time.sleep(1.0)
            stop_load.set()
            for f in futures:
                f.result()
        report(
            "redis killed 2 s then restarted",
            {
                "ok_before": before,
                "outcomes": dict(outcomes),
                "wrong_plans": wrong,
                "outage_s": round(up_at - down_at, 2),
                "recovered_after_s": recovered_after,
            },
        )
        assert wrong == 0
        assert set(outcomes) <= {"ok", "StoreUnavailable", "Unavailable"}, outcomes
        assert during.get("StoreUnavailable", 0) > 0  # the outage was seen, as UNAVAILABLE
        assert recovered_after is not None and recovered_after < 10  # no server restart needed
        assert started == ["cache"] * len(plans)
        with Client(stack.address, cache=False) as after:
            assert after.get(plans[0].key).blob == plans[0].blob  # the AOF kept the plans
    finally:
        stop()
        redis_server.stop()


def test_sigterm_during_compiles_drains_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    try:
        with ExitStack() as stack:
            started = tmp_path / "started"
            started.mkdir()
            gateway, server, worker = stack.enter_context(
                standin_deployment(
                    stack, redis_server.url, tmp_path, 1.5, "--build-processes", "1", started_dir=started
                )
            )
            client = stack.enter_context(Client(gateway, cache=False))
            specs = [matmul_spec(m=8 * (i + 1)) for i in range(3)]
            with ThreadPoolExecutor(3) as pool:
                futures = [pool.submit(client.compile, s, TARGET) for s in specs]
                # The first build under way in the worker's build process (taking a job is not enough:
                # a job taken but not started is handed back to the stream when the worker stops).
                wait_until(lambda: any(started.iterdir()), 30, "a build under way")
                worker.send_signal(signal.SIGTERM)  # the worker finishes its build, then leaves
                server.send_signal(signal.SIGTERM)  # the gateway lets in-flight calls finish (grace period)
                results = []
                for f in futures:
                    try:
                        results.append(f.result(timeout=30).source)
                    except PlanCacheError as e:
                        results.append(type(e).__name__)
            worker_code, server_code = worker.wait(timeout=30), server.wait(timeout=30)
        raw = redis.Redis.from_url(redis_server.url)
        plan_hashes = [k for k in raw.scan_iter(match="plancache:{*}:plan")]
        complete = all(set(raw.hkeys(k)) >= {b"blob", b"meta"} for k in plan_hashes)
        pending = raw.xpending(keys.job_stream(TARGET), keys.JOB_GROUP)["pending"]
        queued = raw.xlen(keys.job_stream(TARGET))
        report(
            "SIGTERM during 3 compiles (1.5 s builds)",
            {
                "results": results,
                "worker_exit": worker_code,
                "server_exit": server_code,
                "plans_stored": len(plan_hashes),
                "all_complete": complete,
                "unacked_jobs": pending,
            },
        )
        assert worker_code == 0 and server_code == 0
        # The build under way (whichever job the worker took first) drained to its caller;
        # the others were told to retry, not left hanging.
        assert sorted(results) == ["Unavailable", "Unavailable", "compiled"]
        assert complete and len(plan_hashes) >= 1
        # Jobs the worker did not start stay in the stream for the next worker: handed back, not lost.
        assert queued == 2 and pending == 0  # the finished job left the stream (its length is the queue depth)
    finally:
        redis_server.stop()

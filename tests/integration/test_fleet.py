"""Fleet behaviour with real processes: several gateways and workers on one
Redis build each key once; a worker that dies mid-build has its job finished
by another (or failed after a bounded number of attempts); cuDNN rejections
are remembered."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from plancache import Client, CompileFailed, CompileOptions, Plan
from plancache.graphspec.canonical import spec_hash
from plancache.keys.plankey import make_key
from plancache.transport.results import TargetStats
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.conftest import Stack
from tests.support.processes import child_env, server_process, wait_for_workers, worker_process
from tests.support.specs import matmul_spec
from tests.support.standin import REJECTED_NAME
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

FAST_RECLAIM = ("--heartbeat-interval", "0.3", "--heartbeat-ttl", "3", "--claim-idle", "1.5")


def test_rejections_are_remembered_not_rebuilt(stack: Stack) -> None:
    spec = matmul_spec(name=REJECTED_NAME)
    with stack.client() as client:
        with pytest.raises(CompileFailed, match="NOT_SUPPORTED"):
            client.compile(spec, TARGET)
        with pytest.raises(CompileFailed, match="remembered from an earlier build"):
            client.compile(spec, TARGET)
        # Other options make another key: built (and rejected) on its own.
        with pytest.raises(CompileFailed, match="NOT_SUPPORTED"):
            client.compile(spec, TARGET, CompileOptions(autotune=False))
    assert len(stack.compiler.builds) == 2


class Fleet:
    def __init__(
        self, stack: ExitStack, redis_url: str, tmp: Path, gateways: int, workers: int, build_s: float, *flags: str
    ) -> None:
        env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS=str(build_s))
        flags = ("--unsigned", *flags)
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(gateways)]
        for i, address in enumerate(self.addresses):
            stack.enter_context(server_process(address, redis_url, tmp / f"server{i}.log", "--gpus", "none", *flags))
        self.workers = [
            stack.enter_context(
                worker_process(
                    redis_url,
                    tmp / f"worker{i}.log",
                    "--device",
                    "0",
                    "--compiler",
                    "tests.support.standin:factory",
                    *flags,
                    env=env,
                )
            )
            for i in range(workers)
        ]
        wait_for_workers(self.addresses[0], count=workers)


@pytest.fixture
def fleet_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    yield server
    server.stop()


def test_two_front_ends_two_workers_build_each_key_once(fleet_redis: EmbeddedRedis, tmp_path: Path) -> None:
    with ExitStack() as stack:
        fleet = Fleet(stack, fleet_redis.url, tmp_path, 2, 2, 1.0)
        clients = [stack.enter_context(Client(a, cache=False)) for a in fleet.addresses]
        barrier = threading.Barrier(64)

        def call(i: int) -> Plan:
            barrier.wait()
            return clients[i % 2].compile(matmul_spec(), TARGET)

        with ThreadPoolExecutor(64) as pool:
            plans = list(pool.map(call, range(64)))
        # The other gateway flushes its counters about once a second.
        counted = wait_until(
            lambda: (row := _row(clients[0])).compiles + row.joined == 64 and row,
            10,
            "both gateways' counters flushed",
        )
    assert len({p.blob for p in plans}) == 1
    assert (counted.compiles, counted.joined) == (1, 63)
    assert sorted(p.source for p in plans).count("compiled") == 1


def _row(client: Client) -> TargetStats:
    return {r.target_id: r for r in client.admin.stats()}[TARGET.id]


def _running_worker(client: redis.Redis, plan_key: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = client.hgetall(keys.job_state(plan_key))
        if state.get(b"state") == b"running":
            return state[b"worker"].decode()
        time.sleep(0.05)
    raise AssertionError("no worker started the build")


def _kill_worker_building(fleet: Fleet, worker_id: str) -> int:
    pid = int(worker_id.split("-")[-2])
    os.kill(pid, signal.SIGKILL)
    return pid


def test_worker_killed_mid_build_job_completes_on_another(fleet_redis: EmbeddedRedis, tmp_path: Path) -> None:
    plan_key = make_key(spec_hash(matmul_spec()), TARGET, CompileOptions())
    with ExitStack() as stack:
        fleet = Fleet(stack, fleet_redis.url, tmp_path, 1, 2, 3.0, *FAST_RECLAIM)
        client = stack.enter_context(Client(fleet.addresses[0], cache=False))
        with ThreadPoolExecutor(8) as pool:
            started = time.monotonic()
            futures = [pool.submit(client.compile, matmul_spec(), TARGET) for _ in range(8)]
            victim = _running_worker(redis.Redis.from_url(fleet_redis.url), plan_key)
            _kill_worker_building(fleet, victim)
            plans = [f.result(timeout=60) for f in futures]
        elapsed = time.monotonic() - started
    print(
        f"\n[fault] worker killed mid-build (3 s builds, 1.5 s claim idle): {len(plans)} callers served in {elapsed:.1f} s; "
        f"built by {plans[0].metadata.built_by}, killed {victim}"
    )
    assert len({p.blob for p in plans}) == 1
    assert plans[0].metadata.built_by != victim
    assert elapsed < 30


def test_job_fails_with_the_reason_after_its_attempts_run_out(fleet_redis: EmbeddedRedis, tmp_path: Path) -> None:
    plan_key = make_key(spec_hash(matmul_spec()), TARGET, CompileOptions())
    with ExitStack() as stack:
        fleet = Fleet(stack, fleet_redis.url, tmp_path, 1, 2, 3.0, *FAST_RECLAIM, "--max-attempts", "1")
        client = stack.enter_context(Client(fleet.addresses[0], cache=False))
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(client.compile, matmul_spec(), TARGET)
            _kill_worker_building(fleet, _running_worker(redis.Redis.from_url(fleet_redis.url), plan_key))
            with pytest.raises(CompileFailed, match="gave up after 1 attempts"):
                future.result(timeout=60)


def test_build_over_its_time_budget_fails_with_the_limit_named(fleet_redis: EmbeddedRedis, tmp_path: Path) -> None:
    with ExitStack() as stack:
        fleet = Fleet(stack, fleet_redis.url, tmp_path, 1, 1, 5.0, "--build-budget", "1")
        client = stack.enter_context(Client(fleet.addresses[0], cache=False))
        started = time.monotonic()
        with pytest.raises(CompileFailed, match=r"time budget of 1 s \(--build-budget\)"):
            client.compile(matmul_spec(), TARGET)
        assert time.monotonic() - started < 4
        # The build process that ran over was ended and replaced; the worker itself goes on.
        assert fleet.workers[0].poll() is None
        with pytest.raises(CompileFailed, match="remembered"):
            client.compile(matmul_spec(), TARGET)
        log = tmp_path / "worker0.log"
        deadline = time.monotonic() + 30
        while log.read_text().count(" ready") < 2:  # a new build process in its place
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert "ran past the build budget (1 s); ending the process" in log.read_text()

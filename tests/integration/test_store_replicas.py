"""Issue 44, item 3: with --store-replicas N, a worker announces a build only once N replicas hold its plan (Redis
WAIT after the plan's write), so a failover that promotes one of them loses no plan a caller was given. A real
master and replica (redis-server --replicaof), a real gateway and a stand-in worker; the replica is stopped
(SIGSTOP) while a plan is built, which is what a lagging replica looks like to its master."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from plancache import NotFound
from plancache.keys.query import PlanQuery
from plancache.log_limits import LogLimiter
from plancache.v1 import plancache_pb2 as pb
from plancache_server import telemetry
from plancache_server.store import keys, plans
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import start_stack
from tests.support import hermetic
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

REPLICA_STOPPED_S = 1.5
TUNED_STOPPED_S = 2.0


@pytest.fixture
def master_and_replica(tmp_path: Path) -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    binary = hermetic.redis_server_bin()
    master = EmbeddedRedis(tmp_path / "master", binary=binary, persist=False).start()
    replica = EmbeddedRedis(
        tmp_path / "replica", binary=binary, persist=False, extra_args=("--replicaof", "127.0.0.1", str(master.port))
    ).start()
    replica_client = redis.Redis.from_url(replica.url)
    try:
        wait_until(lambda: replica_client.info("replication").get("master_link_status") == "up", 20, "the link up")
        yield master, replica
    finally:
        replica_client.close()
        replica.stop()
        master.stop()


def _stopped_for(server: EmbeddedRedis, seconds: float) -> threading.Timer:
    """`server` stopped now (SIGSTOP) and resumed after `seconds` (its master's WAIT gets no answer meanwhile)."""
    pid = server._process.pid  # type: ignore[union-attr]
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    timer.start()
    return timer


def _unreplicated() -> float:
    return float(telemetry.UNREPLICATED._value.get())


@pytest.mark.parametrize("replicas", [1, 0], ids=["--store-replicas 1", "none (the default)"])
def test_a_caller_is_given_a_plan_only_once_a_replica_holds_it(
    master_and_replica: tuple[EmbeddedRedis, EmbeddedRedis], replicas: int
) -> None:
    master, replica = master_and_replica
    stack, stop = start_stack(
        master.url, StandInCompiler(build_seconds=0.02), store_replicas=replicas, store_replicas_wait_ms=10_000
    )
    replica_client = redis.Redis.from_url(replica.url)
    try:
        with stack.client(hedge=False) as client:
            client.compile(matmul_spec(m=8, name="warm-up"), TARGET)  # the channel and the worker started
            before = _unreplicated()
            timer = _stopped_for(replica, REPLICA_STOPPED_S)
            began = time.monotonic()
            plan = client.compile(matmul_spec(m=16, name="replicated"), TARGET)
            took = time.monotonic() - began
            held = replica_client.hget(keys.plan(plan.key), "blob")  # blocks until the replica runs again
            timer.join()
        if replicas:  # given to the caller only after the replica acknowledged it: it holds it
            assert took >= REPLICA_STOPPED_S - 0.1, f"announced after {took:.2f} s, while the replica was stopped"
            assert held == plan.blob
            assert _unreplicated() == before
        else:  # the default: announced once the master has it, whatever its replica holds (the bound said)
            assert took < REPLICA_STOPPED_S - 0.5, f"took {took:.2f} s with no replica asked for"
    finally:
        replica_client.close()
        stop()


@pytest.mark.parametrize("replicas", [1, 0], ids=["--store-replicas 1", "none (the default)"])
def test_a_tuned_plan_is_not_written_over_an_invalidation_made_while_it_was_tuned(
    master_and_replica: tuple[EmbeddedRedis, EmbeddedRedis], replicas: int
) -> None:
    master, replica = master_and_replica
    master_client, replica_client = redis.Redis.from_url(master.url), redis.Redis.from_url(replica.url)
    store = plans.RedisPlanStore(master_client, replicas=replicas, replicas_wait_ms=5000)
    key = f"{9:064x}/{TARGET.id}/opt-{9:016x}"
    provisional, tuned = (_stored_plan(key, seed) for seed in ("provisional", "tuned"))
    try:
        assert store.put(provisional) and store.put(tuned, replacing=True)
        assert store.get(key) == tuned
        if replicas:  # put returned once the replica held it
            assert replica_client.hget(keys.plan(key), "blob") == tuned.blob
        store.delete(key)  # an operator's Invalidate while the next build of it tunes
        assert store.put(provisional)  # that build's provisional plan, then the invalidation
        store.delete(key)
        assert not store.put(tuned, replacing=True), "written over the invalidation"
        assert store.get(key) is None and not master_client.exists(keys.plan(key))
        assert wait_until(lambda: not replica_client.exists(keys.plan(key)), 5.0, "the replica to drop it")
    finally:
        master_client.close()
        replica_client.close()


def _stored_plan(key: str, seed: str) -> plans.StoredPlan:
    blob = hashlib.sha256((key + seed).encode()).digest() * 100
    metadata = pb.PlanMetadata(key=key, spec_hash="cd" * 32, blob_sha256=hashlib.sha256(blob).hexdigest())
    return plans.StoredPlan(blob, metadata)


def test_a_replica_that_does_not_answer_in_time_delays_one_build_by_the_wait_only_and_is_counted(
    master_and_replica: tuple[EmbeddedRedis, EmbeddedRedis],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    master, replica = master_and_replica
    monkeypatch.setattr(plans, "_unreplicated_log", LogLimiter(plans.log))  # its line once a minute: this test's
    wait_ms = 1500
    stack, stop = start_stack(
        master.url, StandInCompiler(build_seconds=0.02), store_replicas=1, store_replicas_wait_ms=wait_ms
    )
    try:
        with stack.client(hedge=False) as client, caplog.at_level(logging.WARNING):
            client.compile(matmul_spec(m=8, name="warm-up"), TARGET)
            before = _unreplicated()
            timer = _stopped_for(replica, 5.0)
            began = time.monotonic()
            plan = client.compile(matmul_spec(m=24, name="not replicated in time"), TARGET)
            took = time.monotonic() - began
            began = time.monotonic()
            client.compile(matmul_spec(m=40, name="right after"), TARGET)
            next_took = time.monotonic() - began
            timer.join()
        assert plan.key
        assert wait_ms / 1000 - 0.05 <= took < 4.0, f"took {took:.2f} s with a {wait_ms} ms wait"
        # The worker stores plans one at a time: with its replicas late, the builds right after do not each wait.
        assert next_took < wait_ms / 1000 - 0.5, f"the next build took {next_took:.2f} s"
        assert _unreplicated() == before + 2
        assert any("0 of the 1 replicas of --store-replicas held it" in r.getMessage() for r in caplog.records)
    finally:
        stop()


def test_a_tuned_plan_is_given_once_a_replica_holds_it_though_its_provisional_plan_was_announced(
    master_and_replica: tuple[EmbeddedRedis, EmbeddedRedis],
) -> None:
    """While the build autotunes, its job says PROVISIONAL; the tuned plan written over it is not given to a
    caller that waits for it (tuned_only) until the job is DONE, which the worker says once the replica holds it."""
    master, replica = master_and_replica
    stack, stop = start_stack(
        master.url,
        StandInCompiler(build_seconds=0.02, tune_seconds=2.0),  # ~0.5 s on the stack's four build threads
        store_replicas=1,
        store_replicas_wait_ms=10_000,
    )
    master_client = redis.Redis.from_url(master.url)
    try:
        with stack.client(hedge=False, compile_timeout=30) as client:
            # Tuned before the replica stops: the worker stores plans one at a time, and a warm-up's tuned plan
            # waiting for the stopped replica would hold this build's writes back too.
            client.compile(matmul_spec(m=8, name="warm-up"), TARGET, tuned_only=True)
            spec = matmul_spec(m=32, name="tuned while its replica lags")
            done: list[tuple[float, bool]] = []

            def wait_for_the_tuned_plan() -> None:
                provisional = client.compile(spec, TARGET, tuned_only=True).provisional
                done.append((time.monotonic(), provisional))

            caller = threading.Thread(target=wait_for_the_tuned_plan)
            key = client.query(spec, TARGET).key
            caller.start()
            deadline = time.monotonic() + 10
            while master_client.hget(keys.job_state(key), "state") != b"provisional":  # stored and announced
                assert time.monotonic() < deadline
                time.sleep(0.002)
            stopped_at = time.monotonic()
            timer = _stopped_for(replica, TUNED_STOPPED_S)  # from before the tuned plan's write to well after it
            caller.join(timeout=30)
            timer.join()
        (given_at, provisional), *_ = done
        assert not provisional
        assert given_at - stopped_at >= TUNED_STOPPED_S - 0.1, (
            f"the tuned plan was given {given_at - stopped_at:.2f} s after its replica stopped"
        )
    finally:
        master_client.close()
        stop()


def test_no_reader_is_given_a_new_plan_before_its_replicas_hold_it(
    master_and_replica: tuple[EmbeddedRedis, EmbeddedRedis],
) -> None:
    """The build's own callers get its plan once the build is announced (the tests above); a reader that asked for
    the key meanwhile (a hit on another gateway, a GetPlan) read it from the master as soon as it was written, a
    plan a failover then could lose. A new plan is now hidden from readers until its replicas hold it."""
    master, replica = master_and_replica
    # No gateway memory: every read below asks Redis.
    stack, stop = start_stack(
        master.url,
        StandInCompiler(build_seconds=0.02),
        store_replicas=1,
        store_replicas_wait_ms=10_000,
        memory_cache_bytes=0,
    )
    # Another gateway, with no flight of its own for the key (a gateway that follows a build answers a read of
    # its key as a miss without asking Redis).
    other, stop_other = start_stack(master.url, None, memory_cache_bytes=0)
    master_client = redis.Redis.from_url(master.url)
    try:
        with stack.client(hedge=False) as client, other.client() as reader, ThreadPoolExecutor(1) as pool:
            client.compile(matmul_spec(m=8, name="warm-up"), TARGET)
            spec = matmul_spec(m=48, name="hidden while replicating")
            key = PlanQuery.of(spec, TARGET).key
            timer = _stopped_for(replica, REPLICA_STOPPED_S)
            building = pool.submit(client.compile, spec, TARGET)
            wait_until(lambda: master_client.hexists(keys.plan(key), "blob"), 5, "the plan written on its master")
            with pytest.raises(NotFound):
                reader.get(key)  # its replica stopped: not given to anyone yet
            assert not building.done()
            plan = building.result()
            timer.join()
            assert reader.get(key).blob == plan.blob  # once the replica holds it: served
            assert master_client.hget(keys.plan(key), "replicating") is None
            # A mark a worker never took off (it died in its wait): the plan is a miss, rebuilt, and the rebuild
            # is hidden until its replica holds it too (readers had no plan there).
            master_client.hset(keys.plan(key), "replicating", b"1")
            with pytest.raises(NotFound):
                reader.get(key)
            timer = _stopped_for(replica, REPLICA_STOPPED_S)
            rebuilding = pool.submit(reader.compile, spec, TARGET)
            wait_until(lambda: stack.compiler.builds.count(PlanQuery.of(spec, TARGET).spec_hash) == 2, 5, "the rebuild")
            time.sleep(0.2)  # written, its WAIT under way
            with pytest.raises(NotFound):
                client.get(key)
            assert rebuilding.result().blob == plan.blob
            timer.join()
            assert client.get(key).blob == plan.blob
            assert master_client.hget(keys.plan(key), "replicating") is None
    finally:
        master_client.close()
        stop_other()
        stop()

"""Issue 44, item 3: a Redis Cluster master killed under load. A real
cluster (3 masters, a replica each, cluster-node-timeout 2 s), a gateway and
a stand-in worker against it; nodes compile new graphs and read stored plans
without pause while one master is killed (SIGKILL) and its replica takes over.

Asserted: no wrong plan, ever; every error a typed, retryable one
(StoreUnavailable / Unavailable) and inside the failover window; the
service back within the cluster's own failover plus 2 s; every plan
acknowledged to a caller still served after the failover, except those
acknowledged in the last second before the kill, which Redis' asynchronous
replication may lose (the bound; counted and reported)."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from plancache import PlanCacheError, StoreUnavailable, Unavailable
from plancache.keys.query import PlanQuery
from plancache_server.store import keys as store_keys
from plancache_server.store.redis_conn import connect
from tests.conftest import start_stack
from tests.support.operator_view import report
from tests.support.redis_cluster import LocalCluster
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

RETRYABLE = (StoreUnavailable, Unavailable)
HEARTBEAT_TTL_S = 1.0
LAG_S = 0.6  # how far the killed master's replica is behind it (stopped): within the second of loss allowed
PAUSE_S = 0.01  # between one node's calls: steady load that leaves the suite's other tests their CPU


@pytest.mark.parametrize("store_replicas", [0, 1], ids=["as by default", "--store-replicas 1"])
def test_a_master_killed_under_load_fails_over_with_no_wrong_plan(tmp_path: Path, store_replicas: int) -> None:
    """The killed master's replica lags (stopped for its last LAG_S, as a replica behind its master is), so what
    the master took in its last instants is what a failover can lose. With --store-replicas 1 a build is
    announced only once its master's replica holds the plan: no plan a caller was given is lost."""
    cluster = LocalCluster(tmp_path / "cluster", masters=3, replicas=1).start()
    # The worker's entry outlives its last beat by 1 s: the failover (4 s here) outlasts it, as a slow one outlasts
    # the default 10 s, and the master killed below is the one that holds it.
    stack, stop = start_stack(
        cluster.url, StandInCompiler(build_seconds=0.02), pool_size=2, store_replicas=store_replicas,
        store_replicas_wait_ms=10_000, heartbeat_ttl_s=HEARTBEAT_TTL_S,
    )  # fmt: skip
    acknowledged: dict[str, tuple[str, float]] = {}  # plan key -> (blob sha256, when acknowledged)
    errors: list[tuple[float, str]] = []
    wrong: list[str] = []
    served_after: list[float] = []
    slowest = [0.0]  # the longest call (a caller's wait across the failover)
    halt = threading.Event()
    lock = threading.Lock()
    try:
        with stack.client(hedge=False, timeout=10, compile_timeout=30) as client:
            for i in range(12):  # stored before the fault, on every shard
                plan = client.compile(matmul_spec(m=8 * (i + 1), name=f"before-{i}"), TARGET)
                acknowledged[plan.key] = (hashlib.sha256(plan.blob).hexdigest(), time.monotonic())
            stored = list(acknowledged)

            def compiles() -> None:
                i = 0
                while not halt.is_set():
                    spec = matmul_spec(m=8 * (100 + i), name=f"during-{i}")
                    i += 1
                    started = time.monotonic()
                    try:
                        plan = client.compile(spec, TARGET)
                    except PlanCacheError as e:  # any: a kind not retryable fails the test below, not the thread
                        with lock:
                            errors.append((time.monotonic(), _kind(e)))
                        continue
                    with lock:
                        acknowledged[plan.key] = (hashlib.sha256(plan.blob).hexdigest(), time.monotonic())
                        served_after.append(time.monotonic())
                        slowest[0] = max(slowest[0], time.monotonic() - started)
                    halt.wait(PAUSE_S)

            def reads(n: int) -> None:
                j = n
                while not halt.is_set():
                    key = stored[j % len(stored)]
                    j += 1
                    started = time.monotonic()
                    try:
                        plan = client.get(key)
                    except PlanCacheError as e:  # any: a kind not retryable fails the test below, not the thread
                        with lock:
                            errors.append((time.monotonic(), _kind(e)))
                        continue
                    if plan.key != key or hashlib.sha256(plan.blob).hexdigest() != acknowledged[key][0]:
                        wrong.append(key)
                    with lock:
                        served_after.append(time.monotonic())
                        slowest[0] = max(slowest[0], time.monotonic() - started)
                    halt.wait(PAUSE_S)

            threads = [threading.Thread(target=compiles)] + [
                threading.Thread(target=reads, args=(n,)) for n in range(2)
            ]
            for t in threads:
                t.start()
            time.sleep(2.0)
            # The master holding the target's workers: their entries expire during the failover, and a miss
            # right after it finds no live worker until the worker's next beat (a CI run once got
            # TargetUnavailable there, not retryable).
            victim = _master_of(cluster, store_keys.workers(TARGET.id))
            lagging = _replica_of(cluster, victim)
            os.kill(lagging, signal.SIGSTOP)
            # Its link cut too: what the master sends to a stopped replica would wait in the replica's socket
            # and reach it once it runs again, after its master died; a lagging replica never gets it.
            _client_kill_replicas(victim)
            time.sleep(LAG_S)
            killed_at = time.monotonic()
            victim.kill()
            os.kill(lagging, signal.SIGCONT)
            # The bound of the wait only: the assertions below measure from the promotion (a loaded CI machine
            # took longer than 30 s to promote once).
            wait_until(lambda: cluster.healthy() and len(cluster.masters()) == 3, 90, "the replica promoted")
            failed_over_at = time.monotonic()
            time.sleep(4.0)
            halt.set()
            for t in threads:
                t.join(timeout=60)
            # Every plan acknowledged to a caller, read again after the failover.
            lost = []
            # In Redis itself: the gateway's memory cache would serve a plan its shard lost until evicted.
            direct = connect(f"redis+cluster://127.0.0.1:{cluster.masters()[0].port}/0")  # a live node
            try:
                for key, (digest, when) in acknowledged.items():
                    blob = direct.hget(store_keys.plan(key), "blob")
                    if blob is None:
                        lost.append((key, when))
                        continue
                    if hashlib.sha256(blob).hexdigest() != digest:  # type: ignore[arg-type]
                        wrong.append(key)
            finally:
                direct.close()
        back_at = min((t for t in served_after if t > killed_at and not _erring_after(errors, t)), default=None)
    finally:
        stop()
        cluster.stop()
    assert not wrong, f"wrong plans served: {wrong[:5]}"
    assert all(kind in {e.__name__ for e in RETRYABLE} for _, kind in errors), errors
    # Errors only inside the failover window (from the kill to the promotion, plus the clients' refresh).
    assert all(killed_at - 0.5 <= t <= failed_over_at + 2.0 for t, _ in errors), (
        [round(t - killed_at, 2) for t, _ in errors],
        round(failed_over_at - killed_at, 2),
    )
    assert back_at is not None and back_at <= failed_over_at + 2.0
    # Asynchronous replication: only plans acknowledged in the last second before the kill may be gone; none
    # when each was announced once a replica held it.
    assert all(killed_at - 1.0 <= when <= killed_at + 0.5 for _, when in lost), [
        round(w - killed_at, 2) for _, w in lost
    ]
    if store_replicas:
        assert not lost, [round(w - killed_at, 2) for _, w in lost]
    report(
        "Redis Cluster master killed under load",
        {
            "failover_s": round(failed_over_at - killed_at, 2),
            "service_back_after_kill_s": round(back_at - killed_at, 2),
            "errors": len(errors),
            "slowest_call_s": round(slowest[0], 2),
            "acknowledged_plans": len(acknowledged),
            "acknowledged_lost": len(lost),
            "wrong": len(wrong),
        },
    )


def _master_of(cluster: LocalCluster, key: str) -> Any:
    """The master serving `key`'s slot."""
    probe = redis.Redis(port=cluster.masters()[0].port, socket_timeout=5)
    try:
        slot = int(probe.execute_command("CLUSTER", "KEYSLOT", key))
        for low, high, (_, port, *_rest), *_replicas in probe.execute_command("CLUSTER", "SLOTS"):
            if int(low) <= slot <= int(high):
                return next(m for m in cluster.masters() if m.port == int(port))
    finally:
        probe.close()
    raise AssertionError(f"no master serves slot {slot}")


def _replica_of(cluster: LocalCluster, master: Any) -> int:
    """The process id of `master`'s replica (ROLE on the master lists its replicas' ports)."""
    client = redis.Redis(port=master.port, socket_timeout=5)
    try:
        ports = {int(replica[1]) for replica in client.execute_command("ROLE")[2]}
    finally:
        client.close()
    found = [node._process.pid for node in cluster.nodes if node.port in ports and node._process is not None]
    assert len(found) == 1, f"{master.port}'s replicas: {ports}"
    return found[0]


def _client_kill_replicas(master: Any) -> None:
    client = redis.Redis(port=master.port, socket_timeout=5)
    try:
        client.execute_command("CLIENT", "KILL", "TYPE", "replica")
    finally:
        client.close()


def _kind(error: PlanCacheError) -> str:
    """A retryable error by its type; any other with its message, which the test prints."""
    return type(error).__name__ if isinstance(error, RETRYABLE) else f"{type(error).__name__}: {error.message}"


def _erring_after(errors: list[tuple[float, str]], t: float) -> bool:
    """Whether calls still failed after `t` (the service is back once they stop)."""
    return any(when > t for when, _ in errors)


def _promote_replica_of(cluster: LocalCluster, key: str) -> float:
    """A planned failover (CLUSTER FAILOVER on the replica of the master serving `key`'s slot: the replica
    catches up with its master, then takes its slots), waited for; its duration."""
    probe = redis.Redis(port=cluster.nodes[0].port, socket_timeout=5)
    try:
        slot = int(probe.execute_command("CLUSTER", "KEYSLOT", key))
        shards = probe.execute_command("CLUSTER", "SHARDS")
    finally:
        probe.close()
    replica_port = None
    for shard in shards:  # redis-py gives each shard as a dict: slots (low, high, ...), nodes (dicts)
        ranges = shard[b"slots"]
        if not any(int(lo) <= slot <= int(hi) for lo, hi in zip(ranges[::2], ranges[1::2], strict=True)):
            continue
        for node in shard[b"nodes"]:
            if node[b"role"] == b"replica":
                replica_port = int(node[b"port"])
    assert replica_port is not None, f"no replica serves slot {slot}"
    replica = redis.Redis(port=replica_port, socket_timeout=5)
    started = time.monotonic()
    try:
        replica.execute_command("CLUSTER", "FAILOVER")
        wait_until(lambda: replica.execute_command("ROLE")[0] in (b"master", "master"), 30, "the replica promoted")
    finally:
        replica.close()
    return time.monotonic() - started


def test_a_replica_promoted_while_a_build_is_being_stored_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44, item 3's second case, forced at the chosen instant: the worker has written a plan's hash to
    its shard's master and the replica of that master is promoted (a planned failover, as an operator's
    maintenance does) before the worker writes the rest (the spec's index on another shard, the store's
    accounting, the job's end). Asserted: the caller waiting on that build gets its plan; the plan is
    stored and served after the promotion with the bytes the caller got; its spec's index lists it; the
    job ends (nothing left in flight); readers of stored plans meanwhile get no wrong plan and only typed,
    retryable errors."""
    cluster = LocalCluster(tmp_path / "cluster", masters=3, replicas=1).start()
    target_spec = matmul_spec(m=808, name="stored-across-the-promotion")
    promoted: list[float] = []
    key_of_target = PlanQuery.of(target_spec, TARGET).key
    original_hset = RedisCluster.hset

    def hset_then_promote(self: RedisCluster, name: Any, *args: Any, **kwargs: Any) -> Any:
        written = original_hset(self, name, *args, **kwargs)
        key = name.decode() if isinstance(name, bytes) else str(name)
        if not promoted and key.endswith(":plan") and key_of_target in key:
            promoted.append(_promote_replica_of(cluster, key))
        return written

    stack, stop = start_stack(cluster.url, StandInCompiler(build_seconds=0.05), pool_size=2)
    errors: list[str] = []
    wrong: list[str] = []
    halt = threading.Event()
    try:
        with stack.client(hedge=False, timeout=15, compile_timeout=60) as client:
            stored = {}
            for i in range(6):
                plan = client.compile(matmul_spec(m=8 * (i + 1), name=f"before-{i}"), TARGET)
                stored[plan.key] = hashlib.sha256(plan.blob).hexdigest()
            monkeypatch.setattr(RedisCluster, "hset", hset_then_promote)

            def reads() -> None:
                keys = list(stored)
                j = 0
                while not halt.is_set():
                    key = keys[j % len(keys)]
                    j += 1
                    try:
                        plan = client.get(key)
                    except RETRYABLE as e:
                        errors.append(type(e).__name__)
                        continue
                    except PlanCacheError as e:
                        errors.append(f"untyped: {type(e).__name__}: {e}")
                        continue
                    if plan.key != key or hashlib.sha256(plan.blob).hexdigest() != stored[key]:
                        wrong.append(key)
                    halt.wait(PAUSE_S)

            reader = threading.Thread(target=reads)
            reader.start()
            plan = client.compile(target_spec, TARGET)
            halt.set()
            reader.join(timeout=60)
            assert promoted, "the promotion did not happen while the plan was stored"
            assert plan.key == key_of_target
            digest = hashlib.sha256(plan.blob).hexdigest()
            again = client.get(key_of_target)  # after the promotion: served by the new master
            assert hashlib.sha256(again.blob).hexdigest() == digest
            spec_hash = again.metadata.spec_hash
            index = stack.redis.smembers(store_keys.spec_index(spec_hash))
            assert key_of_target.encode() in index or key_of_target in index
            job = store_keys.job_state(key_of_target)
            wait_until(lambda: stack.redis.hget(job, "state") in ("done", b"done"), 30, "the job's end")
    finally:
        halt.set()
        stop()
        cluster.stop()
    assert not wrong, f"wrong plans served: {wrong[:5]}"
    assert all(kind in {e.__name__ for e in RETRYABLE} for kind in errors), errors
    report(
        "Redis Cluster replica promoted while a build is stored",
        {"promotion_s": round(promoted[0], 2), "reader_errors": len(errors), "wrong": len(wrong)},
    )

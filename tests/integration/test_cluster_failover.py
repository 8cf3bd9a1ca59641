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
import threading
import time
from pathlib import Path

import pytest

from plancache import PlanCacheError, StoreUnavailable, Unavailable
from tests.conftest import start_stack
from tests.support.operator_view import report
from tests.support.redis_cluster import LocalCluster
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

RETRYABLE = (StoreUnavailable, Unavailable)
PAUSE_S = 0.01  # between one node's calls: steady load that leaves the suite's other tests their CPU


def test_a_master_killed_under_load_fails_over_with_no_wrong_plan(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", masters=3, replicas=1).start()
    stack, stop = start_stack(cluster.url, StandInCompiler(build_seconds=0.02), pool_size=2)
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
                    except RETRYABLE as e:
                        with lock:
                            errors.append((time.monotonic(), type(e).__name__))
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
                    except RETRYABLE as e:
                        with lock:
                            errors.append((time.monotonic(), type(e).__name__))
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
            victim = cluster.masters()[0]
            killed_at = time.monotonic()
            victim.kill()
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
            for key, (digest, when) in acknowledged.items():
                try:
                    plan = client.get(key)
                except PlanCacheError:
                    lost.append((key, when))
                    continue
                if hashlib.sha256(plan.blob).hexdigest() != digest:
                    wrong.append(key)
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
    # Asynchronous replication: only plans acknowledged in the last second before the kill may be gone.
    assert all(killed_at - 1.0 <= when <= killed_at + 0.5 for _, when in lost), [
        round(w - killed_at, 2) for _, w in lost
    ]
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


def _erring_after(errors: list[tuple[float, str]], t: float) -> bool:
    """Whether calls still failed after `t` (the service is back once they stop)."""
    return any(when > t for when, _ in errors)

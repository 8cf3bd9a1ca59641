"""The store's lifecycle on a real redis-server: a bound that holds with the
recently used plans kept and nothing but plans touched, retention on an
injected clock, concurrent sweeps that delete each expired plan once, and
the counters GetStats reports."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from plancache import NotFound
from plancache.graphspec import spec_proto
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.store.lifecycle import Janitor
from plancache_server.store.plans import RedisPlanStore, StoredPlan
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler

MiB = 2**20
DAY = 86400.0


def plan(n: int, size: int = 1000) -> StoredPlan:
    blob = bytes([n % 256]) * size
    key = f"{hashlib.sha256(str(n).encode()).hexdigest()}/{TARGET.id}/opt-{'0' * 16}"
    return StoredPlan(
        blob=blob, metadata=pb.PlanMetadata(key=key, spec_hash=key[:64], blob_sha256=hashlib.sha256(blob).hexdigest())
    )


def stored_at(redis_client: redis.Redis, now: list[float], *batches: tuple[float, list[StoredPlan]]) -> RedisPlanStore:
    """A store on the clock `now[0]`, with each batch of plans written at its time."""
    store = RedisPlanStore(redis_client, clock=lambda: now[0])
    for when, plans in batches:
        now[0] = when
        for p in plans:
            store.put(p)
    return store


@pytest.fixture
def bounded_stack(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Iterator[Stack]:
    """100 MiB bound, 5 MiB plans, no memory cache (an evicted plan must read as gone)."""
    s, stop = start_stack(
        redis_server.url,
        StandInCompiler(blob_size=5 * MiB),
        store_max_mb=100,
        memory_cache_bytes=0,
        max_message_bytes=64 * MiB,
    )
    yield s
    stop()


def test_a_100_mb_bound_holds_while_300_mb_go_in(bounded_stack: Stack, redis_client: redis.Redis) -> None:
    # What is not a plan must survive any eviction: a build lease, a job state, the negative cache, statistics.
    others = {
        "plancache:{x/y/opt-0}:lease": b"job-1",
        "plancache:{x/y/opt-0}:failed": b"no engine",
        "plancache:stats:target:x": None,
    }
    for name, value in others.items():
        if value is None:
            redis_client.hset(name, "hits", 3)
        else:
            redis_client.set(name, value)
    janitor = Janitor(redis_client)
    with bounded_stack.client() as client:
        hot = [client.compile(matmul_spec(m=16 + i), TARGET).key for i in range(4)]
        for i in range(56):  # 60 plans of 5 MiB in all
            client.compile(matmul_spec(m=100 + i), TARGET)
            assert janitor.total_bytes() <= 100 * MiB, f"over the bound after plan {i}"
            if i % 4 == 0:
                for key in hot:
                    client.get(key)  # recently used: these stay
                client.admin.stats()  # GetStats flushes this gateway's counts, last use included
        for key in hot:
            assert len(client.get(key).blob) == 5 * MiB
        (row,) = [r for r in client.admin.stats() if r.target_id == TARGET.id]
    assert row.stored_bytes <= 100 * MiB and row.stored_plans == len(redis_client.zrange(keys.PLAN_INDEX, 0, -1))
    assert row.evicted == 60 - row.stored_plans and row.evicted >= 40
    stored = [k for k in redis_client.scan_iter(match="plancache:{*}:plan")]
    assert len(stored) == row.stored_plans
    for name in others:
        assert redis_client.exists(name), f"{name} was evicted: only plans may be"


def test_retention_deletes_what_was_not_used_since_the_cutoff(redis_client: redis.Redis) -> None:
    now = [0.0]
    old, recent = [plan(i) for i in range(3)], [plan(10 + i) for i in range(2)]
    store = stored_at(redis_client, now, (0.0, old), (10 * DAY, recent))
    now[0] = 20 * DAY
    redis_client.zadd(keys.PLAN_INDEX, {old[0].metadata.key: now[0]}, gt=True)  # served then (a gateway's flush)
    now[0] = 31 * DAY
    deleted = store.janitor.expire(30 * DAY)
    assert sorted(deleted) == sorted(p.metadata.key for p in old[1:])
    kept = {p.metadata.key for p in (old[0], *recent)}
    assert {k for k in kept if store.get(k) is not None} == kept
    usage = store.janitor.usage()[TARGET.id]
    assert (usage.stored_plans, usage.expired, usage.stored_bytes) == (
        3,
        2,
        sum(int(redis_client.hget(keys.plan(k), "size") or 0) for k in kept),
    )


def test_two_sweeps_at_once_delete_each_expired_plan_once_and_nothing_else(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    now = [0.0]
    expired, fresh = [plan(i) for i in range(200)], [plan(1000 + i) for i in range(50)]
    store = stored_at(redis_client, now, (0.0, expired), (40 * DAY, fresh))
    results: list[list[str]] = [[], []]
    sweepers = [Janitor(redis.Redis.from_url(redis_server.url), clock=lambda: now[0]) for _ in range(2)]
    start = threading.Barrier(2)

    def sweep(i: int) -> None:
        start.wait()
        results[i] = sweepers[i].expire(30 * DAY)

    threads = [threading.Thread(target=sweep, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not set(results[0]) & set(results[1]), "a plan deleted twice"
    assert sorted(results[0] + results[1]) == sorted(p.metadata.key for p in expired)
    assert all(store.get(p.metadata.key) is not None for p in fresh)
    usage = store.janitor.usage()[TARGET.id]
    assert (usage.stored_plans, usage.expired) == (50, 200)


def test_a_front_ends_hits_record_last_use_and_invalidate_keeps_the_counts(
    stack: Stack, redis_client: redis.Redis
) -> None:
    with stack.client() as client:
        kept = client.compile(matmul_spec(m=32), TARGET)
        dropped = client.compile(matmul_spec(m=48), TARGET)
        written = redis_client.zscore(keys.PLAN_INDEX, kept.key)
        assert written is not None
        time.sleep(0.05)
        client.get(kept.key)
        client.admin.stats()  # flushes this gateway's counts
        assert (redis_client.zscore(keys.PLAN_INDEX, kept.key) or 0) > written
        assert client.admin.invalidate(dropped.key) == 1
        with pytest.raises(NotFound):
            client.get(dropped.key)
        (row,) = [r for r in client.admin.stats() if r.target_id == TARGET.id]
    assert row.stored_plans == 1 and row.stored_bytes == int(redis_client.hget(keys.plan(kept.key), "size") or 0)
    assert redis_client.zscore(keys.PLAN_INDEX, dropped.key) is None


def test_a_target_no_worker_advertises_any_more_is_listed_then_retired(redis_client: redis.Redis) -> None:
    now = [0.0]
    other_target = "sm_80/cudnn-91900/fe-1.32.0"
    kept, gone = [plan(i) for i in range(2)], [plan(100 + i) for i in range(3)]
    for p in gone:
        p.metadata.key = p.metadata.key.replace(TARGET.id, other_target)
    store = stored_at(redis_client, now, (0.0, kept + gone))
    redis_client.hset(keys.TARGETS_LAST_SEEN, mapping={TARGET.id: 99 * DAY, other_target: 5 * DAY})
    now[0] = 100 * DAY
    assert store.janitor.retirable(90 * DAY) == {other_target: 5 * DAY}
    result = store.janitor.sweep(None, None, retire_after_s=90 * DAY)
    assert sorted(result.retired) == sorted(p.metadata.key for p in gone)
    assert all(store.get(p.metadata.key) is not None for p in kept)
    assert store.janitor.usage()[other_target].stored_plans == 0 and store.janitor.retirable(90 * DAY) == {}


def test_plancache_retire_deletes_a_targets_plans(stack: Stack) -> None:
    import subprocess
    import sys

    from tests.support.processes import REPO, child_env

    with stack.client() as client:
        key = client.compile(matmul_spec(m=24), TARGET).key
        proc = subprocess.run(
            [sys.executable, "-m", "plancache.cli", "retire", "--target", TARGET.id, "--server", stack.address],
            env=child_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0 and f"retired {TARGET.id}: deleted 1 plan(s)" in proc.stdout, proc.stderr
        with pytest.raises(NotFound):
            client.get(key)


def test_a_removed_plan_leaves_nothing_of_its_spec_once_no_plan_of_it_is_left(redis_client: redis.Redis) -> None:
    """Every plan stored keeps its spec's index entry and body (warming's source); evicted or expired, it used to
    leave both behind: ~1 KB of Redis for every plan ever evicted (bench/soak.py, four new plans a second)."""
    store = RedisPlanStore(redis_client)
    first, second = plan(1), plan(1)
    second.metadata.key = first.metadata.key.replace("opt-" + "0" * 16, "opt-" + "1" * 16)  # same spec, other options
    spec = spec_proto.to_proto(matmul_spec(m=32))
    store.put(first, spec)
    store.put(second, spec)
    spec_hash = first.metadata.spec_hash
    janitor = Janitor(redis_client)
    assert janitor.remove(first.metadata.key, "evicted")
    assert redis_client.smembers(keys.spec_index(spec_hash)) == {second.metadata.key.encode()}
    assert redis_client.exists(keys.spec_body(spec_hash))  # a plan of the spec is left: warming still reads it
    assert janitor.remove(second.metadata.key, "expired")
    assert not redis_client.exists(keys.spec_index(spec_hash)) and not redis_client.exists(keys.spec_body(spec_hash))
    assert not janitor.remove(second.metadata.key, "expired")  # gone already: nothing else touched


def test_a_finished_jobs_state_is_kept_an_hour_not_a_day(redis_client: redis.Redis) -> None:
    """A job's state while it waits or runs lasts a day (a queue may hold it that long); once it ended, the
    callers following it read it within seconds, and an hour is left to it (bench/soak.py: a day's states of
    every miss were all of Redis' growth)."""
    from plancache_server.store.build_records import FINISHED_STATE_TTL_S, JOB_STATE_TTL_S, BuildRecorder

    recorder = BuildRecorder(redis_client, lease_s=60)
    built, failed = plan(1).metadata.key, plan(2).metadata.key
    for key in (built, failed):
        recorder.mark_running(key, f"job-{key[:8]}", "w1")
        assert JOB_STATE_TTL_S - 60 < redis_client.ttl(keys.job_state(key)) <= JOB_STATE_TTL_S
    recorder.finish(built, f"job-{built[:8]}", "w1")
    recorder.finish(failed, f"job-{failed[:8]}", "w1", error="cuDNN said no", rejected=True)
    for key, state in ((built, b"done"), (failed, b"failed")):
        assert redis_client.hget(keys.job_state(key), "state") == state
        assert FINISHED_STATE_TTL_S - 60 < redis_client.ttl(keys.job_state(key)) <= FINISHED_STATE_TTL_S

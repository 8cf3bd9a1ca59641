"""Issue 44, item 3: a job lost from Redis while its callers wait is queued again. A Redis Cluster failover drops
the writes its dead master had not replicated: a job's stream entry queued in that instant (its state, on the
plan's own shard, still says queued), or the job's state and lease. The flight following the job found nothing to
move it and its callers waited to their deadline (test_cluster_failover.py, once under a loaded suite: a
CompileTimeout after 30 s). Here the loss is made by hand on a real Redis, with a real gateway and a worker
building on one thread (stand-in compiler): the job queued behind a build is deleted before any worker read it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from plancache.errors import CompileTimeout
from plancache.keys.query import PlanQuery
from plancache_server.gateway import flight as flight_module
from plancache_server.store import keys
from plancache_server.store.build_records import QUEUED
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.store.redis_conn import redis_seconds
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

BUSY_S = 2.0  # each build: the first keeps the worker's one build thread busy while the next job waits unread
LOST_CHECK_S = 0.5  # the flight's look for its job (5 s shipped), shortened for the test


@pytest.fixture
def one_lane(redis_server: EmbeddedRedis, redis_client: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    monkeypatch.setattr(flight_module, "LOST_CHECK_S", LOST_CHECK_S)
    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=BUSY_S), pool_size=1)
    yield s
    stop()


@pytest.fixture
def no_reader(
    redis_server: EmbeddedRedis, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    """A gateway whose target has a live worker entry and no worker reading: a queued job stays unread."""
    monkeypatch.setattr(flight_module, "LOST_CHECK_S", LOST_CHECK_S)
    s, stop = start_stack(redis_server.url, None)
    redis_client.zadd(keys.workers(TARGET.id), {"absent-worker": redis_seconds(redis_client) + 120})
    yield s
    stop()


def spec(i: int) -> object:
    return matmul_spec(m=64 + 16 * i, name=f"lost-{i}")


def entries(store: redis.Redis, plan_key: str) -> list[tuple[bytes, str]]:
    """(entry id, job id) of the plan's jobs in the stream."""
    return [
        (entry_id, fields[b"job_id"].decode())
        for entry_id, fields in store.xrange(keys.job_stream(TARGET))
        if fields[b"plan_key"].decode() == plan_key
    ]


@pytest.mark.parametrize("lost", ["its stream entry", "its stream entry, state and lease"])
def test_a_job_lost_from_redis_while_its_caller_waits_is_queued_again(
    no_reader: Stack, redis_server: EmbeddedRedis, redis_client: redis.Redis, lost: str
) -> None:
    stack, store = no_reader, redis_client
    key = PlanQuery.of(spec(1), TARGET).key  # type: ignore[arg-type]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lambda: stack.client(hedge=False, compile_timeout=30).compile(spec(1), TARGET))
        wait_until(lambda: entries(store, key), 10, "the job queued")
        ((entry_id, job_id),) = entries(store, key)
        # What a failover's lost writes leave: the entry gone; and, on the plan's shard, the job's records too.
        assert store.xdel(keys.job_stream(TARGET), entry_id) == 1
        if "state" in lost:
            store.delete(keys.job_state(key), keys.build_lease(key))
        lost_at = time.monotonic()
        # Found at the flight's next look or the one after, and queued again as a new job.
        wait_until(lambda: entries(store, key), 4 * LOST_CHECK_S + 2, "the job queued again")
        requeued_after = time.monotonic() - lost_at
        ((_, again),) = entries(store, key)
        assert again != job_id
        state = {k.decode(): v.decode() for k, v in store.hgetall(keys.job_state(key)).items()}
        assert state["job_id"] == again and state["state"] == QUEUED, state
        # A worker comes: the caller, still waiting, gets the plan of the job queued again.
        _, stop_worker = start_stack(redis_server.url, StandInCompiler())
        try:
            plan = waiting.result(timeout=20)
        finally:
            stop_worker()
    assert plan.key == key
    assert requeued_after < 4 * LOST_CHECK_S + 1, requeued_after


def test_a_job_lost_behind_jobs_waiting_unread_is_queued_again(no_reader: Stack, redis_client: redis.Redis) -> None:
    """The flight looks for its own entry by id: a loss is found however many jobs wait unread before it (a long
    queue's, a flood's), where a look by job id could not tell it from one of them."""
    stack, store = no_reader, redis_client
    ahead = [PlanQuery.of(spec(i), TARGET).key for i in (2, 3, 4)]  # type: ignore[arg-type]
    key = PlanQuery.of(spec(1), TARGET).key  # type: ignore[arg-type]
    with ThreadPoolExecutor(4) as pool:
        for i in (2, 3, 4):
            pool.submit(lambda i=i: stack.client(hedge=False, compile_timeout=8).compile(spec(i), TARGET))
        wait_until(lambda: all(entries(store, k) for k in ahead), 10, "three jobs queued ahead, unread")
        waiting = pool.submit(lambda: stack.client(hedge=False, compile_timeout=8).compile(spec(1), TARGET))
        wait_until(lambda: entries(store, key), 10, "the job queued behind them")
        ((entry_id, job_id),) = entries(store, key)
        assert store.xdel(keys.job_stream(TARGET), entry_id) == 1
        wait_until(lambda: entries(store, key), 4 * LOST_CHECK_S + 2, "the job queued again")
        ((_, again),) = entries(store, key)
        assert again != job_id
        # The jobs ahead, still there and unread, were not queued twice.
        assert [len(entries(store, k)) for k in ahead] == [1, 1, 1]
        assert store.xlen(keys.job_stream(TARGET)) == 4
        with pytest.raises(CompileTimeout):  # nobody builds here: the caller's own deadline, as for any queue
            waiting.result(timeout=20)


def test_a_job_a_worker_holds_unread_by_others_is_not_queued_again(one_lane: Stack, redis_client: redis.Redis) -> None:
    """The look does not take a job that a worker read (pending, in its lanes) or one waiting unread for a lost
    one: a queue behind a long build queues nothing twice."""
    stack, store = one_lane, redis_client
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(lambda: stack.client(hedge=False).compile(spec(0), TARGET))
        wait_until(lambda: len(stack.compiler.builds) == 1, timeout=20, what="the first build to start")
        second = pool.submit(lambda: stack.client(hedge=False).compile(spec(1), TARGET))
        first.result(timeout=20)
        second.result(timeout=20)
    # Each plan built once, though each flight looked for its job while it waited (every LOST_CHECK_S).
    assert len(stack.compiler.builds) == 2, stack.compiler.builds
    assert store.xlen(keys.job_stream(TARGET)) == 0


def test_flights_behind_a_long_queue_share_one_read_of_its_depth(
    redis_server: EmbeddedRedis, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every waiting flight looks for its job; behind a queue with entries unread (a flood's) they cannot tell and
    do nothing, on one read of the queue's depth a second between them, not one each."""
    import asyncio

    from plancache_server.store.jobs import Job, JobQueue
    from plancache_server.store.redis_conn import connect_async

    async def looks() -> tuple[list[bool | None], int]:
        client = connect_async(redis_server.url)
        queue = JobQueue(client, max_jobs=1000, retry_delay_s=1.0)
        reads = 0
        depth = queue.depth

        async def counted(target: object) -> tuple[int, int]:
            nonlocal reads
            reads += 1
            return await depth(target)  # type: ignore[arg-type]

        monkeypatch.setattr(queue, "depth", counted)
        query = PlanQuery.of(spec(1), TARGET).to_proto()  # type: ignore[arg-type]
        for i in range(50):
            await queue.enqueue(TARGET, Job(job_id=f"job-{i}", plan_key=f"key-{i}", query=query))
        found = [await queue.holds(TARGET, f"job-{i}") for i in range(50)]
        await client.aclose()
        return found, reads

    found, reads = asyncio.run(looks())
    assert found == [None] * 50  # unread entries: not told, not lost
    assert reads == 1


def test_a_flight_finds_its_own_entry_by_id_behind_a_long_queue(redis_server: EmbeddedRedis) -> None:
    """With the entry id it queued its job under, a look is one lookup of that entry: held while the entry is
    there (unread or read), lost once it is gone, whatever waits before it; an entry that holds another job (a
    forged or reused id) is not the job's."""
    import asyncio

    from plancache_server.store.jobs import Job, JobQueue
    from plancache_server.store.redis_conn import connect_async

    async def looks() -> tuple[list[bool | None], bool | None, bool | None, bool | None]:
        client = connect_async(redis_server.url)
        await client.flushdb()
        queue = JobQueue(client, max_jobs=1000, retry_delay_s=1.0)
        query = PlanQuery.of(spec(1), TARGET).to_proto()  # type: ignore[arg-type]
        ids = [await queue.enqueue(TARGET, Job(job_id=f"job-{i}", plan_key=f"key-{i}", query=query)) for i in range(50)]
        held = [await queue.holds(TARGET, f"job-{i}", ids[i]) for i in range(50)]
        other = await queue.holds(TARGET, "job-7", ids[8])
        await client.xdel(keys.job_stream(TARGET), ids[49])
        lost_last = await queue.holds(TARGET, "job-49", ids[49])
        await client.xdel(keys.job_stream(TARGET), ids[0])
        lost_first = await queue.holds(TARGET, "job-0", ids[0])
        await client.aclose()
        return held, other, lost_last, lost_first

    held, other, lost_last, lost_first = asyncio.run(looks())
    assert held == [True] * 50
    assert other is False  # entry 8 holds job-8, and 48 entries wait unread: job-7's own entry is not there
    assert lost_last is False and lost_first is False

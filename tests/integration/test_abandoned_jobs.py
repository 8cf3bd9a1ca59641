"""Issue 44, item 2: nothing is built for no one. A callers' job whose every
caller went (deadline, cancel, disconnect) before a worker took it is
dropped unbuilt and counted (`abandoned`: GetStats, the status page,
/metrics); one that any caller, on any gateway, still waits for is built;
a hedged miss (answered at once, asked again a moment later) is never
dropped between its two calls; a job dropped while a caller still waited
(its claim lost) is queued again for that caller. Real Redis, a real
gateway and a worker building on one thread (stand-in compiler)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest

from plancache import CompileTimeout
from plancache.keys.query import PlanQuery
from plancache.transport.admin import AdminClient
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway import builds as builds_module
from plancache_server.gateway import flight as flight_module
from plancache_server.store import keys
from plancache_server.store.build_records import ABANDONED
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.store.lifecycle import Janitor
from plancache_server.web.metrics import StoreCollector
from plancache_server.web.status import status_of
from plancache_server.web.status_page import render
from plancache_server.worker.worker_queue import WorkerQueue
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

BUSY_S = 1.5  # the build that keeps the worker's one build thread busy while the others queue


@pytest.fixture
def one_lane(redis_server: EmbeddedRedis, redis_client: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """A worker with one build thread: a job queued behind a build waits in the stream until it ends."""
    monkeypatch.setattr(builds_module, "UNWANT_GRACE_S", 0.05)
    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=BUSY_S), pool_size=1)
    yield s
    stop()


def spec(i: int) -> object:
    return matmul_spec(m=64 + 16 * i, name=f"abandon-{i}")


def built(stack: Stack) -> list[str]:
    return list(stack.compiler.builds)


def digest(i: int) -> str:
    return PlanQuery.of(spec(i), TARGET).spec_hash  # type: ignore[arg-type]


def abandoned(store: redis.Redis) -> int:
    usage = Janitor(store).usage().get(TARGET.id)
    return usage.abandoned if usage is not None else 0


def keep_busy(stack: Stack, pool: ThreadPoolExecutor) -> object:
    """A caller whose build occupies the worker for BUSY_S; returns its future."""
    future = pool.submit(lambda: stack.client(hedge=False).compile(spec(0), TARGET))
    wait_until(lambda: digest(0) in built(stack), timeout=20, what="the busy build to start")
    return future


def test_jobs_whose_callers_all_left_are_dropped_unbuilt_and_counted(one_lane: Stack) -> None:
    stack = one_lane
    with ThreadPoolExecutor(4) as pool:
        busy = keep_busy(stack, pool)
        for i in (1, 2, 3):  # each caller gives up while its job waits behind the busy build
            with pytest.raises(CompileTimeout):
                stack.client(hedge=False, compile_timeout=0.3).compile(spec(i), TARGET)
        busy.result(timeout=30)  # type: ignore[attr-defined]
    wait_until(lambda: abandoned(stack.redis) == 3, timeout=20, what="the three jobs dropped")
    assert built(stack) == [digest(0)]  # nothing built for no one
    wait_until(lambda: stack.redis.xlen(keys.job_stream(TARGET)) == 0, 10, "nothing left queued")
    for i in (1, 2, 3):
        state = stack.redis.hgetall(keys.job_state(PlanQuery.of(spec(i), TARGET).key))  # type: ignore[arg-type]
        assert state[b"state"] == ABANDONED.encode()
        assert not stack.redis.exists(keys.build_lease(PlanQuery.of(spec(i), TARGET).key))  # type: ignore[arg-type]
    # A caller asking again later queues it anew and gets its plan.
    again = stack.client(hedge=False).compile(spec(1), TARGET)
    assert again.key == PlanQuery.of(spec(1), TARGET).key  # type: ignore[arg-type]
    assert built(stack) == [digest(0), digest(1)]
    # Operators see it: GetStats, the status page, /metrics.
    with AdminClient(stack.address) as admin:
        row = next(t for t in admin.stats() if t.target_id == TARGET.id)
    assert row.abandoned == 3
    report = stack.gateway.run(status_of(stack.gateway.front).report())
    assert "abandoned builds" in render(report)
    registry = CollectorRegistry()
    registry.register(StoreCollector(Janitor(stack.redis).usage))
    assert f'plancache_jobs_abandoned_total{{target="{TARGET.id}"}} 3.0' in generate_latest(registry).decode()


def test_a_job_any_caller_still_waits_for_is_built(one_lane: Stack) -> None:
    stack = one_lane
    with ThreadPoolExecutor(4) as pool:
        busy = keep_busy(stack, pool)
        patient = pool.submit(lambda: stack.client(hedge=False, compile_timeout=30).compile(spec(1), TARGET))
        wait_until(lambda: stack.redis.xlen(keys.job_stream(TARGET)) >= 1, timeout=10, what="spec 1 queued")
        with pytest.raises(CompileTimeout):  # another caller of the same plan gives up
            stack.client(hedge=False, compile_timeout=0.3).compile(spec(1), TARGET)
        # Another gateway's callers wait for spec 2's job (its claim, as that gateway writes it) while ours leave.
        with pytest.raises(CompileTimeout):
            stack.client(hedge=False, compile_timeout=0.3).compile(spec(2), TARGET)
        key2 = PlanQuery.of(spec(2), TARGET).key  # type: ignore[arg-type]
        job2 = stack.redis.hget(keys.job_state(key2), "job_id").decode()  # type: ignore[union-attr]
        now_ms = int(stack.redis.time()[0]) * 1000
        stack.redis.hset(keys.job_wanted(key2), f"other-gateway|{job2}", now_ms + 60_000)
        busy.result(timeout=30)  # type: ignore[attr-defined]
        assert patient.result(timeout=30).key == PlanQuery.of(spec(1), TARGET).key  # type: ignore[arg-type]
    wait_until(lambda: digest(2) in built(stack), timeout=20, what="spec 2, waited for elsewhere, built")
    assert built(stack) == [digest(0), digest(1), digest(2)] and abandoned(stack.redis) == 0


def test_a_hedged_miss_answered_at_once_is_built_once_never_dropped(
    redis_server: EmbeddedRedis, redis_client: object
) -> None:
    """The first half is answered "building" and leaves; its follow-up asks a moment later: an idle worker
    takes the job between the two, and must build it."""
    stack, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.2), pool_size=1)
    try:
        query = PlanQuery.of(spec(5), TARGET)  # type: ignore[arg-type]
        request = pb.CompileRequest(
            spec=query.spec_proto, target=TARGET.to_proto(), options=query.options.to_proto(), answer_miss_at_once=True
        )
        with stack.client() as c:
            first = c._stub.Compile(request, timeout=10)
            assert first.source == pb.COMPILE_SOURCE_BUILDING
            time.sleep(0.3)  # the worker is idle: it has taken the job by now
            request.answer_miss_at_once, request.counted = False, True
            follow_up = c._stub.Compile(request, timeout=30)
        assert follow_up.plan.metadata.key == query.key
        assert built(stack) == [query.spec_hash] and abandoned(stack.redis) == 0
    finally:
        stop()


def test_a_job_dropped_while_its_caller_still_waited_is_queued_again(
    one_lane: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim lost (a gateway stalled past WANTED_TTL_S, say): the worker drops the job, and the flight
    that still waits sees it abandoned and queues it again: the caller gets its plan, built once."""
    stack = one_lane
    monkeypatch.setattr(flight_module, "WANT_RENEW_S", 3600.0)  # the claim is not renewed
    key = PlanQuery.of(spec(1), TARGET).key  # type: ignore[arg-type]
    with ThreadPoolExecutor(4) as pool:
        busy = keep_busy(stack, pool)
        waiting = pool.submit(lambda: stack.client(hedge=False, compile_timeout=30).compile(spec(1), TARGET))
        wait_until(lambda: stack.redis.exists(keys.job_wanted(key)), timeout=10, what="the caller's claim")
        stack.redis.delete(keys.job_wanted(key))  # lost
        busy.result(timeout=30)  # type: ignore[attr-defined]
        assert waiting.result(timeout=30).key == key
    assert abandoned(stack.redis) == 1
    assert built(stack) == [digest(0), digest(1)]


def test_a_job_of_an_earlier_gateway_without_claims_is_built(stack: Stack) -> None:
    """A job queued by a gateway that does not claim (no `waited` field) is built as before."""
    from plancache_server.store.jobs import Job

    query = PlanQuery.of(spec(7), TARGET)  # type: ignore[arg-type]
    job = Job(job_id="earlier-gateway-job", plan_key=query.key, query=query.to_proto())
    stack.redis.xadd(keys.job_stream(TARGET), {k: v for k, v in job.encode().items() if k != "waited"})
    wait_until(lambda: query.spec_hash in stack.compiler.builds, timeout=20, what="the earlier gateway's job built")
    assert abandoned(stack.redis) == 0


def test_a_gateway_stops_saying_callers_wait_once_they_all_left(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """Callers that leave at once (a hedged miss's first ask, answered "building"; a caller past its deadline):
    their gateway takes its claim on the job back after UNWANT_GRACE_S and never says it again, so the worker
    that takes the job drops it. A flight whose cancel was swallowed (it landed as an awaited Redis read's own
    timeout fired) went on following the job and renewed the claim every WANT_RENEW_S until the build ended."""
    stack, stop = start_stack(redis_server.url, None)  # no worker builds: the jobs stay queued
    WorkerQueue(redis_client).heartbeat("silent-worker", [TARGET, TARGET.generic()], 60)  # one is there, silent
    try:
        for i in range(6):  # the swallowed cancel depends on where it lands: several flights
            query = PlanQuery.of(spec(20 + i), TARGET)  # type: ignore[arg-type]
            request = pb.CompileRequest(
                spec=query.spec_proto,
                target=TARGET.to_proto(),
                options=query.options.to_proto(),
                answer_miss_at_once=True,
            )
            with stack.client() as c:
                assert c._stub.Compile(request, timeout=10).source == pb.COMPILE_SOURCE_BUILDING
                request.answer_miss_at_once, request.counted = False, True
                with pytest.raises(grpc.RpcError) as gave_up:
                    c._stub.Compile(request, timeout=0.05)  # the follow-up gives up at once
                assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        claims = [keys.job_wanted(PlanQuery.of(spec(20 + i), TARGET).key) for i in range(6)]  # type: ignore[arg-type]
        wait_until(
            lambda: not any(redis_client.exists(k) for k in claims), builds_module.UNWANT_GRACE_S + 3, "claims gone"
        )
        time.sleep(flight_module.WANT_RENEW_S + 1.0)  # past a renewal by any flight still following
        assert [k for k in claims if redis_client.exists(k)] == []
    finally:
        stop()


def test_a_gateway_that_stops_ends_the_claims_it_was_taking_back(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """A caller left a moment before the gateway stopped: its claim's withdrawal (waiting UNWANT_GRACE_S, then
    Redis calls) was left pending when the gateway's loop closed; one destroyed mid-call failed a CI run
    ("exception ignored in Builds._withdraw"). Now the gateway's close ends them (their claims run out on their
    own); what the test harness still finds pending after the gateway's stop is named in `left_pending`."""
    stack, stop = start_stack(redis_server.url, None)
    WorkerQueue(redis_client).heartbeat("silent-worker", [TARGET, TARGET.generic()], 60)
    query = PlanQuery.of(spec(40), TARGET)  # type: ignore[arg-type]
    request = pb.CompileRequest(
        spec=query.spec_proto, target=TARGET.to_proto(), options=query.options.to_proto(), answer_miss_at_once=True
    )
    with stack.client() as c:
        assert c._stub.Compile(request, timeout=10).source == pb.COMPILE_SOURCE_BUILDING
        request.answer_miss_at_once, request.counted = False, True
        with pytest.raises(grpc.RpcError):
            c._stub.Compile(request, timeout=0.05)  # gives up at once: its claim is being taken back
    withdrawals = stack.gateway.front.builds.errands
    wait_until(lambda: bool(withdrawals), 5, "the withdrawal under way")
    stop()
    left = [name for name in stack.gateway.left_pending if name.startswith("withdraw ")]
    assert not left, f"the gateway stopped with claims' withdrawals still pending: {left}"


def test_a_gateway_that_stops_ends_the_hurries_it_had_under_way(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """A caller that waits joined a yielding build (a hedged node's) and hurried it: the hurry (its mark taken in
    Redis, then the job queued again) was a task of the gateway nobody awaited, left pending by the gateway's
    close until the loop ended it. Now the close ends it with the withdrawals (here its Redis call never
    returns, so it is under way when the gateway stops)."""
    stack, stop = start_stack(redis_server.url, None)
    WorkerQueue(redis_client).heartbeat("silent-worker", [TARGET, TARGET.generic()], 60)
    states = stack.gateway.front.builds._crew.states
    hurried = []

    async def take_yields_never_answered(plan_key: str, job_id: str) -> bool:
        hurried.append(job_id)
        await asyncio.sleep(60)
        return True

    states.take_yields = take_yields_never_answered  # type: ignore[method-assign]
    query = PlanQuery.of(spec(41), TARGET)  # type: ignore[arg-type]
    hedged = pb.CompileRequest(
        spec=query.spec_proto, target=TARGET.to_proto(), options=query.options.to_proto(), answer_miss_at_once=True,
        builds_itself=True,
    )  # fmt: skip
    try:
        with stack.client() as c, ThreadPoolExecutor(1) as pool:
            assert c._stub.Compile(hedged, timeout=10).source == pb.COMPILE_SOURCE_BUILDING
            follow_up = pb.CompileRequest()
            follow_up.CopyFrom(hedged)
            follow_up.answer_miss_at_once, follow_up.counted = False, True
            # The node waits for the service's plan while it builds its own: the yielding flight stays open.
            node = pool.submit(c._stub.Compile, follow_up, timeout=1.5)
            wait_until(lambda: bool(stack.gateway.front.builds.waiting), 5, "the node's follow-up waiting")
            waiting = pb.CompileRequest(
                spec=query.spec_proto, target=TARGET.to_proto(), options=query.options.to_proto()
            )
            with pytest.raises(grpc.RpcError):
                c._stub.Compile(waiting, timeout=0.5)  # joins the yielding build, hurries it, gives up
            with pytest.raises(grpc.RpcError):
                node.result()
        wait_until(lambda: bool(hurried), 5, "the hurry under way")
        assert any(t.get_name().startswith("hurry ") for t in stack.gateway.front.builds.errands)
    finally:
        stop()
    left = [name for name in stack.gateway.left_pending if name.startswith("hurry ")]
    assert not left, f"the gateway stopped with hurries still pending: {left}"

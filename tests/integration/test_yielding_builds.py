"""Issue 41: a build that only callers building the plan themselves asked
for (hedged misses: CompileRequest.builds_itself) waits while such callers
keep asking (the worker's --hedged-quiet), each at most --hedged-hold-max
(HOLD_MAX_S here: the default, 30 s, would make these tests slow); a caller
that waits for the plan hurries it; a plain miss never waits for them. Real
Redis, a real gateway and a worker (stand-in compiler)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from plancache import Client, race_stats
from plancache.keys.query import PlanQuery
from plancache.transport import hedge
from plancache.v1 import plancache_pb2 as pb
from plancache_server import telemetry
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.standin_local import StandInLocalBuilder
from tests.support.waiting import wait_until

# The workers' --hedged-hold-max in these tests (the default is 30 s: a first node's start with an empty JIT cache).
HOLD_MAX_S = 3.0


def _query(i: int) -> PlanQuery:
    return PlanQuery.of(matmul_spec(m=64 + 16 * i, name=f"yield-{i}"), TARGET)


def _request(query: PlanQuery, *, hedged: bool) -> pb.CompileRequest:
    """A hedged miss's first ask (what plancache's client sends: answered at once, built by the node too), or a
    caller's Compile that waits for the plan."""
    return pb.CompileRequest(
        spec=query.spec_proto,
        target=TARGET.to_proto(),
        options=query.options.to_proto(),
        answer_miss_at_once=hedged,
        builds_itself=hedged,
    )


def _follow_up(query: PlanQuery) -> pb.CompileRequest:
    request = _request(query, hedged=True)
    request.answer_miss_at_once, request.counted = False, True
    return request


def _metadata(redis_client: Any, plan_key: str) -> pb.PlanMetadata:
    return pb.PlanMetadata.FromString(redis_client.hget(keys.plan(plan_key), "meta"))


def _began(stack: Stack, query: PlanQuery) -> float:
    """When the worker began building `query`'s heuristic plan (monotonic)."""
    return next(began for digest, began, _ in stack.compiler.intervals if digest == query.spec_hash)


def test_a_nodes_hedged_misses_are_built_once_it_stops_asking(redis_server: EmbeddedRedis, redis_client: Any) -> None:
    """A first node asks for its graphs one after another while it builds each itself: nothing of the service's
    builds runs beside it; every plan is built after its last ask, and its follow-ups get them all."""
    quiet_s, gap_s = 0.8, 0.3
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.05), hedged_quiet_s=quiet_s, hedged_hold_max_s=HOLD_MAX_S
    )
    try:
        queries = [_query(i) for i in range(4)]
        with stack.client() as c, ThreadPoolExecutor(len(queries)) as pool:
            asked = []
            for query in queries:
                begun = time.monotonic()
                assert c._stub.Compile(_request(query, hedged=True), timeout=10).source == pb.COMPILE_SOURCE_BUILDING
                asked.append(time.monotonic())
                assert asked[-1] - begun < gap_s  # told at once, as before
                time.sleep(gap_s)
            held = telemetry.YIELDING._value.get()  # what an operator sees meanwhile (/metrics)
            answers = list(pool.map(lambda q: c._stub.Compile(_follow_up(q), timeout=30), queries))
        assert held >= 1, "no build was shown held back while the node asked"
        assert [a.plan.metadata.key for a in answers] == [q.key for q in queries]
        wait_until(lambda: telemetry.YIELDING._value.get() == 0, 5, "the held builds to be counted out")
        began = [_began(stack, q) for q in queries]
        assert min(began) >= asked[-1] + quiet_s - 0.15, "the service built beside the node's own builds"
    finally:
        stop()


def test_a_caller_that_waits_for_the_plan_hurries_a_yielding_build(
    redis_server: EmbeddedRedis, redis_client: Any
) -> None:
    quiet_s = 5.0  # far longer than the cap: without the hurry the plan would come after HOLD_MAX_S
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.05), hedged_quiet_s=quiet_s, hedged_hold_max_s=HOLD_MAX_S
    )
    try:
        query = _query(10)
        with stack.client() as c, ThreadPoolExecutor(1) as pool:
            assert c._stub.Compile(_request(query, hedged=True), timeout=10).source == pb.COMPILE_SOURCE_BUILDING
            node = pool.submit(c._stub.Compile, _follow_up(query), timeout=30)  # the hedged node waits for it too
            time.sleep(0.2)  # the worker holds the yielding build by now
            begun = time.monotonic()
            answer = c._stub.Compile(_request(query, hedged=False), timeout=30)
            took = time.monotonic() - begun
            assert node.result().plan.metadata.key == query.key
        assert answer.plan.metadata.key == query.key
        assert took < HOLD_MAX_S / 2, f"a caller waiting for the plan waited {took:.2f} s behind hedged ones"
        assert stack.compiler.builds.count(query.spec_hash) == 1  # hurried, not built twice
    finally:
        stop()


def test_a_plain_miss_never_waits_for_hedged_ones_and_a_steady_stream_is_built_within_the_cap(
    redis_server: EmbeddedRedis, redis_client: Any
) -> None:
    quiet_s, gap_s = 1.0, 0.25
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.05), hedged_quiet_s=quiet_s, hedged_hold_max_s=HOLD_MAX_S
    )
    try:
        with stack.client() as c:
            first = _query(20)
            assert c._stub.Compile(_request(first, hedged=True), timeout=10).source == pb.COMPILE_SOURCE_BUILDING
            first_asked = time.monotonic()
            plain = _query(21)
            begun = time.monotonic()
            assert c._stub.Compile(_request(plain, hedged=False), timeout=30).plan.metadata.key == plain.key
            assert time.monotonic() - begun < quiet_s / 2  # not held behind the yielding build
            # Hedged misses keep coming, never a quiet second: the first is built within the cap all the same.
            i = 22
            while time.monotonic() - first_asked < HOLD_MAX_S + 1.0:
                c._stub.Compile(_request(_query(i), hedged=True), timeout=10)
                i += 1
                time.sleep(gap_s)
            assert c._stub.Compile(_follow_up(first), timeout=30).plan.metadata.key == first.key
        assert _began(stack, first) - first_asked < HOLD_MAX_S + 0.5
    finally:
        stop()


def test_a_node_whose_own_build_failed_hurries_the_build_it_let_wait(
    redis_server: EmbeddedRedis, redis_client: Any
) -> None:
    """A hedged node's build fails: it now waits for the service's plan, and says so (a Compile without
    builds_itself): the build it asked to wait is built at once, not after the wait's cap."""
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.05), hedged_quiet_s=5.0, hedged_hold_max_s=HOLD_MAX_S
    )
    try:
        builder = StandInLocalBuilder(seconds=0.05, fail=True)
        hedge.reset_race_stats()
        with Client(stack.address, cache=False, local_builder=builder) as client:
            begun = time.monotonic()
            plan = client.compile(matmul_spec(m=96, name="yield-local-fails"), TARGET)
            took = time.monotonic() - begun
        assert plan.source in ("compiled", "provisional") and builder.built == [plan.key]
        assert race_stats()["compile"].local_failed == 1
        assert took < HOLD_MAX_S / 2, f"a node whose build failed waited {took:.2f} s for the service"
    finally:
        stop()


def test_a_yielding_build_is_built_for_the_next_nodes_after_its_node_left(
    redis_server: EmbeddedRedis, redis_client: Any
) -> None:
    """A first node that ends while its builds wait (a short program, a test process): the service still
    builds them, below every job someone waits for, and the next node's ask is a hit (before builds yielded they
    had started at once; a build for no one is one that nothing asked for, issue 44)."""
    quiet_s = 2.0  # longer than the gateway's grace before it takes a left caller's claim back (UNWANT_GRACE_S)
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.05), hedged_quiet_s=quiet_s, hedged_hold_max_s=HOLD_MAX_S
    )
    try:
        query = _query(40)
        with stack.client() as c:
            assert c._stub.Compile(_request(query, hedged=True), timeout=10).source == pb.COMPILE_SOURCE_BUILDING
            with pytest.raises(grpc.RpcError) as left:  # the node's follow-up gives up at once: the node ended
                c._stub.Compile(_follow_up(query), timeout=0.1)
            assert left.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: query.spec_hash in stack.compiler.builds, quiet_s + 5, "the left node's plan to be built")
        with stack.client() as c:  # the next node: a hit once the plan is stored (its build just ended)
            answer = wait_until(
                lambda: (
                    (a := c._stub.Compile(_request(query, hedged=True), timeout=10)).source == pb.COMPILE_SOURCE_HIT
                    and a
                ),
                5,
                "the plan to be stored",
            )
        assert answer.source == pb.COMPILE_SOURCE_HIT and answer.plan.metadata.key == query.key
        assert stack.compiler.builds.count(query.spec_hash) == 1
    finally:
        stop()


def test_a_caller_on_another_gateway_hurries_a_yielding_build_once(
    redis_server: EmbeddedRedis, redis_client: Any
) -> None:
    """A hedged node's build queued by one gateway, and a caller that waits for the plan on another (a node
    without a GPU build of its own, a prefetch): the second gateway hurries it, once however many such callers
    join (the job's yield mark is taken by the first), and the plan is built once. Before, that caller waited
    behind the hold, up to HOLD_MAX_S."""
    quiet_s = 5.0  # far longer than the cap: without the hurry the plan would come after HOLD_MAX_S
    first, stop_first = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.05), hedged_quiet_s=quiet_s, hedged_hold_max_s=HOLD_MAX_S
    )
    second, stop_second = start_stack(redis_server.url, None)  # another gateway, the same Redis and worker
    try:
        query = _query(50)
        with first.client() as node, second.client() as other, ThreadPoolExecutor(4) as pool:
            assert node._stub.Compile(_request(query, hedged=True), timeout=10).source == pb.COMPILE_SOURCE_BUILDING
            hedged = pool.submit(node._stub.Compile, _follow_up(query), timeout=30)  # the node waits for it too
            time.sleep(0.2)  # the worker holds the yielding build by now
            begun = time.monotonic()
            waiting = [pool.submit(other._stub.Compile, _request(query, hedged=False), timeout=30) for _ in range(3)]
            answers = [w.result() for w in waiting]
            took = time.monotonic() - begun
            assert hedged.result().plan.metadata.key == query.key
        assert all(a.plan.metadata.key == query.key for a in answers)
        assert took < HOLD_MAX_S / 2, f"callers on another gateway waited {took:.2f} s behind a hedged node"
        assert first.compiler.builds.count(query.spec_hash) == 1  # hurried once, built once
        assert not redis_client.exists(keys.job_yields(query.key))  # the mark taken
    finally:
        stop_second()
        stop_first()


@pytest.mark.parametrize("tune_s", [None, HOLD_MAX_S + 1.5], ids=["one plan", "tuned past the holder's gate"])
def test_with_two_workers_a_hurried_build_is_built_once_whichever_worker_reads_the_hurry(
    redis_server: EmbeddedRedis, redis_client: Any, tune_s: float | None
) -> None:
    """The hurry is the job queued again (Flight.hurry): with two workers of a target it may reach the one that
    does not hold the yielding build. That one builds it at once (a caller waits); the holder, whose build waits
    for its gate, must then find the plan stored (or stored provisional and tuned by the other) and not build it
    again (before: one in four such plans built twice here)."""
    quiet_s = 5.0  # far longer than the cap: the holder's build waits for the cap, the hurry comes first
    compiler = StandInCompiler(build_seconds=0.05, tune_seconds=tune_s)
    first, stop_first = start_stack(
        redis_server.url, compiler, hedged_quiet_s=quiet_s, worker_id="worker-a", hedged_hold_max_s=HOLD_MAX_S
    )
    second, stop_second = start_stack(
        redis_server.url, compiler, hedged_quiet_s=quiet_s, worker_id="worker-b", hedged_hold_max_s=HOLD_MAX_S
    )
    try:
        queries = [_query(60 + i) for i in range(4)]
        with first.client() as node, second.client() as other, ThreadPoolExecutor(8) as pool:
            for query in queries:
                answer = node._stub.Compile(_request(query, hedged=True), timeout=10)
                assert answer.source == pb.COMPILE_SOURCE_BUILDING
            hedged = [pool.submit(node._stub.Compile, _follow_up(q), timeout=30) for q in queries]
            time.sleep(0.3)  # each yielding build held by one of the workers by now
            begun = time.monotonic()
            waiting = [pool.submit(other._stub.Compile, _request(q, hedged=False), timeout=30) for q in queries]
            answers = [w.result() for w in waiting]
            took = time.monotonic() - begun
            assert [h.result().plan.metadata.key for h in hedged] == [q.key for q in queries]
        assert [a.plan.metadata.key for a in answers] == [q.key for q in queries]
        assert took < HOLD_MAX_S / 2, f"callers waited {took:.2f} s behind hedged nodes"
        time.sleep(HOLD_MAX_S + 0.5)  # past every holder's gate: a build it would start has started
        assert [compiler.builds.count(q.spec_hash) for q in queries] == [1] * len(queries)
        if tune_s is not None:  # each plan tuned once, by the worker that took its hurry, and stored tuned
            wait_until(lambda: all(not _metadata(redis_client, q.key).provisional for q in queries), 15, "tuned plans")
            tuned = compiler.candidate_builds
            assert len(tuned) == len(set(tuned)) == len(queries) * (compiler.candidates - 1)
    finally:
        stop_second()
        stop_first()


@pytest.mark.parametrize("tuned", [False, True], ids=["while its first plan builds", "while it is tuned"])
def test_with_two_workers_a_hurry_that_comes_once_the_build_started_is_left_to_the_worker_building_it(
    redis_server: EmbeddedRedis, redis_client: Any, tuned: bool
) -> None:
    """A hedged node's build started once it stopped asking (its gate opened); then a caller that waits for the
    plan hurries it (the job's mark is still there): the job, queued again, reaches the other worker (idle, so
    Redis hands it the entry), which finds this job started by the first (its first plan building: the job's
    state names the worker that claimed its start), or its plan provisional and tuned by the first, and leaves
    it to that worker (before: it built, and tuned, the plan a second time)."""
    # Tuned: ~1.5 s of tuning on four threads, after a provisional plan stored at once.
    compiler = StandInCompiler(build_seconds=0.05, tune_seconds=6.0) if tuned else StandInCompiler(build_seconds=2.0)
    first, stop_first = start_stack(
        redis_server.url, compiler, hedged_quiet_s=0.2, worker_id="worker-a", hedged_hold_max_s=HOLD_MAX_S
    )
    second, stop_second = start_stack(
        redis_server.url, compiler, hedged_quiet_s=0.2, worker_id="worker-b", hedged_hold_max_s=HOLD_MAX_S
    )
    try:
        query = _query(70)
        with first.client() as node, second.client() as other:
            answer = node._stub.Compile(_request(query, hedged=True), timeout=10)
            assert answer.source == pb.COMPILE_SOURCE_BUILDING
            if tuned:
                wait_until(
                    lambda: redis_client.hget(keys.job_state(query.key), "state") == b"provisional", 15, "provisional"
                )
            else:
                wait_until(lambda: compiler.builds.count(query.spec_hash) == 1, 15, "the first plan building")
                assert redis_client.hget(keys.job_state(query.key), "building") in (b"worker-a", b"worker-b")
            plan = other.compile(query, tuned_only=tuned, timeout=30)
        assert plan.key == query.key and not plan.provisional  # final at once, or tuned
        time.sleep(0.5)  # a second build the hurry started would have begun
        assert compiler.builds.count(query.spec_hash) == 1
        if tuned:
            tunings = [c for c in compiler.candidate_builds if c[0] == query.spec_hash]
            assert len(tunings) == len(set(tunings)) == compiler.candidates - 1, tunings
    finally:
        stop_second()
        stop_first()


def test_a_jobs_start_is_claimed_by_one_worker_and_a_dead_workers_claim_is_passed(redis_client: Any) -> None:
    """BuildRecorder.claim_start against real Redis: the first worker to claim a job's start has it; another is
    refused while the state names that job, and sees it built elsewhere; a job reclaimed from a dead worker
    passes its claim; a state naming another job (the plan queued anew) says nothing of this one."""
    from plancache_server.store.build_records import BuildRecorder

    records = BuildRecorder(redis_client, lease_s=30)
    plan_key = _query(91).key
    records.mark_running(plan_key, "job-1", "worker-a")
    assert records.claim_start(plan_key, "job-1", "worker-a")
    assert records.claim_start(plan_key, "job-1", "worker-a")  # its own claim again
    assert not records.claim_start(plan_key, "job-1", "worker-b")
    assert records.built_elsewhere(plan_key, "job-1", "worker-b")
    assert not records.built_elsewhere(plan_key, "job-1", "worker-a")
    assert records.claim_start(plan_key, "job-1", "worker-b", reclaimed=True)  # worker-a stopped answering
    assert not records.claim_start(plan_key, "job-1", "worker-a")
    records.mark_running(plan_key, "job-2", "worker-a")  # a new job's state: no one has started it
    assert not records.built_elsewhere(plan_key, "job-2", "worker-b")
    assert records.claim_start(plan_key, "job-2", "worker-b")
    assert records.claim_start(plan_key, "job-1", "worker-c")  # job-1's claim is gone with its state
    assert redis_client.hget(keys.job_state(plan_key), "building") == b"worker-b"

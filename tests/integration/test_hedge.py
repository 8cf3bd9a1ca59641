"""The hedged miss (plancache.transport.hedge) against a real gateway and
worker: on a miss the node's own build races the service's, whichever is
ready first runs, the service's plan takes over later, a hit never builds
locally, and a failure on either side never hides the other.

The worker is the stand-in compiler (its builds sleep), the node's build is
tests/support/standin_local.py (it sleeps too) and plans run on the
stand-in GPU runtime: who wins is set by the two sleeps. The real race runs
on the GPU (tests/gpu/test_gpu_hedge.py, bench/startup.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from plancache import Client, DiskCache, Target, race_stats
from plancache.errors import CompileFailed, NotStored, ResourceExhausted, SpecError
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.validation import Limits
from plancache.run import execution
from plancache.run.local import BUILT_BY, LocalPlan
from plancache.transport import hedge
from plancache.transport.calls import typed
from plancache.trust.signing import Signer, generate_keypair
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from plancache_server.web.status import first_uses, status_of
from plancache_server.web.status_page import render
from tests.conftest import Stack, start_stack
from tests.support.fake_gpu import FakeRuntime, FakeTensor
from tests.support.specs import matmul_spec
from tests.support.standin import REJECTED_NAME, StandInCompiler
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin_local import StandInLocalBuilder
from tests.support.waiting import wait_until

SLOW_S, FAST_S = 1.5, 0.05


@pytest.fixture(autouse=True)
def runtime() -> Iterator[FakeRuntime]:
    fake = FakeRuntime()
    execution.use_runtime(fake)
    hedge.reset_race_stats()
    yield fake
    execution.use_runtime(None)


def stack_of(redis_server: EmbeddedRedis, build_seconds: float, **kwargs: object) -> tuple[Stack, object]:
    """A stack whose worker builds a hedged miss at once (--hedged-quiet 0): the race itself, decided by the two
    sleeps. A worker's default lets such builds wait while hedged misses keep coming
    (tests/integration/test_yielding_builds.py)."""
    kwargs.setdefault("hedged_quiet_s", 0.0)
    return start_stack(redis_server.url, StandInCompiler(build_seconds=build_seconds), **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def slow_service(redis_server: EmbeddedRedis, redis_client: object) -> Iterator[Stack]:
    s, stop = stack_of(redis_server, SLOW_S)
    yield s
    stop()  # type: ignore[operator]


@pytest.fixture
def fast_service(redis_server: EmbeddedRedis, redis_client: object) -> Iterator[Stack]:
    s, stop = stack_of(redis_server, FAST_S)
    yield s
    stop()  # type: ignore[operator]


def tensors_for(spec: GraphSpec) -> dict[str, FakeTensor]:
    from plancache.graphspec.validation import normalize

    return {
        t.name or "": FakeTensor(tuple(t.dim), tuple(t.stride), t.data_type or "half")
        for t in normalize(spec).tensors
        if not t.is_virtual
    }


def counters(stack: Stack) -> dict[str, float]:
    report = stack.gateway.run(status_of(stack.gateway.front).report())
    return next(t.windows["total"] for t in report.targets if t.target_id == TARGET.id)


def test_a_miss_runs_the_nodes_own_plan_when_it_is_ready_first_then_the_services(
    slow_service: Stack, runtime: FakeRuntime
) -> None:
    builder = StandInLocalBuilder(seconds=FAST_S)
    spec = matmul_spec(m=16, name="hedged")
    with Client(slow_service.address, cache=False, local_builder=builder) as client:
        started = time.monotonic()
        plan = client.compile(spec, TARGET)
        waited = time.monotonic() - started
        assert isinstance(plan, LocalPlan) and plan.source == "local" and plan.local
        assert waited < SLOW_S  # the node did not wait for the service's build
        assert builder.built == [plan.key] and builder.threads == [threading.get_ident()]  # on the caller's thread
        plan.execute(tensors_for(spec))
        assert (
            len(builder.graphs[0].calls) == 1 and runtime.graphs == []
        )  # the node's own plan ran; nothing was deserialized
        assert race_stats()["compile"].local_won == 1
        # The service's plan arrives, verified; the next call runs it.
        deadline = time.monotonic() + 10
        while plan.local and time.monotonic() < deadline:
            time.sleep(0.05)
        plan.execute(tensors_for(spec))
        assert plan.source in ("compiled", "provisional") and not plan.local
        stored = slow_service.redis.hget(keys.plan(plan.key), "blob")
        assert [g.blob for g in runtime.graphs] == [stored]  # the service's blob ran the second call
        assert len(builder.graphs[0].calls) == 1
        assert race_stats()["compile"].replaced == 1
        assert plan.metadata.built_by != BUILT_BY
    # Never stored: what the store holds for the key is the worker's plan.
    meta = pb.PlanMetadata.FromString(slow_service.redis.hget(keys.plan(plan.key), "meta"))  # type: ignore[arg-type]
    assert meta.built_by == "test-worker"
    # The report reached the service: the status page says the service served no first use of it.
    total = counters(slow_service)
    assert total.get("first_uses_local") == 1 and first_uses(total) == (0, 1)
    assert 'data-first-uses="0.0000"' in render(
        slow_service.gateway.run(status_of(slow_service.gateway.front).report())
    )


def test_a_miss_the_service_answers_first_runs_the_services_plan(fast_service: Stack, runtime: FakeRuntime) -> None:
    builder = StandInLocalBuilder(seconds=1.0)
    with Client(fast_service.address, cache=False, local_builder=builder) as client:
        plan = client.compile(matmul_spec(m=32, name="service-first"), TARGET)
        assert not isinstance(plan, LocalPlan) and plan.source in ("compiled", "provisional")
        assert builder.built == [plan.key]  # the node's build ran (the hedge's cost when the service wins)
        assert race_stats()["compile"].service_won == 1 and race_stats()["compile"].local_won == 0
    total = counters(fast_service)
    assert total.get("first_uses_served") == 1 and first_uses(total) == (1, 1)


def test_a_hit_never_starts_a_local_build(fast_service: Stack) -> None:
    spec = matmul_spec(m=48, name="stored")
    with Client(fast_service.address, cache=False, hedge=False) as first:
        first.compile(spec, TARGET, tuned_only=True)
    builder = StandInLocalBuilder(seconds=FAST_S)
    with Client(fast_service.address, cache=False, local_builder=builder) as client:
        plan = client.compile(spec, TARGET)
    assert plan.source == "hit" and builder.built == []
    assert race_stats()["compile"] == hedge.RaceCounts()


def test_a_stored_only_ask_is_one_round_trip_and_the_service_builds_the_plan(slow_service: Stack) -> None:
    """compile(stored_only=True), plancache.torch's first call: a miss is NotStored at once (no build waited
    for, none on this node), the service builds it all the same, and once stored the same ask is its plan."""
    builder = StandInLocalBuilder(seconds=FAST_S)
    spec = matmul_spec(m=80, name="stored-only")
    with Client(slow_service.address, cache=False, local_builder=builder) as client:
        started = time.monotonic()
        with pytest.raises(NotStored, match="not stored yet: the service is building it"):
            client.compile(spec, TARGET, stored_only=True)
        assert time.monotonic() - started < SLOW_S / 2 and builder.built == []
        key = client.query(spec, TARGET).key
        wait_until(lambda: slow_service.redis.exists(keys.plan(key)), 10, "the service's build stored")
        plan = client.compile(spec, TARGET, stored_only=True)
        assert plan.key == key and plan.source == "hit" and builder.built == []
    assert race_stats()["compile"] == hedge.RaceCounts()  # nothing raced


def test_stored_only_asks_expected_to_miss_are_sent_in_the_background(slow_service: Stack) -> None:
    """After two stored-only asks that missed in a row (a first node of a new model), the next graphs' asks go on
    a kept thread and are NotStored at once, the service building them all the same; a graph stored after all
    (its answer in the background a hit) ends the run of misses, and the next ask waits for its answer again."""
    with Client(slow_service.address, cache=False, local_builder=StandInLocalBuilder(seconds=FAST_S)) as client:
        asked_here: list[str] = []
        call = client.connection.call

        def counted(method: object, request: pb.CompileRequest, timeout: float | None) -> object:
            asked_here.append(request.claimed_key)
            return call(method, request, timeout)  # type: ignore[arg-type]

        client.connection.call = counted  # type: ignore[method-assign]
        specs = [matmul_spec(m=200 + 8 * i, name=f"behind-{i}") for i in range(4)]
        for spec in specs:
            with pytest.raises(NotStored):
                client.compile(spec, TARGET, stored_only=True)
        plan_keys = [client.query(spec, TARGET).key for spec in specs]
        assert asked_here == plan_keys[:2]  # the third and fourth were asked on a kept thread
        for key in plan_keys:
            wait_until(lambda key=key: slow_service.redis.exists(keys.plan(key)), 15, f"{key} built")
        with pytest.raises(NotStored, match="expected to miss"):  # stored now, but a third miss was expected
            client.compile(specs[2], TARGET, stored_only=True)
        wait_until(lambda: race_stats()["compile"].stored_after_all == 1, 10, "the background ask's hit")
        plan = client.compile(specs[3], TARGET, stored_only=True)  # asked first again: the stored plan
        assert plan.key == plan_keys[3] and asked_here[-1] == plan_keys[3]


def test_a_graph_cuDNN_rejected_is_refused_in_the_first_answer_not_answered_building(fast_service: Stack) -> None:
    """The negative cache in a miss answered at once: once a build was rejected, a stored-only ask of the graph
    is CompileFailed with cuDNN's reason (before, "building": plancache.torch read it as not stored yet in every
    process and asked again every minute)."""
    spec = matmul_spec(m=96, name=REJECTED_NAME)
    builder = StandInLocalBuilder(seconds=FAST_S)
    with Client(fast_service.address, cache=False, local_builder=builder) as client:
        with pytest.raises(NotStored):  # the first ask: nothing known yet, the build started
            client.compile(spec, TARGET, stored_only=True)
        key = client.query(spec, TARGET).key
        wait_until(lambda: fast_service.redis.exists(keys.failure(key)), 10, "the rejection remembered")
        with pytest.raises(CompileFailed, match="remembered from an earlier build"):
            client.compile(spec, TARGET, stored_only=True)
        assert builder.built == []
    # Expected to miss (two misses in a row before it), its ask goes in the background: the refusal is said at the
    # process's next ask of it, not "not stored" again.
    with Client(fast_service.address, cache=False, local_builder=builder) as client:
        for m in (104, 112):
            with pytest.raises(NotStored):
                client.compile(matmul_spec(m=m, name="missing"), TARGET, stored_only=True)
        with pytest.raises(NotStored, match="expected to miss"):
            client.compile(spec, TARGET, stored_only=True)
        assert client._hedged.settle_asks(5)  # the ask in the background answered
        with pytest.raises(CompileFailed, match="remembered from an earlier build"):
            client.compile(spec, TARGET, stored_only=True)


def test_a_disk_cache_hit_asks_nothing_and_builds_nothing(fast_service: Stack, tmp_path: Path) -> None:
    spec = matmul_spec(m=64, name="on-disk")
    builder = StandInLocalBuilder(seconds=0.5)
    with Client(fast_service.address, cache=DiskCache(tmp_path / "cache"), local_builder=builder) as client:
        client.compile(spec, TARGET, tuned_only=True)
        assert builder.built == []  # tuned_only: the caller wants the tuned plan, which no local build makes
        assert client.compile(spec, TARGET).source == "cache" and builder.built == []


def test_a_local_build_that_fails_does_not_hide_the_services_plan(slow_service: Stack) -> None:
    builder = StandInLocalBuilder(seconds=FAST_S, fail=True)
    with Client(slow_service.address, cache=False, local_builder=builder) as client:
        plan = client.compile(matmul_spec(m=80, name="local-fails"), TARGET)
    assert plan.source in ("compiled", "provisional") and builder.built == [plan.key]
    assert race_stats()["compile"].local_failed == 1


def test_both_failing_raises_the_services_error_naming_the_local_one(fast_service: Stack) -> None:
    builder = StandInLocalBuilder(seconds=FAST_S, fail=True)
    with (
        Client(fast_service.address, cache=False, local_builder=builder) as client,
        pytest.raises(CompileFailed) as raised,
    ):
        client.compile(matmul_spec(m=1000, name=REJECTED_NAME), TARGET)
    assert "this node's own build failed: CompileFailed: stand-in" in raised.value.message


def test_a_service_that_fails_does_not_hide_the_local_plan(redis_server: EmbeddedRedis, redis_client: object) -> None:
    builder = StandInLocalBuilder(seconds=FAST_S)
    s, stop = start_stack(redis_server.url, None)  # no worker: TargetUnavailable
    try:
        with Client(s.address, cache=False, local_builder=builder) as client:
            plan = client.compile(matmul_spec(m=96, name="no-worker"), TARGET)
            assert plan.source == "local"
            time.sleep(0.2)
            assert plan.local  # the service failed: the node's plan keeps running
    finally:
        stop()  # type: ignore[operator]
    with Client(
        f"127.0.0.1:{free_port()}", cache=False, local_builder=builder, timeout=2
    ) as down:  # nothing listens there
        assert down.compile(matmul_spec(m=112, name="server-down"), TARGET, timeout=5).source == "local"
    assert race_stats()["compile"].service_failed == 2


def test_a_service_plan_failing_verification_is_never_run(
    redis_server: EmbeddedRedis,
    redis_client: object,
    tmp_path: Path,
    runtime: FakeRuntime,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker_key, _ = generate_keypair(tmp_path / "worker")
    _, other_public = generate_keypair(tmp_path / "other")
    s, stop = stack_of(redis_server, FAST_S, signer=Signer.from_file(worker_key))
    builder = StandInLocalBuilder(seconds=0.5)
    spec = matmul_spec(m=128, name="untrusted")
    try:
        with Client(
            s.address, cache=False, local_builder=builder, trusted_keys=[other_public], allow_unsigned=False
        ) as client:
            plan = client.compile(spec, TARGET)
            assert plan.source == "local"  # the service's plan came first but failed verification
            time.sleep(0.2)
            plan.execute(tensors_for(spec))
            assert plan.local and runtime.graphs == []  # never deserialized
    finally:
        stop()  # type: ignore[operator]
    assert race_stats()["compile"].service_failed == 1
    # Said, with its remedy: a newcomer's program runs, and the log says why the service's plans do not.
    said = [r.getMessage() for r in caplog.records if "the service's plan was refused" in r.getMessage()]
    assert said and "does not trust" in said[0] and "plancache trust" in said[0]


def test_a_spec_the_service_refuses_is_raised_before_a_build_or_the_nodes_own_plan_runs(
    redis_server: EmbeddedRedis, redis_client: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused in the first answer (no claimed key: the service validated first): raised, nothing built.
    Refused after a claimed miss's answer (the node was building already): the node's plan runs, as it
    would without plancache, and the refusal is logged and counted as the service's failure."""
    s, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=FAST_S), limits=Limits(max_tensors=2)
    )  # this client's limits are wider
    builder = StandInLocalBuilder(seconds=FAST_S)
    try:
        with Client(s.address, cache=False, local_builder=builder) as client:
            query = client.query(matmul_spec(m=144, name="too-many-tensors"), TARGET)
            request = pb.CompileRequest(
                spec=query.spec_proto,
                target=query.target.to_proto(),
                options=query.options.to_proto(),
                answer_miss_at_once=True,
            )
            with pytest.raises(grpc.RpcError) as refused:
                client.connection.stub.Compile(request, timeout=10)
            assert isinstance(typed(refused.value), SpecError)
            assert builder.built == []
            plan = client.compile(query)  # the client claims its key: told "building" first
            assert plan.source == "local" and builder.built
            wait_until(lambda: hedge.race_stats()["compile"].service_failed == 1, 10, "the refusal, counted")
    finally:
        stop()  # type: ignore[operator]
    assert "the service refuses a graph this node builds itself" in caplog.text


def test_off_by_option_by_environment_and_where_this_node_cannot_build(
    slow_service: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = StandInLocalBuilder(seconds=FAST_S)
    with Client(slow_service.address, cache=False, local_builder=builder, hedge=False) as client:
        assert client.compile(matmul_spec(m=160, name="off-1"), TARGET).source in ("compiled", "provisional")
    monkeypatch.setenv("PLANCACHE_HEDGE", "0")
    with Client(slow_service.address, cache=False, local_builder=builder) as client:
        assert not client.hedge
        assert client.compile(matmul_spec(m=176, name="off-2"), TARGET).source in ("compiled", "provisional")
        assert client.compile(matmul_spec(m=192, name="on-3"), TARGET, hedge=True).source == "local"
    monkeypatch.delenv("PLANCACHE_HEDGE")
    elsewhere = StandInLocalBuilder(seconds=FAST_S, machine=Target("sm_80", 91900, "1.32.0", "Other GPU", 108))
    with Client(slow_service.address, cache=False, local_builder=elsewhere) as client:
        assert client.compile(matmul_spec(m=208, name="other-gpu"), TARGET).source in ("compiled", "provisional")
    assert builder.built == [builder.built[0]] and elsewhere.built == []  # only the call that asked for the hedge built


def test_a_report_counts_only_plans_the_service_knows_once_each(fast_service: Stack) -> None:
    """Anyone may send reports: a key nobody asked for, a malformed one or the same one
    repeated counts nothing more than once; too many at once are refused."""
    with Client(fast_service.address, cache=False, hedge=False) as client:
        known = client.compile(matmul_spec(m=224, name="known"), TARGET).key
        stub = client._stub
        unknown = known.replace(known[:8], "0" * 8, 1)
        uses = [pb.FirstUse(plan_key=k, local=True) for k in (known, known, unknown, "not a key", "")]
        assert stub.ReportFirstUses(pb.ReportFirstUsesRequest(uses=uses)).counted == 1
        with pytest.raises(Exception) as raised:
            stub.ReportFirstUses(pb.ReportFirstUsesRequest(uses=[pb.FirstUse(plan_key=known)] * 1025))
        assert isinstance(typed(raised.value), ResourceExhausted)  # type: ignore[arg-type]
    total = counters(fast_service)
    assert total.get("first_uses_local") == 1 and first_uses(total) == (0, 1)


def test_a_node_plan_the_service_failed_is_reused_and_the_service_asked_again(
    redis_server: EmbeddedRedis, redis_client: object
) -> None:
    builder = StandInLocalBuilder(seconds=FAST_S)
    spec = matmul_spec(m=240, name="asked-again")
    s, stop = start_stack(redis_server.url, None)  # no worker yet: the service fails the first race
    try:
        with Client(s.address, cache=False, local_builder=builder) as client:
            first = client.compile(spec, TARGET)
            time.sleep(0.2)
            assert first.source == "local" and first.local and not first.waiting  # type: ignore[attr-defined]
            again = client.compile(spec, TARGET)  # asked again: still no worker
            assert again is first and builder.built == [first.key]  # not rebuilt
    finally:
        stop()  # type: ignore[operator]


def test_misses_one_after_another_wait_for_the_service_on_one_kept_thread(fast_service: Stack) -> None:
    """Each hedged miss's Compile waits on plancache's kept threads: misses one after another start no thread each
    (gRPC's future() started one for a call alone on its channel, ~0.4 ms of every miss: bench/miss_cost.py), and
    the service answers every one of them there, before the node's slower builds end (its plans run)."""
    builder = StandInLocalBuilder(seconds=0.5)  # the service builds in FAST_S: each answer comes during the build
    waiting = hedge.WaitingCalls(hedge.WAITING_THREADS)
    hedge.waiting_calls.use(waiting)
    try:
        with Client(fast_service.address, cache=False, local_builder=builder) as client:
            plans = [client.compile(matmul_spec(m=8 * (i + 1), name=f"kept-{i}"), TARGET) for i in range(6)]
        assert len(builder.built) == 6
        assert [p.source for p in plans] == ["compiled"] * 6, [p.source for p in plans]
        assert waiting._threads == 2  # for six misses: one kept thread and its spare
        assert hedge.race_stats()["compile"].service_won == 6
    finally:
        hedge.waiting_calls.use(None)

"""Expected misses (issue 41): where a process knows a graph is not stored,
its own build starts at once, beside one Compile that waits for the
service's build, instead of after a first answer that says "building" (the
round trip that was most of a miss's fixed cost). It knows so from its
workload's record (a graph the record does not list) or, with no record,
after MISSES_BEFORE_EXPECTING misses in a row.

Against a real Redis, gateway and stand-in worker (its builds sleep); the
node's build is tests/support/standin_local.py. What is asserted is what a
user cares about: no first answer is waited for where a miss is expected;
each graph still runs its own plan, the service's replacing the node's as
before; a graph that was stored after all runs the service's plan, ends
the run of misses (the next graph asks first, and a hit builds nothing),
and the service counts each miss once; a record can make a process build
a graph itself, never run another graph's plan."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from plancache import Client, race_stats
from plancache.graphspec.graph import GraphSpec
from plancache.keys.query import PlanQuery
from plancache.run import execution
from plancache.run.local import LocalPlan
from plancache.transport import hedge
from plancache.transport.hedged_calls import MISSES_BEFORE_EXPECTING
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.web.status import status_of
from tests.conftest import Stack, start_stack
from tests.support.fake_gpu import FakeRuntime
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.standin_local import StandInLocalBuilder
from tests.support.waiting import wait_until

SERVICE_BUILD_S, NODE_BUILD_S = 1.0, 0.05


@pytest.fixture(autouse=True)
def runtime() -> Iterator[FakeRuntime]:
    fake = FakeRuntime()
    execution.use_runtime(fake)
    hedge.reset_race_stats()
    yield fake
    execution.use_runtime(None)


@pytest.fixture
def service(redis_server: EmbeddedRedis, redis_client: object) -> Iterator[Stack]:
    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=SERVICE_BUILD_S))
    yield s
    stop()


def first_asks(client: Client) -> list[str]:
    """The first answers `client` waits for (Compile with answer_miss_at_once), by claimed key, as they are sent."""
    asked: list[str] = []
    call = client.connection.call

    def counting(method: Any, request: Any, timeout: float | None) -> Any:
        if getattr(request, "answer_miss_at_once", False):
            asked.append(request.claimed_key)
        return call(method, request, timeout)

    client.connection.call = counting  # type: ignore[method-assign]
    return asked


def misses(stack: Stack) -> float:
    report = stack.gateway.run(status_of(stack.gateway.front).report())
    return next(t.windows["total"] for t in report.targets if t.target_id == TARGET.id).get("misses", 0)


def key(spec: GraphSpec) -> str:
    return PlanQuery.of(spec, TARGET).key


def store(stack: Stack, *graphs: GraphSpec) -> None:
    with stack.client(hedge=False) as other:
        for spec in graphs:
            other.compile(spec, TARGET, tuned_only=True)


def test_after_misses_in_a_row_the_nodes_build_starts_without_a_first_answer(service: Stack) -> None:
    graphs = [matmul_spec(m=16 * (i + 1), name=f"new{i}") for i in range(4)]
    builder = StandInLocalBuilder(seconds=NODE_BUILD_S)
    with service.client(local_builder=builder, workload_prefetch=False) as client:
        asked = first_asks(client)
        plans = [client.compile(spec, TARGET) for spec in graphs]
        # The first MISSES_BEFORE_EXPECTING graphs asked first; the rest started their builds at once.
        assert asked == [key(s) for s in graphs[:MISSES_BEFORE_EXPECTING]]
        assert race_stats()["compile"].at_once == len(graphs) - MISSES_BEFORE_EXPECTING
        assert all(isinstance(p, LocalPlan) and p.local for p in plans)  # each ran the node's plan at once
        assert [p.key for p in plans] == [key(s) for s in graphs]
        # The service builds each too and its plan takes over, as for any hedged miss.
        wait_until(lambda: not any(p.local for p in plans), timeout=20, what="the service's plans")
        assert all(p.source in ("compiled", "provisional") for p in plans)
    assert misses(service) == len(graphs)  # one miss per graph: an expected one is counted once too
    assert race_stats()["compile"].stored_after_all == 0


def test_a_graph_stored_after_all_runs_the_services_plan_and_the_next_asks_first(service: Stack) -> None:
    stored, also_stored = matmul_spec(m=400, name="stored"), matmul_spec(m=416, name="stored-too")
    store(service, stored, also_stored)
    new = [matmul_spec(m=16 * (i + 1), name=f"new{i}") for i in range(MISSES_BEFORE_EXPECTING)]
    builder = StandInLocalBuilder(seconds=0.3)  # longer than a hit's answer
    with service.client(local_builder=builder, workload_prefetch=False) as client:
        asked = first_asks(client)
        for spec in new:
            client.compile(spec, TARGET)
        plan = client.compile(stored, TARGET)  # expected to miss: built here too, but stored
        assert not isinstance(plan, LocalPlan) and plan.source == "hit"
        assert key(stored) in builder.built  # the wrong guess cost the node's own build, no more
        assert race_stats()["compile"].stored_after_all == 1
        # The run of misses ended: the next graph asks first, and a hit builds nothing.
        again = client.compile(also_stored, TARGET)
        assert again.source == "hit" and key(also_stored) not in builder.built
        assert asked[-1] == key(also_stored)


def test_a_workload_record_says_which_graphs_will_miss(service: Stack) -> None:
    old = [matmul_spec(m=16 * (i + 1), name=f"old{i}") for i in range(2)]
    with service.client(hedge=False, workload="trainer", workload_prefetch=True) as first:
        for spec in old:
            first.compile(spec, TARGET, tuned_only=True)
    elsewhere = matmul_spec(m=512, name="another-workloads")
    store(service, elsewhere)  # stored, but not in trainer's record
    new = matmul_spec(m=640, name="new-layer")

    builder = StandInLocalBuilder(seconds=0.3)
    with service.client(local_builder=builder, workload="trainer", workload_prefetch=True) as second:
        asked = first_asks(second)
        opener = second.compile(old[0], TARGET)  # the first call starts the record's stream
        wait_until(lambda: second.workload_stats().state == "done", timeout=20, what="the workload's stream")
        listed = second.compile(old[1], TARGET)  # listed: its prefetched plan, nothing built
        fresh = second.compile(new, TARGET)  # not listed: built here at once, though no miss came before
        other = second.compile(elsewhere, TARGET)  # not listed but stored: the service's plan runs
    assert [p.key for p in (opener, listed, fresh, other)] == [key(s) for s in (*old, new, elsewhere)]
    assert key(old[1]) not in builder.built and isinstance(fresh, LocalPlan)
    assert not isinstance(other, LocalPlan) and other.source == "hit"
    assert key(new) not in asked and key(elsewhere) not in asked
    assert second.workload.lists(key(old[1])) is True and second.workload.lists(key(new)) is False
    stats = race_stats()["compile"]
    assert (stats.at_once, stats.stored_after_all, stats.record_disbelieved) == (2, 1, 1)


def test_a_record_proven_wrong_no_longer_says_which_graphs_will_miss(service: Stack) -> None:
    """GPU run 36: a process whose workload record did not list the stored graphs it met (a graph family's
    members built beforehand, 15 bucket lengths) built every one itself, since the record said each would
    miss. The first such graph costs the node's build (nothing said otherwise); from then on the record's
    silence predicts nothing: the stored graphs are asked first and are hits, nothing built; after
    MISSES_BEFORE_EXPECTING real misses in a row, misses are expected again as without a record."""
    with service.client(hedge=False, workload="prefill", workload_prefetch=True) as first:
        first.compile(matmul_spec(m=8, name="old"), TARGET, tuned_only=True)
    members = [matmul_spec(m=64 * (i + 1), name="bucket") for i in range(4)]
    store(service, *members)  # stored (a family built ahead), not in prefill's record
    new = [matmul_spec(m=2000 + 16 * i, name="new") for i in range(MISSES_BEFORE_EXPECTING + 1)]

    builder = StandInLocalBuilder(seconds=0.3)  # longer than a hit's answer
    with service.client(local_builder=builder, workload="prefill", workload_prefetch=True) as second:
        asked = first_asks(second)
        second.compile(matmul_spec(m=8, name="old"), TARGET)  # listed: the record's stream
        wait_until(lambda: second.workload_stats().state == "done", timeout=20, what="the workload's stream")
        del asked[:]  # the first call asked before the record was read
        plans = [second.compile(spec, TARGET) for spec in members]
        assert [p.key for p in plans] == [key(s) for s in members]
        assert all(p.source == "hit" and not isinstance(p, LocalPlan) for p in plans)
        assert [key(s) for s in members if key(s) in builder.built] == [key(members[0])]  # the wrong guess alone
        assert asked == [key(s) for s in members[1:]]  # the others asked first
        fresh = [second.compile(spec, TARGET) for spec in new]
    assert [p.key for p in fresh] == [key(s) for s in new]
    assert asked[len(members) - 1 :] == [key(s) for s in new[:MISSES_BEFORE_EXPECTING]]  # then expected again
    stats = race_stats()["compile"]
    assert (stats.stored_after_all, stats.record_disbelieved) == (1, 1)
    assert stats.at_once == 1 + len(new) - MISSES_BEFORE_EXPECTING


def test_a_graph_the_service_may_be_building_ahead_asks_first(service: Stack) -> None:
    """GPU run 31: a sweep's family was being built, yet after two misses each new size was expected to
    miss and the node built it itself, stored or not (490 ms a size instead of a ~30 ms hit). A family's
    member (what the front doors mark, plancache.frontdoors.families) asks first: stored, it is a hit and
    nothing is built; not stored, the node builds it after one answer. Other graphs keep expecting misses."""
    graphs = [matmul_spec(m=16 * (i + 1), name=f"new{i}") for i in range(4)]
    stored, member = matmul_spec(m=500, name="a-member"), matmul_spec(m=516, name="a-member-not-built-yet")
    store(service, stored)
    builder = StandInLocalBuilder(seconds=NODE_BUILD_S)
    with service.client(local_builder=builder, workload_prefetch=False) as client:
        asked = first_asks(client)
        for spec in graphs[:MISSES_BEFORE_EXPECTING]:
            client.compile(spec, TARGET)
        client.ask_first(key(stored))
        client.ask_first(key(member))
        for spec in graphs[MISSES_BEFORE_EXPECTING:]:  # not members: expected misses, built at once
            client.compile(spec, TARGET)
        client.compile(member, TARGET)  # misses in a row, yet asked first
        hit = client.compile(stored, TARGET)
        assert asked == [key(s) for s in [*graphs[:MISSES_BEFORE_EXPECTING], member, stored]]
        assert race_stats()["compile"].at_once == len(graphs) - MISSES_BEFORE_EXPECTING
        assert hit.source == "hit" and not isinstance(hit, LocalPlan)
        assert key(stored) not in builder.built and key(member) in builder.built

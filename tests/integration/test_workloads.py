"""A workload's start-up with nothing to configure (issue 41): the service
keeps, per workload and target, the stored plans the workload's processes
used; a new process of it streams them at its first call, before its graphs
ask. Against a real Redis, gateway and stand-in worker; plans run on the
stand-in GPU runtime (the GPU run: bench/startup.py's stored-* paths).

What is asserted is what a user and an operator care about: the second
process's graphs take prefetched plans (counted), in the order the first
used them; a record is bounded and least recently used out; nothing a
report or a record claims is trusted (unknown, foreign-target, malformed
and oversized entries are refused or bounded; a forged record never makes a
graph run another graph's plan); a prefetch that fails loses nothing but
time; the status page and /metrics show each workload."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import plancache
from plancache import Client
from plancache.errors import InvalidRequest, PlanCacheError, ResourceExhausted
from plancache.keys.query import PlanQuery
from plancache.run import execution
from plancache.transport import workload as workload_module
from plancache.transport.background import BackgroundPrefetch
from plancache.transport.calls import typed
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.web.metrics import WorkloadCollector
from plancache_server.web.status import status_of
from plancache_server.web.status_page import render
from tests.conftest import Stack, start_stack
from tests.support.fake_gpu import FakeRuntime
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.standin_local import StandInLocalBuilder
from tests.support.waiting import wait_until


@pytest.fixture(autouse=True)
def runtime() -> Iterator[FakeRuntime]:
    fake = FakeRuntime()
    execution.use_runtime(fake)
    yield fake
    execution.use_runtime(None)


@pytest.fixture
def service(redis_server: EmbeddedRedis, redis_client: object) -> Iterator[Stack]:
    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.0), workload_plans=6)
    yield s
    stop()


def specs(count: int, base: int = 64) -> list[plancache.GraphSpec]:
    return [matmul_spec(m=base + 16 * i, name=f"g{i}") for i in range(count)]


def client(stack: Stack, name: str = "job", **kwargs: object) -> Client:
    return stack.client(hedge=False, workload=name, workload_prefetch=True, **kwargs)  # type: ignore[arg-type]


def run_process(stack: Stack, graphs: list[plancache.GraphSpec], name: str = "job") -> list[str]:
    """One process of the workload: a compile per graph, then its end (the final report)."""
    with client(stack, name) as c:
        return [c.compile(spec, TARGET).key for spec in graphs]


def listed(stack: Stack, name: str = "job", target_id: str = TARGET.id) -> list[str]:
    with stack.client() as c:
        stub = c.connection.stub
        return list(stub.GetWorkload(pb.GetWorkloadRequest(name=name, target_id=target_id), timeout=10).plan_keys)


def settled(c: Client) -> plancache.WorkloadStats:
    wait_until(
        lambda: c.workload_stats().state in ("done", "stopped", "failed"), timeout=20, what="the workload's prefetch"
    )
    return c.workload_stats()


def operators_view(stack: Stack) -> tuple[dict[str, dict[str, object]], str]:
    """The status page's workloads of TARGET by name, and the workloads' /metrics as scraped."""
    report = stack.gateway.run(status_of(stack.gateway.front).report())
    shown = {w["name"]: w for w in report.to_json()["workloads"] if w["target"] == TARGET.id}
    front = stack.gateway.front
    assert front.workloads is not None
    registry = CollectorRegistry()
    registry.register(WorkloadCollector(front.workloads.summaries, stack.gateway.loop))
    return shown, generate_latest(registry).decode()


def slow_stream(monkeypatch: pytest.MonkeyPatch, seconds_a_plan: float) -> None:
    """The stream's thread takes `seconds_a_plan` over each plan (as deserializing takes on a GPU)."""
    original = BackgroundPrefetch._arrived

    def arrived(self: BackgroundPrefetch, index: int, plan: object) -> None:
        time.sleep(seconds_a_plan)
        original(self, index, plan)  # type: ignore[arg-type]

    monkeypatch.setattr(BackgroundPrefetch, "_arrived", arrived)


def test_a_new_process_streams_what_its_workload_used_first_used_first(service: Stack) -> None:
    graphs = specs(5)
    first = run_process(service, graphs)
    assert listed(service) == first  # every one stored, in the order the process first used them

    with client(service) as second:
        opener = second.compile(graphs[0], TARGET)  # the first call: the record is asked for now
        stats = settled(second)
        assert (stats.state, stats.listed, stats.prefetched, stats.failed) == ("done", 5, 5, 0)
        plans = [second.compile(spec, TARGET) for spec in graphs[1:]]
        assert [p.key for p in [opener, *plans]] == first  # each graph its own plan
        after = second.workload_stats()
        assert after.used >= 4  # the graphs after the first took the prefetched plans
        assert plancache.workload_stats().used >= after.used  # the process's view sums its clients


def test_a_process_that_found_nothing_stored_leaves_a_record_of_what_it_asked_for(service: Stack) -> None:
    """plancache.torch's first calls ask for stored plans only: a process that found none (the service building
    each) still records them, so that its workload's next process streams them once stored, rather than asking
    graph by graph (GPU run 56: the process after ones that found nothing stored had no record)."""
    graphs = specs(3, base=512)
    with client(service) as first:
        for spec in graphs:  # the third asked in the background (two misses in a row before it)
            with pytest.raises(plancache.NotStored):
                first.compile(spec, TARGET, stored_only=True)
        asked = [first.query(spec, TARGET).key for spec in graphs]
        # A process goes on after its first step: by its next report the service has queued each build.
        wait_until(
            lambda: all(service.redis.exists(keys.job_state(k), keys.plan(k)) for k in asked), 10, "the builds asked"
        )
    wait_until(lambda: listed(service) == asked, timeout=20, what="the record of the graphs asked for, stored")
    with client(service) as second:
        second.compile(graphs[0], TARGET, stored_only=True)
        stats = settled(second)
        assert (stats.listed, stats.prefetched) == (3, 3)


@pytest.mark.parametrize("setting", ["", "first-use", "stream"])
def test_where_the_streamed_plans_are_deserialized(
    service: Stack, runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    """By default (and with PLANCACHE_WORKLOAD_DESERIALIZE=stream) the streamed plans of a record not settled are
    deserialized off the caller's thread, on a CUDA stream made there, once the process's graphs have taken the
    record in order (LOAD_AFTER_IN_ORDER listed graphs, none passed over: before, the record may be another
    program's, or interleave another program's first uses with this one's, and nothing is deserialized), those
    past the last graph asked; with first-use, nothing until a graph runs its plan (on the caller's thread)."""
    graphs = specs(6)
    first = run_process(service, graphs)
    monkeypatch.setenv(workload_module.DESERIALIZE_ENV, setting)
    with client(service, local_builder=StandInLocalBuilder()) as second:
        second.compile(graphs[0], TARGET)  # begins the stream, asks the service itself
        assert settled(second).prefetched == 6
        assert runtime.graphs == [] and runtime.own_streams == [], "nothing deserialized before a graph is listed"
        assert second.compile(graphs[1], TARGET).key == first[1]  # listed, the record's next: in order, once
        assert runtime.graphs == [], "one listed graph in order is not yet evidence enough"
        assert second.compile(graphs[2], TARGET).key == first[2]  # twice: the record is this program's
        if setting in ("", "stream"):
            wait_until(lambda: len(runtime.graphs) == 3, timeout=10, what="the plans past it, deserialized")
            streamed = {second.workload._pending.ready(i).blob for i in (3, 4, 5)}  # type: ignore[union-attr]
            assert {g.blob for g in runtime.graphs} == streamed and runtime.own_streams == [0]
            assert all(g.loaded_with is not execution.handle_state(0).handle for g in runtime.graphs)
        else:
            assert runtime.graphs == [] and runtime.own_streams == []
        assert [second.compile(s, TARGET).key for s in graphs] == first


def test_a_stream_the_drop_in_began_leaves_deserializing_to_the_programs_graphs(
    service: Stack, runtime: FakeRuntime
) -> None:
    """plancache.cudnn's graphs deserialize each plan on the program's own handle at their build step, so a
    stream its first graph began (race(), the drop-in's call) deserializes nothing: it would be done twice."""
    graphs = specs(3)
    first = run_process(service, graphs)
    with client(service, local_builder=StandInLocalBuilder()) as second:
        raced = second.race(graphs[0], TARGET, None, lambda: "own build", path="cudnn")
        assert raced.plan is not None and raced.plan.key == first[0]
        assert settled(second).prefetched == 3
        assert runtime.graphs == [] and runtime.own_streams == []
        assert [second.race(s, TARGET, None, lambda: "own build", path="cudnn").plan.key for s in graphs] == first
        assert runtime.graphs == []


def test_a_record_its_processes_said_served_them_is_deserialized_before_any_graph_asks(
    service: Stack, runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process says at its end whether its stream served it; a record whose last verdicts all say so is
    settled: a new process deserializes its plans as they arrive, before a graph asks (a decode step's plans
    ready when the step begins, as the program builds its model). One process of another program under the
    name says it did not (a quarter or more of the record unused): the next process holds them again, until
    one of its graphs is found listed."""
    graphs = specs(4)
    first = run_process(service, graphs)  # makes the record: streamed nothing, says nothing
    with client(service, local_builder=StandInLocalBuilder()) as second:
        assert [second.compile(s, TARGET).key for s in graphs] == first
        assert not settled(second).settled  # no verdict yet: held
    before = len(runtime.graphs)
    with client(service, local_builder=StandInLocalBuilder()) as third:
        third.workload.begin(TARGET)  # the program touched plancache (configure()): nothing asked yet
        stats = settled(third)
        assert stats.settled and stats.prefetched == 4
        wait_until(lambda: len(runtime.graphs) == before + 4, timeout=10, what="the settled record's plans, loaded")
        new_graphs = runtime.graphs[before:]
        assert all(g.loaded_with is not execution.handle_state(0).handle for g in new_graphs)  # on the stream's own
        assert [third.compile(s, TARGET).key for s in graphs] == first
        assert third.workload_stats().used == 4
    monkeypatch.setenv(workload_module.DESERIALIZE_ENV, "listed")  # a settled record not trusted: as unsettled
    with client(service, local_builder=StandInLocalBuilder()) as wary:
        wary.workload.begin(TARGET)
        assert settled(wary).settled and len(runtime.graphs) == before + 4  # nothing loaded ahead
        assert [wary.compile(s, TARGET).key for s in graphs] == first
    monkeypatch.delenv(workload_module.DESERIALIZE_ENV)
    # Another program under the name: its graphs are none of the record's (its verdict: mixed).
    others = specs(2, base=1024)
    with client(service, local_builder=StandInLocalBuilder()) as colliding:
        colliding.workload.begin(TARGET)
        assert settled(colliding).settled
        assert [colliding.compile(s, TARGET).key for s in others] == [PlanQuery.of(s, TARGET).key for s in others]
    loaded = len(runtime.graphs)
    with client(service, local_builder=StandInLocalBuilder()) as after:
        after.workload.begin(TARGET)
        stats = settled(after)
        assert not stats.settled and stats.prefetched > 0
        assert len(runtime.graphs) == loaded, "held: nothing deserialized before a graph is found listed"
        assert {after.compile(s, TARGET).key for s in graphs} <= set(listed(service))
    shown, scraped = operators_view(service)
    # Served: the second, third and wary ones; mixed: the colliding one and the last (the record lists the other
    # program's two plans beside its four: a third of it unused).
    assert (shown["job"]["served"], shown["job"]["mixed"]) == (3, 2)
    for verdict, count in (("served", 3), ("mixed", 2)):
        labels = f'target="{TARGET.id}",verdict="{verdict}",workload="job"'
        assert f"plancache_workload_stream_verdicts_total{{{labels}}} {count}.0" in scraped


def test_an_unknown_deserialize_setting_is_refused_naming_it(service: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(workload_module.DESERIALIZE_ENV, "background")
    with pytest.raises(InvalidRequest, match="PLANCACHE_WORKLOAD_DESERIALIZE='background': expected one of"):
        client(service)


def complete(stack: Stack, name: str = "job") -> bool:
    with stack.client() as c:
        request = pb.GetWorkloadRequest(name=name, target_id=TARGET.id)
        return c.connection.stub.GetWorkload(request, timeout=10).complete


def test_the_record_is_bounded_and_least_recently_used_out(service: Stack) -> None:
    graphs = specs(9)
    run_process(service, graphs[:6])
    assert complete(service)  # every plan the workload used is listed: a graph not listed will miss
    run_process(service, graphs[6:])  # three new ones: the record holds 6 (--workload-plans), three oldest out
    record = listed(service)
    assert len(record) == 6
    assert not complete(service)  # it let plans go: what it does not list may be stored
    with client(service) as later:  # and a process takes it so: the record says nothing of unlisted graphs
        later.compile(graphs[0], TARGET)
        settled(later)
        assert later.workload.lists(PlanQuery.of(graphs[0], TARGET).key) is None
    newest = {PlanQuery.of(s, TARGET).key for s in graphs[6:]}
    assert newest <= set(record)
    assert not {PlanQuery.of(s, TARGET).key for s in graphs[:3]} & set(record)


def test_workloads_are_apart_and_a_collision_costs_fetches_never_a_wrong_plan(
    service: Stack, runtime: FakeRuntime
) -> None:
    a_keys = run_process(service, specs(3), name="trainer")
    b_keys = run_process(service, specs(2, base=512), name="server")
    assert listed(service, "trainer") == a_keys and listed(service, "server") == b_keys

    # A process of another program under the same name (a collision) streams trainer's plans too: wasted.
    others = specs(2, base=1024)
    with client(service, "trainer", local_builder=StandInLocalBuilder()) as colliding:  # a node that runs plans
        got = [colliding.compile(s, TARGET) for s in others]
        stats = settled(colliding)
        assert [p.key for p in got] == [PlanQuery.of(s, TARGET).key for s in others]
        assert stats.prefetched == 3 and stats.used == 0 and stats.wasted == 3
        # Fetched, never deserialized: no graph of this program is listed (GPU run 37: a collided decode step's
        # start deserialized the other program's 13 plans, 1.46x torch's step).
        assert runtime.graphs == [] and runtime.own_streams == []


def test_a_stream_that_brings_none_of_the_graphs_asked_stops_there(
    service: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collision's cost is bounded by what streamed before the program's first COLLISION_ASKS graphs: the
    stream brought none of them (another program's record), so it stops; every graph still gets its own plan."""
    monkeypatch.setattr(workload_module, "COLLISION_ASKS", 3)
    trainer = run_process(service, specs(6), name="trainer")
    solo = run_process(service, specs(6), name="solo")
    slow_stream(monkeypatch, 0.3)
    others = specs(4, base=1024)
    with client(service, "trainer") as colliding:
        started = time.monotonic()
        got = [colliding.compile(s, TARGET).key for s in others]
        stats = settled(colliding)
        assert got == [PlanQuery.of(s, TARGET).key for s in others] and not set(got) & set(trainer)
        assert stats.state == "stopped" and "another program's" in stats.error
        assert stats.used == 0 and stats.stopped >= 3, stats
        assert stats.prefetched + stats.stopped + stats.failed == 6
        assert time.monotonic() - started < 6 * 0.3, "stopped before streaming the whole record"
    with client(service, "solo") as same_program:  # a program its record is of, as slow a stream: never stopped
        same_program.compile(specs(6)[0], TARGET)
        assert [same_program.compile(s, TARGET).key for s in specs(6)[1:]] == solo[1:]
        stats = settled(same_program)
        assert stats.state == "done" and stats.used >= 4 and stats.stopped == 0
    # Operators see which workload's processes stopped their streams (the colliding one's report said so).
    shown, scraped = operators_view(service)
    assert (shown["trainer"]["stopped"], shown["solo"]["stopped"]) == (1, 0)
    assert f'plancache_workload_streams_stopped_total{{target="{TARGET.id}",workload="trainer"}} 1.0' in scraped


def test_a_graph_listed_far_back_in_a_slow_stream_asks_the_service_instead_of_waiting(
    service: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every wait has a bound: a listed graph whose plan is 5 plans back in a stream that takes 0.4 s a plan
    asks the service (a hit) instead of waiting ~2 s; the stream then skips it; a graph near the stream's head
    waits for it and takes the streamed plan."""
    graphs = specs(6)
    first = run_process(service, graphs)
    slow_stream(monkeypatch, 0.4)
    with client(service) as later:
        later.compile(graphs[0], TARGET)  # begins the stream
        started = time.monotonic()
        far = later.compile(graphs[5], TARGET)
        assert time.monotonic() - started < 1.0, "asked the service, not waited for 5 plans"
        assert far.key == first[5] and later.workload_stats().asked_ahead == 1
        near = later.compile(graphs[1], TARGET)  # the stream's next plan: waited for
        assert near.key == first[1]
        stats = settled(later)
        assert stats.state == "done" and stats.used >= 1
        assert stats.prefetched == 5, "the plan asked of the service is not kept from the stream too"


def test_a_record_mixing_another_programs_plans_stops_deserializing_them(
    redis_server: EmbeddedRedis, redis_client: object, runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two programs under one name: the record interleaves their first uses. A process of one of them, its asks
    passing over listed plans, never deserializes ahead (LOAD_AFTER_IN_ORDER: only a record its graphs take in
    order); and one that did start (its first asks in order), once its asks have passed over as many listed
    plans as the stream served it (PASSED_OVER), stops: the other programs' plans then cost a fetch, not a load;
    every graph still gets its plan."""
    stack, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.0), workload_plans=64)
    try:
        monkeypatch.setattr(workload_module, "PASSED_OVER", 4)
        # The collision stop is another rule (tested above): a stream slowed by a loaded machine (CI, the suite at
        # -n 4 on two cores, once) must not be stopped before the switch this test is about.
        monkeypatch.setattr(workload_module, "COLLISION_ASKS", 10**6)
        program_a, program_b = specs(12), specs(12, base=4096)
        run_process(stack, program_a, name="shared")
        b_keys = run_process(stack, program_b, name="shared")
        record = listed(stack, "shared")
        assert len(record) == 24 and record.index(b_keys[0]) < record.index(b_keys[-1])
        slow_stream(monkeypatch, 0.05)
        with client(stack, "shared", local_builder=StandInLocalBuilder()) as process_b:
            process_b.compile(program_b[0], TARGET)  # begins the stream
            got = []
            for spec in program_b[1:]:
                time.sleep(0.2)  # the program's own work: the stream (0.05 s a plan) keeps ahead of its asks
                got.append(process_b.compile(spec, TARGET).key)
            assert got == b_keys[1:]
            pending = process_b.workload._pending
            assert pending is not None and not pending.loading, "never deserialized ahead"
            stats = settled(process_b)
            assert stats.state == "done" and stats.used >= 4
            assert runtime.graphs == [], "the other program's plans cost a fetch each, never a load"

        # Three programs sharing their first graphs (the same stem, say) under one name: a process of the third
        # takes the shared start in order (deserializing ahead begins), then passes over two plans for each of its
        # own: past PASSED_OVER and as many as the stream served it, the deserializing stops.
        shared_start = specs(3, base=8192)
        thirds = [shared_start + specs(10, base=base) for base in (12288, 16384, 20480)]
        keys_of = [run_process(stack, program, name="trio") for program in thirds]
        original_load = BackgroundPrefetch._load_plan

        def slow_load(self: BackgroundPrefetch, plan: object) -> None:
            time.sleep(0.05)  # as a deserialization takes on a GPU
            original_load(self, plan)  # type: ignore[arg-type]

        monkeypatch.setattr(BackgroundPrefetch, "_load_plan", slow_load)
        with client(stack, "trio", local_builder=StandInLocalBuilder()) as process_c:
            process_c.compile(thirds[2][0], TARGET)  # begins the stream
            settled(process_c)
            got = [process_c.compile(spec, TARGET).key for spec in thirds[2][1:]]
            assert got == keys_of[2][1:]
            pending = process_c.workload._pending
            assert pending is not None and not pending.loading, "deserializing stopped"
            time.sleep(0.5)  # unstopped, the loader would have deserialized ~10 more of the 30 meanwhile
            assert 0 < len(runtime.graphs) <= 6, f"{len(runtime.graphs)} deserialized ahead"
    finally:
        stop()


def test_a_record_slow_to_read_costs_one_calls_wait_not_every_calls(
    service: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record takes 3 s to read (a service under load): the second graph waits for it LIST_WAIT_S in vain,
    and the graphs after it do not wait at all (they ask the service as they would without a record)."""
    graphs = specs(5)
    first = run_process(service, graphs)
    monkeypatch.setattr(workload_module, "LIST_WAIT_S", 0.4)
    original = workload_module.WorkloadStart._list_and_stream

    def slow_record(self: workload_module.WorkloadStart, target: object) -> None:
        time.sleep(3.0)
        original(self, target)  # type: ignore[arg-type]

    monkeypatch.setattr(workload_module.WorkloadStart, "_list_and_stream", slow_record)
    with client(service) as later:
        later.compile(graphs[0], TARGET)  # begins the (slow) read; does not wait for it
        started = time.monotonic()
        keys = [later.compile(spec, TARGET).key for spec in graphs[1:]]
        assert time.monotonic() - started < 0.4 + 1.0, "one wait of LIST_WAIT_S, not four"
        assert keys == first[1:]


def test_a_forged_record_never_serves_another_graphs_plan(service: Stack) -> None:
    stored_keys = run_process(service, specs(2), name="warmup")
    # Anyone who can write to Redis lists another graph's stored plan (and junk) in workload "victim".
    wanted = matmul_spec(m=999, name="mine")
    recency, order = keys.workload_recency(TARGET.id, "victim"), keys.workload_order(TARGET.id, "victim")
    service.redis.zadd(recency, {stored_keys[0]: time.time(), "not a key": time.time()})
    service.redis.hset(order, mapping={stored_keys[0]: "0", "not a key": "zero"})
    with client(service, "victim") as victim:
        victim.compile(specs(1, base=2048)[0], TARGET)  # first call: the forged record is read
        settled(victim)
        plan = victim.compile(wanted, TARGET)
        assert plan.key == PlanQuery.of(wanted, TARGET).key
        assert plan.metadata.key == plan.key
        stats = victim.workload_stats()
        assert stats.listed == 1 and stats.used == 0  # the junk entry never listed; the other graph's plan unused


def test_reports_cannot_invent_entries(service: Stack) -> None:
    stored = run_process(service, specs(1), name="real")[0]
    foreign = stored.replace(TARGET.id, "sm_90/cudnn-9.0.0/fe-1.0.0/dev-other", 1)
    unknown = PlanQuery.of(matmul_spec(m=4000), TARGET).key  # a well-formed key of a plan nobody built
    with service.client() as c:
        stub = c.connection.stub

        def report(name: str, plan_keys: list[str], target_id: str = TARGET.id) -> int:
            uses = [pb.WorkloadUse(plan_key=k, order=i) for i, k in enumerate(plan_keys)]
            request = pb.ReportFirstUsesRequest(workload=pb.WorkloadUses(name=name, target_id=target_id, uses=uses))
            return stub.ReportFirstUses(request, timeout=10).workload_recorded

        assert report("hostile", [stored, foreign, unknown, "garbage"]) == 1  # only the stored plan of its target
        assert listed(service, "hostile") == [stored]
        assert report("bad name; DROP", [stored]) == 0
        assert report("x" * 129, [stored]) == 0
        with pytest.raises(grpc.RpcError) as refused:
            report("big", [stored] * 513)
        assert isinstance(typed(refused.value), ResourceExhausted)
        with pytest.raises(grpc.RpcError) as invalid:
            stub.GetWorkload(pb.GetWorkloadRequest(name="no spaces allowed", target_id=TARGET.id), timeout=10)
        assert isinstance(typed(invalid.value), InvalidRequest)


def test_a_record_settles_on_its_last_four_verdicts_all_served(service: Stack) -> None:
    """Verdicts are kept per record, newest first, the last 4: one mixed verdict unsettles it until four served
    ones follow; a verdict the client does not know (a newer enum value) is no verdict; a record without one is
    not settled."""
    run_process(service, specs(2))
    with service.client() as c:
        stub = c.connection.stub

        def say(verdict: int) -> None:
            uses = pb.WorkloadUses(name="job", target_id=TARGET.id, verdict=verdict)  # type: ignore[arg-type]
            stub.ReportFirstUses(pb.ReportFirstUsesRequest(workload=uses), timeout=10)

        def is_settled() -> bool:
            return stub.GetWorkload(pb.GetWorkloadRequest(name="job", target_id=TARGET.id), timeout=10).settled

        assert not is_settled()
        say(pb.STREAM_VERDICT_SERVED)
        assert is_settled()
        say(pb.STREAM_VERDICT_MIXED)
        for _ in range(3):
            say(pb.STREAM_VERDICT_SERVED)
            assert not is_settled(), "the mixed verdict is among the last four"
        say(99)  # unknown: recorded as nothing
        assert not is_settled()
        say(pb.STREAM_VERDICT_SERVED)
        assert is_settled()


def test_a_process_prefetches_within_its_own_bound(service: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs = specs(5)
    run_process(service, graphs)
    monkeypatch.setenv(workload_module.PLANS_ENV, "2")
    with client(service) as bounded:
        bounded.compile(graphs[0], TARGET)
        stats = settled(bounded)
        assert stats.listed == 2 and stats.prefetched == 2
        assert [bounded.compile(s, TARGET).key for s in graphs] == [PlanQuery.of(s, TARGET).key for s in graphs]


def test_a_prefetch_that_fails_loses_nothing_but_time(service: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs = specs(3)
    first = run_process(service, graphs)

    def broken(self: Client, manifest: object, target: object, load: bool, held: bool) -> object:
        raise PlanCacheError("the stream broke")

    monkeypatch.setattr(Client, "_workload_prefetch", broken)
    with client(service) as unlucky:
        unlucky.compile(graphs[0], TARGET)
        stats = settled(unlucky)
        assert stats.state == "failed" and "the stream broke" in stats.error
        assert [unlucky.compile(s, TARGET).key for s in graphs] == first  # each asked the service as before


def test_a_server_without_records_costs_nothing(redis_server: EmbeddedRedis, redis_client: object) -> None:
    stack, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.0), workload_plans=0)
    try:
        graphs = specs(2)
        first = run_process(stack, graphs)
        assert listed(stack) == []
        with client(stack) as c:
            assert [c.compile(s, TARGET).key for s in graphs] == first
            assert settled(c).listed == 0
    finally:
        stop()


def test_operators_see_each_workload(service: Stack) -> None:
    graphs = specs(3)
    run_process(service, graphs)
    with client(service) as second:
        for spec in graphs:
            second.compile(spec, TARGET)
        settled(second)
    report = service.gateway.run(status_of(service.gateway.front).report())
    workloads = {(w["target"], w["name"]): w for w in report.to_json()["workloads"]}
    job = workloads[(TARGET.id, "job")]
    # processes: those that found a record (the first found none; a read never makes a record)
    assert job["plans"] == 3 and job["processes"] == 1 and job["prefetched"] == 3
    assert job["used"] >= 2 and job["wasted"] <= 1
    page = render(report)
    assert 'data-workload="job"' in page
    front = service.gateway.front
    assert front.workloads is not None
    registry = CollectorRegistry()
    registry.register(WorkloadCollector(front.workloads.summaries, service.gateway.loop))
    scraped = generate_latest(registry).decode()
    labels = f'target="{TARGET.id}",workload="job"'
    assert f"plancache_workload_plans{{{labels}}} 3.0" in scraped
    assert f'plancache_workload_prefetch_plans_total{{outcome="prefetched",{labels}}} 3.0' in scraped
    assert f"plancache_workload_processes_total{{{labels}}} 1.0" in scraped

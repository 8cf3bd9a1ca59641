"""A worker's lanes (plancache_server.worker.lanes): the order a free build
process takes pieces in, what a stopping worker hands back, a promoted warm
build's pieces moving to the callers' lanes; and a build process's view of
a task's query (plancache_server.worker.build_tasks): parsed once per bytes,
not normalized again."""

from __future__ import annotations

import pytest

from plancache.keys.query import PlanQuery
from plancache_server.store.jobs import Job
from plancache_server.worker.build_tasks import CANDIDATE, HEURISTIC, BuildTask, task_plan_query, task_query
from plancache_server.worker.held_builds import Build
from plancache_server.worker.lanes import TUNING_WAIT_CAP_S, YIELD_WAIT_CAP_S, Lane, Lanes, TuningGate, YieldGate
from plancache_server.worker.verified_job import VerifiedJob
from plancache_server.worker.warm_runner import WarmRef
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET

_task_ids = iter(range(1, 1000))


def _build(m: int, warm: bool = False, yields: bool = False) -> Build:
    query = PlanQuery.of(matmul_spec(m=m), TARGET)
    job = Job(job_id=f"job-{m}", plan_key=query.key, query=query.proto, yields=yields)
    return Build(None, job, VerifiedJob(query), warm=WarmRef(TARGET.id, m) if warm else None)


def _push(lanes: Lanes, lane: Lane, build: Build, kind: str, index: int) -> None:
    lanes.push(lane, build, BuildTask(next(_task_ids), kind, build.query, index))


def _drain(lanes: Lanes) -> list[tuple[Lane, str, int]]:
    order = []
    while lanes:
        piece = lanes.pop()
        order.append((piece.lane, piece.build.job.job_id, piece.index))
    return order


def test_pieces_go_by_lane_then_by_the_builds_acceptance_then_by_candidate() -> None:
    older, newer, warming = _build(16), _build(32), _build(48, warm=True)
    lanes = Lanes()
    _push(lanes, Lane.CANDIDATE, newer, CANDIDATE, 1)
    _push(lanes, Lane.WARM_CANDIDATE, warming, CANDIDATE, 1)
    _push(lanes, Lane.CANDIDATE, older, CANDIDATE, 2)
    _push(lanes, Lane.CANDIDATE, older, CANDIDATE, 1)
    _push(lanes, Lane.WARM_HEURISTIC, warming, HEURISTIC, 0)
    _push(lanes, Lane.HEURISTIC, newer, HEURISTIC, 0)
    assert lanes.next_lane() == Lane.HEURISTIC and lanes.count(Lane.CANDIDATE) == 3
    assert _drain(lanes) == [
        (Lane.HEURISTIC, "job-32", 0),
        (Lane.WARM_HEURISTIC, "job-48", 0),
        (Lane.CANDIDATE, "job-16", 1),
        (Lane.CANDIDATE, "job-16", 2),
        (Lane.CANDIDATE, "job-32", 1),
        (Lane.WARM_CANDIDATE, "job-48", 1),
    ]
    assert lanes.next_lane() is None


def test_a_stopping_worker_takes_back_the_builds_whose_first_piece_waits() -> None:
    tuning, waiting, warm = _build(16), _build(32), _build(48, warm=True)
    lanes = Lanes()
    _push(lanes, Lane.CANDIDATE, tuning, CANDIDATE, 1)
    _push(lanes, Lane.HEURISTIC, waiting, HEURISTIC, 0)
    _push(lanes, Lane.WARM_HEURISTIC, warm, HEURISTIC, 0)
    assert lanes.take_unstarted() == [waiting, warm]
    assert _drain(lanes) == [(Lane.CANDIDATE, "job-16", 1)]


def test_a_promoted_warm_build_moves_to_the_callers_lanes() -> None:
    other, warm = _build(16), _build(48, warm=True)  # the warm build accepted after the other
    lanes = Lanes()
    _push(lanes, Lane.WARM_CANDIDATE, warm, CANDIDATE, 1)
    _push(lanes, Lane.WARM_HEURISTIC, warm, HEURISTIC, 0)
    _push(lanes, Lane.CANDIDATE, other, CANDIDATE, 1)
    warm.promoted.append(object())  # type: ignore[arg-type]  # a caller's delivery
    lanes.relane(warm)
    assert _drain(lanes) == [
        (Lane.HEURISTIC, "job-48", 0),
        (Lane.CANDIDATE, "job-16", 1),
        (Lane.CANDIDATE, "job-48", 1),
    ]


def test_a_build_for_callers_building_it_themselves_yields_until_one_that_waits_joins() -> None:
    hedged, waited = _build(16, yields=True), _build(32)
    assert hedged.yielding and hedged.lanes == (Lane.YIELDING, Lane.CANDIDATE)
    assert not waited.yielding and waited.lanes == (Lane.HEURISTIC, Lane.CANDIDATE)
    assert not _build(48, warm=True, yields=True).yielding  # a warm build's lanes are warming's
    lanes = Lanes()
    _push(lanes, Lane.YIELDING, hedged, HEURISTIC, 0)
    _push(lanes, Lane.WARM_HEURISTIC, _build(64, warm=True), HEURISTIC, 0)
    _push(lanes, Lane.HEURISTIC, waited, HEURISTIC, 0)
    assert [p[:2] for p in _drain(lanes)] == [
        (Lane.HEURISTIC, "job-32"),
        (Lane.YIELDING, "job-16"),  # before warming: a node asked for it
        (Lane.WARM_HEURISTIC, "job-64"),
    ]
    _push(lanes, Lane.YIELDING, hedged, HEURISTIC, 0)
    _push(lanes, Lane.HEURISTIC, waited, HEURISTIC, 0)
    hedged.promoted.append(object())  # type: ignore[arg-type]  # a caller that waits for it (Flight.hurry)
    assert not hedged.yielding
    lanes.relane(hedged)
    assert [p[:2] for p in _drain(lanes)] == [(Lane.HEURISTIC, "job-16"), (Lane.HEURISTIC, "job-32")]
    # A stopping worker hands a yielding build back unstarted, as any other first piece.
    _push(lanes, Lane.YIELDING, _build(80, yields=True), HEURISTIC, 0)
    assert [b.job.job_id for b in lanes.take_unstarted()] == ["job-80"]


def test_warmings_first_plan_is_taken_past_yielding_builds_held_back() -> None:
    """While hedged callers build their own graphs, the worker takes warming's first plan (a family the program
    sweeps) past their held builds, leaving the rest in order."""
    lanes = Lanes()
    hedged, warm, tuning = _build(16, yields=True), _build(48, warm=True), _build(64)
    _push(lanes, Lane.CANDIDATE, tuning, CANDIDATE, 1)
    _push(lanes, Lane.WARM_HEURISTIC, warm, HEURISTIC, 0)
    _push(lanes, Lane.YIELDING, hedged, HEURISTIC, 0)
    assert lanes.next_lane() == Lane.YIELDING
    piece = lanes.pop_first_of(Lane.WARM_HEURISTIC)
    assert (piece.lane, piece.build) == (Lane.WARM_HEURISTIC, warm)
    assert [p[:2] for p in _drain(lanes)] == [(Lane.YIELDING, "job-16"), (Lane.CANDIDATE, "job-64")]


def test_a_job_says_whether_it_yields_on_the_wire() -> None:
    query = PlanQuery.of(matmul_spec(m=16), TARGET)
    for yields in (True, False):
        job = Job(job_id="j", plan_key=query.key, query=query.proto, waited=True, yields=yields)
        assert Job.decode({k.encode(): v for k, v in job.encode().items()}).yields is yields
    # A job of an earlier gateway (no field) is built at once.
    fields = {k.encode(): v for k, v in Job(job_id="j", plan_key=query.key, query=query.proto).encode().items()}
    del fields[b"yields"]
    assert Job.decode(fields).yields is False


def test_a_task_query_is_the_workers_query_parsed_once_per_bytes() -> None:
    query = PlanQuery.of(matmul_spec(m=80, name="task-query"), TARGET)
    data = task_query(query)
    parsed = task_plan_query(data)
    assert task_plan_query(bytes(bytearray(data))) is parsed  # equal bytes: the same query, not parsed again
    assert parsed.key == query.key and parsed.spec_hash == query.spec_hash
    assert parsed.target == query.target and parsed.options.id == query.options.id


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_autotuning_waits_for_callers_misses_to_pause_within_a_cap() -> None:
    clock = _Clock()
    gate = TuningGate(1.0, clock)
    assert not gate.holds(Lane.CANDIDATE)  # no caller yet: tuning goes
    gate.urgent_started()  # a caller's heuristic plan
    assert not gate.holds(Lane.HEURISTIC) and not gate.holds(Lane.WARM_HEURISTIC)  # first plans never wait
    assert gate.holds(Lane.CANDIDATE) and gate.holds(Lane.WARM_CANDIDATE) and gate.waiting
    clock.now += 0.6
    gate.urgent_started()  # the node's next graph, 0.6 s later: the pause counts from it
    clock.now += 0.6
    assert gate.holds(Lane.CANDIDATE)
    assert gate.remaining_s() == pytest.approx(0.4)  # the worker waits for jobs this long, no longer
    clock.now += 0.5  # 1.1 s without a caller's plan: the pause came
    assert not gate.holds(Lane.CANDIDATE) and not gate.waiting
    # A steady stream of misses holds tuning back at most TUNING_WAIT_CAP_S.
    start = clock.now
    while clock.now - start < TUNING_WAIT_CAP_S - 0.5:
        gate.urgent_started()
        assert gate.holds(Lane.CANDIDATE)
        clock.now += 0.5
    gate.urgent_started()
    clock.now += 0.5
    assert not gate.holds(Lane.CANDIDATE)
    gate.released()  # a candidate started: the next one held back counts from now
    assert gate.holds(Lane.CANDIDATE)


def test_no_wait_when_off() -> None:
    gate = TuningGate(0.0)
    gate.urgent_started()
    assert not gate.holds(Lane.CANDIDATE) and not gate.waiting


def test_builds_wait_while_callers_build_their_own_within_a_cap() -> None:
    clock = _Clock()
    gate = YieldGate(1.0, clock)
    taken = clock.now
    assert not gate.holds(Lane.YIELDING, taken) and not gate.holds(Lane.CANDIDATE, taken)  # nobody hedged yet
    gate.asked()  # a hedged miss's job: its node builds the graph itself now
    assert not gate.holds(Lane.HEURISTIC, taken)  # a plan someone waits for never waits
    for lane in (Lane.YIELDING, Lane.CANDIDATE, Lane.WARM_CANDIDATE):
        assert gate.holds(lane, taken) and gate.waiting  # their builds and every autotuning wait
    assert not gate.holds(Lane.WARM_HEURISTIC, taken)  # a family the program sweeps goes on (issue 43)
    clock.now += 0.6
    gate.asked()  # the node's next graph: the quiet counts from it
    clock.now += 0.6
    assert gate.holds(Lane.YIELDING, taken)
    assert gate.remaining_s() == pytest.approx(0.4)  # the worker waits for jobs this long, no longer
    clock.now += 0.5  # 1.1 s without a hedged miss: the node is done
    assert not gate.holds(Lane.YIELDING, taken) and not gate.waiting and gate.remaining_s() == 0
    # A steady stream of hedged misses holds each build back at most YIELD_WAIT_CAP_S after it was taken.
    taken = clock.now
    while clock.now - taken < YIELD_WAIT_CAP_S - 0.25:
        gate.asked()
        assert gate.holds(Lane.YIELDING, taken)
        clock.now += 0.25
    gate.asked()
    clock.now += 0.3
    assert not gate.holds(Lane.YIELDING, taken)
    assert gate.holds(Lane.YIELDING, clock.now)  # a build taken just now still waits


def test_a_first_node_with_an_empty_jit_cache_is_not_built_beside_while_it_asks() -> None:
    # GPU run 46: such a node built its 13 graphs in 4-6 s, asking for the next every 0.3-1 s; with a 3 s hold the
    # service built and tuned beside it once 3 s had passed (1.09-1.31x its local start).
    clock = _Clock()
    gate = YieldGate(1.0, clock)  # the default hold (--hedged-hold-max)
    taken = clock.now
    while clock.now - taken < 10.0:
        gate.asked()
        assert gate.holds(Lane.YIELDING, taken) and gate.holds(Lane.CANDIDATE, taken)
        clock.now += 0.9
    clock.now += 1.1  # the node is done
    assert not gate.holds(Lane.YIELDING, taken)


def test_a_hold_set_shorter_ends_there_however_long_callers_ask() -> None:
    clock = _Clock()
    gate = YieldGate(1.0, clock, cap_s=2.0)
    taken = clock.now
    while clock.now - taken < 1.9:
        gate.asked()
        assert gate.holds(Lane.YIELDING, taken)
        clock.now += 0.5
    gate.asked()
    assert not gate.holds(Lane.YIELDING, taken)


def test_the_hold_setting_is_bounded() -> None:
    from plancache_server.settings import server_settings

    assert server_settings([]).hedged_hold_max_s == YIELD_WAIT_CAP_S == 30.0
    assert server_settings(["--hedged-hold-max", "5"]).hedged_hold_max_s == 5.0
    for bad in ("-1", "61"):
        with pytest.raises(SystemExit, match="--hedged-hold-max must be 0 to 60 seconds"):
            server_settings(["--hedged-hold-max", bad])


def test_no_yielding_when_off() -> None:
    gate = YieldGate(0.0)
    gate.asked()
    assert not gate.holds(Lane.YIELDING, 0.0) and not gate.waiting


@pytest.mark.parametrize(
    ("setting", "pool_size", "expected"),
    [(-1, 8, 3), (-1, 2, 0), (-1, 1, 0), (-1, 5, 2), (0, 8, 0), (5, 8, 5), (20, 8, 7), (3, 1, 0)],
)
def test_warming_builds_beside_callers_only_on_processes_past_the_first(
    setting: int, pool_size: int, expected: int
) -> None:
    from plancache_server.worker.worker import beside_callers

    assert beside_callers(setting, pool_size) == expected

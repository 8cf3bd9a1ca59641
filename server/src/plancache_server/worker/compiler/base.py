"""What a compiler returns, and the protocol every compiler implements.

A build is cut into pieces that can run apart, so that a worker can build
side by side in a pool of processes and never make a miss wait behind an
autotuning (plancache_server.worker.build_pool, plancache_server.worker.worker):

- `heuristic`: cuDNN's heuristic choice, the first candidate that builds,
  serialized (what a node building locally would run), and how many
  candidates the graph has;
- `candidate(index)`: one more candidate built and serialized (the frontend
  serializes the plan built last, so a process can build one candidate and
  hand it over as a blob);
- `time_plans`: every built candidate deserialized and timed on the GPU,
  in one place, one at a time (timings stay honest).

Every piece takes the build's PlanQuery (plancache.keys.query): its spec
normalized once where the query was made (the worker's check of its job),
its key made once, so that the pieces of one build in one process neither
normalize nor hash the spec again.

`compile_inline` runs the pieces one after another in one process (tools,
benchmarks).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target

# uid -> (dims, strides) of bound tensors whose geometry the spec leaves to cuDNN (read from the built graph).
Geometry = dict[int, tuple[list[int], list[int]]]


@dataclass(frozen=True)
class CandidateResult:
    index: int
    plan_name: str
    engine_id: int
    median_ms: float | None  # None: did not build or run
    error: str = ""
    timing: str = ""
    # What the frontend says of the candidate (plancache.cudnn answers plan-list queries from these).
    knobs: dict[str, int] = field(default_factory=dict)
    behavior_notes: tuple[str, ...] = ()
    workspace_size: int | None = None  # known once built


@dataclass(frozen=True)
class BuiltPlan:
    """One candidate, built and serialized (or why it did not build: `error`, no blob)."""

    index: int
    blob: bytes
    plan_name: str
    engine_id: int
    knobs: dict[str, int]
    workspace_size: int
    is_python_engine: bool
    seconds: float = 0.0  # its build
    error: str = ""
    behavior_notes: tuple[str, ...] = ()
    geometry: Geometry = field(default_factory=dict)

    @property
    def built(self) -> bool:
        return not self.error

    def untimed(self) -> CandidateResult:
        return CandidateResult(
            self.index,
            self.plan_name,
            self.engine_id,
            None,
            self.error,
            knobs=dict(self.knobs),
            behavior_notes=self.behavior_notes,
            workspace_size=self.workspace_size if self.built else None,
        )


@dataclass(frozen=True)
class Heuristic:
    """cuDNN's heuristic choice, built; the graph has `count` candidates."""

    chosen: BuiltPlan
    count: int
    seconds: float  # graph, heuristics and the chosen plan's build
    # Candidates tried before it that did not build, and what else the
    # compiler knows of the candidates without timing them (a compiler
    # that does not autotune may give its timings here).
    candidates: list[CandidateResult] = field(default_factory=list)
    # Every entry of the plan list as the frontend describes it (name, engine, knobs, notes).
    listing: list[CandidateResult] = field(default_factory=list)
    # Why its candidates must not be timed on random inputs (then the heuristic plan is final).
    untimed_reason: str = ""


@dataclass(frozen=True)
class CompiledPlan:
    blob: bytes
    workspace_size: int
    engine_id: int
    knobs: dict[str, int]
    plan_name: str
    is_python_engine: bool
    candidates: list[CandidateResult] = field(default_factory=list)
    build_seconds: float = 0.0
    autotune_seconds: float = 0.0
    # A heuristic plan stored at once while the autotuned one is built.
    provisional: bool = False
    geometry: Geometry = field(default_factory=dict)


class Compiler(Protocol):
    """Builds plans for one GPU. Raises CompileFailed when cuDNN rejects a graph."""

    @property
    def target(self) -> Target: ...

    def heuristic(self, query: PlanQuery) -> Heuristic:
        """The heuristic plan and the number of candidates (CompileFailed when none builds)."""
        ...

    def candidate(self, query: PlanQuery, index: int) -> BuiltPlan:
        """Candidate `index` built and serialized; one that does not build is returned with its error."""
        ...

    def time_plans(self, query: PlanQuery, plans: Sequence[BuiltPlan]) -> list[CandidateResult]:
        """Each built plan's GPU time, in the order given (an error for one that does not run)."""
        ...


def tunes(options: CompileOptions, heuristic: Heuristic) -> bool:
    """Whether a build goes on past its heuristic plan."""
    return options.autotune and heuristic.count > 1 and not heuristic.untimed_reason


def compiled(
    plan: BuiltPlan, candidates: list[CandidateResult], build_s: float, tune_s: float, provisional: bool
) -> CompiledPlan:
    return CompiledPlan(
        blob=plan.blob,
        workspace_size=plan.workspace_size,
        engine_id=plan.engine_id,
        knobs=plan.knobs,
        plan_name=plan.plan_name,
        is_python_engine=plan.is_python_engine,
        candidates=candidates,
        build_seconds=build_s,
        autotune_seconds=tune_s,
        provisional=provisional,
        geometry=plan.geometry,
    )


def with_listing(heuristic: Heuristic, records: dict[int, CandidateResult]) -> list[CandidateResult]:
    """Every entry of the plan list, in index order: what was tried or timed,
    and for the rest what the frontend says of them (the records a program's
    plan-list queries are answered from)."""
    merged = {c.index: c for c in heuristic.listing}
    for index, record in records.items():
        known = merged.get(index)
        described = known is not None and not record.knobs and not record.behavior_notes
        merged[index] = (
            replace(record, knobs=known.knobs, behavior_notes=known.behavior_notes) if described and known else record
        )
    return [merged[i] for i in sorted(merged)]


def heuristic_plan(heuristic: Heuristic, provisional: bool) -> CompiledPlan:
    """The heuristic plan as stored: provisional while the autotuning goes on, or final."""
    chosen = heuristic.chosen.untimed()
    if heuristic.untimed_reason:
        chosen = replace(chosen, timing=f"untimed: {heuristic.untimed_reason}")
    records = {c.index: c for c in heuristic.candidates}
    if all(
        c.plan_name != chosen.plan_name for c in records.values()
    ):  # unless the compiler timed it among its candidates
        records[chosen.index] = chosen
    return compiled(heuristic.chosen, with_listing(heuristic, records), heuristic.seconds, 0.0, provisional)


def winner(plans: Sequence[BuiltPlan], timed: Sequence[CandidateResult]) -> BuiltPlan | None:
    """The built plan with the lowest precisely measured time (a candidate
    the screen left out never wins: its time is one replay's)."""
    finalists = [
        (t.median_ms, p) for p, t in zip(plans, timed, strict=True) if t.median_ms is not None and t.timing != "screen"
    ]
    return min(finalists, key=lambda f: f[0] if f[0] is not None else math.inf, default=(None, None))[1]


def build_seconds(heuristic: Heuristic, others: Sequence[BuiltPlan]) -> float:
    """What building every candidate costs one process: the metadata's
    build_seconds (autotune_seconds is the timing's), which a hit saves a
    node that would build locally."""
    return heuristic.seconds + sum(p.seconds for p in others)


def tuned_plan(
    heuristic: Heuristic,
    built: Sequence[BuiltPlan],
    timed: Sequence[CandidateResult],
    failed: Sequence[BuiltPlan],
    build_s: float,
    tune_s: float,
) -> CompiledPlan | None:
    """The autotuned plan: the fastest of `built` (`timed[i]` is `built[i]`'s
    time), with every candidate's record in index order, those that did not
    build too; None when none ran."""
    best = winner(built, timed)
    if best is None:
        return None
    records = {c.index: c for c in heuristic.candidates if c.error}
    records.update({p.index: p.untimed() for p in failed})
    built_by_index = {p.index: p for p in built}
    records.update({t.index: _with_build(t, built_by_index.get(t.index)) for t in timed})
    return compiled(best, with_listing(heuristic, records), build_s, tune_s, provisional=False)


def _with_build(timed: CandidateResult, plan: BuiltPlan | None) -> CandidateResult:
    """A timing with what its build recorded (knobs, notes, workspace)."""
    if plan is None:
        return timed
    return replace(
        timed, knobs=dict(plan.knobs), behavior_notes=plan.behavior_notes, workspace_size=plan.workspace_size
    )


def compile_inline(compiler: Compiler, query: PlanQuery) -> Iterator[CompiledPlan]:
    """The plan as it gets better, every piece in this process, one after
    another: the heuristic plan (provisional when autotuning follows), then
    the autotuned plan. An error raised after the provisional plan is the
    autotuning's."""
    heuristic = compiler.heuristic(query)
    if not tunes(query.options, heuristic):
        yield heuristic_plan(heuristic, provisional=False)
        return
    yield heuristic_plan(heuristic, provisional=True)
    others = [compiler.candidate(query, i) for i in range(heuristic.count) if i != heuristic.chosen.index]
    built = sorted([heuristic.chosen, *(p for p in others if p.built)], key=lambda p: p.index)
    started = time.perf_counter()
    timed = compiler.time_plans(query, built)
    plan = tuned_plan(
        heuristic,
        built,
        timed,
        [p for p in others if not p.built],
        build_seconds(heuristic, others),
        time.perf_counter() - started,
    )
    if plan is None:
        raise RuntimeError(f"none of the {heuristic.count} candidate plans ran: {timed[0].error if timed else ''}")
    yield plan

"""The pieces of builds that wait for a build process, and the order a free
process takes them in.

By lane first (a caller's heuristic plan, then warming's, then the
candidates of callers' autotunings, then warming's), then by the build's
acceptance (older builds' candidates go first), then by candidate.
"""

from __future__ import annotations

import enum
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from plancache_server.settings.groups import HEDGED_HOLD_MAX_DEFAULT_S
from plancache_server.worker.build_tasks import BuildTask

if TYPE_CHECKING:
    from plancache_server.worker.held_builds import Build


class Lane(enum.IntEnum):
    """What a free build process takes first (the lowest lane)."""

    HEURISTIC = 0  # a job's first plan: someone waits for it
    # A job's first plan whose callers build it themselves meanwhile (hedged misses, Job.yields): it waits while
    # such callers keep asking (YieldGate), then goes before everything but callers' plans.
    YIELDING = 1
    # Warming: a plan nobody asked for yet (plancache_server.worker.warm_runner). Its
    # first plan goes before the candidates of an autotuning: a stored plan
    # serves the nodes that come next, a tuned one a few percent better
    # (bench/upgrade.py: with warming behind every autotuning, a rollout's
    # misses kept it from running at all).
    WARM_HEURISTIC = 2
    CANDIDATE = 3  # a candidate of an autotuning
    WARM_CANDIDATE = 4


# The lanes of a build's first piece, its heuristic plan: what a stopping worker hands back unstarted.
FIRST_LANES = (Lane.HEURISTIC, Lane.YIELDING, Lane.WARM_HEURISTIC)
# The lanes of autotuning: candidates timed on the GPU, for a few percent (DESIGN.md).
TUNING_LANES = (Lane.CANDIDATE, Lane.WARM_CANDIDATE)
# Longest a candidate waits for callers' misses to pause (TuningGate): a steady stream of misses still gets tuned.
TUNING_WAIT_CAP_S = 10.0


@dataclass(order=True)
class QueuedPiece:
    """One piece of a build in its lane (and, once submitted, while it builds).
    Ordered by its lane, its build's acceptance, its candidate's index, then
    its task's id (unique: no two pieces are ever equal)."""

    lane: Lane
    build_seq: int
    index: int
    task_id: int
    task: BuildTask = field(compare=False)
    build: Build = field(compare=False)


class TuningGate:
    """Autotuning waits for a pause in callers' misses: no candidate starts
    until `quiet_s` after the last caller's heuristic plan started (at most
    TUNING_WAIT_CAP_S after the first candidate was held back). A first node
    asks for its graphs one after another, each a few tens of milliseconds
    apart, and builds each itself meanwhile (the hedge): candidates built
    beside it on the same host's CPUs slowed its own builds (issue 41's
    shared-CPU start-up, GPU run 28: measured once with 1 s, within that
    machine's drift, so it is off unless set: --tune-after-quiet). The tuned
    plan comes `quiet_s` later; the heuristic plan, what a node needs first,
    no later. 0: no wait."""

    def __init__(self, quiet_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet_s, self._clock = quiet_s, clock
        self._last_urgent = float("-inf")
        self._held_since: float | None = None  # when a candidate was first held back (None: none is)

    def urgent_started(self) -> None:
        self._last_urgent = self._clock()

    def holds(self, lane: Lane) -> bool:
        """Whether a piece of `lane` waits now (counted from the first piece held back)."""
        if lane not in TUNING_LANES or self.quiet_s <= 0:
            return False
        now = self._clock()
        if now - self._last_urgent >= self.quiet_s:
            self._held_since = None
            return False
        if self._held_since is None:
            self._held_since = now
        return now - self._held_since < TUNING_WAIT_CAP_S

    def remaining_s(self) -> float:
        """Seconds until a candidate held back may start (0 when none is held)."""
        if self._held_since is None:
            return 0.0
        ends = min(self._last_urgent + self.quiet_s, self._held_since + TUNING_WAIT_CAP_S)
        return max(0.0, ends - self._clock())

    def released(self) -> None:
        """A candidate started: the cap counts again from the next one held back."""
        self._held_since = None

    @property
    def waiting(self) -> bool:
        """Whether a candidate is held back now (the worker's loop then polls for the end of the wait)."""
        return self._held_since is not None


# Longest a yielding build waits (YieldGate) by default, from when its worker took it: a fleet whose nodes never stop
# asking still has its plans stored this soon after (the setting --hedged-hold-max, whose default this is). 3 s until
# GPU run 46: a first node with an empty JIT cache builds its 13 graphs in 4-6 s, and the service then built and
# tuned beside it.
YIELD_WAIT_CAP_S = HEDGED_HOLD_MAX_DEFAULT_S


# What waits while callers build their own graphs: their builds, and every autotuning.
HELD_BY_YIELDING = (Lane.YIELDING, *TUNING_LANES)


class YieldGate:
    """Builds for callers that build the plan themselves (hedged misses,
    Job.yields) wait while such callers keep asking, and autotuning with
    them (HELD_BY_YIELDING): none of them starts until `quiet_s` after the
    last yielding job came, each at most `cap_s` (YIELD_WAIT_CAP_S) after its
    build was taken. A waiting caller's plan never waits, nor warming's first
    plans: a graph family the program sweeps is what turns its next sizes
    into hits (issue 43), built beside its misses as before.

    A first node asks for its graphs one after another while it builds each
    itself: the service's builds and autotuning beside it, on the same
    host's GPU, slowed its own builds 1.14-1.43x, whether the service had
    other CPU cores or one build process, and not at all with the worker
    stopped (1.02x; issue 41, GPU run 41). Those callers run their own
    plans meanwhile; the service's come for their take-over and for the
    nodes after them. 0: no wait."""

    def __init__(
        self, quiet_s: float, clock: Callable[[], float] = time.monotonic, cap_s: float = YIELD_WAIT_CAP_S
    ) -> None:
        self.quiet_s, self.cap_s, self._clock = quiet_s, cap_s, clock
        self._last_asked = float("-inf")
        self._until = float("-inf")  # while a piece is held back: when the first of its reasons ends

    def asked(self) -> None:
        """A yielding job came: its callers are building."""
        self._last_asked = self._clock()

    def holds(self, lane: Lane, taken_at: float) -> bool:
        """Whether a piece of `lane`, of a build taken at `taken_at` (the gate's clock), waits now."""
        if lane not in HELD_BY_YIELDING or self.quiet_s <= 0:
            return False
        now = self._clock()
        until = min(self._last_asked + self.quiet_s, taken_at + self.cap_s)
        self._until = until if now < until else float("-inf")
        return now < until

    def remaining_s(self) -> float:
        """Seconds until the piece held back may start (0 when none is)."""
        return max(0.0, self._until - self._clock())

    @property
    def waiting(self) -> bool:
        """Whether a piece is held back now (the worker's loop then polls for the end of the wait)."""
        return self._until > self._clock()


class Lanes:
    """The pieces waiting for a build process: a heap, the lowest first."""

    def __init__(self) -> None:
        self._heap: list[QueuedPiece] = []

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, lane: Lane, build: Build, task: BuildTask) -> None:
        heapq.heappush(self._heap, QueuedPiece(lane, build.seq, task.index, task.task_id, task, build))

    def next_lane(self) -> Lane | None:
        """The lane of the piece that goes next (None when none waits)."""
        return self._heap[0].lane if self._heap else None

    def peek(self) -> QueuedPiece:
        """The piece that goes next, left in place (there must be one)."""
        return self._heap[0]

    def pop(self) -> QueuedPiece:
        """The piece that goes next (there must be one)."""
        return heapq.heappop(self._heap)

    def pop_first_of(self, lane: Lane) -> QueuedPiece:
        """The piece of `lane` that goes first among its lane's, taken out past those of lower lanes (there
        must be one)."""
        piece = min(p for p in self._heap if p.lane == lane)
        self._heap.remove(piece)
        heapq.heapify(self._heap)
        return piece

    def count(self, lane: Lane) -> int:
        return sum(1 for piece in self._heap if piece.lane == lane)

    def take_of(self, build: Build) -> list[QueuedPiece]:
        """The pieces of `build`, taken out (in the order they would have gone)."""
        return self._take(lambda piece: piece.build is build)

    def take_unstarted(self) -> list[Build]:
        """The builds whose first piece waits, their pieces taken out (those
        waiting for candidates stay, to be finished)."""
        return [piece.build for piece in self._take(lambda piece: piece.lane in FIRST_LANES)]

    def relane(self, build: Build) -> None:
        """A warm or yielding build a caller now waits for: its pieces move to its lanes now (the callers')."""
        heuristic, candidate = build.lanes
        for piece in self._take(lambda piece: piece.build is build):
            self.push(heuristic if piece.lane in FIRST_LANES else candidate, build, piece.task)

    def clear(self) -> None:
        self._heap.clear()

    def _take(self, which: Callable[[QueuedPiece], bool]) -> list[QueuedPiece]:
        taken = sorted(piece for piece in self._heap if which(piece))
        self._heap = [piece for piece in self._heap if not which(piece)]
        heapq.heapify(self._heap)
        return taken

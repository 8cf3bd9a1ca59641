"""How this process's graphs ended, counted and reported to the service: the
fleet coverage operators read (graphs served against graphs built locally,
by reason class and node type).

Every front door counts its own graphs here, once each: `Client.compile`
and `get` (path "compile"), `plancache.cudnn`'s build step ("cudnn"),
`plancache.functional`'s first call of a geometry ("functional"). A graph is
served (the service's plan from a server), from the disk cache (the
service's plan, no call), or local (the node built it; in
plancache.functional torch ran it), with a reason class from the fixed set
REASONS and the graph's anchor node type from the catalog. The labels are
bounded on both sides: the server folds what it does not know into
"other", so a hostile client cannot grow its label sets.

The counts are per process (`outcome_stats()`), as `race_stats()` and
`plancache.cudnn.stats()` are; each client's background reporter
(plancache.transport.hedge.Reports) takes what was counted since the last
report and sends it in ReportFirstUses, so a process reports each graph
once whatever its number of clients. A spec hash travels only where the
operator opts in (PLANCACHE_REPORT_SPECS=1); the spec never does.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from plancache.env import env_bool
from plancache.errors import (
    CompileFailed,
    CompileTimeout,
    IntegrityError,
    InvalidRequest,
    PermissionDenied,
    PlanCacheError,
    ResourceExhausted,
    SpecError,
    TargetUnavailable,
    Unauthenticated,
    Unavailable,
    UntrustedBuild,
)
from plancache.keys.plankey import parse_key
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.outcome_labels import OTHER, REASONS

REPORT_ENV = "PLANCACHE_REPORT"
REPORT_SPECS_ENV = "PLANCACHE_REPORT_SPECS"
_BY_ERROR: tuple[tuple[type[PlanCacheError], str], ...] = (
    (TargetUnavailable, "no_worker"),
    (CompileTimeout, "timeout"),
    (ResourceExhausted, "refused_for_now"),
    (Unauthenticated, "not_permitted"),
    (PermissionDenied, "not_permitted"),
    (IntegrityError, "untrusted_plan"),  # UntrustedPlan is one
    (UntrustedBuild, "untrusted_plan"),
    (CompileFailed, "compile_failed"),
    (SpecError, "no_spec_form"),
    (InvalidRequest, "invalid_request"),
    (Unavailable, "unavailable"),
)


def reason_of(error: BaseException) -> str:
    """The reason class of a failure to serve (an error class may name its own: `reason_class`)."""
    named = getattr(error, "reason_class", None)
    if isinstance(named, str) and named in REASONS:
        return named
    return next((reason for kind, reason in _BY_ERROR if isinstance(error, kind)), OTHER)


class Outcome(enum.IntEnum):
    SERVED = pb.GRAPH_OUTCOME_SERVED
    DISK_CACHE = pb.GRAPH_OUTCOME_DISK_CACHE
    LOCAL = pb.GRAPH_OUTCOME_LOCAL


def served_outcome(source: str) -> Outcome:
    """A plan's outcome by its source: from the disk cache, the node's own build (a hedge it won), or the service."""
    return Outcome.DISK_CACHE if source == "cache" else Outcome.LOCAL if source == "local" else Outcome.SERVED


@dataclass(frozen=True)
class OutcomeKey:
    """One counter of outcome_stats(): what the report's OutcomeCount labels say."""

    path: str
    target_id: str
    outcome: Outcome
    reason: str = ""  # LOCAL only
    node_type: str = ""
    spec_hash: str = ""  # LOCAL only, and only with PLANCACHE_REPORT_SPECS=1

    def to_proto(self, count: int) -> pb.OutcomeCount:
        return pb.OutcomeCount(
            target_id=self.target_id,
            path=self.path,
            outcome=pb.GraphOutcome.Name(self.outcome),
            reason=self.reason,
            node_type=self.node_type,
            count=count,
            spec_hash=self.spec_hash,
        )


def report_default() -> bool:
    """Whether clients report to the service (PLANCACHE_REPORT, on unless it says off)."""
    return env_bool(REPORT_ENV, True)


@cache
def reports_specs() -> bool:
    """Whether the operator opted in to spec hashes in reports (PLANCACHE_REPORT_SPECS=1; read once)."""
    return env_bool(REPORT_SPECS_ENV, False)


def target_of(plan_key: str) -> str:
    """The target id in a plan key ("" when it is none)."""
    try:
        return parse_key(plan_key).target.id
    except PlanCacheError:
        return ""


class Tally:
    """Counters of one process, and what was counted since the last `take()`.
    Bounded: past MAX_KEYS distinct counters (spec hashes only can get
    there), new ones are counted without their spec hash."""

    MAX_KEYS = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total: dict[OutcomeKey, int] = {}
        self._pending: dict[OutcomeKey, int] = {}
        self.on_first_pending: Callable[[], None] | None = None  # reporters wake on it

    def add(self, key: OutcomeKey) -> None:
        with self._lock:
            if key not in self._total and len(self._total) >= self.MAX_KEYS and key.spec_hash:
                key = OutcomeKey(key.path, key.target_id, key.outcome, key.reason, key.node_type)
            self._total[key] = self._total.get(key, 0) + 1
            first = not self._pending
            self._pending[key] = self._pending.get(key, 0) + 1
        if first and self.on_first_pending is not None:
            self.on_first_pending()

    def take(self) -> dict[OutcomeKey, int]:
        """What was counted since the previous take (and forget it: a report sends it once)."""
        with self._lock:
            taken, self._pending = self._pending, {}
        return taken

    def give_back(self, taken: dict[OutcomeKey, int]) -> None:
        """Counts a report did not deliver: taken again by the next report."""
        with self._lock:
            for key, count in taken.items():
                self._pending[key] = self._pending.get(key, 0) + count

    def totals(self) -> dict[OutcomeKey, int]:
        with self._lock:
            return dict(self._total)

    def clear(self) -> None:
        with self._lock:
            self._total.clear()
            self._pending.clear()


TALLY = Tally()


def record(
    path: str, target_id: str, outcome: Outcome, node_type: str, *, reason: str = "", spec_hash: str = ""
) -> None:
    """Count one graph of a front door. `reason` (a key of REASONS) for a local one."""
    local = outcome is Outcome.LOCAL
    TALLY.add(
        OutcomeKey(
            path, target_id, outcome, reason if local else "", node_type, spec_hash if local and reports_specs() else ""
        )
    )


def outcome_stats() -> dict[OutcomeKey, int]:
    """This process's graphs by front door, target, outcome, reason and node
    type since it started (what its clients report to the service)."""
    return TALLY.totals()


def reset_outcome_stats() -> None:
    TALLY.clear()

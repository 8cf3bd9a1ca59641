"""How each graph was built (Built: served by plancache, or locally and why), counted and reported.

plancache.cudnn._serving counts every graph once, as served or as built
locally (a served graph the program later drives itself moves from one
count to the other): `stats()` and `graphs()` read these counts, the
service is told the outcome (plancache.transport.outcomes), and why a
graph built locally is logged once per reason.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from plancache.cudnn._capture import current_device
from plancache.errors import PlanCacheError
from plancache.frontdoors.service import ABOUT_THE_GRAPH, SERVICE, Once, describe, reason_key
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.graph import GraphSpec
from plancache.run.plan import Plan
from plancache.transport import outcomes
from plancache.wire import outcome_labels

log = logging.getLogger("plancache.cudnn")  # the drop-in's one logger, whichever of its modules logs
_once = Once()


@dataclass
class Built:
    """How one graph was built: served by plancache (its plan) or locally (why)."""

    name: str
    spec: GraphSpec | None = field(default=None, repr=False)
    plan: Plan | None = None
    reason: str | None = None
    # The frontend's node types of the graph, in order (pointwise ones as "POINTWISE:<mode>").
    node_types: tuple[str, ...] = ()
    # Built locally: whether the program's own build succeeded (None: not known yet, or served).
    local_built: bool | None = None
    # The program's own build won a hedged miss (its plan ran first; `plan`, once set, took over later).
    hedged: bool = False
    # The plan key the service was asked for, where the program's own build ran and no plan is set (a hedged miss):
    # the plan the graph's next run fetches.
    key: str | None = None

    @property
    def source(self) -> str:
        """The plan's source ("hit", "compiled", "provisional", "cache", ...) or "local"."""
        return self.plan.source if self.plan is not None else "local"


@dataclass
class Stats:
    served: int = 0
    local: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Local:
    """Why a graph builds locally: the reason (stats(), graphs()), its key for
    logging once, whether it is about this graph (else about the service),
    and its reason class (what the service is told: outcome_labels.REASONS)."""

    reason: str
    key: str
    about_the_graph: bool
    reason_class: str


NO_PLAN = Local("no plan", "no plan", True, outcome_labels.OTHER)
HEDGED = (
    "hedged miss: the service was building it and this program's own build was ready first"
    " (the service's plan takes over at a later execute)"
)

_STATS = Stats()
_RECENT: deque[Built] = deque(maxlen=256)


def stats() -> Stats:
    """Graphs served and built locally since the process started, and why."""
    return Stats(_STATS.served, _STATS.local, dict(_STATS.reasons))


def graphs() -> list[Built]:
    """The latest graphs built (up to 256), oldest first."""
    return list(_RECENT)


def count_served(built: Built, plan: Plan) -> None:
    """A graph served by plancache, with `plan`."""
    _STATS.served += 1
    _RECENT.append(built)
    outcomes.record(
        "cudnn",
        outcomes.target_of(plan.key),
        outcomes.served_outcome(plan.source),
        outcome_labels.anchor_node_type(built.node_types),
    )


def uncount_served() -> None:
    """A served graph the program drives itself: it is counted again, as built locally (count_local)."""
    _STATS.served -= 1


def count_local(built: Built, why: Local, level: int = logging.WARNING) -> None:
    """A graph built locally, and why (logged once per `why.key`)."""
    _STATS.local += 1
    reason = built.reason or "unknown"
    _STATS.reasons[reason] = _STATS.reasons.get(reason, 0) + 1
    _RECENT.append(built)
    spec_hash = hash_normalized(built.spec) if built.spec is not None and outcomes.reports_specs() else ""
    outcomes.record(
        "cudnn",
        SERVICE.known_target_id(current_device()),
        outcomes.Outcome.LOCAL,
        outcome_labels.anchor_node_type(built.node_types),
        reason=why.reason_class,
        spec_hash=spec_hash,
    )
    what = f"graph {built.name!r}" if why.about_the_graph else "graphs"
    _once(log, why.key, "plancache.cudnn: %s built locally: %s", what, reason, level=level)


def relabel_local(built: Built, why: Local) -> None:
    """A graph counted as built locally for one reason now stands for another (`why`: a hedged miss whose
    service plan was refused when it came, plancache.cudnn._serving), logged once per `why.key`. The service
    was told the first reason when the graph was built (a race it saw; rare: a capture that differs)."""
    old = built.reason or "unknown"
    if _STATS.reasons.get(old, 0) > 0:
        _STATS.reasons[old] -= 1
        if not _STATS.reasons[old]:
            del _STATS.reasons[old]
    built.reason = why.reason
    _STATS.reasons[why.reason] = _STATS.reasons.get(why.reason, 0) + 1
    what = f"graph {built.name!r}" if why.about_the_graph else "graphs"
    _once(log, why.key, "plancache.cudnn: %s keeps its own build: %s", what, why.reason, level=logging.WARNING)


def refused(error: PlanCacheError) -> Local:
    """Why a graph builds locally when the service did not serve it (`error`)."""
    return Local(describe(error), reason_key(error), isinstance(error, ABOUT_THE_GRAPH), outcomes.reason_of(error))


@contextlib.contextmanager
def recording(built: Built | None) -> Iterator[None]:
    """The program's own build of a graph plancache did not serve: whether
    it built is recorded (a graph the frontend cannot build either is not
    one plancache failed to serve)."""
    try:
        yield
    except BaseException:
        if built is not None:
            built.local_built = False
        raise
    if built is not None:
        built.local_built = True


def node_types(graph: Any) -> tuple[str, ...]:
    """The graph's frontend node types in order, a pointwise node's with its mode."""
    found = []
    for node in getattr(graph, "nodes", ()):
        kind = str(getattr(node.node_type, "name", node.node_type))
        found.append(f"{kind}:{node.params.get('mode')}" if kind == "POINTWISE" else kind)
    return tuple(found)

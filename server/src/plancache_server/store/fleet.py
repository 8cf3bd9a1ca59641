"""What nodes report of their own graphs (ReportFirstUses' outcomes and
races), bounded and named: the fields of the fleet scopes in
plancache_server.store.stats, and the coverage records the status page,
the JSON status and GetStats read back from them.

Every label a node sends is folded into a fixed set before it is counted:
a front door other than compile, cudnn and functional, a reason class
outside plancache.wire.outcome_labels.REASONS, a node type outside the
catalog's all count as "other" (targets are bounded by the directory, as
every statistic is). A hostile node can add to counts, within a report's
bounds, but cannot add a label value, a Redis field or a metric series.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from plancache.v1 import plancache_pb2 as pb
from plancache.wire.outcome_labels import OTHER, PATHS, REASONS, node_types

SEP = "|"
OUTCOMES = {
    pb.GRAPH_OUTCOME_SERVED: "served",
    pb.GRAPH_OUTCOME_DISK_CACHE: "disk_cache",
    pb.GRAPH_OUTCOME_LOCAL: "local",
}
RACE_RESULTS = {
    pb.RACE_RESULT_LOCAL_WON: "local_won",
    pb.RACE_RESULT_SERVICE_WON: "service_won",
    pb.RACE_RESULT_LOCAL_FAILED: "local_failed",
    pb.RACE_RESULT_SERVICE_FAILED: "service_failed",
    pb.RACE_RESULT_REPLACED: "replaced",
}
# Most graphs one entry of one report may claim (a larger count is cut to it).
MAX_COUNT = 100_000
_SPEC_HASH = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Labels:
    """One outcome entry's labels, folded into the fixed sets."""

    path: str
    outcome: str
    reason: str
    node_type: str

    def field(self) -> str:
        return SEP.join((self.outcome, self.path, self.reason, self.node_type))


def labels(entry: pb.OutcomeCount) -> Labels | None:
    """The entry's labels, bounded; None for an entry that counts nothing (no outcome)."""
    outcome = OUTCOMES.get(entry.outcome)
    if outcome is None:
        return None
    path = entry.path if entry.path in PATHS else OTHER
    reason = (entry.reason if entry.reason in REASONS else OTHER) if outcome == "local" else ""
    node_type = entry.node_type if entry.node_type in node_types() else OTHER
    return Labels(path, outcome, reason, node_type)


def count_of(entry: pb.OutcomeCount | pb.RaceCount) -> int:
    return min(int(entry.count), MAX_COUNT)


def race_field(entry: pb.RaceCount) -> str | None:
    result = RACE_RESULTS.get(entry.result)
    if result is None:
        return None
    return SEP.join((entry.path if entry.path in PATHS else OTHER, result))


def local_spec_member(target_scope: str, found: Labels, spec_hash: str) -> str | None:
    """The ranking's member for a graph built locally, named by a well-formed spec hash (else None)."""
    if found.outcome != "local" or not _SPEC_HASH.fullmatch(spec_hash):
        return None
    return SEP.join((target_scope, found.reason, found.node_type, spec_hash))


# ---- reading back -------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalBuilds:
    """Graphs built locally for one reason class and node type."""

    reason: str
    node_type: str
    graphs: float
    meaning: str  # what the reason class says (REASONS)


@dataclass(frozen=True)
class Coverage:
    """Graphs nodes reported, by where their plan came from: the service
    (fetched, or from the node's disk cache) or the node itself (and why)."""

    served: float = 0.0  # fetched from a server
    disk_cache: float = 0.0  # the service's plan, from a node's disk cache
    local: float = 0.0  # built by the node (plancache.functional: torch ran it)
    local_by_reason: list[LocalBuilds] = field(default_factory=list)  # most first
    by_path: dict[str, dict[str, float]] = field(default_factory=dict)  # front door -> outcome -> graphs

    @property
    def graphs(self) -> float:
        return self.served + self.disk_cache + self.local

    @property
    def from_service(self) -> float:
        return self.served + self.disk_cache

    @property
    def share(self) -> float | None:
        """Graphs the service's plans ran, of every graph the fleet built; None without any."""
        return self.from_service / self.graphs if self.graphs else None

    def top_reasons(self, count: int) -> list[LocalBuilds]:
        """The reason classes with the most graphs built locally (node types together), most first."""
        per_reason: defaultdict[str, float] = defaultdict(float)
        for row in self.local_by_reason:
            per_reason[row.reason] += row.graphs
        ranked = sorted(per_reason.items(), key=lambda item: (-item[1], item[0]))[:count]
        return [LocalBuilds(reason, "", graphs, REASONS.get(reason, "")) for reason, graphs in ranked]


def coverage(values: dict[str, float]) -> Coverage:
    """A fleet scope's counters (one window) as a Coverage."""
    return merged([values])


def merged(scopes: Iterable[dict[str, float]]) -> Coverage:
    """Several fleet scopes' counters (targets) as one Coverage: the fleet's."""
    totals: defaultdict[str, float] = defaultdict(float)
    local: defaultdict[tuple[str, str], float] = defaultdict(float)
    by_path: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
    for values in scopes:
        for name, amount in values.items():
            parts = name.split(SEP)
            if len(parts) != 4 or parts[0] not in OUTCOMES.values():
                continue
            outcome, path, reason, node_type = parts
            totals[outcome] += amount
            by_path[path][outcome] += amount
            if outcome == "local":
                local[(reason, node_type)] += amount
    rows = [
        LocalBuilds(reason, node_type, graphs, REASONS.get(reason, ""))
        for (reason, node_type), graphs in local.items()
        if graphs
    ]
    rows.sort(key=lambda row: (-row.graphs, row.reason, row.node_type))
    return Coverage(
        totals["served"], totals["disk_cache"], totals["local"], rows, {p: dict(o) for p, o in sorted(by_path.items())}
    )


def races(values: dict[str, float]) -> dict[str, dict[str, float]]:
    """The fleet-wide races scope as front door -> result -> races."""
    out: defaultdict[str, dict[str, float]] = defaultdict(dict)
    for name, amount in values.items():
        path, _, result = name.partition(SEP)
        if result in RACE_RESULTS.values():
            out[path][result] = amount
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class LocalSpec:
    """A graph nodes built locally, named by its spec hash (opted-in nodes only)."""

    target_id: str
    reason: str
    node_type: str
    spec_hash: str
    graphs: float


def local_spec(member: str, graphs: float) -> LocalSpec | None:
    parts = member.split(SEP)
    if len(parts) != 4:
        return None
    return LocalSpec(parts[0], parts[1], parts[2], parts[3], graphs)

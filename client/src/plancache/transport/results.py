"""What a client's calls answer: a prefetch's plans and errors per entry,
the targets that can build, the statistics per target and window."""

from __future__ import annotations

from dataclasses import dataclass, field

from plancache.errors import PlanCacheError
from plancache.run.plan import Plan
from plancache.v1 import plancache_pb2 as pb


@dataclass(frozen=True)
class TargetInfo:
    target_id: str
    live_workers: int
    worker_ids: tuple[str, ...]


@dataclass
class PrefetchResult:
    """Per manifest entry index: its plan or its error."""

    total: int
    plans: dict[int, Plan] = field(default_factory=dict)
    errors: dict[int, PlanCacheError] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)
    from_cache: int = 0
    # The manifest's graph families: each one's status once asked for (by family key), or why it could not be.
    families: dict[str, FamilyStatus] = field(default_factory=dict)
    family_errors: dict[int, PlanCacheError] = field(default_factory=dict)
    fetched: int = 0  # stored plans
    compiled: int = 0  # plans of builds this call started, joined or saw begin (provisional)
    stopped: int = 0  # entries that had not come when a PrefetchStop ended the prefetch

    @property
    def done(self) -> int:
        return len(self.plans) + len(self.errors)

    @property
    def provisional(self) -> int:
        """Plans that are cuDNN's heuristic choice, their autotuning still under way."""
        return sum(plan.provisional for plan in self.plans.values())

    @property
    def failed(self) -> int:
        return len(self.errors)


@dataclass(frozen=True)
class WindowCounts:
    hits: int = 0
    misses: int = 0
    compiles: int = 0
    failures: int = 0
    joined: int = 0
    bytes_served: int = 0
    build_seconds_saved: float = 0.0
    refused: int = 0  # compiles answered TargetUnavailable
    untrusted_builds: int = 0  # builds whose plan the gateway refused (UntrustedBuild)

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    @classmethod
    def from_proto(cls, w: pb.WindowStats) -> WindowCounts:
        return cls(
            w.hits,
            w.misses,
            w.compiles,
            w.failures,
            w.joined,
            w.bytes_served,
            w.build_seconds_saved,
            w.refused,
            w.untrusted_builds,
        )


@dataclass(frozen=True)
class TargetStats:
    """Totals of one target, and `windows` ("5m", "1h", "24h", "total")."""

    target_id: str
    hits: int
    misses: int
    compiles: int
    failures: int
    joined: int
    live_workers: int
    bytes_served: int = 0
    build_seconds_saved: float = 0.0
    windows: dict[str, WindowCounts] = field(default_factory=dict)
    # The store: plans held now, and how many left it (bound, retention).
    stored_bytes: int = 0
    stored_plans: int = 0
    evicted: int = 0
    expired: int = 0
    # Callers' builds dropped unbuilt: every caller had gone when a worker took the job.
    abandoned: int = 0

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    @classmethod
    def from_proto(cls, t: pb.TargetStats) -> TargetStats:
        return cls(
            t.target_id,
            t.hits,
            t.misses,
            t.compiles,
            t.failures,
            t.joined,
            t.live_workers,
            t.bytes_served,
            t.build_seconds_saved,
            {w.window: WindowCounts.from_proto(w) for w in t.windows},
            t.stored_bytes,
            t.stored_plans,
            t.evicted,
            t.expired,
            t.abandoned,
        )


@dataclass(frozen=True)
class FamilyStatus:
    """Where a graph family stands on the service: its graphs, how many are
    stored (each is a hit from now on), how many wait for a worker; how many
    stored ones were ever served (`fetched`: the others go first when the
    store is full, and expire on their own) and their bytes; how many this
    ask left out past the workload's budget; who asked; cancelled or not."""

    family_key: str
    target_id: str
    total: int
    stored: int
    queued: int
    created_at: float
    fetched: int = 0
    bytes: int = 0
    over_budget: int = 0
    workload: str = ""
    cancelled: bool = False

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.stored >= self.total

    @classmethod
    def from_proto(cls, s: pb.FamilyStatus) -> FamilyStatus:
        return cls(
            s.family_key,
            s.target_id,
            s.total,
            s.stored,
            s.queued,
            s.created_at,
            s.fetched,
            s.bytes,
            s.over_budget,
            s.workload,
            s.cancelled,
        )

"""What the status page shows, gathered from Redis: every gateway sees the
same numbers (counters, queues and failures are shared, not per process).

One read per page view; nothing here is cached, so a refresh is current.
It runs on the gateway's event loop (the HTTP thread hands it over).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from plancache.errors import InvalidRequest
from plancache.keys.plankey import parse_key
from plancache.keys.target import Target
from plancache_server.gateway.app import Gateway
from plancache_server.gateway.builds import Builds
from plancache_server.gateway.signing_keys import SigningKeys
from plancache_server.gateway.workloads import WorkloadService
from plancache_server.store.build_records import FailedBuild
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.families import FamilyRecords
from plancache_server.store.fleet import Coverage, LocalSpec, coverage, local_spec, merged, races
from plancache_server.store.jobs import JobQueue
from plancache_server.store.lifecycle import Janitor, TargetUsage
from plancache_server.store.plans import PlanStore
from plancache_server.store.stats import (
    RACES_SCOPE,
    WINDOWS,
    Bucket,
    Counter,
    PlanCounts,
    Ranking,
    Stats,
    family_scope,
    fleet_scope,
    target_ids,
    target_scope,
)
from plancache_server.store.warming import Warming, WarmStatus

log = logging.getLogger(__name__)

# Range of the hit-rate charts -> (bucket unit, bucket count).
RANGES = {"1h": ("m", 60), "24h": ("h", 24)}
TOP_COUNT = 10
FAILURE_COUNT = 20
LOCAL_SPECS_SHOWN = 10
WORKLOADS_SHOWN = 20
FAMILIES_SHOWN = 20

# window -> counter name -> value (see stats.WINDOWS and stats.Counter)
Windows = dict[str, dict[str, float]]


def hit_rate(values: dict[str, float]) -> float | None:
    """Hits over lookups; None without lookups (not 0 %: nothing was asked)."""
    hits, misses = values.get(Counter.HITS.value, 0.0), values.get(Counter.MISSES.value, 0.0)
    return hits / (hits + misses) if hits + misses > 0 else None


def first_uses(total: dict[str, float]) -> tuple[float, float]:
    """(first uses served by the service, first uses): a first use is a
    caller that waited for a build (compiles + joined); those whose node ran
    its own plan first (a hedged miss, as nodes report it) were not served."""
    waited = total.get(Counter.COMPILES.value, 0) + total.get(Counter.JOINED.value, 0)
    local = min(total.get(Counter.FIRST_USES_LOCAL.value, 0), waited)
    return waited - local, waited


@dataclass(frozen=True)
class TargetStatus:
    target_id: str
    live_workers: int
    jobs_waiting: int  # queued, not yet taken by a worker
    jobs_running: int  # taken by a worker, not finished
    windows: Windows
    history: list[Bucket]  # the report's range, oldest first
    stored: TargetUsage = field(default_factory=TargetUsage)  # plans in the store, evicted, expired
    # What nodes reported of their graphs for this target, per window (stats.WINDOWS).
    fleet: dict[str, Coverage] = field(default_factory=dict)


@dataclass(frozen=True)
class TopEntry:
    plan_key: str
    target_id: str
    hits: float
    build_seconds_saved: float
    stored: bool  # False once invalidated or evicted from Redis
    build_seconds: float  # build + autotune of the stored plan (0 when not stored)
    blob_size: int
    plan_name: str


@dataclass(frozen=True)
class SigningKeyStatus:
    """A key the server's plans are signed with (plancache_server.gateway.signing_keys): what an
    operator compares with the fingerprint `plancache trust` prints on a client."""

    key_id: str
    fingerprint: str
    state: str  # current, next, previous


# A workload's counts as WorkloadStatus lists them, after its name, plans and last report.
WORKLOAD_COLUMNS = ("processes", "listed", "prefetched", "used", "wasted", "stopped", "served", "mixed")


@dataclass(frozen=True)
class WorkloadStatus:
    """A workload's start-up record (plancache_server.store.workloads) and how its processes' prefetches went."""

    target: str
    name: str
    plans: int  # in the record now
    last_seen: float  # unix seconds, its latest report
    processes: int  # processes that read the record (GetWorkload)
    listed: int  # keys those reads listed, summed
    prefetched: int  # plans processes fetched and deserialized before their graphs asked
    used: int  # of those, plans a graph took
    wasted: int  # prefetched, never taken by the time the process ended
    stopped: int  # processes whose stream brought none of their first graphs (a name collision, a stale record)
    served: int  # processes that said at their end that their stream served them (the record settles on these)
    mixed: int  # processes that said it did not: stopped, or a quarter of the record unused (a collision, stale)


@dataclass(frozen=True)
class GraphFamilyStatus:
    """A graph family asked for (BuildFamily): the service's speculative builds, and whether they paid."""

    family_key: str
    target: str
    workload: str
    asked: int  # members
    stored: int
    fetched: int  # stored members served at least once
    bytes: int
    cancelled: bool
    created_at: float


@dataclass(frozen=True)
class StatusReport:
    generated_at: float
    range: str
    targets: list[TargetStatus]
    families: dict[str, Windows]
    top_by_hits: list[TopEntry]
    top_by_seconds_saved: list[TopEntry]
    recent_failures: list[FailedBuild]
    # Targets with stored plans no worker advertised for --retire-after-days: target -> last seen (None: never).
    retire_eligible: dict[str, float | None] = field(default_factory=dict)
    retire_after_days: float = 0.0
    warming: list[WarmStatus] = field(default_factory=list)
    # The whole fleet's reported graphs per window (every target's together), its races, and
    # the graphs built locally most, by spec hash (from nodes whose operators opted in).
    fleet: dict[str, Coverage] = field(default_factory=dict)
    fleet_races: dict[str, dict[str, float]] = field(default_factory=dict)
    local_specs: list[LocalSpec] = field(default_factory=list)
    # Plans a repair of the private store lost, until each is rebuilt (plancache_server.store.repair).
    lost_to_repair: list[str] = field(default_factory=list)
    # The public keys of the server's plan signatures (GetSigningKeys): current, next, previous.
    signing_keys: list[SigningKeyStatus] = field(default_factory=list)
    # Workloads' start-up records, the most recently reported first.
    workloads: list[WorkloadStatus] = field(default_factory=list)
    # Graph families asked for, the latest first.
    graph_families: list[GraphFamilyStatus] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for target, raw in zip(self.targets, data["targets"], strict=True):
            raw["hit_rate"] = {window: hit_rate(values) for window, values in target.windows.items()}
            served, waited = first_uses(target.windows.get("total", {}))
            raw["first_uses"] = {"served_by_service": served, "total": waited}
            _coverage_json(target.fleet, raw["fleet"])
        _coverage_json(self.fleet, data["fleet"])
        for failure, raw in zip(self.recent_failures, data["recent_failures"], strict=True):
            raw["target_id"] = failure.target_id
        for status, raw in zip(self.warming, data["warming"], strict=True):
            raw.update(coverage=status.coverage, remaining=status.remaining)
        return data


def _coverage_json(windows: dict[str, Coverage], raw: dict[str, Any]) -> None:
    """What the properties of each window's Coverage say, beside its fields."""
    for window, found in windows.items():
        raw[window].update(graphs=found.graphs, from_service=found.from_service, share=found.share)


def status_of(front: Gateway) -> StatusSource:
    """The status report of a started gateway (its counters, queues, store and warming)."""
    settings = front.settings
    return StatusSource(
        front.stats,
        front.queue,
        front.store,
        front.builds,
        front.directory,
        front.janitor,
        settings.retire_after_days * 86400,
        front.warming,
        front.signing_keys,
        front.workloads,
        front.family_records,
    )


class StatusSource:
    def __init__(
        self,
        stats: Stats,
        queue: JobQueue,
        store: PlanStore,
        builds: Builds,
        directory: WorkerDirectory,
        janitor: Janitor | None = None,
        retire_after_s: float = 0.0,
        warming: Warming | None = None,
        signing_keys: SigningKeys | None = None,
        workloads: WorkloadService | None = None,
        families: FamilyRecords | None = None,
    ) -> None:
        self._families = families
        self._signing_keys = signing_keys
        self._workloads = workloads
        self._janitor = janitor
        self._warming = warming
        self._retire_after_s = retire_after_s
        self._stats = stats
        self._queue = queue
        self._store = store
        self._builds = builds
        self._directory = directory

    async def report(self, range_: str = "1h") -> StatusReport:
        if range_ not in RANGES:
            raise InvalidRequest(f"range must be one of {', '.join(RANGES)}, not {range_[:20]!r}")
        unit, count = RANGES[range_]
        await self._directory.refresh()
        readings = await self._stats.read()
        reported = {scope.removeprefix(fleet_scope("")) for scope in readings if scope.startswith(fleet_scope(""))}
        targets_seen = sorted(target_ids(readings) | set(self._directory.live) | reported)
        history = await self._stats.history([target_scope(t) for t in targets_seen], unit, count)
        targets = [
            dataclasses.replace(
                await self._target(t, readings.get(target_scope(t), {}), history[target_scope(t)]),
                fleet={w: coverage(readings.get(fleet_scope(t), {}).get(w, {})) for w in WINDOWS},
            )
            for t in targets_seen
        ]
        retirable: dict[str, float | None] = {}
        lost: list[str] = []
        if self._janitor is not None:
            lost = await asyncio.to_thread(self._janitor.lost_to_repair)
            usage = await asyncio.to_thread(self._janitor.usage)
            targets = [dataclasses.replace(t, stored=usage.get(t.target_id, TargetUsage())) for t in targets]
            if self._retire_after_s:
                retirable = await asyncio.to_thread(self._janitor.retirable, self._retire_after_s)
        families = {
            scope.removeprefix(family_scope("")): windows
            for scope, windows in readings.items()
            if scope.startswith(family_scope(""))
        }
        return StatusReport(
            generated_at=time.time(),
            range=range_,
            targets=targets,
            families=families,
            top_by_hits=await self._entries(Ranking.HITS),
            top_by_seconds_saved=await self._entries(Ranking.SECONDS_SAVED),
            recent_failures=await self._builds.recent_failures(FAILURE_COUNT),
            retire_eligible=retirable,
            retire_after_days=self._retire_after_s / 86400,
            warming=await asyncio.to_thread(self._warming.all_status) if self._warming is not None else [],
            fleet={w: merged(readings.get(fleet_scope(t), {}).get(w, {}) for t in reported) for w in WINDOWS},
            fleet_races=races(readings.get(RACES_SCOPE, {}).get("total", {})),
            local_specs=[
                found
                for member, graphs in await self._stats.local_specs(LOCAL_SPECS_SHOWN)
                if (found := local_spec(member, graphs))
            ],
            lost_to_repair=lost,
            signing_keys=await self._keys(),
            workloads=await self._workload_statuses(),
            graph_families=await asyncio.to_thread(self._graph_families),
        )

    def _graph_families(self) -> list[GraphFamilyStatus]:
        """On a thread: the latest families and their members' counts (at most FAMILIES_SHOWN x 1,024 reads)."""
        if self._families is None:
            return []
        shown = []
        for record in self._families.latest(FAMILIES_SHOWN):
            counts = self._families.counts(record.members)
            shown.append(
                GraphFamilyStatus(
                    record.family_key,
                    record.target_id,
                    record.workload,
                    len(record.members),
                    sum(counts.stored),
                    counts.fetched,
                    counts.bytes,
                    record.cancelled,
                    record.created_at,
                )
            )
        return shown

    async def _workload_statuses(self) -> list[WorkloadStatus]:
        if self._workloads is None:
            return []
        found = await self._workloads.summaries(WORKLOADS_SHOWN)
        return [
            WorkloadStatus(
                s.target_id,
                s.name,
                s.plans,
                s.last_seen,
                *(s.counts.get(c, 0) for c in WORKLOAD_COLUMNS),
            )
            for s in found
        ]

    async def _keys(self) -> list[SigningKeyStatus]:
        if self._signing_keys is None:
            return []
        try:
            keys = await self._signing_keys.recent()
        except (InvalidRequest, OSError) as e:  # the page still shows the rest; the log says which file
            log.error("status page: the signing keys: %s", e.message if isinstance(e, InvalidRequest) else e)
            return []
        return [SigningKeyStatus(k.key_id, k.fingerprint, k.state) for k in keys]

    async def _target(self, target_id: str, windows: Windows, history: list[Bucket]) -> TargetStatus:
        try:
            target = Target.parse(target_id)
        except InvalidRequest:  # the bucket of other targets: its counters, with no queue
            return TargetStatus(target_id, 0, 0, 0, windows, history)
        waiting, running = await self._queue.depth(target)
        return TargetStatus(target_id, len(self._directory.live.get(target_id, ())), waiting, running, windows, history)

    async def _entries(self, ranking: Ranking) -> list[TopEntry]:
        entries = []
        for counts in await self._stats.top(ranking, TOP_COUNT):
            try:
                entries.append(await self._entry(counts))
            except InvalidRequest:  # a member that is no plan key (written by someone else): skipped, not shown
                log.warning("top entries: skipping %r, which is not a plan key", counts.plan_key[:200])
        return entries

    async def _entry(self, counts: PlanCounts) -> TopEntry:
        target_id = parse_key(counts.plan_key).target.id
        plan = await self._store.get(counts.plan_key)
        if plan is None:
            return TopEntry(counts.plan_key, target_id, counts.hits, counts.build_seconds_saved, False, 0.0, 0, "")
        meta = plan.metadata
        return TopEntry(
            counts.plan_key,
            target_id,
            counts.hits,
            counts.build_seconds_saved,
            True,
            meta.build_seconds + meta.autotune_seconds,
            meta.blob_size,
            meta.plan_name,
        )

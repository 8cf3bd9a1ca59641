"""ReportFirstUses: a node's background report of how its hedged misses
ended, and of its graphs' outcomes and races, added to the fleet's counts.

A report can add to counts, never invent keys, targets or label values:
only a plan this gateway knows is counted, every label is folded into its
fixed set (plancache_server.store.fleet) and every count is bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from plancache.errors import PlanCacheError, ResourceExhausted
from plancache.keys.plankey import parse_key
from plancache.log_limits import LogLimiter
from plancache.v1 import plancache_pb2 as pb
from plancache_server import telemetry
from plancache_server.gateway.builds import Builds
from plancache_server.gateway.workloads import WorkloadService
from plancache_server.store import fleet
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.plans import PlanStore
from plancache_server.store.stats import Counter, Stats
from plancache_server.store.workloads import MAX_USES

log = logging.getLogger(__name__)
_faults = LogLimiter(log)  # one line a minute when Redis refuses the records

# First uses one ReportFirstUses may carry (a client batches at most 256).
MAX_FIRST_USES = 1024
# Outcome and race counts one ReportFirstUses may carry (a client sends at most 256 and 15).
MAX_OUTCOMES = 512
MAX_RACES = 64


class NodeReports:
    def __init__(
        self,
        store: PlanStore,
        builds: Builds,
        stats: Stats,
        directory: WorkerDirectory,
        workloads: WorkloadService | None = None,
    ) -> None:
        self._store = store
        self._builds = builds
        self._stats = stats
        self._directory = directory
        self._workloads = workloads

    async def report(self, request: pb.ReportFirstUsesRequest) -> pb.ReportFirstUsesResponse:
        """A node's background report: first uses, and its graphs' outcomes and races (see count_outcomes)."""
        if len(request.outcomes) > MAX_OUTCOMES or len(request.races) > MAX_RACES:
            raise ResourceExhausted(
                f"a ReportFirstUses takes at most {MAX_OUTCOMES} outcomes and {MAX_RACES} races: send several"
            )
        if len(request.workload.uses) > MAX_USES:
            raise ResourceExhausted(f"a ReportFirstUses takes at most {MAX_USES} workload uses: send several")
        counted = await self.report_first_uses(request.uses)
        recorded = 0
        if self._workloads is not None and request.HasField("workload"):
            try:
                recorded = await self._workloads.record(request.workload)
            except PlanCacheError as e:  # the record is best effort: the report's counts still count
                _faults.warning("workload record", "a workload's first uses were not recorded: %s", e.message)
        return pb.ReportFirstUsesResponse(
            counted=counted,
            outcomes_counted=self.count_outcomes(request.outcomes, request.races),
            workload_recorded=recorded,
        )

    def count_outcomes(self, entries: Sequence[pb.OutcomeCount], races: Sequence[pb.RaceCount]) -> int:
        """Add a node's counts to the fleet's, every label folded into its
        fixed set (plancache_server.store.fleet) and every count bounded:
        a report can add to counts, never a label value."""
        counted = 0
        for entry in entries:
            labels = fleet.labels(entry)
            amount = fleet.count_of(entry)
            if labels is None or not amount:
                continue
            target = self._directory.scope(entry.target_id)
            self._stats.fleet(target, labels.field(), amount)
            telemetry.child(
                telemetry.FLEET_GRAPHS, target, labels.path, labels.outcome, labels.reason, labels.node_type
            ).inc(amount)
            member = fleet.local_spec_member(target, labels, entry.spec_hash) if entry.spec_hash else None
            if member is not None:
                self._stats.local_spec(member, amount)
            counted += 1
        for race in races:
            field, amount = fleet.race_field(race), fleet.count_of(race)
            if field is None or not amount:
                continue
            self._stats.race(field, amount)
            telemetry.child(telemetry.FLEET_RACES, *field.split(fleet.SEP)).inc(amount)
            counted += 1
        return counted

    async def report_first_uses(self, uses: Sequence[pb.FirstUse]) -> int:
        """Count how hedged misses ended on a node. Only a plan this service
        knows (stored, or being built here) is counted, once per report:
        a report cannot invent keys or targets."""
        if len(uses) > MAX_FIRST_USES:
            raise ResourceExhausted(
                f"a ReportFirstUses takes at most {MAX_FIRST_USES} uses, this one has {len(uses)}: send several"
            )
        counted = 0
        for plan_key, local in {use.plan_key: use.local for use in uses}.items():
            try:
                target_id = parse_key(plan_key).target.id
            except PlanCacheError:
                continue
            if (
                not self._builds.flying(plan_key)
                and self._store.cached(plan_key) is None
                and await self._store.get(plan_key) is None
            ):
                continue
            self._stats.incr(Counter.FIRST_USES_LOCAL if local else Counter.FIRST_USES_SERVED, target_id=target_id)
            counted += 1
        return counted

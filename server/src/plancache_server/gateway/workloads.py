"""Workloads' start-up records on a gateway: written from nodes' reports
(ReportFirstUses' `workload`), read by a workload's new processes
(GetWorkload). plancache_server.store.workloads says what a record is and
why nothing in it is trusted."""

from __future__ import annotations

from plancache.errors import PlanCacheError
from plancache.keys.plankey import parse_key
from plancache.keys.workload_names import NAME
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.builds import Builds
from plancache_server.store.plans import PlanStore
from plancache_server.store.redis_conn import translated_errors
from plancache_server.store.workloads import WorkloadRecords, WorkloadSummary, check_name

# A process's prefetch counts one report may add (per count): a report adds to counts, within bounds.
MAX_WORKLOAD_COUNT = 100_000


class WorkloadService:
    def __init__(self, records: WorkloadRecords, store: PlanStore, builds: Builds) -> None:
        self._records = records
        self._store = store
        self._builds = builds

    async def record(self, uses: pb.WorkloadUses) -> int:
        """Add a process's uses to its workload's record: only keys of the
        report's target whose plans this service holds or builds, or was
        asked to build (a stored-only ask's graph, plancache.torch's, whose
        build nobody waits for: the next process streams it once stored; a
        report cannot make a record list what does not exist); a name that is not
        one of NAME's records nothing (a report is best effort: the rest of
        it still counts). How many keys it recorded."""
        if not NAME.fullmatch(uses.name) or not NAME.fullmatch(uses.target_id):
            return 0
        candidates: dict[str, int] = {}
        for use in uses.uses:
            try:
                if parse_key(use.plan_key).target.id != uses.target_id:
                    continue  # another target's plan: not this record's
            except PlanCacheError:
                continue
            candidates.setdefault(use.plan_key, use.order)
        known = [k for k in candidates if self._builds.flying(k) or self._store.cached(k) is not None]
        held = set(known)
        unknown = [k for k in candidates if k not in held]
        counts = {
            "prefetched": min(uses.prefetched, MAX_WORKLOAD_COUNT),
            "used": min(uses.used, MAX_WORKLOAD_COUNT),
            "wasted": min(uses.wasted, MAX_WORKLOAD_COUNT),
            "stopped": min(uses.stopped, 1),
        }
        served = {pb.STREAM_VERDICT_SERVED: True, pb.STREAM_VERDICT_MIXED: False}.get(uses.verdict)
        with translated_errors("recording a workload's first uses"):
            held_now = await self._records.stored(unknown, or_built=True)
            known += [k for k, stored in zip(unknown, held_now, strict=True) if stored]
            recorded = [(k, candidates[k]) for k in known]
            return await self._records.record(uses.target_id, uses.name, recorded, counts, served)

    async def plans(self, request: pb.GetWorkloadRequest) -> pb.GetWorkloadResponse:
        """GetWorkload: the record's stored plans, first used first (InvalidRequest for a name that is not one)."""
        check_name(request.name)
        check_name(request.target_id)
        with translated_errors("reading a workload's start-up record"):
            read = await self._records.plans(request.target_id, request.name)
            return pb.GetWorkloadResponse(plan_keys=read.plan_keys, complete=read.complete, settled=read.settled)

    async def summaries(self, limit: int) -> list[WorkloadSummary]:
        with translated_errors("reading workloads' start-up records"):
            return await self._records.summaries(limit)

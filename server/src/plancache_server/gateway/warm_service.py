"""The Warm and WarmStatus calls: operators plan, cancel and watch warming
(plancache_server.store.warming), on the gateway's event loop; the Redis work
runs on a thread, as the janitor's does. And BuildFamily / GetFamily: every
graph of a family (plancache.graphspec.family) queued at warming's priority, its
plan keys derived here as a Compile's are, and its record."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence

from plancache.errors import InvalidRequest, NotFound
from plancache.graphspec import spec_io
from plancache.graphspec.family import Family
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import make_family_key
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.resolver import QueryResolver
from plancache_server.gateway.shares import CALLER
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.families import FamilyRecord, FamilyRecords, MemberCounts
from plancache_server.store.warming import DEFAULT_TOP, MAX_TOP, Source, Warming, WarmStatus
from plancache_server.store.workloads import check_name
from plancache_server.telemetry import FAMILY_MEMBERS

log = logging.getLogger(__name__)


class WarmService:
    def __init__(
        self,
        warming: Warming,
        directory: WorkerDirectory,
        resolver: QueryResolver,
        families: FamilyRecords,
        family_budget: int = 2048,
    ) -> None:
        """`resolver`: a manifest's queries and a family's graphs are
        validated, normalized and keyed as a Compile's are. `family_budget`:
        members one workload may queue per target and day."""
        self._warming = warming
        self._directory = directory
        self._resolver = resolver
        self._families = families
        self._family_budget = family_budget

    async def warm(self, request: pb.WarmRequest) -> WarmStatus:
        target = Target.parse(request.target_id)
        if request.cancel:
            return await asyncio.to_thread(self._warming.cancel, target.id)
        await self._directory.refresh()
        if target.id not in self._directory.known:
            known = ", ".join(sorted(self._directory.known)) or "none yet"
            raise InvalidRequest(
                f"target {target.id} is unknown: no worker has advertised it (known targets: {known[:2000]})"
            )
        top = request.top or DEFAULT_TOP
        if not 1 <= top <= MAX_TOP:
            raise InvalidRequest(f"top must be between 1 and {MAX_TOP}, not {request.top}")
        kind = request.WhichOneof("source")
        if kind == "from_target":
            source = Source(target_id=Target.parse(request.from_target).id)
        elif kind == "served_days":
            source = Source(days=request.served_days)
        elif kind == "manifest":
            if len(request.manifest.queries) > MAX_TOP:
                raise InvalidRequest(
                    f"a warming manifest takes at most {MAX_TOP} specs, not {len(request.manifest.queries)}"
                )
            resolved = [
                await self._resolver.resolve(q.spec, target.to_proto(), q.options) for q in request.manifest.queries
            ]
            source = Source(manifest=tuple(query.proto for query in resolved))
        else:
            raise InvalidRequest("Warm needs a source: from_target, served_days or a manifest (or cancel)")
        status = await asyncio.to_thread(self._warming.plan, target, source, top, request.min_hits, "operator")
        assert status is not None  # an operator's plan is kept, empty or not
        log.warning("warming %s from %s: %d spec(s) planned", target.id, source.text, status.total)
        return status

    async def status(self, request: pb.WarmStatusRequest) -> list[WarmStatus]:
        if request.target_id:
            return [await asyncio.to_thread(self._warming.status, Target.parse(request.target_id).id)]
        return await asyncio.to_thread(self._warming.all_status)

    # ---- graph families ------------------------------------------------------------

    async def build_family(self, request: pb.BuildFamilyRequest) -> pb.FamilyStatus:
        """Queue every graph of the family not stored for the target, and record it."""
        spec_io.refuse_unknown_fields(request.family, "family")
        family = Family.from_proto(request.family)  # SpecError: no form, too many graphs
        target = Target.from_proto(request.target)
        options = CompileOptions.from_proto(request.options)
        await self._directory.refresh()
        if target.id not in self._directory.known:
            known = ", ".join(sorted(self._directory.known)) or "none yet"
            raise InvalidRequest(
                f"target {target.id} is unknown: no worker has advertised it (known targets: {known[:2000]})"
            )
        family_key = make_family_key(family.family_hash(), target, options)
        seen = sizes_seen(family, request.seen)
        workload = asker(request.workload)
        return await asyncio.to_thread(self._queue_family, family, family_key, target, options, seen, workload)

    def _queue_family(
        self,
        family: Family,
        family_key: str,
        target: Target,
        options: CompileOptions,
        seen: Mapping[str, Sequence[int]],
        workload: str,
    ) -> pb.FamilyStatus:
        """On a thread: each graph resolved as a Compile's spec is
        (normalized, validated, keyed), the missing ones queued, nearest the
        sizes the program met first (soonest_first), as many as the
        workload's budget for the target has left today."""
        members: list[tuple[str, pb.PlanQuery]] = []
        values_of: list[dict[str, int]] = []
        for values, spec in family.instances():
            query = self._resolver.resolve_now(spec_io.to_proto(spec), target.to_proto(), options.to_proto())
            members.append((query.key, query.proto))
            values_of.append(values)
        stored = self._families.stored([key for key, _ in members])
        missing = [
            members[i] for i in soonest_first(values_of, seen) if not stored[i]
        ]  # the order the workers take them in
        granted = self._families.spend(target.id, workload, len(missing), self._family_budget)
        queued = self._warming.extend(target, missing[:granted], f"graph family {family_key[:80]}")
        record = self._families.put(family_key, target.id, family.to_proto(), [key for key, _ in members], workload)
        over_budget = len(missing) - granted
        FAMILY_MEMBERS.labels(outcome="queued").inc(queued)
        FAMILY_MEMBERS.labels(outcome="over_budget").inc(over_budget)
        log.info(
            "graph family %s for %s, workload %s: %d graph(s), %d stored, %d queued, %d past its budget",
            family_key,
            target.id,
            workload,
            len(members),
            len(members) - len(missing),
            queued,
            over_budget,
        )
        status = _family_status(record, len(members) - len(missing), queued)
        status.over_budget = over_budget
        return status

    async def get_family(self, request: pb.GetFamilyRequest) -> pb.FamilyStatus:
        record = await self._record(request.family_key)
        counts = await asyncio.to_thread(self._families.counts, record.members)
        return _family_status(record, sum(counts.stored), _queued(record, counts.stored), counts)

    async def cancel_family(self, request: pb.GetFamilyRequest) -> pb.FamilyStatus:
        """Stop building a family's members not built yet: the workers skip them (what is stored stays)."""
        record = await self._record(request.family_key)
        stored = await asyncio.to_thread(self._families.cancel, record)
        unbuilt = len(stored) - sum(stored)
        FAMILY_MEMBERS.labels(outcome="cancelled").inc(unbuilt)
        log.warning(
            "graph family %s for %s cancelled: %d member(s) not built skipped",
            record.family_key,
            record.target_id,
            unbuilt,
        )
        record = dataclasses.replace(record, cancelled=True)
        counts = await asyncio.to_thread(self._families.counts, record.members)
        return _family_status(record, sum(counts.stored), 0, counts)

    async def _record(self, family_key: str) -> FamilyRecord:
        record = await asyncio.to_thread(self._families.get, family_key)
        if record is None:
            raise NotFound(f"no graph family {family_key[:200]} was asked for")
        return record


def asker(workload: str) -> str:
    """Whose budget a BuildFamily spends: its workload (checked as a workload's name), else the caller."""
    if workload:
        return check_name(workload)
    return CALLER.get() or "anonymous"


def _queued(record: FamilyRecord, stored: Sequence[bool]) -> int:
    return 0 if record.cancelled else len(stored) - sum(stored)


# Sizes of one symbol a BuildFamily may say the program met.
MAX_SEEN_SIZES = 256


def sizes_seen(family: Family, seen: Sequence[pb.SizesSeen]) -> dict[str, tuple[int, ...]]:
    """A request's sizes met, checked: the family's symbols, positive sizes, at most MAX_SEEN_SIZES each."""
    symbols = {v.symbol for v in family.varying}
    out: dict[str, tuple[int, ...]] = {}
    for item in seen:
        if item.symbol not in symbols:
            raise InvalidRequest(
                f"sizes seen of {item.symbol[:64]!r}, which the family does not vary ({', '.join(sorted(symbols))})"
            )
        if len(item.sizes) > MAX_SEEN_SIZES or any(size < 1 for size in item.sizes):
            raise InvalidRequest(
                f"sizes seen of {item.symbol!r}: at most {MAX_SEEN_SIZES} positive sizes, "
                f"not {len(item.sizes)} (smallest {min(item.sizes, default=0)})"
            )
        out[item.symbol] = tuple(item.sizes)
    return out


def soonest_first(values_of: Sequence[Mapping[str, int]], seen: Mapping[str, Sequence[int]]) -> list[int]:
    """The members' indices, the ones a program is likeliest to meet next first: a program that met
    sizes 17 and 150 meets 16, 18, 149 and 151 before 90 (a sweep's neighbours, a decode batch one
    request away). Distance: over the symbols with sizes seen, the sum of each size's distance to the
    nearest seen; ties (and every member, when nothing was seen) in size order."""

    def distance(i: int) -> int:
        return sum(min(abs(values_of[i][s] - x) for x in sizes) for s, sizes in seen.items() if sizes)

    return sorted(range(len(values_of)), key=lambda i: (distance(i), i))


def _family_status(
    record: FamilyRecord, stored: int, queued: int, counts: MemberCounts | None = None
) -> pb.FamilyStatus:
    return pb.FamilyStatus(
        family_key=record.family_key,
        target_id=record.target_id,
        total=len(record.members),
        stored=stored,
        queued=queued,
        created_at=record.created_at,
        fetched=counts.fetched if counts else 0,
        bytes=counts.bytes if counts else 0,
        workload=record.workload,
        cancelled=record.cancelled,
    )

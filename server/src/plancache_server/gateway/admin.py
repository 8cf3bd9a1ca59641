"""An operator's calls on a gateway: list and invalidate plans, explain a
miss, drain a worker, list targets, read the statistics."""

from __future__ import annotations

import asyncio
import logging

from plancache.errors import InvalidRequest
from plancache.keys.plankey import parse_key
from plancache.keys.target import Target, slug
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.rich_status import bounded
from plancache_server.gateway.resolver import QueryResolver
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.jobs import JobQueue
from plancache_server.store.lifecycle import Janitor, TargetUsage
from plancache_server.store.plans import PlanStore
from plancache_server.store.stats import WINDOWS, Counter, Stats, target_ids, target_scope

log = logging.getLogger(__name__)


class AdminService:
    def __init__(
        self,
        store: PlanStore,
        resolver: QueryResolver,
        queue: JobQueue,
        stats: Stats,
        directory: WorkerDirectory,
        janitor: Janitor,
    ) -> None:
        self._store = store
        self._resolver = resolver
        self._queue = queue
        self._stats = stats
        self._directory = directory
        self._janitor = janitor

    async def list_plans(self, target_id: str) -> list[str]:
        """Stored plan keys, of one target or all."""
        if target_id:
            return await self._store.keys_of_target(Target.parse(target_id).id)
        return await self._store.keys_of_target(None)

    async def invalidate(self, request: pb.InvalidateRequest) -> int:
        """Delete stored plans: one key, every plan of a spec, or of a target."""
        what = request.WhichOneof("what")
        if what == "key":
            parse_key(request.key)
            doomed = [request.key]
        elif what == "spec_hash":
            if len(request.spec_hash) != 64:
                raise InvalidRequest("spec_hash must be 64 hex digits")
            doomed = await self._store.keys_of_spec(request.spec_hash)
        elif what == "target_id":
            doomed = await self._store.keys_of_target(Target.parse(request.target_id).id)
        else:
            raise InvalidRequest("Invalidate needs a key, a spec_hash or a target_id")
        removed = await asyncio.to_thread(lambda: [key for key in doomed if self._janitor.remove(key, "invalidated")])
        for key in doomed:
            self._store.forget(key)
        deleted = len(removed)
        await self._stats.forget_plans(doomed)
        log.warning(
            "invalidated %d plan(s) (%s %s)", deleted, what, bounded(str(getattr(request, what or "key")))[:200]
        )
        return deleted

    async def explain(self, query: pb.PlanQuery) -> pb.ExplainResponse:
        """How the asked key differs from the stored keys of the same spec."""
        resolved = await self._resolver.resolve(query.spec, query.target, query.options)
        asked = parse_key(resolved.key)
        stored = await self._store.get(resolved.key) is not None
        variants = []
        for key in await self._store.keys_of_spec(asked.spec_hash):
            if key == resolved.key or await self._store.get(key) is None:
                continue
            other = parse_key(key)
            variants.append(
                pb.StoredVariant(
                    key=key, differences=_differences(resolved.target, other.target, asked.options_id, other.options_id)
                )
            )
        if stored:
            summary = "stored: a lookup hits"
        elif variants:
            summary = (
                f"not stored for this target and options; {len(variants)} plan(s) of the same spec are stored "
                "under other keys"
            )
        else:
            summary = (
                "no plan of this spec is stored under any target or options (the spec differs from every stored "
                "one, or was never compiled)"
            )
        return pb.ExplainResponse(
            key=resolved.key, stored=stored, spec_hash=asked.spec_hash, variants=variants, summary=summary
        )

    async def drain_worker(self, worker_id: str) -> bool:
        if not worker_id or len(worker_id) > 256:
            raise InvalidRequest("DrainWorker needs a worker id (see ListTargets)")
        known = await self._queue.request_drain(worker_id)
        log.warning("asked worker %s to drain (%s)", worker_id, "live" if known else "not live now")
        return known

    async def list_targets(self) -> list[pb.TargetInfo]:
        await self._directory.refresh()
        return [
            pb.TargetInfo(target_id=t, live_workers=len(w), worker_ids=w)
            for t, w in sorted(self._directory.live.items())
        ]

    async def stats(self) -> pb.GetStatsResponse:
        await self._directory.refresh()
        readings = await self._stats.read()
        usage = await asyncio.to_thread(self._janitor.usage)
        live = self._directory.live
        response = pb.GetStatsResponse()
        for target_id in sorted(
            target_ids(readings)
            | set(live)
            | {t for t, u in usage.items() if u.stored_plans or u.evicted or u.expired or u.abandoned}
        ):
            windows = readings.get(target_scope(target_id), {})
            row = _window(windows.get("total", {}), "total")
            stored = usage.get(target_id, TargetUsage())
            response.targets.append(
                pb.TargetStats(
                    target_id=target_id,
                    hits=row.hits,
                    misses=row.misses,
                    compiles=row.compiles,
                    failures=row.failures,
                    joined=row.joined,
                    live_workers=len(live.get(target_id, ())),
                    bytes_served=row.bytes_served,
                    build_seconds_saved=row.build_seconds_saved,
                    windows=[_window(windows.get(w, {}), w) for w in WINDOWS],
                    stored_bytes=stored.stored_bytes,
                    stored_plans=stored.stored_plans,
                    evicted=stored.evicted,
                    expired=stored.expired,
                    abandoned=stored.abandoned,
                )
            )
        for scope in sorted(readings):
            if scope.startswith("family:"):
                response.op_families.append(
                    pb.FamilyStats(
                        family=scope.removeprefix("family:"),
                        windows=[_window(readings[scope].get(w, {}), w) for w in WINDOWS],
                    )
                )
        return response


def _differences(asked: Target, stored: Target, asked_options: str, stored_options: str) -> list[str]:
    parts = [
        ("compute capability", asked.compute_capability, stored.compute_capability),
        ("cuDNN version", asked.cudnn_version, stored.cudnn_version),
        ("frontend version", asked.frontend_version, stored.frontend_version),
        ("device", slug(asked.device_name) or "(any)", slug(stored.device_name) or "(any)"),  # keys hold the slug
        ("SM count", asked.sm_count or "(any)", stored.sm_count or "(any)"),
        ("options", asked_options, stored_options),
    ]
    return [f"{name}: stored {theirs}, asked {ours}" for name, ours, theirs in parts if str(ours) != str(theirs)]


def _window(values: dict[str, float], window: str) -> pb.WindowStats:
    def count(counter: Counter) -> int:
        return round(values.get(counter.value, 0.0))

    return pb.WindowStats(
        window=window,
        hits=count(Counter.HITS),
        misses=count(Counter.MISSES),
        compiles=count(Counter.COMPILES),
        failures=count(Counter.FAILURES),
        joined=count(Counter.JOINED),
        bytes_served=count(Counter.BYTES_SERVED),
        build_seconds_saved=values.get(Counter.SECONDS_SAVED.value, 0.0),
        refused=count(Counter.REFUSED),
        untrusted_builds=count(Counter.UNTRUSTED),
    )

"""The Warm and WarmStatus calls: operators plan, cancel and watch warming
(plancache_server.store.warming), on the front end's event loop; the Redis work
runs on a thread, as the janitor's does."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from plancache.errors import InvalidRequest
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.warming import DEFAULT_TOP, MAX_TOP, Source, Warming, WarmStatus

log = logging.getLogger(__name__)

# (spec, target, options) -> the normalized query, validated as a Compile's is.
Resolver = Callable[[pb.GraphSpec, pb.Target, pb.CompileOptions], Awaitable[pb.PlanQuery]]


class WarmService:
    def __init__(self, warming: Warming, directory: WorkerDirectory, resolve: Resolver) -> None:
        self._warming = warming
        self._directory = directory
        self._resolve = resolve

    async def warm(self, request: pb.WarmRequest) -> WarmStatus:
        target = Target.parse(request.target_id)
        if request.cancel:
            return await asyncio.to_thread(self._warming.cancel, target.id)
        await self._directory.refresh()
        if target.id not in self._directory.known:
            known = ", ".join(sorted(self._directory.known)) or "none yet"
            raise InvalidRequest(f"target {target.id} is unknown: no worker has advertised it (known targets: {known[:2000]})")
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
                raise InvalidRequest(f"a warming manifest takes at most {MAX_TOP} specs, not {len(request.manifest.queries)}")
            resolved = [await self._resolve(q.spec, target.to_proto(), q.options) for q in request.manifest.queries]
            source = Source(manifest=tuple(resolved))
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

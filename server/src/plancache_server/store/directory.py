"""Which targets exist, as one gateway sees them.

A target exists when a worker advertised it (its heartbeat adds it to a
set in Redis) or an operator listed it (`--targets`). Statistics and metric
labels are kept per existing target only; lookups for any other target id,
however many distinct ones a caller invents, share one bucket, so a caller
cannot make the gateway create Redis keys or label values at will.

The directory is a snapshot, refreshed in the background about once a
second and on demand (GetStats, ListTargets) — never on the hit path.
"""

from __future__ import annotations

import asyncio
import logging

from plancache.errors import PlanCacheError
from plancache_server.store.jobs import JobQueue
from plancache_server.store.redis_conn import stop_task

log = logging.getLogger(__name__)

# The shared bucket of statistics for target ids no worker has advertised.
OTHER_TARGETS = "(other targets)"
REFRESH_S = 1.0


class WorkerDirectory:
    def __init__(self, queue: JobQueue, listed: tuple[str, ...] = (), refresh_s: float = REFRESH_S) -> None:
        self._queue = queue
        self._listed = frozenset(listed)
        self._refresh_s = refresh_s
        self.known: frozenset[str] = self._listed
        # Targets with live workers at the last refresh, and those workers.
        self.live: dict[str, list[str]] = {}
        self._task: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Future[None] | None = None

    def scope(self, target_id: str) -> str:
        """What statistics and metrics count a target id under."""
        return target_id if target_id in self.known else OTHER_TARGETS

    async def refresh(self) -> None:
        """Read the advertised targets and their live workers (one refresh at
        a time; concurrent callers share it)."""
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
            return
        self._refreshing = asyncio.get_running_loop().create_future()
        try:
            live = await self._queue.live_targets()
            advertised = await self._queue.advertised_targets()
            self.known = frozenset(advertised) | self._listed
            self.live = live
            self._refreshing.set_result(None)
        except BaseException as e:
            self._refreshing.set_exception(e)
            self._refreshing.exception()
            raise
        finally:
            self._refreshing = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="plancache-directory")

    async def stop(self) -> None:
        await stop_task(self._task)

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except PlanCacheError as e:
                log.debug("target directory not refreshed: %s", e.message)
            await asyncio.sleep(self._refresh_s)

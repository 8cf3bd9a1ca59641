"""The workers' announcements of finished jobs, as one gateway hears them:
one pub/sub subscription that wakes the flights waiting for those jobs."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import redis

from plancache_server.store import keys
from plancache_server.store.redis_conn import AsyncRedis, stop_task

log = logging.getLogger(__name__)


class CompletionWatcher:
    """One pub/sub subscription per gateway: wakes flights by job id, and
    tells `on_plan` which plan changed (a provisional plan replaced by the
    tuned one: memory caches drop it)."""

    def __init__(self, client: AsyncRedis, on_plan: Callable[[str], None] = lambda key: None) -> None:
        self._redis = client
        self._on_plan = on_plan
        self._events: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        if self._task is None and not self._stopping:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="plancache-events")

    def register(self, job_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._events.setdefault(job_id, set()).add(event)
        self.start()
        return event

    def unregister(self, job_id: str, event: asyncio.Event) -> None:
        events = self._events.get(job_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[job_id]

    async def stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        await stop_task(task)

    def _wake(self, data: bytes) -> None:
        try:
            decoded = json.loads(data)
            job_id, plan_key = str(decoded["job_id"]), str(decoded.get("plan_key", ""))
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed event %r", data[:200])
            return
        if plan_key:
            self._on_plan(plan_key[:1024])
        for event in self._events.get(job_id, ()):
            event.set()

    async def _run(self) -> None:
        while not self._stopping:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(keys.EVENTS_CHANNEL)
                while not self._stopping:
                    message = await pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "message":
                        self._wake(message["data"])
            except (redis.RedisError, OSError, ValueError) as e:
                # Flights keep re-checking meanwhile; subscribe again when Redis is back.
                log.debug("event subscription lost (%s); retrying", e)
                await asyncio.sleep(1.0)
            finally:
                try:
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                except (redis.RedisError, OSError):
                    pass

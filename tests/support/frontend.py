"""Run a gateway (grpc.aio) on an event loop in a background thread, so that
blocking tests and workers can talk to it from the main thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from plancache_server.gateway.app import Gateway
from plancache_server.settings import Settings

T = TypeVar("T")


class ThreadedFrontEnd:
    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.left_pending: list[str] = []  # tasks the gateway's own stop left (ended then: _end_loop)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway-loop", daemon=True)
        self._thread.start()
        try:
            self.front: Gateway = self.run(Gateway.start(settings, redis_url))
        except BaseException:
            self._end_loop()
            raise

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run a coroutine on the gateway's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=timeout)

    @property
    def port(self) -> int:
        return self.front.port

    def stop(self, grace: float | None = None) -> None:
        try:
            self.run(self.front.stop(grace))
        finally:
            self._end_loop()

    def _end_loop(self) -> None:
        """What asyncio.run does before it closes its loop (the server's main runs under it): tasks still pending
        are cancelled and awaited, so none is destroyed mid-call with the loop (a Redis read's clean-up then ran
        with no loop and failed a test as "exception ignored"). Their names are kept (`left_pending`)."""
        try:
            self.left_pending = self.run(_end_tasks(), timeout=10)
        except Exception:  # a loop that never started its gateway, or a task that would not end: closed anyway
            self.left_pending = []
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


async def _end_tasks() -> list[str]:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return [task.get_name() for task in tasks]

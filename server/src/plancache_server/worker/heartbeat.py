"""A worker's heartbeat thread: it keeps the worker's presence, the leases
of the builds it holds and its warming lease alive, and stops the worker
when an operator asks it to drain."""

from __future__ import annotations

import threading

from plancache.errors import StoreUnavailable
from plancache.keys.target import Target
from plancache_server.store.build_records import BuildRecorder
from plancache_server.worker.held_builds import HeldBuilds
from plancache_server.worker.warm_runner import WarmRunner
from plancache_server.worker.worker_log import log
from plancache_server.worker.worker_queue import WorkerQueue


class Heartbeat:
    """Every `interval_s` until `stop` is set (which a drain request sets)."""

    def __init__(
        self,
        queue: WorkerQueue,
        builds: BuildRecorder,
        held: HeldBuilds,
        warm: WarmRunner | None,
        worker_id: str,
        targets: list[Target],
        interval_s: float,
        ttl_s: float,
        stop: threading.Event,
    ) -> None:
        self._queue = queue
        self._builds = builds
        self._held = held
        self._warm = warm
        self._worker_id = worker_id
        self._targets = targets
        self._interval = interval_s
        self._ttl = ttl_s
        self._stop = stop

    def start(self) -> threading.Thread:
        beat = threading.Thread(target=self._loop, name=f"heartbeat-{self._worker_id}", daemon=True)
        beat.start()
        return beat

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._queue.drain_requested(self._worker_id):
                    log.warning(
                        "worker %s: asked to drain; finishing the builds it holds, then leaving", self._worker_id
                    )
                    self._stop.set()
                    break
                self._queue.heartbeat(self._worker_id, self._targets, self._ttl)
                for build in self._held.snapshot():
                    self._builds.renew(build.job.plan_key, build.job.job_id)
                    for delivery in build.deliveries:
                        self._queue.touch(delivery, self._worker_id)
                if self._warm is not None:
                    self._warm.renew()
            except StoreUnavailable as e:
                log.debug("heartbeat failed: %s", e)
            self._stop.wait(self._interval)

"""What a worker writes of its builds: their plans, a provisional plan's
announcement, and how each job ended.

A plan is stored signed, with the spec it was built from; a job's end is
its state, its stream entries acknowledged, a warming item's outcome and
the metrics. A finished plan is written through a Redis blip (`durably`):
building it again would cost far more.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import TypeVar

from plancache.errors import StoreUnavailable
from plancache.keys.target import Target
from plancache.trust.signing import Signer
from plancache_server import telemetry
from plancache_server.store.build_records import BuildRecorder
from plancache_server.store.plans import RedisPlanStore, StoredPlan
from plancache_server.store.warming import BUILT, FAILED
from plancache_server.worker.compiler import CompiledPlan
from plancache_server.worker.compiler.base import Heuristic, heuristic_plan
from plancache_server.worker.held_builds import Build
from plancache_server.worker.verified_job import plan_metadata
from plancache_server.worker.warm_runner import WarmRunner
from plancache_server.worker.worker_log import faults, log
from plancache_server.worker.worker_queue import WorkerQueue

T = TypeVar("T")

# A finished plan is stored through a Redis blip: retried with backoff for
# this long (building it again would cost far more).
STORE_RETRY_S = 60.0


class BuildOutcomes:
    """The writes of one worker (`worker_id`, building for `target`)."""

    def __init__(
        self,
        store: RedisPlanStore,
        builds: BuildRecorder,
        queue: WorkerQueue,
        worker_id: str,
        target: Target,
        signer: Signer | None,
        warm: WarmRunner | None,
    ) -> None:
        self._store = store
        self._builds = builds
        self._queue = queue
        self._worker_id = worker_id
        self._target = target
        self._signer = signer
        self._warm = warm

    def store_plan(self, build: Build, compiled: CompiledPlan, *, replacing: bool = False) -> None:
        """`replacing`: the build's final plan over its own provisional one (stored only if that still is)."""
        job = build.job
        metadata = plan_metadata(build.verified, compiled, self._worker_id, self._target.to_proto())
        signature = self._signer.sign(metadata) if self._signer is not None else None
        plan = StoredPlan(blob=compiled.blob, metadata=metadata, signature=signature)
        warmed = build.warming
        spec = build.verified.query.spec_proto  # what this worker derived the key from
        written = self.durably(
            f"storing plan {job.plan_key}", lambda: self._store.put(plan, spec=spec, warmed=warmed, replacing=replacing)
        )
        if not written:
            # An operator's Invalidate (or the store's bound) deleted the provisional plan while the build tuned: the
            # deletion stands; callers still waiting for the tuned plan have their job queued again by their flight
            # (plancache_server.gateway.flight), once.
            log.info(
                "job %s: plan %s was deleted while it was tuned (invalidated, or evicted by --store-max-mb); its "
                "final plan is not stored",
                job.job_id,
                job.plan_key,
            )
            return
        log.info(
            "job %s: stored %s plan %s (%d candidates, chose %s, %d bytes)",
            job.job_id,
            "provisional" if compiled.provisional else "final",
            job.plan_key,
            len(compiled.candidates),
            compiled.plan_name,
            len(compiled.blob),
        )

    def announce_provisional(self, build: Build) -> None:
        """Its provisional plan is stored: the flights waiting for it read it."""
        job = build.job
        self.durably(
            f"announcing the provisional plan of {job.plan_key}",
            lambda: self._builds.provisional(job.plan_key, job.job_id, self._worker_id),
        )

    def keep_heuristic(self, build: Build, heuristic: Heuristic, reason: str) -> None:
        """Its autotuning failed: the heuristic plan is stored as final, each candidate noting why."""
        log.warning(
            "job %s: autotuning %s failed (%s); the heuristic plan is final",
            build.job.job_id,
            build.job.plan_key,
            reason,
        )
        plan = heuristic_plan(heuristic, provisional=False)
        noted = [dataclasses.replace(c, error=f"autotuning failed: {reason[:500]}") for c in plan.candidates]
        self.store_plan(build, dataclasses.replace(plan, candidates=noted), replacing=True)

    def end(self, build: Build, error: str | None, rejected: bool = False) -> None:
        """Record the job's outcome (the worker then lets it go)."""
        job = build.job
        target_id = self._target.id
        telemetry.BUILDS.labels(
            target_id,
            "rejected" if rejected else "failed" if error else "warmed" if build.warming else "built",
        ).inc()
        telemetry.BUILD_SECONDS.labels(target_id).observe(time.monotonic() - build.started)
        if error is None:
            log.info("job %s: built %s in %.2fs", job.job_id, job.plan_key, time.monotonic() - build.started)
        self.durably(
            f"recording job {job.job_id}",
            lambda: self._builds.finish(job.plan_key, job.job_id, self._worker_id, error=error, rejected=rejected),
        )
        for delivery in build.deliveries:
            other = delivery.job
            # A caller's job promoted onto this build: its state too.
            if other is not None and other.job_id != job.job_id:
                finish = functools.partial(
                    self._builds.finish, other.plan_key, other.job_id, self._worker_id, error=error
                )
                self.durably(f"recording job {other.job_id}", finish)
            self.durably(f"acknowledging job {job.job_id}", lambda d=delivery: self._queue.ack(d))  # type: ignore[misc]
        if build.warm is not None and self._warm is not None:
            self._warm.record(build.warm, FAILED if error else BUILT, error or "", job.plan_key)

    def durably(self, doing: str, step: Callable[[], T]) -> T:
        """Run a step that must not be lost to a Redis blip: retried with
        backoff (0.1 s doubling to 2 s) for up to STORE_RETRY_S; its result."""
        deadline, pause = time.monotonic() + STORE_RETRY_S, 0.1
        while True:
            try:
                return step()
            except StoreUnavailable as e:
                if time.monotonic() + pause > deadline:
                    raise
                faults.warning(
                    "store",
                    "worker %s: %s failed (%s); retrying for up to %.0f s",
                    self._worker_id,
                    doing,
                    e.message,
                    STORE_RETRY_S,
                )
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

"""How a worker takes callers' jobs from its targets' streams, and hands back
the ones it never started when it stops.

Jobs are new ones or those of workers that died mid-build; each one is
checked (plancache_server.worker.verified_job), then refused, found stored,
given up after too many attempts, joined to the warm build of its plan, or
started; a started job whose callers all left is dropped just before its
build begins (may_start: one check per job, however long it was held), a
yielding one whose plan another worker stored meanwhile is not built again,
and a job that can reach two workers (a yielding or warm build, and the job
queued again to hurry it) is built by the one that starts it first.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from plancache.errors import InvalidRequest
from plancache.keys.target import Target
from plancache_server import telemetry
from plancache_server.store.build_records import BuildRecorder
from plancache_server.store.jobs import Delivery, Job
from plancache_server.store.plans import RedisPlanStore
from plancache_server.worker.held_builds import Build, HeldBuilds
from plancache_server.worker.verified_job import verify_job
from plancache_server.worker.worker_log import log
from plancache_server.worker.worker_queue import WorkerQueue

# How often a worker looks for jobs of dead workers.
RECLAIM_CHECK_S = 0.5


class JobIntake:
    """The jobs of one worker (`worker_id`, building for `target` and the `served` targets)."""

    def __init__(
        self,
        queue: WorkerQueue,
        builds: BuildRecorder,
        store: RedisPlanStore,
        worker_id: str,
        target: Target,
        served: list[Target],
        claim_idle_s: float,
        max_attempts: int,
    ) -> None:
        """`claim_idle_s`: a job pending this long in another worker's hands is
        taken; `max_attempts`: a job taken more often than this is given up."""
        self._queue = queue
        self._builds = builds
        self._store = store
        self._worker_id = worker_id
        self._target = target
        self._served = served
        self._claim_idle_ms = int(claim_idle_s * 1000)
        self._max_attempts = max_attempts
        self._next_reclaim = 0.0

    def take(
        self,
        room: int,
        block_s: float | None,
        held: HeldBuilds,
        start: Callable[[Build], None],
        promote: Callable[[Build, Delivery], None],
    ) -> None:
        """Up to `room` jobs, new ones first (waiting up to `block_s` for one
        to come; None: not at all), then jobs of dead workers; each one
        started (`start`), joined to a warm or yielding build of its plan
        (`promote`) or answered at once."""
        block_ms = None if block_s is None else max(1, int(block_s * 1000))  # 0 would be "for ever" to Redis
        deliveries = self._queue.read(self._worker_id, self._served, block_ms=block_ms, count=room)
        if not deliveries and time.monotonic() >= self._next_reclaim:
            # Jobs whose worker died mid-build: its heartbeat expired
            # (at once), or it went silent past claim_idle.
            deliveries = self._queue.reclaim(self._worker_id, self._served, self._claim_idle_ms)
            self._next_reclaim = time.monotonic() + RECLAIM_CHECK_S
        for delivery in deliveries:
            self._accept(delivery, held, start, promote)

    def may_start(self, build: Build) -> bool:
        """Whether a build taken earlier starts its first plan now (a worker takes a few jobs ahead of its free
        build processes). Not when no caller waits for it any more (dropped, counted), when another worker
        stored its plan meanwhile, or when another worker started it first: a job that can reach two workers
        (a yielding or warm build, and the job queued again to hurry it) is started by one, whichever claims it
        first (BuildRecorder.claim_start). Not started: its deliveries are acknowledged and the caller forgets
        it (a warming item's, recorded skipped by the caller). A warming build is always wanted."""
        if build.delivery is not None:
            # A yielding build waited for its gate (up to YIELD_WAIT_CAP_S): a caller's hurry may have reached
            # another worker meanwhile, which built it at once.
            if build.yielding and self._built_already(build.job, build.deliveries):
                return False
            if not self._wanted(build.job, [build.delivery, *build.promoted]):
                return False
        job = build.job
        if not (job.yields or job.hurries or build.warm is not None):
            return True  # a caller's job reaches one worker (or a dead worker's, reclaimed: attempts > 1)
        reclaimed = build.delivery is not None and build.delivery.attempts > 1
        # A caller's own job joined onto a warm build is this build's to finish: never left.
        joined = any(d.job is not None and d.job.job_id != job.job_id for d in build.deliveries)
        if self._builds.claim_start(job.plan_key, job.job_id, self._worker_id, reclaimed=reclaimed or joined):
            return True
        log.info("job %s: plan %s: another worker started building it first: left to it", job.job_id, job.plan_key)
        for delivery in build.deliveries:
            self._queue.ack(delivery)
        return False

    def _built_already(self, job: Job, deliveries: list[Delivery]) -> bool:
        """Whether `job` needs no build here, its deliveries acknowledged: its plan is stored (the job is finished,
        as by the build that stored it), or another worker builds this very job: it started its first plan, or
        stored it provisional and autotunes it (a hurry, the job queued again, reached the worker that does not
        hold it; the one building it finishes it). A job reclaimed from a worker that stopped answering is never
        left to the state that worker wrote. The state is read only where it can say so: a hurry, or a
        provisional plan stored (a plain miss pays no read)."""
        stored = self._store.get(job.plan_key)
        if stored is not None and not stored.metadata.provisional:
            log.info("job %s: plan %s already stored", job.job_id, job.plan_key)
            self._builds.finish(job.plan_key, job.job_id, self._worker_id)
        elif (
            (stored is not None or job.hurries)
            and deliveries[0].attempts == 1
            and self._builds.built_elsewhere(job.plan_key, job.job_id, self._worker_id)
        ):
            # Should that worker die, its delivery of the job is reclaimed as any dead worker's; a forged state
            # costs the plan (or its tuned version) until the plan is asked again.
            log.info("job %s: plan %s is being built by another worker: left to it", job.job_id, job.plan_key)
        else:
            return False  # nothing stored, or a provisional plan nobody tunes now (an earlier build's): built here
        for delivery in deliveries:
            self._queue.ack(delivery)
        return True

    def _wanted(self, job: Job, deliveries: list[Delivery]) -> bool:
        """A job queued for callers (`waited`) that none waits for any more is dropped: nobody is built for
        (plancache_server.store.build_records.TAKE_IF_WANTED)."""
        if not job.waited or deliveries[0].attempts > 1:
            return True  # an earlier version's job, or one that was running (a dead worker's): it finishes
        if self._builds.wanted(job.plan_key, job.job_id, self._worker_id):
            return True
        log.info("job %s (%s): dropped, no caller waits for it any more", job.job_id, job.plan_key)
        telemetry.BUILDS.labels(self._target.id, "abandoned").inc()
        for delivery in deliveries:
            self._queue.ack(delivery)
        return False

    def hand_back(self, unstarted: list[Build], held: HeldBuilds) -> None:
        """Stopping: jobs taken but not started go back to their stream for
        the next worker, warming items to their plan."""
        for build in unstarted:
            log.info("job %s: handed back unstarted (this worker is stopping)", build.job.job_id)
            for delivery in build.deliveries:
                self._queue.hand_back(delivery)
            if build.delivery is None:
                # Warming: the item stays in flight; the next holder of the target's lease builds it.
                self._builds.release(build.job.plan_key, build.job.job_id)
            held.forget(build)

    def _accept(
        self,
        delivery: Delivery,
        held: HeldBuilds,
        start: Callable[[Build], None],
        promote: Callable[[Build, Delivery], None],
    ) -> None:
        job = delivery.job
        if job is None:
            self._queue.ack(delivery)
            return
        try:
            verified = verify_job(job, self._served)
        except InvalidRequest as e:
            # Anyone who can write to Redis can add a job: it is refused, and
            # the plan it names (its lease, its state) is left alone.
            reason = f"refused job {job.job_id[:64]}: {e.message}"
            log.error("worker %s: %s", self._worker_id, reason)
            telemetry.BUILDS.labels(self._target.id, "refused").inc()
            self._builds.record_refusal(job.plan_key, self._worker_id, reason)
            self._queue.ack(delivery)
            return
        joined = held.joined_by(job)
        if joined is not None:
            promote(joined, delivery)
            return
        if self._built_already(job, [delivery]):
            return
        if delivery.attempts > self._max_attempts:
            reason = (
                f"gave up after {delivery.attempts - 1} attempts: "
                "every worker that took this build stopped answering mid-build"
            )
            log.error("job %s (%s): %s", job.job_id, job.plan_key, reason)
            self._builds.finish(job.plan_key, job.job_id, self._worker_id, error=reason)
            self._queue.ack(delivery)
            return
        if delivery.attempts > 1:
            log.warning(
                "job %s: reclaimed (attempt %d) from a worker that stopped answering", job.job_id, delivery.attempts
            )
        self._builds.mark_running(job.plan_key, job.job_id, self._worker_id)
        self._builds.renew(job.plan_key, job.job_id)
        start(Build(delivery, job, verified))

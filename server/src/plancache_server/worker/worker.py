"""A compile worker: one per GPU, reading build jobs for its target.

It consumes two streams: the one for its exact target (device name and SM
count included) and the one for its generic target (architecture and
versions only), since any GPU of that kind may build a generic request.

A build is cut into pieces (plancache_server.worker.compiler.base): cuDNN's
heuristic plan, stored as provisional so that its callers can run at once,
then, when it autotunes, every other candidate built and serialized, then
all of them timed on this GPU and the fastest stored under the same key.
The pieces that build run side by side in the worker's pool of build
processes (plancache_server.worker.build_pool); the timing runs here, one build at
a time, on the GPU. What runs next is decided by lane: a heuristic build
(someone waits for it) before any candidate of an autotuning, and one
process is kept for heuristic builds alone, so a miss never waits behind
autotuning: its heuristic build starts at once, or as soon as the one
before it ends. Jobs whose autotuning is under way stay claimed by the
worker (their leases renewed), so that a worker that dies mid-way hands
them to another, which builds them again.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from plancache.errors import InvalidRequest, PlanCacheError, StoreUnavailable
from plancache.graphspec import spec_io
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.log_limits import LogLimiter
from plancache.trust.signing import Signer
from plancache.v1 import plancache_pb2 as pb
from plancache.wire import metadata as wire_metadata
from plancache.wire.metadata import Built
from plancache_server import telemetry
from plancache_server.store.build_records import BuildRecorder
from plancache_server.store.jobs import Delivery, Job
from plancache_server.store.plans import RedisPlanStore, StoredPlan
from plancache_server.store.warming import BUILT, FAILED, SKIPPED, WARM_JOB_PREFIX, WarmItem
from plancache_server.worker.build_pool import (
    CANDIDATE,
    HEURISTIC,
    BuildPool,
    BuildTask,
    TaskResult,
    task_ids,
    task_query,
)
from plancache_server.worker.compiler import CompiledPlan, Compiler
from plancache_server.worker.compiler.base import BuiltPlan, Heuristic, build_seconds, heuristic_plan, tuned_plan, tunes
from plancache_server.worker.compiler.faults import GpuLost, gpu_fault
from plancache_server.worker.warm_runner import WarmRef, WarmRunner
from plancache_server.worker.worker_queue import WorkerQueue

log = logging.getLogger(__name__)
# A Redis outage or a dying build process is met over and over: one line a minute per kind.
_faults = LogLimiter(log)

# How often a worker looks for jobs of dead workers.
RECLAIM_CHECK_S = 0.5
# How long the loop waits for a build piece to end before it looks for new
# jobs again (a non-blocking read): the delay a new job sees while pieces
# build (GPU run 19: 50 ms of it, a few percent of a first node's graphs).
POLL_S = 0.005
# Tries of one piece whose build process died (a crash, the OOM killer).
MAX_TASK_ATTEMPTS = 3
# Warming items one turn of the loop may take that need no build (stored already, refused).
WARM_ITEMS_PER_TURN = 64
# Warm builds a worker holds at once: most wait for their candidates, the lowest lane
# (bench/upgrade.py: at 64 the rollout's autotunings kept warming from going on).
MAX_WARM_BUILDS = 512
# A finished plan is stored through a Redis blip: retried with backoff for
# this long (building it again would cost far more).
STORE_RETRY_S = 60.0


def default_worker_id(device: int) -> str:
    return f"{socket.gethostname()}-{os.getpid()}-gpu{device}"


@dataclass(frozen=True)
class VerifiedJob:
    """A job whose plan key is the one its spec, target and options make,
    for a target this worker builds: what it builds and signs."""

    query: PlanQuery  # derived by this worker from the job's spec, target and options

    @property
    def plan_key(self) -> str:
        return self.query.key

    @property
    def spec(self) -> GraphSpec:  # normalized by this worker
        return self.query.spec

    @property
    def target(self) -> Target:
        return self.query.target

    @property
    def options(self) -> CompileOptions:
        return self.query.options


class Lane(enum.IntEnum):
    """What a free build process takes first (the lowest lane)."""

    HEURISTIC = 0  # a job's first plan: someone waits for it
    # Warming: a plan nobody asked for yet (plancache_server.worker.warm_runner). Its
    # first plan goes before the candidates of an autotuning: a stored plan
    # serves the nodes that come next, a tuned one a few percent better
    # (bench/upgrade.py: with warming behind every autotuning, a rollout's
    # misses kept it from running at all).
    WARM_HEURISTIC = 1
    CANDIDATE = 2  # a candidate of an autotuning
    WARM_CANDIDATE = 3


@dataclass(eq=False)
class _Build:
    """A job being built: its pieces, as they come back."""

    delivery: Delivery | None  # None for warming (no job in a stream)
    job: Job
    verified: VerifiedJob
    query: bytes  # what its build tasks carry
    seq: int  # acceptance order: older builds' candidates go first
    started: float = field(default_factory=time.monotonic)
    heuristic: Heuristic | None = None
    waiting: set[int] = field(default_factory=set)  # candidates not back yet
    built: list[BuiltPlan] = field(default_factory=list)
    failed: list[BuiltPlan] = field(default_factory=list)
    attempts: dict[tuple[str, int], int] = field(default_factory=dict)
    warm: WarmRef | None = None  # a warming item, until a caller asks for it (then it is promoted)
    promoted: list[Delivery] = field(default_factory=list)  # callers' jobs for the same plan, acknowledged with it

    @property
    def key(self) -> str:
        return self.delivery.entry_id if self.delivery is not None else self.job.job_id

    @property
    def lanes(self) -> tuple[Lane, Lane]:
        """(heuristic, candidate) lanes of its tasks."""
        return (
            (Lane.WARM_HEURISTIC, Lane.WARM_CANDIDATE)
            if self.warm is not None and not self.promoted
            else (Lane.HEURISTIC, Lane.CANDIDATE)
        )


def verify_job(job: Job, served: list[Target]) -> VerifiedJob:
    """Derive the job's plan key; a job is data from Redis, not an authority.
    Raises InvalidRequest naming what does not hold."""
    try:
        query = PlanQuery.from_proto(job.query)
    except PlanCacheError as e:
        raise InvalidRequest(f"its query does not parse: {e.message[:300]}") from e
    if query.target.id not in {t.id for t in served}:
        raise InvalidRequest(
            f"it is for target {query.target.id}, which this worker does not build "
            f"(it builds {', '.join(t.id for t in served)})"
        )
    if query.key != job.plan_key:
        raise InvalidRequest(
            f"it names plan {job.plan_key[:300]} but its spec, target and options make plan {query.key}"
        )
    return VerifiedJob(query)


def plan_metadata(job: VerifiedJob, compiled: CompiledPlan, worker_id: str, built_on: pb.Target) -> pb.PlanMetadata:
    """Everything a client needs to execute the blob without the spec (plancache.wire.metadata)."""
    candidates = [
        pb.CandidateTiming(
            index=c.index,
            plan_name=c.plan_name,
            engine_id=c.engine_id,
            median_ms=c.median_ms,
            error=c.error,
            timing=c.timing,
            knobs=[pb.Knob(name=k, value=v) for k, v in sorted(c.knobs.items())],
            behavior_notes=c.behavior_notes,
            workspace_size=c.workspace_size,
        )
        for c in compiled.candidates
    ]
    built = Built(
        blob=compiled.blob,
        geometry=compiled.geometry,
        workspace_size=compiled.workspace_size,
        plan_name=compiled.plan_name,
        built_by=worker_id,
        built_on=built_on,
        provisional=compiled.provisional,
        build_seconds=compiled.build_seconds,
        autotune_seconds=compiled.autotune_seconds,
        engine_id=compiled.engine_id,
        knobs=dict(compiled.knobs),
        is_python_engine=compiled.is_python_engine,
        candidates=candidates,
    )
    return wire_metadata.plan_metadata(job.query, built)


class Worker:
    def __init__(
        self,
        compiler: Compiler,
        queue: WorkerQueue,
        builds: BuildRecorder,
        store: RedisPlanStore,
        worker_id: str,
        *,
        pool: BuildPool,
        heartbeat_interval_s: float = 2.0,
        heartbeat_ttl_s: float = 10.0,
        claim_idle_s: float = 60.0,
        max_attempts: int = 3,
        signer: Signer | None = None,
        warm: WarmRunner | None = None,
    ) -> None:
        """`compiler` times plans here; `pool` builds them (it is closed when
        the worker ends); `warm`: builds warming items when nothing else waits."""
        self.compiler = compiler
        self.worker_id = worker_id
        self._queue = queue
        self._builds = builds
        self._store = store
        self._pool = pool
        self._warm = warm
        self._targets = list(dict.fromkeys([compiler.target, compiler.target.generic()]))
        self._interval = heartbeat_interval_s
        self._ttl = heartbeat_ttl_s
        self._claim_idle_ms = int(claim_idle_s * 1000)
        self._max_attempts = max_attempts
        self._signer = signer
        self._stop = threading.Event()
        # Builds this worker holds (building, or waiting for their autotuning),
        # whose leases (and stream entries) the heartbeat thread keeps alive.
        self._held: dict[str, _Build] = {}
        self._held_lock = threading.Lock()
        self._active: dict[str, _Build] = {}  # by build key
        self._lanes: list[
            tuple[int, int, int, int, BuildTask, _Build]
        ] = []  # (lane, build seq, index, task id, task, build): a heap
        self._running: dict[int, tuple[_Build, Lane]] = {}  # task id -> its build
        self.gpu_lost: str | None = None  # why, once its GPU is lost (the worker then ends: see _lose_gpu)
        self._seq = itertools.count()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Serve jobs until stop(), then finish the builds it holds (their
        autotuning included); survives Redis outages by retrying."""
        log.info(
            "worker %s serving targets %s with %d build processes",
            self.worker_id,
            ", ".join(t.id for t in self._targets),
            self._pool.size,
        )
        telemetry.BUILD_PROCESSES.set(self._pool.size)
        beat = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{self.worker_id}", daemon=True)
        beat.start()
        joined = False
        next_reclaim = 0.0
        handed_back = False
        try:
            while not self._stop.is_set() or self._active:
                try:
                    if not joined:
                        self._queue.join(self._targets)
                        joined = True
                    if not self._stop.is_set():
                        next_reclaim = self._intake(next_reclaim)
                        self._warm_up()
                    elif not handed_back:
                        self._hand_back_unstarted()
                        handed_back = True
                    self._dispatch()
                    for result in self._pool.results(timeout=POLL_S if self._running or self._stop.is_set() else 0.0):
                        self._on_result(result)
                        self._dispatch()
                    telemetry.BUSY.set(1 if self._running else 0)
                except StoreUnavailable as e:
                    _faults.warning("store", "worker %s: %s; retrying every second", self.worker_id, e.message)
                    joined = False
                    self._stop.wait(1.0)
        finally:
            self._pool.close()
        try:
            if self._warm is not None:
                self._warm.release_all()
            self._queue.leave(self.worker_id, self._targets)
        except StoreUnavailable:
            pass
        beat.join(timeout=self._interval + 1)

    # ---- taking jobs -------------------------------------------------------------------

    def _intake(self, next_reclaim: float) -> float:
        """New jobs, and jobs of dead workers: read while the heuristic lane
        is short (the rest stay in the stream for other workers). Blocks for
        up to half a second only when nothing else is going on."""
        room = self._pool.size - sum(1 for lane, *_ in self._lanes if lane == Lane.HEURISTIC)
        if room <= 0:
            return next_reclaim
        # Blocks only when nothing else is going on (warming with items left is something).
        idle = not self._active and (self._warm is None or not self._warm.has_work())
        deliveries = self._queue.read(self.worker_id, self._targets, block_ms=500 if idle else None, count=room)
        if not deliveries and time.monotonic() >= next_reclaim:
            # Jobs whose worker died mid-build: its heartbeat expired
            # (at once), or it went silent past claim_idle.
            deliveries = self._queue.reclaim(self.worker_id, self._targets, self._claim_idle_ms)
            next_reclaim = time.monotonic() + RECLAIM_CHECK_S
        for delivery in deliveries:
            self._accept(delivery)
        return next_reclaim

    def _hand_back_unstarted(self) -> None:
        """Stopping: jobs taken but not started go back to their stream for
        the next worker, warming items to their plan (the builds under way are finished)."""
        unstarted = [build for lane, *_, build in self._lanes if lane in (Lane.HEURISTIC, Lane.WARM_HEURISTIC)]
        self._lanes = [entry for entry in self._lanes if entry[0] not in (Lane.HEURISTIC, Lane.WARM_HEURISTIC)]
        heapq.heapify(self._lanes)
        for build in unstarted:
            log.info("job %s: handed back unstarted (this worker is stopping)", build.job.job_id)
            for delivery in self._deliveries(build):
                self._queue.hand_back(delivery)
            if (
                build.delivery is None
            ):  # warming: the item stays in flight; the next holder of the target's lease builds it
                self._builds.release(build.job.plan_key, build.job.job_id)
            self._forget(build)

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._queue.drain_requested(self.worker_id):
                    log.warning(
                        "worker %s: asked to drain; finishing the builds it holds, then leaving", self.worker_id
                    )
                    self._stop.set()
                    break
                self._queue.heartbeat(self.worker_id, self._targets, self._ttl)
                with self._held_lock:
                    held = list(self._held.values())
                for build in held:
                    self._builds.renew(build.job.plan_key, build.job.job_id)
                    for delivery in self._deliveries(build):
                        self._queue.touch(delivery, self.worker_id)
                if self._warm is not None:
                    self._warm.renew()
            except StoreUnavailable as e:
                log.debug("heartbeat failed: %s", e)
            self._stop.wait(self._interval)

    def _accept(self, delivery: Delivery) -> None:
        job = delivery.job
        if job is None:
            self._queue.ack(delivery)
            return
        try:
            verified = verify_job(job, self._targets)
        except InvalidRequest as e:
            # Anyone who can write to Redis can add a job: it is refused, and
            # the plan it names (its lease, its state) is left alone.
            reason = f"refused job {job.job_id[:64]}: {e.message}"
            log.error("worker %s: %s", self.worker_id, reason)
            telemetry.BUILDS.labels(self.compiler.target.id, "refused").inc()
            self._builds.record_refusal(job.plan_key, self.worker_id, reason)
            self._queue.ack(delivery)
            return
        warming = next(
            (b for b in self._active.values() if b.warm is not None and b.job.plan_key == verified.plan_key), None
        )
        if warming is not None:
            self._promote(warming, delivery)
            return
        stored = self._store.get(job.plan_key)
        if stored is not None and not stored.metadata.provisional:
            log.info("job %s: plan %s already stored", job.job_id, job.plan_key)
            self._builds.finish(job.plan_key, job.job_id, self.worker_id)
            self._queue.ack(delivery)
            return
        if delivery.attempts > self._max_attempts:
            reason = f"gave up after {delivery.attempts - 1} attempts: every worker that took this build stopped answering mid-build"
            log.error("job %s (%s): %s", job.job_id, job.plan_key, reason)
            self._builds.finish(job.plan_key, job.job_id, self.worker_id, error=reason)
            self._queue.ack(delivery)
            return
        if delivery.attempts > 1:
            log.warning(
                "job %s: reclaimed (attempt %d) from a worker that stopped answering", job.job_id, delivery.attempts
            )
        self._builds.mark_running(job.plan_key, job.job_id, self.worker_id)
        self._builds.renew(job.plan_key, job.job_id)
        self._start(
            _Build(
                delivery, job, verified, task_query(verified.spec, job.query.target, verified.options), next(self._seq)
            )
        )

    def _start(self, build: _Build) -> None:
        with self._held_lock:
            self._held[build.key] = build
        self._active[build.key] = build
        self._queue_task(build, build.lanes[0], HEURISTIC, 0)

    # ---- warming: the lowest lanes -------------------------------------------------------

    def _warm_up(self) -> None:
        """Take warming items while no caller's heuristic plan waits or
        builds: one warm heuristic plan queued at a time (it goes before the
        candidates of autotunings, which would otherwise keep warming from
        ever starting during a rollout), fewer in their heuristic phase than
        there are build processes past the first, and at most
        MAX_WARM_BUILDS held (those waiting for their candidates, the lowest
        lane, included). Items that need no build (stored, refused) are
        recorded and the next one taken at once."""
        if self._warm is None:
            return
        if any(lane == Lane.HEURISTIC for lane, *_ in self._lanes) or self._urgent_running():
            self._warm.busy()
            return
        for _ in range(WARM_ITEMS_PER_TURN):
            warm = [b for b in self._active.values() if b.warm is not None and not b.promoted]
            first_phase = sum(1 for b in warm if b.heuristic is None)
            queued = sum(1 for lane, *_ in self._lanes if lane == Lane.WARM_HEURISTIC)
            if queued or first_phase >= max(1, self._pool.size - 1) or len(warm) >= MAX_WARM_BUILDS:
                return
            found = self._warm.next_item()
            if found is None or self._start_warm(*found):
                return

    def _start_warm(self, ref: WarmRef, item: WarmItem) -> bool:
        """True when a build started; False when the item needed none (recorded)."""
        assert self._warm is not None
        job = item.job()
        try:
            verified = verify_job(job, self._targets)
        except InvalidRequest as e:  # a forged or damaged item: recorded, skipped
            self._warm.record(ref, FAILED, f"refused: {e.message}", item.plan_key)
            return False
        stored = self._store.get(job.plan_key)
        if stored is not None and not stored.metadata.provisional:
            self._warm.record(ref, SKIPPED, "already stored", job.plan_key)
            return False
        holder = self._builds.take_lease(job.plan_key, job.job_id)
        if holder is not None and holder.startswith(WARM_JOB_PREFIX):
            self._warm.defer(
                ref
            )  # another warm build of it, maybe of a worker that died: its lease runs out (--build-lease)
            return True
        if holder is not None:
            self._warm.record(ref, SKIPPED, "being built for a caller", job.plan_key)
            return False
        self._builds.mark_running(job.plan_key, job.job_id, self.worker_id)
        log.info(
            "warming %s: item %d, plan %s (%.0f recent hits of the source)",
            ref.target_id,
            ref.index,
            job.plan_key,
            item.hits,
        )
        self._start(
            _Build(
                None,
                job,
                verified,
                task_query(verified.spec, job.query.target, verified.options),
                next(self._seq),
                warm=ref,
            )
        )
        return True

    def _promote(self, build: _Build, delivery: Delivery) -> None:
        """A caller asks for a plan this worker is warming: its pieces move
        to the callers' lanes, and the caller's job ends with it."""
        log.info(
            "job %s: plan %s was being warmed; its build now has a caller",
            delivery.job.job_id if delivery.job else "?",
            build.job.plan_key,
        )
        build.promoted.append(delivery)
        with self._held_lock:
            self._held[build.key] = build
        heuristic, candidate = build.lanes
        mine = [entry for entry in self._lanes if entry[-1] is build]
        self._lanes = [entry for entry in self._lanes if entry[-1] is not build]
        for lane, _, _, _, task, _ in mine:
            self._push(heuristic if lane == Lane.WARM_HEURISTIC else candidate, build, task)
        heapq.heapify(self._lanes)

    # ---- what runs next ------------------------------------------------------------------

    def _queue_task(self, build: _Build, lane: Lane, kind: str, index: int) -> None:
        self._push(lane, build, BuildTask(next(task_ids), kind, build.query, index))

    def _push(self, lane: Lane, build: _Build, task: BuildTask) -> None:
        heapq.heappush(self._lanes, (lane, build.seq, task.index, task.task_id, task, build))

    def _dispatch(self) -> None:
        """Fill the free build processes, lowest lane first. A caller's
        heuristic plan is urgent: it may use any process, the first one
        first, which nothing else uses: the next miss starts at once. While
        one builds, no other piece starts (those under way go on): building
        side by side slowed a first node's heuristic plans by a third on the
        H200 (GPU run 19, bench/startup.py first-compile)."""
        while self._lanes:
            urgent = self._lanes[0][0] == Lane.HEURISTIC
            if not self._pool.free(urgent) or (not urgent and self._urgent_running()):
                return
            lane, *_, task, build = heapq.heappop(self._lanes)
            if build.key not in self._active:
                continue  # abandoned (see _on_result)
            self._running[task.task_id] = (build, Lane(lane))
            self._pool.submit(task, urgent)

    def _urgent_running(self) -> bool:
        return any(lane == Lane.HEURISTIC for _, lane in self._running.values())

    def _on_result(self, result: TaskResult) -> None:
        entry = self._running.pop(result.task.task_id, None)
        if entry is None or entry[0].key not in self._active:
            return
        build, lane = entry
        try:
            self._advance(build, lane, result)
        except StoreUnavailable:
            # Redis stayed away past the retries: this worker lets the job go;
            # it stays pending in its stream, and a worker claims it once idle.
            log.warning("job %s: left to be claimed again (Redis unreachable)", build.job.job_id)
            self._forget(build)
            raise

    def _forget(self, build: _Build) -> None:
        self._active.pop(build.key, None)
        with self._held_lock:
            self._held.pop(build.key, None)

    def _advance(self, build: _Build, lane: Lane, result: TaskResult) -> None:
        task = result.task
        if result.gpu_lost:
            self._lose_gpu(result.error)
            return
        if result.lost:
            key = (task.kind, task.index)
            build.attempts[key] = build.attempts.get(key, 1) + 1
            if build.attempts[key] <= MAX_TASK_ATTEMPTS:
                _faults.warning(
                    "build process died",
                    "job %s: %s; building its %s again (try %d of %d)",
                    build.job.job_id,
                    result.error,
                    _piece(task),
                    build.attempts[key],
                    MAX_TASK_ATTEMPTS,
                )
                self._push(
                    build.lanes[0] if task.kind == HEURISTIC else build.lanes[1],
                    build,
                    dataclasses.replace(task, task_id=next(task_ids)),
                )
                return
            result = dataclasses.replace(
                result, error=f"{result.error}, {MAX_TASK_ATTEMPTS} times", rejected=task.kind == HEURISTIC
            )
        if task.kind == HEURISTIC:
            self._on_heuristic(build, result)
        else:
            self._on_candidate(build, result)

    def _on_heuristic(self, build: _Build, result: TaskResult) -> None:
        job, verified = build.job, build.verified
        if result.heuristic is None:
            reason = result.error or "the build process answered nothing"
            log.info(
                "job %s: %s %s: %s",
                job.job_id,
                "cuDNN rejected" if result.rejected else "could not build",
                job.plan_key,
                reason,
            )
            self._end(build, reason, rejected=result.rejected)
            return
        build.heuristic = heuristic = result.heuristic
        if not tunes(verified.options, heuristic):
            self._store_plan(build, heuristic_plan(heuristic, provisional=False))
            self._end(build, None)
            return
        self._store_plan(build, heuristic_plan(heuristic, provisional=True))
        self._durably(
            f"announcing the provisional plan of {job.plan_key}",
            lambda: self._builds.provisional(job.plan_key, job.job_id, self.worker_id),
        )
        build.built.append(heuristic.chosen)
        build.waiting = {i for i in range(heuristic.count) if i != heuristic.chosen.index}
        for index in sorted(build.waiting):
            self._queue_task(build, build.lanes[1], CANDIDATE, index)

    def _on_candidate(self, build: _Build, result: TaskResult) -> None:
        index = result.task.index
        build.waiting.discard(index)
        plan = result.plan
        if plan is None:
            assert build.heuristic is not None
            plan = dataclasses.replace(
                build.heuristic.chosen,
                index=index,
                blob=b"",
                plan_name=f"plan {index}",
                engine_id=-1,
                error=result.error,
            )
        (build.built if plan.built else build.failed).append(plan)
        if not build.waiting:
            self._finish_tuning(build)

    def _finish_tuning(self, build: _Build) -> None:
        """Every candidate is back: time them here, on the GPU, and store the fastest."""
        heuristic = build.heuristic
        assert heuristic is not None
        job, verified = build.job, build.verified
        built = sorted(build.built, key=lambda p: p.index)
        started = time.perf_counter()
        telemetry.BUSY.set(1)
        try:
            timed = self.compiler.time_plans(verified.spec, verified.options, built)
            others = [p for p in built if p.index != heuristic.chosen.index] + build.failed
            tuned = tuned_plan(
                heuristic, built, timed, build.failed, build_seconds(heuristic, others), time.perf_counter() - started
            )
            reason = (
                None
                if tuned is not None
                else f"none of the {len(built)} candidates that built ran: {timed[0].error if timed else ''}"
            )
        except Exception as e:  # a GPU fault while timing: the heuristic plan stays, final
            if isinstance(gpu_fault(e), GpuLost):
                self._lose_gpu(f"{type(e).__name__}: {str(e)[:500]}")
                return
            log.exception("job %s: timing the candidates failed", job.job_id)
            tuned, reason = None, f"compiler error on worker {self.worker_id}: {type(e).__name__}: {e}"
        if tuned is None:
            self._keep_heuristic(build, heuristic, reason or "")
        else:
            self._store_plan(build, tuned)
        self._end(build, None)

    def _lose_gpu(self, reason: str) -> None:
        """The GPU's CUDA context is gone (an Xid): every build this worker
        holds fails with the reason (nothing is remembered against the
        graphs: a call again builds them), the worker leaves its targets, so
        gateways answer TargetUnavailable for new misses at once, and ends
        (worker_main exits EXIT_GPU_LOST: its supervisor restarts it, which
        succeeds once the GPU answers again)."""
        if self.gpu_lost is not None:
            return
        self.gpu_lost = reason
        held = list(self._active.values())
        _faults.error(
            "gpu lost",
            "worker %s: its GPU was lost (%s): failing the %d build(s) it holds with the reason and leaving; "
            "it starts again once the GPU answers (nvidia-smi; the kernel log names the Xid)",
            self.worker_id,
            reason,
            len(held),
        )
        self._stop.set()
        self._lanes.clear()
        try:  # at once: a gateway must not queue another build for this worker meanwhile
            self._queue.leave(self.worker_id, self._targets)
        except StoreUnavailable:
            pass  # its heartbeat expires on its own (--heartbeat-ttl)
        for build in held:
            self._end(
                build,
                f"the GPU of worker {self.worker_id} was lost while it built this plan ({reason[:300]}): call again; "
                "a worker whose GPU works builds it",
            )

    def _end(self, build: _Build, error: str | None, rejected: bool = False) -> None:
        """Record the job's outcome and let it go."""
        job = build.job
        target_id = self.compiler.target.id
        telemetry.BUILDS.labels(
            target_id,
            "rejected"
            if rejected
            else "failed"
            if error
            else "warmed"
            if build.warm and not build.promoted
            else "built",
        ).inc()
        telemetry.BUILD_SECONDS.labels(target_id).observe(time.monotonic() - build.started)
        if error is None:
            log.info("job %s: built %s in %.2fs", job.job_id, job.plan_key, time.monotonic() - build.started)
        try:
            self._durably(
                f"recording job {job.job_id}",
                lambda: self._builds.finish(job.plan_key, job.job_id, self.worker_id, error=error, rejected=rejected),
            )
            for delivery in self._deliveries(build):
                other = delivery.job
                # A caller's job promoted onto this build: its state too.
                if other is not None and other.job_id != job.job_id:
                    finish = functools.partial(
                        self._builds.finish, other.plan_key, other.job_id, self.worker_id, error=error
                    )
                    self._durably(f"recording job {other.job_id}", finish)
                self._durably(f"acknowledging job {job.job_id}", lambda d=delivery: self._queue.ack(d))  # type: ignore[misc]
            if build.warm is not None and self._warm is not None:
                self._warm.record(build.warm, FAILED if error else BUILT, error or "", job.plan_key)
        finally:
            self._forget(build)

    @staticmethod
    def _deliveries(build: _Build) -> list[Delivery]:
        return [d for d in (build.delivery, *build.promoted) if d is not None]

    def _durably(self, doing: str, step: Callable[[], None]) -> None:
        """Run a step that must not be lost to a Redis blip: retried with
        backoff (0.1 s doubling to 2 s) for up to STORE_RETRY_S."""
        deadline, pause = time.monotonic() + STORE_RETRY_S, 0.1
        while True:
            try:
                step()
                return
            except StoreUnavailable as e:
                if time.monotonic() + pause > deadline:
                    raise
                _faults.warning(
                    "store",
                    "worker %s: %s failed (%s); retrying for up to %.0f s",
                    self.worker_id,
                    doing,
                    e.message,
                    STORE_RETRY_S,
                )
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _store_plan(self, build: _Build, compiled: CompiledPlan) -> None:
        job = build.job
        metadata = plan_metadata(build.verified, compiled, self.worker_id, self.compiler.target.to_proto())
        signature = self._signer.sign(metadata) if self._signer is not None else None
        plan = StoredPlan(blob=compiled.blob, metadata=metadata, signature=signature)
        warmed = build.warm is not None and not build.promoted
        spec = spec_io.to_proto(build.verified.spec)  # what this worker derived the key from
        self._durably(f"storing plan {job.plan_key}", lambda: self._store.put(plan, spec=spec, warmed=warmed))
        log.info(
            "job %s: stored %s plan %s (%d candidates, chose %s, %d bytes)",
            job.job_id,
            "provisional" if compiled.provisional else "final",
            job.plan_key,
            len(compiled.candidates),
            compiled.plan_name,
            len(compiled.blob),
        )

    def _keep_heuristic(self, build: _Build, heuristic: Heuristic, reason: str) -> None:
        log.warning(
            "job %s: autotuning %s failed (%s); the heuristic plan is final",
            build.job.job_id,
            build.job.plan_key,
            reason,
        )
        plan = heuristic_plan(heuristic, provisional=False)
        noted = [dataclasses.replace(c, error=f"autotuning failed: {reason[:500]}") for c in plan.candidates]
        self._store_plan(build, dataclasses.replace(plan, candidates=noted))


def _piece(task: BuildTask) -> str:
    return "heuristic plan" if task.kind == HEURISTIC else f"candidate {task.index}"

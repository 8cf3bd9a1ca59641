"""A compile worker: one per GPU, reading build jobs for its target.

It consumes two streams: the one for its exact target (device name and SM
count included) and the one for its generic target (architecture and
versions only), since any GPU of that kind may build a generic request.
The cuDNN handle is not thread-safe and the frontend holds the GIL, so a
worker builds one job at a time, and a GPU host runs one worker process per
GPU rather than threads.

A build has two phases when it autotunes: cuDNN's heuristic plan (seconds
at most), stored as provisional so that its callers can run at once, then
the autotuning (often much longer). A worker runs every waiting job's first
phase before any job's autotuning: the first node of a new model, asking for
all its plans at once, gets every provisional plan after the heuristic
builds, not after the autotuning of the plans queued before them. Jobs whose
autotuning is deferred stay claimed by the worker (their leases renewed),
so that a worker that dies mid-way hands them to another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from plancache import spec_io
from plancache.canonical import hash_normalized
from plancache.errors import CompileFailed, InvalidRequest, PlanCacheError, StoreUnavailable
from plancache.ops import anchor_family
from plancache.options import CompileOptions
from plancache.plankey import make_key
from plancache.signing import Signer
from plancache.spec import GraphSpec
from plancache.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache.validation import normalize
from plancache_server import metrics
from plancache_server.build_records import BuildRecorder
from plancache_server.compiler import CompiledPlan, Compiler
from plancache_server.jobs import Delivery, Job
from plancache_server.store import RedisPlanStore, StoredPlan
from plancache_server.worker_queue import WorkerQueue

log = logging.getLogger(__name__)

# Exit status of a worker process that ended a build over its time budget.
EXIT_OVER_BUDGET = 4
# How often an idle worker looks for jobs of dead workers.
RECLAIM_CHECK_S = 0.5
# A finished plan is stored through a Redis blip: retried with backoff for
# this long (building it again would cost far more).
STORE_RETRY_S = 60.0


def default_worker_id(device: int) -> str:
    return f"{socket.gethostname()}-{os.getpid()}-gpu{device}"


@dataclass(frozen=True)
class VerifiedJob:
    """A job whose plan key is the one its spec, target and options make,
    for a target this worker builds: what it builds and signs."""

    plan_key: str
    spec: GraphSpec  # normalized by this worker
    target: Target
    options: CompileOptions


@dataclass
class _Build:
    """A job being built: its phases (a generator: resumed for the autotuning)."""

    delivery: Delivery
    job: Job
    verified: VerifiedJob
    phases: Iterator[CompiledPlan]
    started: float = field(default_factory=time.monotonic)
    provisional: CompiledPlan | None = None


def verify_job(job: Job, served: list[Target]) -> VerifiedJob:
    """Derive the job's plan key; a job is data from Redis, not an authority.
    Raises InvalidRequest naming what does not hold."""
    try:
        spec = normalize(spec_io.from_proto(job.query.spec))
        target = Target.from_proto(job.query.target)
        options = CompileOptions.from_proto(job.query.options)
    except PlanCacheError as e:
        raise InvalidRequest(f"its query does not parse: {e.message[:300]}") from e
    if target.id not in {t.id for t in served}:
        raise InvalidRequest(f"it is for target {target.id}, which this worker does not build (it builds {', '.join(t.id for t in served)})")
    derived = make_key(hash_normalized(spec), target, options)
    if derived != job.plan_key:
        raise InvalidRequest(f"it names plan {job.plan_key[:300]} but its spec, target and options make plan {derived}")
    return VerifiedJob(derived, spec, target, options)


def plan_metadata(job: VerifiedJob, compiled: CompiledPlan, worker_id: str, built_on: pb.Target) -> pb.PlanMetadata:
    """Everything a client needs to execute the blob without the spec."""
    spec = spec_io.to_proto(job.spec)
    bindings = [
        pb.TensorBinding(
            uid=t.uid, name=t.name, dim=t.dim, stride=t.stride, data_type=t.data_type, is_output=t.is_output,
            is_pass_by_value=t.is_pass_by_value,
            scalar_value=t.scalar_value if t.HasField("scalar_value") else None, ragged_offset_uid=t.ragged_offset_uid,
        )
        for t in sorted(spec.tensors, key=lambda t: t.uid)
        if not t.is_virtual
    ]  # fmt: skip
    return pb.PlanMetadata(
        key=job.plan_key,
        spec_hash=job.plan_key.split("/", 1)[0],
        target=built_on,
        options=job.options.to_proto(),
        tensors=bindings,
        workspace_size=compiled.workspace_size,
        engine_id=compiled.engine_id,
        knobs=[pb.Knob(name=k, value=v) for k, v in sorted(compiled.knobs.items())],
        plan_name=compiled.plan_name,
        engine_kind=pb.ENGINE_KIND_PYTHON if compiled.is_python_engine else pb.ENGINE_KIND_BACKEND,
        candidates=[
            pb.CandidateTiming(index=c.index, plan_name=c.plan_name, engine_id=c.engine_id, median_ms=c.median_ms, error=c.error, timing=c.timing)
            for c in compiled.candidates
        ],
        build_seconds=compiled.build_seconds,
        autotune_seconds=compiled.autotune_seconds,
        blob_sha256=hashlib.sha256(compiled.blob).hexdigest(),
        blob_size=len(compiled.blob),
        created_at=time.time(),
        built_by=worker_id,
        provisional=compiled.provisional,
        op_family=anchor_family([n.op for n in job.spec.nodes]),
    )


class Worker:
    def __init__(
        self,
        compiler: Compiler,
        queue: WorkerQueue,
        builds: BuildRecorder,
        store: RedisPlanStore,
        worker_id: str,
        heartbeat_interval_s: float = 2.0,
        heartbeat_ttl_s: float = 10.0,
        claim_idle_s: float = 60.0,
        max_attempts: int = 3,
        signer: Signer | None = None,
        build_budget_s: float | None = None,
        on_over_budget: Callable[[], None] | None = None,
    ) -> None:
        self.compiler = compiler
        self.worker_id = worker_id
        self._queue = queue
        self._builds = builds
        self._store = store
        self._targets = list(dict.fromkeys([compiler.target, compiler.target.generic()]))
        self._interval = heartbeat_interval_s
        self._ttl = heartbeat_ttl_s
        self._claim_idle_ms = int(claim_idle_s * 1000)
        self._max_attempts = max_attempts
        self._signer = signer
        # A build cannot be interrupted inside cuDNN: past its budget the job
        # is failed and the worker process ends (its supervisor starts a new one).
        self._build_budget_s = build_budget_s
        self._on_over_budget = on_over_budget or (lambda: os._exit(EXIT_OVER_BUDGET))
        self._stop = threading.Event()
        # Jobs this worker holds (building, or waiting for their autotuning),
        # kept alive by the heartbeat thread.
        self._held: dict[str, Delivery] = {}
        self._held_lock = threading.Lock()
        # Jobs whose provisional plan is stored, oldest first: tuned when no job waits.
        self._tunings: deque[_Build] = deque()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Serve jobs until stop(), then finish the autotuning of the jobs it
        holds; survives Redis outages by retrying."""
        log.info("worker %s serving targets %s", self.worker_id, ", ".join(t.id for t in self._targets))
        beat = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{self.worker_id}", daemon=True)
        beat.start()
        joined = False
        next_reclaim = 0.0
        while not self._stop.is_set() or self._tunings:
            try:
                if not joined:
                    self._queue.join(self._targets)
                    joined = True
                deliveries: list[Delivery] = []
                if not self._stop.is_set():
                    # A deferred autotuning waits only for jobs already queued: no blocking read then.
                    deliveries = self._queue.read(self.worker_id, self._targets, block_ms=None if self._tunings else 500)
                    if not deliveries and time.monotonic() >= next_reclaim:
                        # Jobs whose worker died mid-build: its heartbeat expired
                        # (at once), or it went silent past claim_idle.
                        deliveries = self._queue.reclaim(self.worker_id, self._targets, self._claim_idle_ms)
                        next_reclaim = time.monotonic() + RECLAIM_CHECK_S
                for delivery in deliveries:
                    self._handle(delivery)
                if not deliveries and self._tunings:
                    self._advance(self._tunings.popleft(), until_provisional=False)
            except StoreUnavailable as e:
                log.warning("worker %s: %s; retrying in 1s", self.worker_id, e)
                joined = False
                self._stop.wait(1.0)
        try:
            self._queue.leave(self.worker_id, self._targets)
        except StoreUnavailable:
            pass
        beat.join(timeout=self._interval + 1)

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._queue.drain_requested(self.worker_id):
                    log.warning("worker %s: asked to drain; finishing the current build, then leaving", self.worker_id)
                    self._stop.set()
                    break
                self._queue.heartbeat(self.worker_id, self._targets, self._ttl)
                with self._held_lock:
                    held = list(self._held.values())
                for delivery in held:
                    if delivery.job is not None:
                        self._builds.renew(delivery.job.plan_key, delivery.job.job_id)
                        self._queue.touch(delivery, self.worker_id)
            except StoreUnavailable as e:
                log.debug("heartbeat failed: %s", e)
            self._stop.wait(self._interval)

    def _handle(self, delivery: Delivery) -> None:
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
            metrics.BUILDS.labels(self.compiler.target.id, "refused").inc()
            self._builds.record_refusal(job.plan_key, self.worker_id, reason)
            self._queue.ack(delivery)
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
            log.warning("job %s: reclaimed (attempt %d) from a worker that stopped answering", job.job_id, delivery.attempts)
        self._builds.mark_running(job.plan_key, job.job_id, self.worker_id)
        self._builds.renew(job.plan_key, job.job_id)
        with self._held_lock:
            self._held[delivery.entry_id] = delivery
        build = _Build(delivery, job, verified, iter(self.compiler.compile_phases(verified.spec, verified.options)))
        self._advance(build, until_provisional=True)

    def _advance(self, build: _Build, until_provisional: bool) -> None:
        """Run the build's next phases: up to its provisional plan (then it
        waits in _tunings), or to the end (then the job is recorded and
        acknowledged)."""
        watchdog = self._watchdog(build.delivery, build.job)
        metrics.BUSY.set(1)
        try:
            outcome = self._run_phases(build, until_provisional)
        except BaseException:  # e.g. Redis gone past the retries: no more renewals, another worker reclaims it
            self._release(build.delivery)
            raise
        finally:
            metrics.BUSY.set(0)
            if watchdog is not None:
                watchdog.cancel()
        if outcome is None:
            self._tunings.append(build)
            return
        error, rejected = outcome
        job, delivery = build.job, build.delivery
        target_id = self.compiler.target.id
        metrics.BUILDS.labels(target_id, "rejected" if rejected else "failed" if error else "built").inc()
        metrics.BUILD_SECONDS.labels(target_id).observe(time.monotonic() - build.started)
        try:
            self._durably(f"recording job {job.job_id}", lambda: self._builds.finish(job.plan_key, job.job_id, self.worker_id, error=error, rejected=rejected))
            self._durably(f"acknowledging job {job.job_id}", lambda: self._queue.ack(delivery))
        finally:
            self._release(delivery)

    def _release(self, delivery: Delivery) -> None:
        with self._held_lock:
            self._held.pop(delivery.entry_id, None)

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
                log.warning("worker %s: %s failed (%s); retrying in %.1f s", self.worker_id, doing, e.message, pause)
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _watchdog(self, delivery: Delivery, job: Job) -> threading.Timer | None:
        if self._build_budget_s is None:
            return None

        def over_budget() -> None:
            reason = f"the build ran past its time budget of {self._build_budget_s:g} s (--build-budget) on worker {self.worker_id}"
            log.error("job %s (%s): %s; ending this worker process", job.job_id, job.plan_key, reason)
            try:
                # Remembered like a rejection: building it again would end another worker.
                self._builds.finish(job.plan_key, job.job_id, self.worker_id, error=reason, rejected=True)
                self._queue.ack(delivery)
            finally:
                self._on_over_budget()

        timer = threading.Timer(self._build_budget_s, over_budget)
        timer.daemon = True
        timer.start()
        return timer

    def _run_phases(self, build: _Build, until_provisional: bool) -> tuple[str | None, bool] | None:
        """Compile and store the build's plans: None when it stopped at its
        provisional plan, else (failure reason or None, whether cuDNN
        rejected the graph, as opposed to the worker failing).

        With autotuning, cuDNN's heuristic plan is stored first, marked
        provisional, and announced, so that the job's callers have a plan
        at once; the autotuned plan then replaces it under the same key. If
        autotuning fails, the heuristic plan is stored again as final (with
        the reason among its candidates): callers are not left waiting for a
        tuned plan that will not come."""
        job, verified = build.job, build.verified
        try:
            for compiled in build.phases:
                self._store_plan(job, verified, compiled)
                if compiled.provisional:
                    build.provisional = compiled
                    self._durably(
                        f"announcing the provisional plan of {job.plan_key}", lambda: self._builds.provisional(job.plan_key, job.job_id, self.worker_id)
                    )
                    if until_provisional:
                        return None
        except CompileFailed as e:
            if build.provisional is not None:
                return self._keep_heuristic(job, verified, build.provisional, e.message)
            log.info("job %s: cuDNN rejected %s: %s", job.job_id, job.plan_key, e.message)
            return e.message, True
        except PlanCacheError as e:
            if build.provisional is not None:
                return self._keep_heuristic(job, verified, build.provisional, e.message)
            log.warning("job %s: %s", job.job_id, e.message)
            return e.message, False
        except Exception as e:  # a bug or a GPU fault: report it, keep serving
            log.exception("job %s: compiler crashed", job.job_id)
            reason = f"compiler error on worker {self.worker_id}: {type(e).__name__}: {e}"
            if build.provisional is not None:
                return self._keep_heuristic(job, verified, build.provisional, reason)
            return reason, False
        log.info("job %s: built %s in %.2fs", job.job_id, job.plan_key, time.monotonic() - build.started)
        return None, False

    def _store_plan(self, job: Job, verified: VerifiedJob, compiled: CompiledPlan) -> None:
        metadata = plan_metadata(verified, compiled, self.worker_id, self.compiler.target.to_proto())
        signature = self._signer.sign(metadata) if self._signer is not None else None
        self._durably(f"storing plan {job.plan_key}", lambda: self._store.put(StoredPlan(blob=compiled.blob, metadata=metadata, signature=signature)))
        log.info(
            "job %s: stored %s plan %s (%d candidates, chose %s, %d bytes)", job.job_id, "provisional" if compiled.provisional else "final",
            job.plan_key, len(compiled.candidates), compiled.plan_name, len(compiled.blob),
        )  # fmt: skip

    def _keep_heuristic(self, job: Job, verified: VerifiedJob, heuristic: CompiledPlan, reason: str) -> tuple[str | None, bool]:
        log.warning("job %s: autotuning %s failed (%s); the heuristic plan is final", job.job_id, job.plan_key, reason)
        noted = [dataclasses.replace(c, error=f"autotuning failed: {reason[:500]}") for c in heuristic.candidates]
        self._store_plan(job, verified, dataclasses.replace(heuristic, provisional=False, candidates=noted))
        return None, False

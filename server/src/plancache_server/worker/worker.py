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
a time, on the GPU. What runs next is decided by lane
(plancache_server.worker.lanes): a heuristic build (someone waits for it)
before any candidate of an autotuning, and one process is kept for
heuristic builds alone, so a miss never waits behind autotuning: its
heuristic build starts at once, or as soon as the one before it ends. Jobs
whose autotuning is under way stay claimed by the worker (their leases
renewed by its heartbeat), so that a worker that dies mid-way hands them to
another, which builds them again.

The worker keeps its loop and its decisions here; how it takes jobs is
plancache_server.worker.job_intake, warming items
plancache_server.worker.warm_intake, and what it writes of a build
plancache_server.worker.outcomes.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time

from plancache.errors import StoreUnavailable
from plancache.trust.signing import Signer
from plancache_server import telemetry
from plancache_server.store.build_records import BuildRecorder
from plancache_server.store.jobs import Delivery
from plancache_server.store.plans import RedisPlanStore
from plancache_server.store.warming import SKIPPED
from plancache_server.worker.build_pool import BuildPool
from plancache_server.worker.build_tasks import CANDIDATE, HEURISTIC, BuildTask, TaskResult, task_ids
from plancache_server.worker.compiler import CompiledPlan, Compiler
from plancache_server.worker.compiler.base import BuiltPlan, Heuristic, build_seconds, heuristic_plan, tuned_plan, tunes
from plancache_server.worker.compiler.faults import GpuLost, gpu_fault
from plancache_server.worker.heartbeat import Heartbeat
from plancache_server.worker.held_builds import Build, HeldBuilds
from plancache_server.worker.job_intake import JobIntake
from plancache_server.worker.lanes import (
    TUNING_LANES,
    YIELD_WAIT_CAP_S,
    Lane,
    Lanes,
    QueuedPiece,
    TuningGate,
    YieldGate,
)
from plancache_server.worker.outcomes import BuildOutcomes
from plancache_server.worker.warm_intake import WarmIntake
from plancache_server.worker.warm_runner import WarmRunner
from plancache_server.worker.worker_log import faults, log
from plancache_server.worker.worker_queue import WorkerQueue

# How long the loop waits for a build piece to end before it looks for new
# jobs again (a non-blocking read): the delay a new job sees while pieces
# build (GPU run 19: 50 ms of it, a few percent of a first node's graphs).
POLL_S = 0.005
# Seconds a worker with nothing to do waits on its job stream at a time.
IDLE_BLOCK_S = 0.5
# Tries of one piece whose build process died (a crash, the OOM killer).
MAX_TASK_ATTEMPTS = 3


def beside_callers(setting: int, pool_size: int) -> int:
    """Warming's first plans that may build beside a caller's miss: never on
    the first process (the next miss's), so at most the processes past it;
    -1: half of those (on the H200's 8 processes, 3), so that a caller's
    second and third concurrent misses still find idle processes."""
    past_first = max(0, pool_size - 1)
    return past_first // 2 if setting < 0 else min(setting, past_first)


def default_worker_id(device: int) -> str:
    return f"{socket.gethostname()}-{os.getpid()}-gpu{device}"


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
        tune_after_quiet_s: float = 0.0,
        warm_beside_callers: int = -1,
        hedged_quiet_s: float = 0.0,
        hedged_hold_max_s: float = YIELD_WAIT_CAP_S,
    ) -> None:
        """`compiler` times plans here; `pool` builds them (it is closed when
        the worker ends); `warm`: builds warming items when nothing else waits;
        `tune_after_quiet_s`: candidates wait this long after a caller's
        heuristic plan started (TuningGate); `warm_beside_callers`: warming's
        first plans that may build while a caller's miss builds (-1: half the
        processes past the first; see beside_callers); `hedged_quiet_s`: builds
        for callers that build them themselves wait until no such job came
        for this long (YieldGate; 0: no wait; the deployments' default is the
        setting's, --hedged-quiet), each at most `hedged_hold_max_s` after it was
        taken (--hedged-hold-max)."""
        self.compiler = compiler
        self.worker_id = worker_id
        self._queue = queue
        self._pool = pool
        self._warm = warm
        self._targets = list(dict.fromkeys([compiler.target, compiler.target.generic()]))
        self._interval = heartbeat_interval_s
        self._stop = threading.Event()
        # Builds this worker holds (building, or waiting for their autotuning),
        # whose leases (and stream entries) the heartbeat thread keeps alive.
        self._held = HeldBuilds()
        self._lanes = Lanes()
        self._tuning = TuningGate(tune_after_quiet_s)
        self._yielding = YieldGate(hedged_quiet_s, cap_s=hedged_hold_max_s)
        self._warm_beside = beside_callers(warm_beside_callers, pool.size)
        self._running: dict[int, QueuedPiece] = {}  # by task id: the pieces building
        self.gpu_lost: str | None = None  # why, once its GPU is lost (the worker then ends: see _lose_gpu)
        self._jobs = JobIntake(
            queue, builds, store, worker_id, compiler.target, self._targets, claim_idle_s, max_attempts
        )
        self._outcomes = BuildOutcomes(store, builds, queue, worker_id, compiler.target, signer, warm)
        self._warm_intake = (
            WarmIntake(warm, store, builds, worker_id, self._targets, pool.size, self._warm_beside)
            if warm is not None
            else None
        )
        self._heartbeat = Heartbeat(
            queue, builds, self._held, warm, worker_id, self._targets, heartbeat_interval_s, heartbeat_ttl_s, self._stop
        )

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
        beat = self._heartbeat.start()
        joined = False
        handed_back = False
        try:
            while not self._stop.is_set() or self._held:
                try:
                    if not joined:
                        self._queue.join(self._targets)
                        joined = True
                    waited = False
                    if not self._stop.is_set():
                        # Warming first, then jobs: taken only after the intake, warming waited for an idle
                        # spell as long as the intake's block (IDLE_BLOCK_S), and a program missing more often
                        # than that (a sweep through a graph family's sizes) starved the family it was asking
                        # for until it ended (GPU run 29, issue 43). A caller's job still goes first: its
                        # plan takes the first build process, which warming never uses.
                        self._warm_up()
                        waited = self._intake()
                        self._warm_up()
                    elif not handed_back:
                        # The builds under way are finished.
                        self._jobs.hand_back(self._lanes.take_unstarted(), self._held)
                        handed_back = True
                    self._dispatch()
                    waits = self._running or self._stop.is_set() or (self._held_back() and not waited)
                    for result in self._pool.results(timeout=POLL_S if waits else 0.0):
                        self._on_result(result)
                        self._dispatch()
                    telemetry.BUSY.set(1 if self._running else 0)
                    telemetry.YIELDING.set(self._lanes.count(Lane.YIELDING))
                except StoreUnavailable as e:
                    faults.warning("store", "worker %s: %s; retrying every second", self.worker_id, e.message)
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

    def _intake(self) -> bool:
        """New jobs, and jobs of dead workers: read while the heuristic lane
        is short (the rest stay in the stream for other workers). Blocks for
        up to half a second when nothing else is going on, and while only
        autotuning waits (TuningGate) until its wait ends: a new job ends
        either at once. Whether it waited."""
        room = self._pool.size - self._lanes.count(Lane.HEURISTIC)
        if room <= 0:
            return False
        # Blocks only when nothing else is going on (warming with items left is something).
        idle = not self._held and (self._warm is None or not self._warm.has_work())
        held_back = not idle and not self._running and self._held_back()
        block_s = IDLE_BLOCK_S if idle else self._held_back_s() if held_back else None
        self._jobs.take(room, block_s, self._held, self._start, self._promote)
        return block_s is not None

    def _held_back(self) -> bool:
        """Whether a piece waits for a gate (TuningGate, YieldGate): the loop polls for the end of its wait."""
        return self._tuning.waiting or self._yielding.waiting

    def _held_back_s(self) -> float:
        """Seconds until a piece held back by a gate may start."""
        waits = [gate.remaining_s() for gate in (self._tuning, self._yielding) if gate.waiting]
        return min(waits, default=0.0)

    def _start(self, build: Build) -> None:
        self._held.add(build)
        if build.yielding:
            self._yielding.asked()
        self._queue_task(build, build.lanes[0], HEURISTIC, 0)

    def _warm_up(self) -> None:
        """Warming items, in the lowest lanes; while a caller's heuristic plan
        waits or builds, only as many as may build beside it (WarmIntake.take)."""
        if self._warm_intake is not None:
            callers = self._lanes.count(Lane.HEURISTIC) + self._running_in(Lane.HEURISTIC)
            self._warm_intake.take(self._lanes, self._held, callers, self._start)

    def _promote(self, build: Build, delivery: Delivery) -> None:
        """A caller waits for a plan this worker is warming, or building for
        callers that build it themselves (yielding): its pieces move to the
        callers' lanes, and the caller's job ends with it."""
        log.info(
            "job %s: plan %s was being %s; its build now has a caller that waits for it",
            delivery.job.job_id if delivery.job else "?",
            build.job.plan_key,
            "warmed" if build.warming else "built for callers building it themselves" if build.yielding else "built",
        )
        build.promoted.append(delivery)
        self._lanes.relane(build)

    # ---- what runs next ------------------------------------------------------------------

    def _queue_task(self, build: Build, lane: Lane, kind: str, index: int) -> None:
        self._lanes.push(lane, build, BuildTask(next(task_ids), kind, build.query, index))

    def _dispatch(self) -> None:
        """Fill the free build processes, lowest lane first. A caller's
        heuristic plan is urgent: it may use any process, the first one
        first, which nothing else uses: the next miss starts at once. While
        one builds, no other piece starts (those under way go on): building
        side by side slowed a first node's heuristic plans by a third on the
        H200 (GPU run 19, bench/startup.py first-compile). Except warming's
        first plans, up to `warm_beside_callers` of them: a program sweeping
        a family's sizes misses back to back, and its family, built only in
        the pauses, was ready after it ended (GPU run 30, issue 43)."""
        while self._lanes:
            lane = self._lanes.next_lane()
            past_yielding = False
            if lane is not None and self._yielding.holds(lane, self._lanes.peek().build.started):
                # Callers build their own graphs now (hedged misses): their builds wait, and autotuning with
                # them; warming's first plans go past (a family the program sweeps: its next sizes' hits).
                if lane != Lane.YIELDING or not self._lanes.count(Lane.WARM_HEURISTIC):
                    return
                lane, past_yielding = Lane.WARM_HEURISTIC, True
            urgent = lane == Lane.HEURISTIC
            if not self._pool.free(urgent):
                return
            if not urgent and self._urgent_running() and not self._may_build_beside(lane):
                return
            if lane is not None and self._tuning.holds(lane):  # autotuning waits for callers' misses to pause
                return
            piece = self._lanes.pop_first_of(Lane.WARM_HEURISTIC) if past_yielding else self._lanes.pop()
            if not self._held.holds(piece.build):
                continue  # abandoned (see _on_result)
            if piece.task.kind == HEURISTIC and not self._jobs.may_start(piece.build):
                # Its callers all left while it waited here, or another worker stored or started it: not built.
                if piece.build.warm is not None and self._warm is not None:
                    self._warm.record(
                        piece.build.warm, SKIPPED, "built for a caller by another worker", piece.build.job.plan_key
                    )
                self._held.forget(piece.build)
                continue
            self._running[piece.task.task_id] = piece
            self._pool.submit(piece.task, urgent)
            if urgent:
                self._tuning.urgent_started()
            elif piece.lane in TUNING_LANES:
                self._tuning.released()

    def _urgent_running(self) -> bool:
        return self._running_in(Lane.HEURISTIC) > 0

    def _running_in(self, lane: Lane) -> int:
        return sum(1 for piece in self._running.values() if piece.lane == lane)

    def _may_build_beside(self, lane: Lane | None) -> bool:
        """Whether a piece of `lane` may start while a caller's heuristic plan builds."""
        return lane == Lane.WARM_HEURISTIC and self._running_in(Lane.WARM_HEURISTIC) < self._warm_beside

    def _on_result(self, result: TaskResult) -> None:
        piece = self._running.pop(result.task.task_id, None)
        if piece is None or not self._held.holds(piece.build):
            return
        build = piece.build
        try:
            self._advance(build, result)
        except StoreUnavailable:
            # Redis stayed away past the retries: this worker lets the job go;
            # it stays pending in its stream, and a worker claims it once idle.
            log.warning("job %s: left to be claimed again (Redis unreachable)", build.job.job_id)
            self._held.forget(build)
            raise

    def _advance(self, build: Build, result: TaskResult) -> None:
        task = result.task
        if result.gpu_lost:
            self._lose_gpu(result.error)
            return
        if result.lost:
            key = (task.kind, task.index)
            build.attempts[key] = build.attempts.get(key, 1) + 1
            if build.attempts[key] <= MAX_TASK_ATTEMPTS:
                faults.warning(
                    "build process died",
                    "job %s: %s; building its %s again (try %d of %d)",
                    build.job.job_id,
                    result.error,
                    _piece(task),
                    build.attempts[key],
                    MAX_TASK_ATTEMPTS,
                )
                self._lanes.push(
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

    def _on_heuristic(self, build: Build, result: TaskResult) -> None:
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
            self._outcomes.store_plan(build, heuristic_plan(heuristic, provisional=False))
            self._end(build, None)
            return
        self._outcomes.store_plan(build, heuristic_plan(heuristic, provisional=True))
        self._outcomes.announce_provisional(build)
        build.built.append(heuristic.chosen)
        build.waiting = {i for i in range(heuristic.count) if i != heuristic.chosen.index}
        for index in sorted(build.waiting):
            self._queue_task(build, build.lanes[1], CANDIDATE, index)

    def _on_candidate(self, build: Build, result: TaskResult) -> None:
        index = result.task.index
        build.waiting.discard(index)
        plan = result.plan
        if plan is None:
            assert build.heuristic is not None
            plan = _unbuilt(build.heuristic, index, result.error)
        (build.built if plan.built else build.failed).append(plan)
        if not build.waiting:
            self._finish_tuning(build)

    def _finish_tuning(self, build: Build) -> None:
        """Every candidate is back: time them here, on the GPU, and store the fastest."""
        heuristic = build.heuristic
        assert heuristic is not None
        telemetry.BUSY.set(1)
        try:
            tuned, reason = _timed(self.compiler, build, heuristic)
        except Exception as e:  # a GPU fault while timing: the heuristic plan stays, final
            if isinstance(gpu_fault(e), GpuLost):
                self._lose_gpu(f"{type(e).__name__}: {str(e)[:500]}")
                return
            log.exception("job %s: timing the candidates failed", build.job.job_id)
            tuned, reason = None, f"compiler error on worker {self.worker_id}: {type(e).__name__}: {e}"
        if tuned is None:
            self._outcomes.keep_heuristic(build, heuristic, reason or "")
        else:
            self._outcomes.store_plan(build, tuned, replacing=True)
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
        held = self._held.all()
        faults.error(
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

    def _end(self, build: Build, error: str | None, rejected: bool = False) -> None:
        """Record the job's outcome and let it go."""
        try:
            self._outcomes.end(build, error, rejected)
        finally:
            self._held.forget(build)


def _timed(compiler: Compiler, build: Build, heuristic: Heuristic) -> tuple[CompiledPlan | None, str | None]:
    """The build's candidates timed on this GPU: the tuned plan, or why there is none."""
    built = sorted(build.built, key=lambda p: p.index)
    started = time.perf_counter()
    timed = compiler.time_plans(build.verified.query, built)
    others = [p for p in built if p.index != heuristic.chosen.index] + build.failed
    tuned = tuned_plan(
        heuristic, built, timed, build.failed, build_seconds(heuristic, others), time.perf_counter() - started
    )
    if tuned is not None:
        return tuned, None
    return None, f"none of the {len(built)} candidates that built ran: {timed[0].error if timed else ''}"


def _unbuilt(heuristic: Heuristic, index: int, error: str) -> BuiltPlan:
    """A candidate whose build process answered no plan, with why."""
    return dataclasses.replace(
        heuristic.chosen, index=index, blob=b"", plan_name=f"plan {index}", engine_id=-1, error=error
    )


def _piece(task: BuildTask) -> str:
    return "heuristic plan" if task.kind == HEURISTIC else f"candidate {task.index}"

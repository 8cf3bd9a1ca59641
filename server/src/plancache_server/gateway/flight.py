"""The flight of one build on a gateway: every caller waiting for one plan
key, and the one task that takes the key's build from its lease to its
outcome.

The task takes the key's build lease and queues the job, or finds the lease
and follows that job; one follower watches the job (woken by the workers'
announcement, re-checking every half second in case one is lost) and reads
the finished plan once. When the build finishes, its plan is handed to at
most DELIVERY_SLOTS callers of the gateway at a time, each holding its slot
until its response is written (or SLOT_HOLD_S has passed): a plan fanning
out to thousands of callers never fills the event loop's queue, so a hit
arriving meanwhile waits for a few writes, not for all of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from plancache.errors import (
    CompileFailed,
    CompileTimeout,
    IntegrityError,
    PlanCacheError,
    ResourceExhausted,
    TargetUnavailable,
    Unavailable,
)
from plancache.keys.target import Target
from plancache.log_limits import LogLimiter
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.build_states import BuildStates
from plancache_server.gateway.completions import CompletionWatcher
from plancache_server.gateway.refusals import RefusedBuilds
from plancache_server.gateway.shares import QueueSlots
from plancache_server.store.build_records import (
    ABANDONED,
    DONE,
    FAILED,
    PROVISIONAL,
    QUEUED,
    RUNNING,
    WANTED_TTL_S,
)
from plancache_server.store.jobs import Job, JobQueue
from plancache_server.store.plans import PlanStore, StoredPlan
from plancache_server.store.warming import WARM_JOB_PREFIX

log = logging.getLogger(__name__)
# Every flight meets a Redis outage twice a second: one line a minute says it.
_faults = LogLimiter(log)

RECHECK_S = 0.5
# Finished builds being written to their callers at once, per gateway, and
# how long one caller may hold its slot: a caller that does not read keeps
# its own response pending in gRPC, and holds up the others for at most this.
DELIVERY_SLOTS = 16
SLOT_HOLD_S = 0.02
# A flight checks that its target still has a live worker every this many
# re-checks (2 s), and gives up once none was seen for WORKERLESS_S: longer
# than a worker's restart (a deploy: the job stays queued for it), far
# shorter than a default deadline (--compile-timeout, 900 s).
WORKER_RECHECK_EVERY = 4
WORKERLESS_S = 30.0
# Re-reads of a finished build's plan, not found, before its waiters are
# told that it is gone (deleted or evicted between its store and its read).
GONE_RECHECKS = 4
# A flight whose job has been queued this long looks for it in its stream (JobQueue.holds), and again this often;
# a job in no stream (lost with a failed-over master's last writes) or with no state left is queued again, once.
LOST_CHECK_S = 5.0
# A flight says again that its callers wait for its job this often (the claim lasts WANTED_TTL_S): a job
# whose callers all left, or whose gateway died, is dropped by the worker that takes it
# (plancache_server.store.build_records.TAKE_IF_WANTED).
WANT_RENEW_S = WANTED_TTL_S / 5


def _unannounced(plan: StoredPlan, ours: str | None) -> bool:
    """Whether `plan` may be one our job is storing and has not announced yet: found while the job is queued or
    running, or a tuned plan found while it has announced only its provisional one."""
    return ours in (QUEUED, RUNNING) or (ours == PROVISIONAL and not plan.provisional)


@dataclass(frozen=True)
class FlightCrew:
    """What every flight of one gateway shares."""

    store: PlanStore
    queue: JobQueue
    states: BuildStates
    refusals: RefusedBuilds
    watcher: CompletionWatcher
    delivery_slots: asyncio.Semaphore
    # Each caller's builds in the shared build queue (plancache_server.gateway.shares); how long one waits for
    # a slot, and the retry delay of a refusal. None: not bounded.
    queue_slots: QueueSlots | None = None
    queue_wait_s: float = 900.0
    retry_delay_s: float = 1.0
    # --store-replicas: a plan our job is storing is given to its waiters once the job says so (the worker says it
    # once the replicas hold it), not as soon as the master has it.
    announced_only: bool = False
    # Short tasks the gateway's flights start and nobody awaits (a claim taken back, a build hurried): kept from
    # the garbage collector here, and ended by the gateway's close (Builds.close), not destroyed with its loop.
    errands: set[asyncio.Task[None]] = field(default_factory=set)

    def run_errand(self, errand: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(errand, name=name)
        self.errands.add(task)
        task.add_done_callback(self.errands.discard)

    async def end_errands(self) -> None:
        """Cancel the errands under way and wait for them to end."""
        errands = list(self.errands)
        for errand in errands:
            errand.cancel()
        await asyncio.gather(*errands, return_exceptions=True)


class Waiter:
    """One caller waiting for one flight: `future` resolves to the plan or
    to the build's error. `leave(waiter)` takes it off its flight, once."""

    def __init__(self, flight: Flight, leave: Callable[[Waiter], None], tuned_only: bool = False) -> None:
        self._leave = leave
        self.flight = flight
        self.tuned_only = tuned_only  # waits past a provisional plan
        self.future: asyncio.Future[StoredPlan] = asyncio.get_running_loop().create_future()
        self.started = False  # this caller's call queued the build
        self.caller = ""  # whose share the wait is charged to (plancache_server.gateway.shares)
        self._released = False
        self._slot: tuple[asyncio.Semaphore, asyncio.TimerHandle] | None = None

    @property
    def plan_key(self) -> str:
        return self.flight.plan_key

    async def result(self, deadline: float) -> StoredPlan:
        """The plan once built; CompileFailed with cuDNN's reason; CompileTimeout."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.future), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise self.timeout() from None

    def timeout(self) -> PlanCacheError:
        if self.flight.waiting_for_turn:
            return ResourceExhausted(
                f"plan {self.plan_key} was not queued: the builds this caller already has in the build queue "
                "fill its share of it (--caller-queued), and within this call's deadline none of them ended with "
                "the queue free of other callers' builds (a build past a caller's share waits for that): "
                "call again later",
                retry_after=self.flight.retry_delay_s,
            )
        return CompileTimeout(
            f"plan {self.plan_key} is still building (job {self.flight.job_id}); the build continues and its plan "
            "will be stored: call again later"
        )

    def hold(self, slots: asyncio.Semaphore) -> None:
        """Hold a delivery slot (taken) until delivered(), at most SLOT_HOLD_S."""
        self._slot = (slots, asyncio.get_running_loop().call_later(SLOT_HOLD_S, self.delivered))

    def delivered(self) -> None:
        """The caller's response is written: its delivery slot goes to the next."""
        if self._slot is not None:
            slots, timer = self._slot
            self._slot = None
            timer.cancel()
            slots.release()

    def release(self) -> None:
        """This caller stops waiting (answered, gave up or went away)."""
        self.delivered()
        if not self._released:
            self._released = True
            self._leave(self)


class Flight:
    """Every caller on this gateway waiting for one plan key. `forget(flight)`
    takes it out of the gateway's flights once it is settled or given up:
    later callers find the plan in the store, or start anew."""

    def __init__(self, plan_key: str, crew: FlightCrew, forget: Callable[[Flight], None]) -> None:
        self.plan_key = plan_key
        # Done once the job id is known (this gateway queued it, or found it);
        # carries the error that kept it from being queued.
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.job_id = ""
        self.started = False  # this gateway queued the build
        self.waiters: list[Waiter] = []
        self.outcome: StoredPlan | PlanCacheError | None = None
        # The provisional plan, once stored: every waiter but the tuned_only ones has it.
        self.provisional: StoredPlan | None = None
        self.task: asyncio.Task[None] | None = None  # opens, follows the job, wakes the waiters
        # Its callers all left (Builds._leave): it stops following, whatever became of the cancel of its task. A
        # cancel can be swallowed (one landing as an awaited read's own timeout fires), and the flight then
        # followed the job on, saying every WANT_RENEW_S that callers waited for it: a job nobody waited for
        # was never dropped (issue 44) until its build ended.
        self.left = False
        self._query = pb.PlanQuery()  # what fly() queues (again, should its job be dropped)
        self.started_by = ""  # the caller whose share holds this flight's build (given back when forgotten)
        # Every caller so far builds the plan itself (CompileRequest.builds_itself): its job yields (Job.yields)
        # until a caller that waits for the plan joins (hurry).
        self.yields = False
        self.queue_slot = False  # holds one of started_by's slots in the build queue (release_queue_slot)
        self.waiting_for_turn = False  # opened before its job is queued: waits for one of those slots
        # The job this gateway queued and its stream entry: taken back out if its callers all leave first.
        self.queued: tuple[Target, Job] | None = None
        self.entry_id = ""
        # Queued while its target's last worker's entry had just expired (_take_or_find_lease): since that expiry.
        self.workerless_since: float | None = None
        self._crew = crew
        self._forget = forget

    async def fly(self, target: Target, query: pb.PlanQuery) -> None:
        """The flight's task: open (lease and job), follow the job, wake the waiters."""
        self._query = query
        try:
            if not self._queue_turn_at_once():
                # The starting caller's builds fill its slots in the queue: its callers wait for the plan
                # within their own deadlines, not here, where a call holds its turn of the gateway's work
                # (plancache_server.gateway.shares.FairTurns) until the flight opens.
                self.waiting_for_turn = True
                self.opened.set_result(None)
                await self._queue_turn()
                self.waiting_for_turn = False
            await self._take_or_find_lease(target, query)
            if not self.started:
                self.release_queue_slot()  # another's build (or a plan stored meanwhile): nothing of ours queued
        except asyncio.CancelledError:
            self._forget(self)
            self.opened.cancel()
            raise
        except GeneratorExit:  # closed unfinished (its loop gone, at exit): nothing may be awaited any more
            raise
        except BaseException as e:
            self._forget(self)
            if not self.opened.done():
                self.opened.set_exception(e)
                self.opened.exception()  # retrieved: the waiters get it through their shield
                return
            # Opened early (it waited for its caller's turn): the waiters get it as the build's outcome.
            self.settle(e if isinstance(e, PlanCacheError) else Unavailable(f"queueing plan {self.plan_key}: {e}"))
            await self.wake()
            return
        if not self.opened.done():
            self.opened.set_result(None)
        if self.outcome is None:
            await self._follow(target)
        await self.wake()

    def _queue_turn_at_once(self) -> bool:
        """One of the starting caller's slots in the build queue, if one is free now (or none is needed)."""
        crew = self._crew
        if crew.queue_slots is None or not self.started_by:
            return True
        if crew.queue_slots.try_acquire(self.started_by):
            self.queue_slot = True
            return True
        return False

    async def _queue_turn(self) -> None:
        """Wait for one of the starting caller's slots in the build queue (its share: at most so many of its
        builds ahead of other callers' in the queue's order); held until a worker takes the job, or the
        flight ends."""
        crew = self._crew
        assert crew.queue_slots is not None
        await crew.queue_slots.acquire(self.started_by, crew.queue_wait_s, crew.retry_delay_s)
        self.queue_slot = True

    @property
    def retry_delay_s(self) -> float:
        return self._crew.retry_delay_s

    def release_queue_slot(self) -> None:
        if self.queue_slot and self._crew.queue_slots is not None:
            self.queue_slot = False
            self._crew.queue_slots.release(self.started_by)

    async def _take_or_find_lease(self, target: Target, query: pb.PlanQuery) -> None:
        crew, plan_key = self._crew, self.plan_key
        job_id = uuid.uuid4().hex
        holder = await crew.states.take_lease(plan_key, job_id)
        if holder is not None:
            # Another's job, under an entry this flight does not know (nothing of its own left to withdraw).
            self.job_id, self.entry_id, self.queued = holder, "", None
            await crew.states.want(plan_key, holder)  # another caller's job: ours too now
            # Being warmed, or yielding (its callers, maybe on another gateway, build it themselves): a caller that
            # waits for the plan hurries it. A yielding job is hurried once, by whichever caller takes its mark
            # first: a job queued again for every join could be built twice by two workers.
            if holder.startswith(WARM_JOB_PREFIX):
                await self._promote(target, holder)
            elif not self.yields:
                await self._hurry_if_yielding(target, holder)
            return
        try:
            try:
                plan = await crew.store.fresh(plan_key)
            except IntegrityError as refused:  # a forged or damaged plan is rebuilt over, unless our build made it
                plan = None
                await crew.refusals.refuse_same_rebuild(plan_key, refused)
            if plan is not None and not plan.provisional:
                # The previous build finished between the caller's miss and our lease.
                self.job_id = job_id
                self.settle(plan)
                await crew.states.release_lease(plan_key, job_id)
                return
            reason = await crew.states.known_failure(plan_key)
            if reason is not None:
                raise CompileFailed(reason)
            if await crew.queue.live_workers(target) == 0:
                # A worker's entry that expired a moment ago: its beats did not reach Redis for a while (a
                # failover longer than its --heartbeat-ttl; the next beat renews it) or it is restarting. Queued
                # for it, and waited for as a flight whose workers vanish is: WORKERLESS_S from the expiry at
                # most. No entry (none ever beat, or each one left: stopped, its GPU lost) or an old one: refused.
                expired_s = await crew.queue.seconds_since_expiry(target)
                if expired_s is None or expired_s >= WORKERLESS_S:
                    raise TargetUnavailable(
                        f"no live GPU worker can build for target {target.id}; {await self._live_targets_text()}"
                    )
                self.workerless_since = time.monotonic() - expired_s
            self.job_id = job_id  # withdrawn as any other should its callers leave from here on
            await crew.states.want(plan_key, job_id)  # before a worker can take it
            await crew.states.mark_queued(plan_key, job_id)
            # A build only callers building it themselves asked for is built though they leave (their next nodes
            # fetch it; before builds yielded, it had started at once): not `waited`, it runs in its lane, below
            # every job someone waits for (issue 44, item 2), never dropped.
            job = Job(job_id=job_id, plan_key=plan_key, query=query, waited=not self.yields, yields=self.yields)
            if self.yields:  # before a worker can take it: a caller that waits for the plan hurries it
                await crew.states.mark_yields(plan_key, job_id)
            self.entry_id = await crew.queue.enqueue(target, job)
            self.queued = (target, job)
        except BaseException:
            await crew.states.release_lease(plan_key, job_id)
            raise
        self.job_id, self.started = job_id, True

    def hurry(self, target: Target) -> None:
        """A caller that waits for the plan (not building it itself) joined a build that yields: the build's
        job (this gateway's, or the one whose lease it found) is queued again without yielding, and the worker
        holding it moves it to the callers' lanes, as it does a warm build a caller asks for. A flight not open
        yet queues its own job without yielding, or hurries the one it finds."""
        if not self.yields:
            return
        self.yields = False
        if not self.job_id:
            return
        self._crew.run_errand(self._hurry_if_yielding(target, self.job_id), f"hurry {self.job_id}")

    async def _hurry_if_yielding(self, target: Target, job_id: str) -> None:
        """Job `job_id` hurried (_promote) if it yields and nobody hurried it yet (its mark taken here)."""
        try:
            hurry = await self._crew.states.take_yields(self.plan_key, job_id)
        except PlanCacheError as e:  # the build goes on; it waits --hedged-hold-max at most
            log.warning("could not hurry the build of %s: %s", self.plan_key, e.message)
            return
        if hurry:
            await self._promote(target, job_id)

    async def _promote(self, target: Target, job_id: str) -> None:
        """The plan is being warmed (built at the lowest priority, nobody
        waiting) or built for callers that build it themselves (yielding):
        its job is queued again as a caller's, so that the worker holding it
        moves it to the callers' lanes (plancache_server.worker.worker; a
        worker that finds it stored, or holds it in the callers' lanes
        already, acknowledges it with the build)."""
        job = Job(job_id=job_id, plan_key=self.plan_key, query=self._query, waited=True, hurries=True)
        try:
            await self._crew.queue.enqueue(target, job)
            log.info("plan %s: asked the worker building it (job %s) to hurry", job.plan_key, job.job_id)
        except PlanCacheError as e:  # a full queue: the build goes on at its pace
            log.warning("could not hurry the build of %s: %s", job.plan_key, e.message)

    async def _live_targets_text(self) -> str:
        live = sorted(await self._crew.queue.live_targets())
        if live:
            return f"targets with workers now: {', '.join(live)}"
        return (
            "no worker is connected to this deployment: start a compile worker on a GPU host against this "
            "deployment's Redis (plancache-worker --redis-url ...; docs/deploying.md)"
        )

    async def _follow(self, target: Target) -> None:
        """Watch the flight's job until its plan is stored, it failed, its
        plan cannot be served (refused, or gone), or no worker of its target
        is left to build it (each one's GPU lost, say): every way out of the
        loop is a state of the job or of the workers, so a waiter never
        re-reads a plan for nothing nor waits for a build nobody can do."""
        crew = self._crew
        event = crew.watcher.register(self.job_id)
        gone = 0
        queued_again = False
        lost_checked_at = time.monotonic()
        checks = 0
        workerless_since = self.workerless_since
        wanted_at = time.monotonic()
        try:
            while self.outcome is None and not self.left:
                try:
                    if time.monotonic() - wanted_at >= WANT_RENEW_S:
                        await crew.states.want(self.plan_key, self.job_id)
                        wanted_at = time.monotonic()
                    # The job's state before the plan: a plan refused after our job is DONE (or PROVISIONAL) is
                    # what our build stored. Read the other way round, a stale plan read while the build ran
                    # (a corrupted one it was replacing) was blamed on the build once it had ended meanwhile.
                    state = await crew.states.state(self.plan_key)
                    ours = state.get("state") if state.get("job_id") == self.job_id else None
                    refused: IntegrityError | None = None
                    try:
                        plan = await crew.store.fresh(self.plan_key)
                    except IntegrityError as e:
                        plan, refused = None, e
                    if plan is not None and crew.announced_only and _unannounced(plan, ours):
                        plan = None  # being stored by our job, its replicas waited for: not announced yet
                    if plan is not None and not plan.provisional:
                        self.settle(plan)
                        break
                    if plan is not None and self.provisional is None:
                        self.provisional = plan
                        await self._deliver(plan, lambda w: not w.tuned_only)
                    if self.queue_slot and (self.provisional is not None or ours not in (None, QUEUED)):
                        self.release_queue_slot()  # a worker took the job (mark_running): out of the line
                    if ours == ABANDONED:
                        # Dropped as waited for by nobody, while we were (our claim came late): queued anew.
                        dropped = self.job_id
                        event, blip = await self._queue_again(target, event)
                        if blip is not None:
                            raise blip
                        if self.outcome is not None:
                            break
                        log.info(
                            "plan %s: job %s was dropped as waited for by nobody while callers waited: "
                            "queued again (job %s)",
                            self.plan_key,
                            dropped,
                            self.job_id,
                        )
                        wanted_at = time.monotonic()
                        continue
                    if ours == FAILED:
                        self.settle(CompileFailed(state.get("error") or "build failed without a reason"))
                        break
                    if refused is not None and ours in (PROVISIONAL, DONE):
                        # What our build stored is refused: a rebuild would be signed the same way.
                        self.settle(await crew.refusals.untrusted_build(self.plan_key, self.job_id, refused, state))
                        break
                    gone = gone + 1 if plan is None and refused is None and ours == DONE else 0
                    checks += 1
                    if checks % WORKER_RECHECK_EVERY == 0:
                        live = await crew.queue.live_workers(target)
                        workerless_since = None if live else (workerless_since or time.monotonic())
                    if workerless_since is not None and time.monotonic() - workerless_since >= WORKERLESS_S:
                        self.settle(
                            TargetUnavailable(
                                f"no live GPU worker of target {target.id} for {WORKERLESS_S:.0f} s to build plan "
                                f"{self.plan_key} (job {self.job_id}, still queued: the next worker of the target "
                                "builds it); call again"
                            )
                        )
                        break
                    if not queued_again and time.monotonic() - lost_checked_at >= LOST_CHECK_S:
                        lost_checked_at = time.monotonic()
                        if plan is None and refused is None and await self._lost(target, ours):
                            queued_again, lost = True, self.job_id
                            await crew.states.release_lease(self.plan_key, lost)  # while it names the lost job
                            event, blip = await self._queue_again(target, event)
                            if blip is not None:
                                raise blip
                            if self.outcome is not None:
                                break
                            log.warning(
                                "plan %s: job %s is in no build queue (lost with a Redis master's last writes in a "
                                "failover?) or has no state left: queued again (job %s)",
                                self.plan_key,
                                lost,
                                self.job_id,
                            )
                            wanted_at = time.monotonic()
                            continue
                    if gone >= GONE_RECHECKS and not queued_again:
                        # Built, then deleted before its callers read it: invalidated while it was tuned (the worker
                        # then stores no tuned plan over the deletion), or evicted. Its callers still wait: queued
                        # anew, once (deleted again, the store's bound is too small for it: said below).
                        queued_again, built = True, self.job_id
                        event, blip = await self._queue_again(target, event)
                        if blip is not None:
                            raise blip
                        if self.outcome is not None:
                            break
                        self.provisional, gone = None, 0
                        log.info(
                            "plan %s: built (job %s) but deleted before its callers read it: queued again (job %s)",
                            self.plan_key,
                            built,
                            self.job_id,
                        )
                        wanted_at = time.monotonic()
                        continue
                    if gone >= GONE_RECHECKS:
                        self.settle(
                            Unavailable(
                                f"plan {self.plan_key} was built (job {self.job_id}) but is no longer stored: it was "
                                "deleted or evicted (--store-max-mb) before it could be read; call again"
                            )
                        )
                        break
                except Unavailable as e:
                    # A Redis blip must not fail every waiter: they keep their deadlines.
                    _faults.warning(
                        "follow",
                        "following the build of %s: %s (its callers keep waiting, within their deadlines)",
                        self.plan_key,
                        e.message,
                    )
                try:
                    await asyncio.wait_for(event.wait(), RECHECK_S)
                except TimeoutError:
                    pass
                event.clear()
        finally:
            crew.watcher.unregister(self.job_id, event)

    async def _lost(self, target: Target, ours: str | None) -> bool:
        """Whether the flight's job is lost: one it queued whose state is gone (no record of any job for the plan;
        a job it joined may be a warm build, which has none until it starts), or one still queued and in no stream
        (the state read again after the stream: a worker leaves it only once it has marked the job)."""
        crew = self._crew
        if ours is None:
            return self.started and not await crew.states.state(self.plan_key)
        if ours != QUEUED or await crew.queue.holds(target, self.job_id, self.entry_id) is not False:
            return False
        state = await crew.states.state(self.plan_key)
        return state.get("job_id") == self.job_id and state.get("state") == QUEUED

    async def _queue_again(self, target: Target, event: asyncio.Event) -> tuple[asyncio.Event, Unavailable | None]:
        """The flight's job queued anew (its callers still wait), as a new caller's would be: settled with its plan
        if one is stored meanwhile, or with the error a new caller would get (a full queue, no worker left). The
        event to follow the new job by, and a Redis blip to raise (the follow loop's, which keeps its waiters)."""
        crew = self._crew
        crew.watcher.unregister(self.job_id, event)
        blip: Unavailable | None = None
        try:
            await self._take_or_find_lease(target, self._query)
        except Unavailable as e:
            blip = e
        except PlanCacheError as e:
            self.settle(e)
        return crew.watcher.register(self.job_id), blip

    def settle(self, outcome: StoredPlan | PlanCacheError) -> None:
        self.outcome = outcome
        self._forget(self)  # later callers find the plan in the store, or start anew

    async def wake(self) -> None:
        """Answer the flight's waiters: an error to all at once; a plan to a
        few at a time, each holding a delivery slot while it is written."""
        outcome = self.outcome
        if isinstance(outcome, PlanCacheError):
            for waiter in list(self.waiters):
                if not waiter.future.done():
                    waiter.future.set_exception(outcome)
        elif outcome is not None:
            await self._deliver(outcome, lambda w: True)

    async def _deliver(self, plan: StoredPlan, accepts: Callable[[Waiter], bool]) -> None:
        slots = self._crew.delivery_slots
        for waiter in list(self.waiters):
            if waiter.future.done() or not accepts(waiter):
                continue
            await slots.acquire()
            if waiter.future.done():  # it left while we waited for a slot
                slots.release()
                continue
            waiter.hold(slots)
            waiter.future.set_result(plan)

"""One build per plan key, and waiting for it, on a gateway.

A gateway that misses takes the plan's build lease (SET NX with expiry,
holding a job id) and queues the job; any other caller, on this gateway or
another, finds the lease and waits for that job instead of starting a
second build (plancache_server.store.build_records has the worker's side).

On one gateway, every caller waiting for the same key shares one
*flight*: one lease lookup, one follower that watches the job (woken by the
workers' pub/sub announcement, re-checking every half second in case one is
lost), one read of the finished plan. A waiting caller is a coroutine and a
future, not a thread, and costs nothing a hit needs: hits never touch a
flight. When a build finishes, its plan is handed to at most DELIVERY_SLOTS
callers at a time, each holding its slot until its response is written (or
SLOT_HOLD_S has passed): a plan fanning out to thousands of callers never
fills the event loop's queue, so a hit arriving meanwhile waits for a few
writes, not for all of them.

Admission control: past `max_waiters` waiting callers on this gateway, or
`max_waiters_per_key` on one key, a new caller is refused at once with
ResourceExhausted and a retry delay.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import redis

from plancache.errors import (
    CompileFailed,
    CompileTimeout,
    IntegrityError,
    InvalidRequest,
    PlanCacheError,
    ResourceExhausted,
    TargetUnavailable,
    Unavailable,
    UntrustedBuild,
    UntrustedPlan,
)
from plancache.keys.target import Target
from plancache.log_limits import LogLimiter
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.build_records import (
    DONE,
    FAILED,
    PROVISIONAL,
    QUEUED,
    RELEASE_IF_OWNER,
    FailedBuild,
    state_fields,
)
from plancache_server.store.jobs import Job, JobQueue
from plancache_server.store.plans import PlanStore, StoredPlan
from plancache_server.store.redis_conn import AsyncRedis, stop_task, text, translated_errors
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
# A build whose plan this gateway refused (signed by a key it does not
# trust) is not started again for this long: a rebuild would be signed the
# same way. Long enough that callers retrying in a loop cost no builds,
# short enough that mended keys take effect soon.
UNTRUSTED_BUILD_TTL_S = 120
# A flight checks that its target still has a live worker every this many
# re-checks (2 s), and gives up once none was seen for WORKERLESS_S: longer
# than a worker's restart (a deploy: the job stays queued for it), far
# shorter than a default deadline (--compile-timeout, 900 s).
WORKER_RECHECK_EVERY = 4
WORKERLESS_S = 30.0
# Re-reads of a finished build's plan, not found, before its waiters are
# told that it is gone (deleted or evicted between its store and its read).
GONE_RECHECKS = 4
MEND_KEYS = "give its workers a --signing-key this gateway trusts, or add their public key to the gateway's --trusted-keys (PLANCACHE_SERVER_TRUSTED_KEYS)"


@dataclass(frozen=True)
class Admission:
    max_waiters: int = 50_000
    max_waiters_per_key: int = 5_000
    retry_delay_s: float = 1.0


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


@dataclass(eq=False)
class Flight:
    """Every caller on this gateway waiting for one plan key."""

    plan_key: str
    # Done once the job id is known (this gateway queued it, or found it);
    # carries the error that kept it from being queued.
    opened: asyncio.Future[None]
    job_id: str = ""
    started: bool = False  # this gateway queued the build
    waiters: list[Waiter] = field(default_factory=list)
    outcome: StoredPlan | PlanCacheError | None = None
    # The provisional plan, once stored: every waiter but the tuned_only ones has it.
    provisional: StoredPlan | None = None
    task: asyncio.Task[None] | None = None  # opens, follows the job, wakes the waiters


class Waiter:
    """One caller waiting for one flight: `future` resolves to the plan or
    to the build's error."""

    def __init__(self, builds: Builds, flight: Flight, tuned_only: bool = False) -> None:
        self._builds = builds
        self.flight = flight
        self.tuned_only = tuned_only  # waits past a provisional plan
        self.future: asyncio.Future[StoredPlan] = asyncio.get_running_loop().create_future()
        self.started = False  # this caller's call queued the build
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

    def timeout(self) -> CompileTimeout:
        return CompileTimeout(
            f"plan {self.plan_key} is still building (job {self.flight.job_id}); the build continues and its plan will be stored: call again later"
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
            self._builds._leave(self)


class Builds:
    def __init__(
        self,
        client: AsyncRedis,
        store: PlanStore,
        queue: JobQueue,
        lease_s: float,
        admission: Admission,
        on_untrusted_build: Callable[[str], None] = lambda plan_key: None,
    ) -> None:
        """`on_untrusted_build(plan_key)`: once per build whose plan this gateway refused (counted)."""
        self._redis = client
        self._on_untrusted_build = on_untrusted_build
        self._store = store
        self._queue = queue
        self._lease_s = lease_s
        self._admission = admission
        self._release_lease = client.register_script(RELEASE_IF_OWNER)
        self._watcher = CompletionWatcher(client, store.forget)
        self._flights: dict[str, Flight] = {}
        self.waiting = 0  # callers waiting on this gateway, all keys
        self._closing = False
        self._delivery_slots = asyncio.Semaphore(DELIVERY_SLOTS)

    def start(self) -> None:
        """Listen for finished and replaced plans from now on (not only while waiting)."""
        self._watcher.start()

    def flying(self, plan_key: str) -> bool:
        """Whether callers here already wait for this key (then the store
        need not be asked: the flight answers when the plan lands)."""
        return plan_key in self._flights

    async def join(self, target: Target, plan_key: str, query: pb.PlanQuery, tuned_only: bool = False) -> Waiter:
        """Wait for this key's build: start it (lease, job), or join the one
        under way. The waiter's future has the first plan it accepts: the
        provisional one, unless `tuned_only`. Raises ResourceExhausted past
        the admission bounds, and what kept the build from being queued
        (TargetUnavailable, CompileFailed from the negative cache, a full
        queue)."""
        if self._closing:
            raise Unavailable(f"this gateway is shutting down; call again (plan {plan_key})")
        flight = self._flights.get(plan_key)
        self._admit(plan_key, flight)
        first = flight is None
        if flight is None:
            flight = Flight(plan_key, asyncio.get_running_loop().create_future())
            self._flights[plan_key] = flight
            # Its own task: the build is queued even if this caller goes away.
            flight.task = asyncio.get_running_loop().create_task(
                self._fly(flight, target, query), name=f"flight {plan_key}"
            )
        waiter = Waiter(self, flight, tuned_only)
        flight.waiters.append(waiter)
        self.waiting += 1
        if flight.provisional is not None and not tuned_only:
            waiter.future.set_result(flight.provisional)
        try:
            await asyncio.shield(flight.opened)
        except BaseException:
            waiter.release()
            raise
        waiter.started = first and flight.started
        return waiter

    def _admit(self, plan_key: str, flight: Flight | None) -> None:
        limits = self._admission
        if self.waiting >= limits.max_waiters:
            raise ResourceExhausted(
                f"this gateway already has {self.waiting} callers waiting for builds (--max-waiters {limits.max_waiters}); "
                f"plan {plan_key} was not asked for: call again later",
                retry_after=limits.retry_delay_s,
            )
        if flight is not None and len(flight.waiters) >= limits.max_waiters_per_key:
            raise ResourceExhausted(
                f"{len(flight.waiters)} callers already wait for plan {plan_key} on this gateway (--max-waiters-per-key "
                f"{limits.max_waiters_per_key}); its build goes on: call again later",
                retry_after=limits.retry_delay_s,
            )

    async def _fly(self, flight: Flight, target: Target, query: pb.PlanQuery) -> None:
        try:
            await self._take_or_find_lease(flight, target, query)
        except asyncio.CancelledError:
            self._forget(flight)
            flight.opened.cancel()
            raise
        except BaseException as e:
            self._forget(flight)
            flight.opened.set_exception(e)
            flight.opened.exception()  # retrieved: the waiters get it through their shield
            return
        flight.opened.set_result(None)
        if flight.outcome is None:
            await self._follow(flight, target)
        await self._wake(flight)

    async def _take_or_find_lease(self, flight: Flight, target: Target, query: pb.PlanQuery) -> None:
        plan_key = flight.plan_key
        lease = keys.build_lease(plan_key)
        job_id = uuid.uuid4().hex
        with translated_errors("taking a build lease"):
            while True:
                if await self._redis.set(lease, job_id, nx=True, px=int(self._lease_s * 1000)):
                    break
                existing = await self._redis.get(lease)
                if existing is not None:
                    flight.job_id = text(existing)
                    if flight.job_id.startswith(WARM_JOB_PREFIX):
                        await self._promote(target, Job(job_id=flight.job_id, plan_key=plan_key, query=query))
                    return
        try:
            try:
                plan = await self._store.fresh(plan_key)
            except IntegrityError as refused:  # a forged or damaged plan is rebuilt over, unless our build made it
                plan = None
                await self._refuse_same_rebuild(plan_key, refused)
            if plan is not None and not plan.provisional:
                # The previous build finished between the caller's miss and our lease.
                flight.job_id = job_id
                self._settle(flight, plan)
                await self._release(plan_key, job_id)
                return
            reason = await self.known_failure(plan_key)
            if reason is not None:
                raise CompileFailed(reason)
            if await self._queue.live_workers(target) == 0:
                raise TargetUnavailable(
                    f"no live GPU worker can build for target {target.id}; {await self._live_targets_text()}"
                )
            with translated_errors("recording a job state"):
                await self._redis.hset(keys.job_state(plan_key), mapping=state_fields(job_id, QUEUED))  # type: ignore[arg-type]
                await self._redis.expire(keys.job_state(plan_key), 24 * 3600)
            await self._queue.enqueue(target, Job(job_id=job_id, plan_key=plan_key, query=query))
        except BaseException:
            await self._release(plan_key, job_id)
            raise
        flight.job_id, flight.started = job_id, True

    async def _promote(self, target: Target, job: Job) -> None:
        """The plan is being warmed (built at the lowest priority, nobody
        waiting): its job is queued as a caller's, so that the worker
        warming it moves it to the callers' lanes (plancache_server.worker.worker)."""
        try:
            await self._queue.enqueue(target, job)
            log.info("plan %s was being warmed (job %s): asked its worker to hurry", job.plan_key, job.job_id)
        except PlanCacheError as e:  # a full queue: the warm build goes on at its pace
            log.warning("could not hurry the warm build of %s: %s", job.plan_key, e.message)

    async def _live_targets_text(self) -> str:
        live = sorted(await self._queue.live_targets())
        return f"targets with workers now: {', '.join(live)}" if live else "no worker is connected to this deployment"

    async def _release(self, plan_key: str, job_id: str) -> None:
        try:
            with translated_errors("releasing a build lease"):
                await self._release_lease(keys=[keys.build_lease(plan_key)], args=[job_id])
        except Unavailable as e:  # it expires on its own
            _faults.warning("lease", "could not release the lease of %s: %s", plan_key, e.message)

    async def _follow(self, flight: Flight, target: Target) -> None:
        """Watch the flight's job until its plan is stored, it failed, its
        plan cannot be served (refused, or gone), or no worker of its target
        is left to build it (each one's GPU lost, say): every way out of the
        loop is a state of the job or of the workers, so a waiter never
        re-reads a plan for nothing nor waits for a build nobody can do."""
        event = self._watcher.register(flight.job_id)
        gone = 0
        checks = 0
        workerless_since: float | None = None
        try:
            while flight.outcome is None:
                try:
                    refused: IntegrityError | None = None
                    try:
                        plan = await self._store.fresh(flight.plan_key)
                    except IntegrityError as e:
                        plan, refused = None, e
                    if plan is not None and not plan.provisional:
                        self._settle(flight, plan)
                        break
                    if plan is not None and flight.provisional is None:
                        flight.provisional = plan
                        await self._deliver(flight, plan, lambda w: not w.tuned_only)
                    state = await self.state(flight.plan_key)
                    ours = state.get("state") if state.get("job_id") == flight.job_id else None
                    if ours == FAILED:
                        self._settle(flight, CompileFailed(state.get("error") or "build failed without a reason"))
                        break
                    if refused is not None and ours in (PROVISIONAL, DONE):
                        # What our build stored is refused: a rebuild would be signed the same way.
                        self._settle(flight, await self._untrusted_build(flight, refused, state))
                        break
                    gone = gone + 1 if plan is None and refused is None and ours == DONE else 0
                    checks += 1
                    if checks % WORKER_RECHECK_EVERY == 0:
                        live = await self._queue.live_workers(target)
                        workerless_since = None if live else (workerless_since or time.monotonic())
                    if workerless_since is not None and time.monotonic() - workerless_since >= WORKERLESS_S:
                        self._settle(
                            flight,
                            TargetUnavailable(
                                f"no live GPU worker of target {target.id} for {WORKERLESS_S:.0f} s to build plan {flight.plan_key} (job "
                                f"{flight.job_id}, still queued: the next worker of the target builds it); call again"
                            ),
                        )
                        break
                    if gone >= GONE_RECHECKS:
                        self._settle(
                            flight,
                            Unavailable(
                                f"plan {flight.plan_key} was built (job {flight.job_id}) but is no longer stored: it was deleted or evicted "
                                "(--store-max-mb) before it could be read; call again"
                            ),
                        )
                        break
                except Unavailable as e:
                    # A Redis blip must not fail every waiter: they keep their deadlines.
                    _faults.warning(
                        "follow",
                        "following the build of %s: %s (its callers keep waiting, within their deadlines)",
                        flight.plan_key,
                        e.message,
                    )
                try:
                    await asyncio.wait_for(event.wait(), RECHECK_S)
                except TimeoutError:
                    pass
                event.clear()
        finally:
            self._watcher.unregister(flight.job_id, event)

    async def _untrusted_build(self, flight: Flight, refused: IntegrityError, state: dict[str, str]) -> UntrustedBuild:
        """The error for every waiter of a build whose plan this gateway
        refused; remembered (no same rebuild for a while) and counted."""
        cause = _refusal_cause(refused)
        if cause is not None:
            try:
                with translated_errors("remembering a refused build"):
                    await self._redis.set(keys.untrusted_build(flight.plan_key), cause, ex=UNTRUSTED_BUILD_TTL_S)
            except Unavailable as e:
                log.warning("could not remember the refused build of %s: %s", flight.plan_key, e.message)
        self._on_untrusted_build(flight.plan_key)
        worker = state.get("worker") or "a worker"
        message = f"the plan {worker} built for this call (job {flight.job_id}) fails this gateway's checks: {refused.message}"
        if cause is not None:
            message += f". No rebuild is started for {UNTRUSTED_BUILD_TTL_S} s, since it would be signed the same way: {MEND_KEYS}"
        log.error("%s", message)
        return UntrustedBuild(message)

    async def _refuse_same_rebuild(self, plan_key: str, refused: IntegrityError) -> None:
        """UntrustedBuild when the stored plan is refused for the reason our
        last build of it was: building it again would end the same way."""
        cause = _refusal_cause(refused)
        if cause is None:
            return
        with translated_errors("reading a refused build"):
            remembered = await self._redis.get(keys.untrusted_build(plan_key))
            ttl = await self._redis.ttl(keys.untrusted_build(plan_key)) if remembered is not None else 0
        if remembered is not None and text(remembered) == cause:
            raise UntrustedBuild(
                f"{refused.message}. The last build of this plan was refused for this reason; no rebuild is started for another {max(ttl, 1)} s, "
                f"since it would be signed the same way: {MEND_KEYS}"
            )

    def _settle(self, flight: Flight, outcome: StoredPlan | PlanCacheError) -> None:
        flight.outcome = outcome
        self._forget(flight)  # later callers find the plan in the store, or start anew

    async def _wake(self, flight: Flight) -> None:
        """Answer the flight's waiters: an error to all at once; a plan to a
        few at a time, each holding a delivery slot while it is written."""
        outcome = flight.outcome
        if isinstance(outcome, PlanCacheError):
            for waiter in list(flight.waiters):
                if not waiter.future.done():
                    waiter.future.set_exception(outcome)
        elif outcome is not None:
            await self._deliver(flight, outcome, lambda w: True)

    async def _deliver(self, flight: Flight, plan: StoredPlan, accepts: Callable[[Waiter], bool]) -> None:
        for waiter in list(flight.waiters):
            if waiter.future.done() or not accepts(waiter):
                continue
            await self._delivery_slots.acquire()
            if waiter.future.done():  # it left while we waited for a slot
                self._delivery_slots.release()
                continue
            waiter.hold(self._delivery_slots)
            waiter.future.set_result(plan)

    def _leave(self, waiter: Waiter) -> None:
        flight = waiter.flight
        try:
            flight.waiters.remove(waiter)
        except ValueError:
            return
        self.waiting -= 1
        if not waiter.future.done():
            waiter.future.cancel()
        if not flight.waiters and flight.outcome is None:
            # Nobody here waits any more: stop following (a queued build goes on).
            self._forget(flight)
            if flight.task is not None:
                flight.task.cancel()

    def _forget(self, flight: Flight) -> None:
        if self._flights.get(flight.plan_key) is flight:
            del self._flights[flight.plan_key]

    async def close(self) -> None:
        """Stop waiting: callers still waiting get Unavailable (the builds go
        on and their plans are stored for the next call)."""
        self._closing = True
        for flight in list(self._flights.values()):
            if not flight.opened.done():
                flight.opened.set_exception(
                    Unavailable(f"this gateway is shutting down; call again (plan {flight.plan_key})")
                )
                flight.opened.exception()
            if flight.outcome is None:
                flight.outcome = Unavailable(
                    f"this gateway is shutting down; plan {flight.plan_key} is still building: call again"
                )
                if flight.task is not None:
                    flight.task.cancel()
                await self._wake(flight)
        self._flights.clear()
        await self._watcher.stop()

    # ---- reads ---------------------------------------------------------------

    async def state(self, plan_key: str) -> dict[str, str]:
        with translated_errors("reading a job state"):
            raw = await self._redis.hgetall(keys.job_state(plan_key))
        return {text(k): text(v) for k, v in raw.items()}

    async def known_failure(self, plan_key: str) -> str | None:
        """Why cuDNN rejected this key's graph, if it did recently."""
        with translated_errors("reading the negative cache"):
            reason = await self._redis.get(keys.failure(plan_key))
            ttl = await self._redis.ttl(keys.failure(plan_key)) if reason is not None else 0
        if reason is None:
            return None
        return f"{text(reason)} (remembered from an earlier build; retried after {ttl} s)"

    async def recent_failures(self, count: int) -> list[FailedBuild]:
        """The latest failed builds, newest first."""
        with translated_errors("reading recent failures"):
            raw = await self._redis.lrange(keys.RECENT_FAILURES, 0, count - 1)
        return list(_failures(item for item in raw if isinstance(item, bytes)))


def _refusal_cause(refused: IntegrityError) -> str | None:
    """What a rebuild would repeat: a key this gateway does not trust, or
    no signature. None for damaged or altered bytes, which a rebuild writes anew."""
    if isinstance(refused, UntrustedPlan) and refused.unknown_key:
        return f"signer:{refused.signer}" if refused.signer else "unsigned"
    return None


def _failures(raw: Iterable[bytes]) -> Iterable[FailedBuild]:
    for item in raw:
        try:
            failure = FailedBuild(**json.loads(item))
            failure.target_id  # noqa: B018 -- a record whose key does not parse is skipped
        except (ValueError, TypeError, InvalidRequest):
            log.warning("ignoring a malformed failure record %r", item[:200])
            continue
        yield failure

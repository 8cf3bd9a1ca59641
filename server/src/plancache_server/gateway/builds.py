"""One build per plan key, and waiting for it, on a gateway.

A gateway that misses takes the plan's build lease (SET NX with expiry,
holding a job id) and queues the job; any other caller, on this gateway or
another, finds the lease and waits for that job instead of starting a
second build (plancache_server.store.build_records has the worker's side).

On one gateway, every caller waiting for the same key shares one
*flight* (plancache_server.gateway.flight): one lease lookup, one follower
that watches the job, one read of the finished plan. A waiting caller is a
coroutine and a future, not a thread, and costs nothing a hit needs: hits
never touch a flight. Builds is the registry of a gateway's flights: a
caller joins the key's flight, or starts it, and leaves it.

A build nobody waits for is not built: each flight says, while its callers
wait, that they do (renewed every few seconds, taken back when its last
caller leaves), and a worker drops a job no gateway says so of
(plancache_server.store.build_records.TAKE_IF_WANTED).

Admission control: past `max_waiters` waiting callers on this gateway, or
`max_waiters_per_key` on one key, or past the caller's own share of waits
and builds (plancache_server.gateway.shares), a new caller is refused at
once with ResourceExhausted and a retry delay.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from plancache.errors import PlanCacheError, ResourceExhausted, Unavailable
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.build_states import BuildStates
from plancache_server.gateway.completions import CompletionWatcher
from plancache_server.gateway.flight import DELIVERY_SLOTS, Flight, FlightCrew, Waiter
from plancache_server.gateway.refusals import RefusedBuilds
from plancache_server.gateway.shares import CALLER, Shares
from plancache_server.store.build_records import FailedBuild
from plancache_server.store.jobs import JobQueue
from plancache_server.store.plans import PlanStore
from plancache_server.store.redis_conn import AsyncRedis

log = logging.getLogger(__name__)

# Seconds a gateway keeps saying that callers wait for a job after its last one left (see _withdraw).
UNWANT_GRACE_S = 1.0


@dataclass(frozen=True)
class Admission:
    max_waiters: int = 50_000
    max_waiters_per_key: int = 5_000
    retry_delay_s: float = 1.0


class Builds:
    def __init__(
        self,
        client: AsyncRedis,
        store: PlanStore,
        queue: JobQueue,
        lease_s: float,
        admission: Admission,
        on_untrusted_build: Callable[[str], None] = lambda plan_key: None,
        shares: Shares | None = None,
        queue_wait_s: float = 900.0,
        *,
        announced_only: bool = False,
    ) -> None:
        """`on_untrusted_build(plan_key)`: once per build whose plan this gateway refused (counted);
        `shares`: what each caller may hold (waits, builds it queued, builds in the queue at once);
        `queue_wait_s`: the longest a build waits for its caller's turn in the queue (--compile-timeout);
        `announced_only`: a build's waiters get its plan once the worker announced it, not as soon as its master
        holds it (--store-replicas: the worker announces once the replicas hold it)."""
        self._admission = admission
        self._shares = shares or Shares()
        # Names this gateway's claims that its callers wait for a job (plancache_server.store.build_records).
        self.gateway_id = uuid.uuid4().hex[:16]
        self._states = BuildStates(client, lease_s, self.gateway_id)
        self._watcher = CompletionWatcher(client, store.forget)
        self._crew = FlightCrew(
            store,
            queue,
            self._states,
            RefusedBuilds(client, on_untrusted_build),
            self._watcher,
            asyncio.Semaphore(DELIVERY_SLOTS),
            self._shares.queue_slots,
            queue_wait_s,
            self._shares.limits.retry_delay_s,
            announced_only,
        )
        self._flights: dict[str, Flight] = {}
        self.waiting = 0  # callers waiting on this gateway, all keys
        self._closing = False

    def start(self) -> None:
        """Listen for finished and replaced plans from now on (not only while waiting)."""
        self._watcher.start()

    async def known_failure(self, plan_key: str) -> str | None:
        """Why cuDNN rejected this key's graph, if a build did recently (the negative cache, --negative-ttl)."""
        return await self._states.known_failure(plan_key)

    def flying(self, plan_key: str) -> bool:
        """Whether callers here already wait for this key (then the store
        need not be asked: the flight answers when the plan lands)."""
        return plan_key in self._flights

    async def join(
        self, target: Target, plan_key: str, query: pb.PlanQuery, tuned_only: bool = False, yields: bool = False
    ) -> Waiter:
        """Wait for this key's build: start it (lease, job), or join the one
        under way. The waiter's future has the first plan it accepts: the
        provisional one, unless `tuned_only`. `yields`: the caller builds the
        plan itself meanwhile (a hedged miss): a build only such callers ask
        for waits while they keep asking (Job.yields); any other caller's
        join hurries it. Raises ResourceExhausted past
        the admission bounds, and what kept the build from being queued
        (TargetUnavailable, CompileFailed from the negative cache, a full
        queue)."""
        if self._closing:
            raise Unavailable(f"this gateway is shutting down; call again (plan {plan_key})")
        flight = self._flights.get(plan_key)
        self._admit(plan_key, flight)
        caller = CALLER.get()
        self._shares.take(caller, "waiters")  # this caller's share (plancache_server.gateway.shares)
        first = flight is None
        if flight is None:
            try:
                self._shares.take(caller, "builds")
            except ResourceExhausted:
                self._shares.give_back(caller, "waiters")
                raise
            flight = Flight(plan_key, self._crew, self._forget)
            flight.started_by = caller
            flight.yields = yields
            self._flights[plan_key] = flight
            # Its own task: the build is queued even if this caller goes away.
            flight.task = asyncio.get_running_loop().create_task(flight.fly(target, query), name=f"flight {plan_key}")
        elif not yields:
            flight.hurry(target)
        waiter = Waiter(flight, self._leave, tuned_only)
        waiter.caller = caller
        flight.waiters.append(waiter)
        self.waiting += 1
        if flight.provisional is not None and not tuned_only:
            waiter.future.set_result(flight.provisional)
        try:
            await asyncio.shield(flight.opened)
        except BaseException:
            waiter.release()
            raise
        # The first caller queues the build, or will once its turn in the queue comes (waiting_for_turn).
        waiter.started = first and (flight.started or flight.waiting_for_turn)
        return waiter

    def _admit(self, plan_key: str, flight: Flight | None) -> None:
        limits = self._admission
        if self.waiting >= limits.max_waiters:
            raise ResourceExhausted(
                f"this gateway already has {self.waiting} callers waiting for builds (--max-waiters "
                f"{limits.max_waiters}); plan {plan_key} was not asked for: call again later",
                retry_after=limits.retry_delay_s,
            )
        if flight is not None and len(flight.waiters) >= limits.max_waiters_per_key:
            raise ResourceExhausted(
                f"{len(flight.waiters)} callers already wait for plan {plan_key} on this gateway "
                f"(--max-waiters-per-key {limits.max_waiters_per_key}); its build goes on: call again later",
                retry_after=limits.retry_delay_s,
            )

    def _leave(self, waiter: Waiter) -> None:
        flight = waiter.flight
        try:
            flight.waiters.remove(waiter)
        except ValueError:
            return
        self.waiting -= 1
        self._shares.give_back(waiter.caller, "waiters")
        if not waiter.future.done():
            waiter.future.cancel()
        if not flight.waiters and flight.outcome is None:
            # Nobody here waits any more: stop following, and take back this gateway's claim on the job (a
            # queued build that no gateway's callers wait for is dropped by the worker that takes it).
            self._forget(flight)
            flight.left = True  # read by its loop: it stops even where the cancel below is swallowed
            if flight.task is not None:
                flight.task.cancel()
            if flight.job_id:
                self._crew.run_errand(self._withdraw(flight), f"withdraw {flight.plan_key}")

    async def _withdraw(self, flight: Flight) -> None:
        """Its callers all left: take back this gateway's claim on the flight's job and, when this gateway
        queued it and no worker has read it yet, the job itself (a job nobody waits for holds no room in
        its queue), after UNWANT_GRACE_S, unless a caller follows that job here again by then: a hedged
        miss is answered at once and asks again a moment later for the same build
        (plancache_server.gateway.service), which must not be dropped meanwhile. A job another gateway's
        callers want after all goes back to its queue."""
        plan_key, job_id = flight.plan_key, flight.job_id
        await asyncio.sleep(UNWANT_GRACE_S)
        again = self._flights.get(plan_key)
        if again is not None and again.job_id in ("", job_id):
            return
        await self._states.unwant(plan_key, job_id)
        if flight.queued is None:
            return
        target, job = flight.queued
        if job.yields:  # built for the nodes after them, below every job someone waits for (Flight): kept
            return
        try:
            if await self._crew.queue.withdraw(target, flight.entry_id) and await self._states.abandon_unless_wanted(
                plan_key, job_id
            ):
                await self._crew.queue.enqueue(target, job)
        except PlanCacheError as e:  # left queued: the worker that takes it drops it
            log.debug("could not withdraw job %s of %s: %s", job_id, plan_key, e.message)

    def _forget(self, flight: Flight) -> None:
        flight.release_queue_slot()
        if self._flights.get(flight.plan_key) is flight:
            del self._flights[flight.plan_key]
            self._shares.give_back(flight.started_by, "builds")

    @property
    def errands(self) -> set[asyncio.Task[None]]:
        """The short tasks under way that nobody awaits (FlightCrew.errands)."""
        return self._crew.errands

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
                await flight.wake()
        self._flights.clear()
        # Claims still being taken back (they run out on their own: WANTED_TTL_S), builds being hurried (they build
        # at their pace). Ended here, not left to the loop's close: a withdrawal mid-call then was destroyed
        # pending, and the test that stopped the gateway failed on the "exception ignored" (CI, a loaded machine).
        await self._crew.end_errands()
        await self._watcher.stop()

    async def recent_failures(self, count: int) -> list[FailedBuild]:
        """The latest failed builds, newest first (the status page's)."""
        return await self._states.recent_failures(count)

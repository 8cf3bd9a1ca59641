"""The hot path behind the gRPC servicer: Compile and GetPlan.

Everything here speaks plancache types and raises plancache errors; the
servicer only converts protos, and the interceptors map the errors. Plans
go out as bytes serialized once per plan (see StoredPlan), whatever the
number of callers they are sent to. A node's reports, the Prefetch stream
and an operator's calls have classes of their own (reports, prefetch,
admin).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from plancache.errors import CompileFailed, NotFound, PlanCacheError
from plancache.keys.plankey import parse_key
from plancache.keys.query import PlanQuery
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.lookups import PlanLookups, plan_source
from plancache_server.gateway.resolver import QueryResolver
from plancache_server.gateway.shares import Shares
from plancache_server.store.plans import PlanStore, StoredPlan

log = logging.getLogger(__name__)

# Hedged misses answered before their work (deriving the key, queueing the build) on one gateway at
# once; past it, a hedged miss is answered after its work, as before issue 41: a flood of first asks
# holds no more than this many deferred tasks, and its callers wait for their own work.
MAX_DEFERRED = 1024

# Compile's answer to a miss the caller races (answer_miss_at_once): no plan, the build under way.
BUILDING = pb.CompileResponse(source=pb.COMPILE_SOURCE_BUILDING).SerializeToString()


class PlanService:
    def __init__(
        self, store: PlanStore, resolver: QueryResolver, lookups: PlanLookups, shares: Shares | None = None
    ) -> None:
        self._store = store
        self._resolver = resolver
        self._lookups = lookups
        # Each call's CPU-heavy steps take turns with other callers' (plancache_server.gateway.shares).
        self._shares = shares or Shares()
        self._starting: set[asyncio.Task[None]] = set()  # builds being queued after a hedged miss's answer
        self._deferred = 0  # hedged misses answered whose deferred work has not ended (MAX_DEFERRED)

    async def compile(
        self, request: pb.CompileRequest, time_remaining: float | None, when_sent: Callable[[Callable[[], None]], None]
    ) -> bytes:
        """A serialized CompileResponse. `when_sent(callback)` calls back once
        the response is written (it frees the caller's delivery slot)."""
        deferring = self._deferred < MAX_DEFERRED  # past it, a caller waits for its own work (back-pressure)
        async with self._shares.turn():  # the call's steps before it waits: in its turn
            if (
                deferring
                and request.answer_miss_at_once
                and request.claimed_key
                and await self._absent(request.claimed_key)
            ):
                # A hedged miss by the caller's own key: told now, before this gateway derives the key (a
                # large spec's validation and hash: the caller's build waits for this answer, issue 41).
                await self._not_rejected(request.claimed_key)
                self._after_answer(when_sent, request)
                return BUILDING
            resolved = await self._resolver.resolve(request.spec, request.target, request.options)
            count = not request.counted  # the caller's own earlier request (answer_miss_at_once) was counted
            plan = await self._lookups.lookup(
                resolved.key, resolved.target.id, resolved.op_family, request.tuned_only, count=count
            )
            if plan is not None:
                # A stored plan, provisional or not (its metadata says which).
                return plan.compile_response(pb.COMPILE_SOURCE_HIT)
            if request.answer_miss_at_once:
                await self._not_rejected(resolved.key)
                # A hedged miss: the caller builds meanwhile, and asks again (counted) for this build. It is
                # told at once, the build queued after the answer: the caller's own build waits for this
                # answer, not for the lease and the job (a few Redis round trips, issue 41). What keeps the
                # build from being queued (no worker, a known failure, admission) answers the follow-up.
                if deferring:
                    self._after_answer(when_sent, request, resolved)
                else:
                    (
                        await self._lookups.start_build(
                            resolved, request.tuned_only, count=count, yields=request.builds_itself
                        )
                    ).release()
                return BUILDING
            waiter = await self._lookups.start_build(
                resolved, request.tuned_only, count=count, yields=request.builds_itself
            )
        when_sent(waiter.release)
        try:
            plan = await waiter.result(self._lookups.deadline(time_remaining))
        except PlanCacheError as e:
            self._lookups.failed(waiter, resolved, e)
            raise
        # A counted request is the second half of a hedged compile: the build
        # its first half started or joined (said as compiled).
        return plan.compile_response(
            plan_source(
                plan, pb.COMPILE_SOURCE_COMPILED if waiter.started or request.counted else pb.COMPILE_SOURCE_JOINED
            )
        )

    async def _not_rejected(self, plan_key: str) -> None:
        """A miss answered at once is answered "building" only where a build may store the plan: a graph cuDNN
        rejected recently (the negative cache) is CompileFailed now, as a caller that waits would be told. Before,
        it was "building" and the build refused after the answer: a caller that asks for stored plans only
        (plancache.torch) read "not stored yet" in every process, and a hedging node built it itself to fail."""
        reason = await self._lookups.known_failure(plan_key)
        if reason is not None:
            raise CompileFailed(reason)

    async def _absent(self, claimed_key: str) -> bool:
        """Whether no plan is stored (or being built here) under a caller's claimed key; False for a
        claim that is no plan key (the request is then answered as any other)."""
        try:
            parse_key(claimed_key)
        except PlanCacheError:
            return False
        if self._store.cached(claimed_key) is not None:
            return False
        return await self._store.get(claimed_key) is None

    def _after_answer(
        self,
        when_sent: Callable[[Callable[[], None]], None],
        request: pb.CompileRequest,
        resolved: PlanQuery | None = None,
    ) -> None:
        """Once the answer is written: nothing the caller waits for runs on the event loop before it."""
        loop = asyncio.get_running_loop()
        self._deferred += 1

        def sent() -> None:  # gRPC may call back on another thread
            loop.call_soon_threadsafe(self._start_after_answer, request, resolved)

        when_sent(sent)

    def _start_after_answer(self, request: pb.CompileRequest, resolved: PlanQuery | None = None) -> None:
        """The rest of a hedged miss after its answer: the key derived (when the answer came before it),
        the miss counted and the build started or joined. A hit after all (the caller's claim was not
        the key: another plan, or one stored meanwhile) queues nothing; its follow-up is answered it."""
        count = not request.counted

        async def start() -> None:
            try:
                async with self._shares.turn():  # the caller's (the task runs in its call's context)
                    await start_in_turn()
            except PlanCacheError as e:  # refused its turn (its share of a busy loop): the follow-up asks again
                log.debug("a hedged miss's build was not queued: %s", e.message)

        async def start_in_turn() -> None:
            query = resolved
            try:
                if query is None:
                    query = await self._resolver.resolve(request.spec, request.target, request.options)
                    found = await self._lookups.lookup(
                        query.key, query.target.id, query.op_family, request.tuned_only, count=count
                    )
                    if found is not None:
                        return
                waiter = await self._lookups.start_build(
                    query, request.tuned_only, count=count, yields=request.builds_itself
                )
            except PlanCacheError as e:  # the caller's follow-up meets it again, and is told
                log.debug("plan %s: its build was not queued: %s", query.key if query else "?", e.message)
                return
            waiter.release()

        task = asyncio.get_running_loop().create_task(start(), name="start a hedged miss's build")
        self._starting.add(task)  # held: a task nobody references may be collected before it runs
        task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task[None]) -> None:
        self._starting.discard(task)
        self._deferred -= 1

    async def get(self, ref: pb.PlanRef) -> StoredPlan:
        """The stored plan a reference names; NotFound when none is (GetPlan never compiles)."""
        if ref.WhichOneof("ref") == "key":  # a fleet node's fetch by key, from memory: nothing to await
            plan = self._store.cached(ref.key)
            if plan is not None:
                self._lookups.count(ref.key, plan, parse_key(ref.key).target.id, None)
                return plan
        # A stored plan by key is a hit, though not in this gateway's memory: never paced (its turn is a Redis
        # read; pacing charges a step's slot time, which would book a Redis round trip as loop time).
        async with self._shares.turn(paced=ref.WhichOneof("ref") != "key"):
            return await self._get_in_turn(ref)

    async def _get_in_turn(self, ref: pb.PlanRef) -> StoredPlan:
        plan_key, resolved = await self._resolver.ref_key(ref)
        plan = await self._lookups.lookup(
            plan_key,
            resolved.target.id if resolved else parse_key(plan_key).target.id,
            resolved.op_family if resolved else None,
        )
        if plan is None:
            raise NotFound(f"no stored plan {plan_key} (GetPlan never compiles; use Compile)")
        return plan

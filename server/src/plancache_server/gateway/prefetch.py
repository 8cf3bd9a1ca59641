"""The Prefetch stream: a manifest's stored plans first, then, with
compile_missing, each build as it finishes.

Every missing plan's build is queued before the first plan is sent, so a
slow reader delays nothing but itself; and the stream holds no copy of a
plan: it writes one item at a time, paced by the gRPC window (a caller
that stops reading holds one message, not a thread).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from plancache.errors import NotFound, PlanCacheError, ResourceExhausted
from plancache.keys.plankey import parse_key
from plancache.keys.query import PlanQuery
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.rich_status import bounded, duration
from plancache_server.gateway.flight import Waiter
from plancache_server.gateway.lookups import PlanLookups, plan_source
from plancache_server.gateway.resolver import QueryResolver
from plancache_server.gateway.shares import CALLER, Shares
from plancache_server.store.plans import PlanStore, StoredPlan


class PrefetchService:
    def __init__(
        self,
        store: PlanStore,
        resolver: QueryResolver,
        lookups: PlanLookups,
        max_prefetch_refs: int,
        shares: Shares | None = None,
    ) -> None:
        self._store = store
        self._resolver = resolver
        self._lookups = lookups
        self._max_prefetch_refs = max_prefetch_refs
        self._shares = shares or Shares()

    async def prefetch(
        self, request: pb.PrefetchRequest, time_remaining: float | None
    ) -> AsyncIterator[bytes | pb.PrefetchItem]:
        """One item per plan ref, stored plans first. A failure answers its
        own item and never ends the stream."""
        refs = request.refs
        if len(refs) > self._max_prefetch_refs:
            raise ResourceExhausted(
                f"a Prefetch takes at most {self._max_prefetch_refs} plan refs, this one has {len(refs)}: "
                "split the manifest"
            )
        # The caller's share (plancache_server.gateway.shares): one stream, its refs, until the stream ends.
        caller = CALLER.get()
        self._shares.take(caller, "streams")
        try:
            self._shares.take(caller, "refs", len(refs))
        except ResourceExhausted:
            self._shares.give_back(caller, "streams")
            raise
        try:
            async for item in self._answers(request, time_remaining):
                yield item
        finally:
            self._shares.give_back(caller, "refs", len(refs))
            self._shares.give_back(caller, "streams")

    def _held_here(
        self, index: int, ref: pb.PlanRef, request: pb.PrefetchRequest, stored: list[tuple[int, str]]
    ) -> bool:
        """A ref by key whose plan this gateway's memory holds: kept in `stored` and counted as a hit, at once."""
        if ref.WhichOneof("ref") != "key":
            return False
        plan = self._store.cached(ref.key)
        if plan is None or (request.tuned_only and plan.provisional):
            return False
        try:
            target_id = parse_key(ref.key).target.id
        except PlanCacheError:
            return False
        self._lookups.count(ref.key, plan, target_id, None)
        stored.append((index, ref.key))
        return True

    async def _ask(
        self,
        index: int,
        ref: pb.PlanRef,
        request: pb.PrefetchRequest,
        stored: list[tuple[int, str]],
        waiting: dict[asyncio.Future[StoredPlan], tuple[int, Waiter, PlanQuery]],
    ) -> pb.PrefetchItem | None:
        """One ref: found stored (kept in `stored`), its build started or joined (kept in `waiting`), or the
        error item that answers it."""
        key = ""
        try:
            key, resolved = await self._resolver.ref_key(ref)
            target_id = resolved.target.id if resolved else parse_key(key).target.id
            plan = await self._lookups.lookup(
                key, target_id, resolved.op_family if resolved else None, request.tuned_only
            )
            if plan is not None:
                stored.append((index, key))
                return None
            refused = _missing(key, request, resolved)
            if refused is not None:
                raise refused
            assert resolved is not None
            waiter = await self._lookups.start_build(resolved, request.tuned_only)
            waiting[waiter.future] = (index, waiter, resolved)
            return None
        except PlanCacheError as e:
            return _error_item(index, key, e)

    async def _answers(
        self, request: pb.PrefetchRequest, time_remaining: float | None
    ) -> AsyncIterator[bytes | pb.PrefetchItem]:
        refs = request.refs
        deadline = self._lookups.deadline(time_remaining)
        stored: list[tuple[int, str]] = []
        waiting: dict[asyncio.Future[StoredPlan], tuple[int, Waiter, PlanQuery]] = {}
        missed_by_key = False
        try:
            for index, ref in enumerate(refs):
                if self._held_here(index, ref, request, stored):
                    continue  # a stored plan in the gateway's memory, by key: no turn (a hit never waits for one)
                # Each other ref in its caller's turn (plancache_server.gateway.shares), a spec's paced (a key's
                # is a lookup, a hit if stored: not paced, unless the stream's last key was not stored: then it
                # is a stream of misses, each an error item's work, and paced as new work is; a flooder's
                # 100,000 unknown keys over ten connections held the loop ~5 s unpaced). Refused its turn (the
                # caller's share of a busy loop booked past the horizon), the stream ends RESOURCE_EXHAUSTED
                # with the wait: one answer for all its refs left (a client asks again for the unanswered ones
                # after it), where an error item each cost the loop more than the refs (33,000 of them a
                # flood's first second).
                by_query = ref.WhichOneof("ref") == "query"
                async with self._shares.turn(paced=by_query or missed_by_key):
                    error = await self._ask(index, ref, request, stored, waiting)
                if not by_query:
                    missed_by_key = error is not None
                if error is not None:
                    yield error
            for index, key in stored:
                # From the memory cache as a rule; read again otherwise (the
                # stream keeps keys, not plans, while the caller reads).
                plan = self._store.cached(key)
                if plan is None:
                    async with self._shares.turn(paced=False):  # found already: finishing, not new work
                        plan = await self._store.get(key)
                yield (
                    plan.prefetch_item(index, key, pb.COMPILE_SOURCE_HIT)
                    if plan
                    else _error_item(index, key, NotFound(f"plan {key} was deleted meanwhile"))
                )
            while waiting:
                done, _ = await asyncio.wait(
                    waiting, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    for index, waiter, _ in waiting.values():
                        yield _error_item(index, waiter.plan_key, waiter.timeout())
                    break
                for future in done:
                    index, waiter, resolved = waiting.pop(future)
                    try:
                        try:
                            plan = future.result()
                        except PlanCacheError as e:
                            self._lookups.failed(waiter, resolved, e)
                            yield _error_item(index, resolved.key, e)
                            continue
                        source = pb.COMPILE_SOURCE_COMPILED if waiter.started else pb.COMPILE_SOURCE_JOINED
                        async with self._shares.turn(paced=False):  # a built plan handed over: not paced
                            item = plan.prefetch_item(index, resolved.key, plan_source(plan, source))
                        yield item
                    finally:
                        waiter.release()  # resumed: the item is written, its delivery slot is free
        finally:
            for _, waiter, _ in waiting.values():
                waiter.release()


def _missing(key: str, request: pb.PrefetchRequest, resolved: PlanQuery | None) -> NotFound | None:
    """Why a missing plan is not built for this ref (None: it is)."""
    if not request.compile_missing:
        return NotFound(f"no {'autotuned ' if request.tuned_only else ''}stored plan {key} (compile_missing is off)")
    if resolved is None:
        return NotFound(f"no stored plan {key}; send its spec, target and options to have it compiled")
    return None


def _error_item(index: int, key: str, error: PlanCacheError) -> pb.PrefetchItem:
    item = pb.PrefetchItem(
        index=index,
        key=key,
        error=pb.PrefetchError(code=error.code.name, message=bounded(error.message), error_class=type(error).__name__),
    )
    if error.retry_after is not None:
        item.error.retry_delay.CopyFrom(duration(error.retry_after))
    return item

"""A plan looked up, or its build started or joined, each counted once: what
Compile, GetPlan and Prefetch share.

A lookup is a hit (with the bytes it serves and the build time it saves)
or a miss of its target and op family; a build is started, joined or
refused, and fails at most once for the caller that started it.
"""

from __future__ import annotations

import logging
import time

from plancache.errors import PlanCacheError, TargetUnavailable
from plancache.keys.query import PlanQuery
from plancache.v1 import plancache_pb2 as pb
from plancache_server import telemetry
from plancache_server.gateway.builds import Builds
from plancache_server.gateway.flight import Waiter
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.plans import PlanStore, StoredPlan
from plancache_server.store.stats import Counter, Stats

log = logging.getLogger(__name__)


class PlanLookups:
    def __init__(
        self, store: PlanStore, builds: Builds, stats: Stats, directory: WorkerDirectory, compile_timeout_s: float
    ) -> None:
        self._store = store
        self._builds = builds
        self._stats = stats
        self._directory = directory
        self._compile_timeout_s = compile_timeout_s

    def deadline(self, time_remaining: float | None) -> float:
        """When a caller stops waiting for builds: its own deadline, or --compile-timeout if sooner."""
        budget = self._compile_timeout_s if time_remaining is None else min(time_remaining, self._compile_timeout_s)
        return time.monotonic() + budget

    async def known_failure(self, plan_key: str) -> str | None:
        """Why cuDNN rejected this key's graph recently, or None (also while callers here wait for its build)."""
        if self._builds.flying(plan_key):
            return None
        return await self._builds.known_failure(plan_key)

    async def lookup(
        self, plan_key: str, target_id: str, family: str | None = None, tuned_only: bool = False, count: bool = True
    ) -> StoredPlan | None:
        """The stored plan, counted as a hit (with the bytes it serves and the
        build time it saves) or a miss of its target and op family. A key
        whose build callers here already wait for is a miss without asking
        Redis: a herd of callers costs one read, when the plan lands. A
        provisional plan is a miss for a caller who wants the tuned one."""
        plan = self._store.cached(plan_key)
        if plan is None and not self._builds.flying(plan_key):
            plan = await self._store.get(plan_key)
        if plan is not None and tuned_only and plan.provisional:
            plan = None
        if count:
            self.count(plan_key, plan, target_id, family)
        return plan

    def count(self, plan_key: str, plan: StoredPlan | None, target_id: str, family: str | None) -> None:
        if family is None and plan is not None:  # a lookup by key: the plan knows its family
            family = plan.metadata.op_family or None
        if plan is None:
            self._stats.incr(Counter.MISSES, target_id=target_id, family=family)
        else:
            saved = plan.metadata.build_seconds + plan.metadata.autotune_seconds
            self._stats.hit(plan_key, len(plan.blob), saved, target_id=target_id, family=family)
        telemetry.child(
            telemetry.LOOKUPS, self._directory.scope(target_id), "hit" if plan is not None else "miss"
        ).inc()

    async def start_build(
        self, resolved: PlanQuery, tuned_only: bool = False, count: bool = True, yields: bool = False
    ) -> Waiter:
        """Wait for the build of a missing plan: started here, or joined (counted unless not `count`;
        `yields`: the caller builds it itself meanwhile, Builds.join)."""
        try:
            waiter = await self._builds.join(resolved.target, resolved.key, resolved.proto, tuned_only, yields)
        except TargetUnavailable:  # the first caller learns it while the build is being queued
            self._stats.incr(Counter.REFUSED, target_id=resolved.target.id, family=resolved.op_family)
            raise
        if count or waiter.started:
            self._stats.incr(
                Counter.COMPILES if waiter.started else Counter.JOINED,
                target_id=resolved.target.id,
                family=resolved.op_family,
            )
        if waiter.started:
            log.info("started the build of %s (job %s)", resolved.key, waiter.flight.job_id)
        return waiter

    def failed(self, waiter: Waiter, resolved: PlanQuery, error: PlanCacheError) -> None:
        if isinstance(error, TargetUnavailable):  # no build happened: a refusal, counted per caller
            self._stats.incr(Counter.REFUSED, target_id=resolved.target.id, family=resolved.op_family)
        elif waiter.started:
            self._stats.incr(Counter.FAILURES, target_id=resolved.target.id, family=resolved.op_family)


def plan_source(plan: StoredPlan, source: int) -> int:
    """How a built plan reached its caller; a provisional one says so
    instead. A stored plan is a hit, provisional or not (its metadata says)."""
    return pb.COMPILE_SOURCE_PROVISIONAL if plan.provisional else source

"""Warming: plans built for a target before its nodes ask.

Every upgrade of cuDNN or the frontend, and every new GPU kind, is a new
target with no plans. Warming builds, for a target T, the specs another
source served, in order of their recent hits: a sibling target's plans (the
same compute capability with other versions, or the same versions on
another device), the specs any target served in the last N days, or a
manifest.

A *warming plan* is written once per target: its items in build order, each
a complete build query (the spec the source's worker stored, T, the source
plan's options) and the source's recent hits of it; the share of the
source's hits the items cover once built is the plan's coverage. Workers of
T take the items one by one at the lowest priority (plancache_server.worker.worker:
a real miss is never delayed by warming beyond one candidate build) under a
per-target lease (one worker warms a target at a time across the fleet),
record each item's outcome (built, skipped because stored or being built,
failed with the reason) and resume where a restart left off: an item in
flight on a worker whose lease moved to another is built again.

Nothing here trusts Redis: an item is a job like any other, and the worker
derives its plan key from its spec, target and options before building it
(a forged or damaged item fails, is recorded and skipped).

Blocking (a worker, and gateways through a thread, as the janitor). The
plan's writing (warm_plans), a worker's side (warm_queue), what it has done
(warm_progress) and its items (warm_items) are modules of their own;
Warming is the one handle on the three that a worker and a gateway hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import redis

from plancache.errors import InvalidRequest
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store.warm_items import (
    ACTIVE,
    BUILT,
    CANCELLED,
    DONE,
    FAILED,
    SKIPPED,
    WARM_JOB_PREFIX,
    WarmItem,
)
from plancache_server.store.warm_plans import (
    DEFAULT_TOP,
    FAMILIES_SOURCE,
    HIT_HOURS,
    MAX_DAYS,
    MAX_QUEUED_ITEMS,
    MAX_TOP,
    Source,
    WarmPlans,
    recent_plan_hits,
)
from plancache_server.store.warm_progress import FAILURES_SHOWN, WarmProgress, WarmStatus
from plancache_server.store.warm_queue import WarmItemQueue

# Warming's names, read from here by the worker, the gateway and the web side.
__all__ = [
    "ACTIVE",
    "BUILT",
    "CANCELLED",
    "DEFAULT_TOP",
    "DONE",
    "FAILED",
    "FAILURES_SHOWN",
    "FAMILIES_SOURCE",
    "HIT_HOURS",
    "MAX_DAYS",
    "MAX_QUEUED_ITEMS",
    "MAX_TOP",
    "SKIPPED",
    "WARM_JOB_PREFIX",
    "Source",
    "WarmItem",
    "WarmStatus",
    "Warming",
    "recent_plan_hits",
    "siblings",
]


class Warming:
    """A target's warming as a worker and a gateway see it: each call is one
    of its parts' (plans: writing plans; items: a worker's side; progress:
    what a plan has done)."""

    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self.progress = WarmProgress(client)
        self.plans = WarmPlans(client, clock, self.progress)
        self.items = WarmItemQueue(client, clock)

    @property
    def client(self) -> redis.Redis:
        return self._redis

    # ---- plans (plancache_server.store.warm_plans) ----------------------------------

    def plan(
        self,
        target: Target,
        source: Source,
        top: int = DEFAULT_TOP,
        min_hits: float = 0.0,
        by: str = "operator",
        keep_empty: bool = True,
    ) -> WarmStatus | None:
        return self.plans.plan(target, source, top, min_hits, by, keep_empty)

    def extend(self, target: Target, items: Sequence[tuple[str, pb.PlanQuery]], by: str) -> int:
        return self.plans.extend(target, items, by)

    def cancel(self, target_id: str) -> WarmStatus:
        return self.plans.cancel(target_id)

    # ---- progress (plancache_server.store.warm_progress) ----------------------------

    def targets(self) -> list[str]:
        return self.progress.targets()

    def status(self, target_id: str) -> WarmStatus:
        return self.progress.status(target_id)

    def all_status(self) -> list[WarmStatus]:
        return self.progress.all_status()

    def created_at(self, target_id: str) -> float | None:
        return self.progress.created_at(target_id)

    # ---- a worker's side (plancache_server.store.warm_queue) ------------------------

    def active_targets(self, served: Iterable[Target]) -> list[str]:
        return self.items.active_targets(served)

    def hold(self, target_id: str, worker_id: str, lease_s: float) -> bool:
        return self.items.hold(target_id, worker_id, lease_s)

    def release(self, target_id: str, worker_id: str) -> None:
        self.items.release(target_id, worker_id)

    def next_item(self, target_id: str, worker_id: str) -> WarmItem | None:
        return self.items.next_item(target_id, worker_id)

    def cancelled(self, target_id: str, plan_key: str) -> bool:
        return self.items.cancelled(target_id, plan_key)

    def retry_later(self, target_id: str, index: int) -> None:
        self.items.retry_later(target_id, index)

    def record(self, target_id: str, index: int, outcome: str, reason: str = "", plan_key: str = "") -> None:
        self.items.record(target_id, index, outcome, reason, plan_key)


def siblings(target: Target, known: Iterable[str]) -> list[Target]:
    """Targets whose history can warm `target`: the same compute capability
    with other versions, or the same versions on another device (the
    generic target of an exact one, and the other way round)."""
    found = []
    for target_id in known:
        try:
            other = Target.parse(target_id)
        except InvalidRequest:
            continue
        if other.id == target.id or other.compute_capability != target.compute_capability:
            continue
        same_versions = (other.cudnn_version, other.frontend_version) == (target.cudnn_version, target.frontend_version)
        if not same_versions or (other.device_name, other.sm_count) != (target.device_name, target.sm_count):
            found.append(other)
    return found

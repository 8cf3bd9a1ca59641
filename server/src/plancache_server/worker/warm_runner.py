"""A worker's side of warming (plancache_server.store.warming): which item to
build next, and warming new targets on its own.

The worker asks for an item only when one of its build processes beyond
the first (kept for callers' heuristic plans) is free, and while a caller's
heuristic plan waits or builds only up to --warm-beside-callers of them, so
a real miss is never delayed by warming beyond one candidate build; a warm
item's heuristic plan then goes before autotunings' candidates, its
candidates after them (plancache_server.worker.lanes.Lane;
plancache_server.worker.warm_intake takes the items). One worker warms a
target at a time (a lease renewed by the worker's heartbeat).

On its own, a worker with no caller's heuristic plan for `auto_after_s`
looks at the targets it serves: one with fewer stored plans than a sibling
(plancache_server.store.warming.siblings) and no recent warming plan is planned
from that sibling's history (the specs it served in the last 24 h, most hit
first), unless --no-warm.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from plancache.errors import InvalidRequest
from plancache.keys.target import Target
from plancache_server.store import keys
from plancache_server.store.lifecycle import Janitor
from plancache_server.store.redis_conn import text, translated_errors
from plancache_server.store.warming import DEFAULT_TOP, Source, Warming, WarmItem, siblings

log = logging.getLogger(__name__)

# How often a worker with nothing to warm looks again: a graph family asked by a program sweeping its sizes
# is what the program's next misses need (one Redis read per look; at 1 s a sweep's family waited up to a
# second, several of its misses, before a member started).
CHECK_S = 0.2
# A target warmed on a worker's own initiative is planned again at most this often.
REPLAN_S = 3600.0
# Recent hits a spec needs to be warmed on a worker's own initiative.
AUTO_MIN_HITS = 1.0


@dataclass(frozen=True)
class WarmRef:
    """What a warm build reports its outcome to."""

    target_id: str
    index: int


class WarmRunner:
    def __init__(
        self,
        warming: Warming,
        janitor: Janitor,
        worker_id: str,
        targets: list[Target],
        lease_s: float,
        auto_after_s: float | None,
    ) -> None:
        """`auto_after_s`: idle seconds before warming a sibling on its own (None: never)."""
        self._warming = warming
        self._janitor = janitor
        self._worker_id = worker_id
        self._targets = targets
        self._lease_s = lease_s
        self._auto_after_s = auto_after_s
        self._held: set[str] = set()  # targets whose warming lease this worker holds
        self._next_check = 0.0
        self._idle_since = time.monotonic()

    def busy(self) -> None:
        """A caller's heuristic plan waits or builds: the idle clock starts again."""
        self._idle_since = time.monotonic()

    def has_work(self) -> bool:
        """Whether this worker warms a target now (it should not sleep on its job stream)."""
        return bool(self._held)

    def next_item(self) -> tuple[WarmRef, WarmItem] | None:
        """The next item of a target this worker warms, if one is due."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        for target_id in self._warming.active_targets(self._targets):
            if not self._warming.hold(target_id, self._worker_id, self._lease_s):
                continue  # another worker warms it
            self._held.add(target_id)
            item = self._warming.next_item(target_id, self._worker_id)
            if item is not None:
                return WarmRef(target_id, item.index), item
            self._warming.release(target_id, self._worker_id)
            self._held.discard(target_id)
        self._next_check = now + CHECK_S
        if self._auto_after_s is not None and now - self._idle_since >= self._auto_after_s and self._plan_on_own():
            self._next_check = 0.0  # its items at once
        return None

    def cancelled(self, ref: WarmRef, plan_key: str) -> bool:
        """Whether the item is a member of a graph family an operator cancelled."""
        return self._warming.cancelled(ref.target_id, plan_key)

    def record(self, ref: WarmRef, outcome: str, reason: str = "", plan_key: str = "") -> None:
        self._warming.record(ref.target_id, ref.index, outcome, reason, plan_key)

    def defer(self, ref: WarmRef) -> None:
        """This item cannot be built now (another warm build holds its lease):
        built again later; warming pauses a little meanwhile."""
        self._warming.retry_later(ref.target_id, ref.index)
        self._next_check = time.monotonic() + CHECK_S

    def renew(self) -> None:
        """From the heartbeat: keep the leases of the targets being warmed."""
        for target_id in list(self._held):
            if not self._warming.hold(target_id, self._worker_id, self._lease_s):
                log.warning("lost the warming lease of %s", target_id)
                self._held.discard(target_id)

    def release_all(self) -> None:
        for target_id in self._held:
            self._warming.release(target_id, self._worker_id)
        self._held.clear()

    # ---- on its own --------------------------------------------------------------------

    def _plan_on_own(self) -> bool:
        """Plan warming a target of this worker from its richest sibling; whether it did."""
        try:
            usage = self._janitor.usage()
            known = self._known_targets()
        except InvalidRequest:
            return False
        for target in self._targets:
            if target.id in self._recently_planned():
                continue
            mine = usage.get(target.id)
            richest = max(
                siblings(target, known), key=lambda s: usage[s.id].stored_plans if s.id in usage else 0, default=None
            )
            if richest is None or richest.id not in usage:
                continue
            if usage[richest.id].stored_plans <= (mine.stored_plans if mine else 0):
                continue
            if not self._warming.hold(target.id, self._worker_id, self._lease_s):
                continue
            try:
                status = self._warming.plan(
                    target,
                    Source(target_id=richest.id),
                    DEFAULT_TOP,
                    AUTO_MIN_HITS,
                    f"worker {self._worker_id}",
                    keep_empty=False,
                )
            except InvalidRequest as e:
                log.info("not warming %s from %s: %s", target.id, richest.id, e.message)
                status = None
            if status is None:  # nothing of the sibling was hit recently: nothing worth warming yet
                self._warming.release(target.id, self._worker_id)
                continue
            self._held.add(target.id)
            log.info(
                "warming %s on its own from %s (%d stored there, %d here): %d spec(s) with recent hits",
                target.id,
                richest.id,
                usage[richest.id].stored_plans,
                mine.stored_plans if mine else 0,
                status.total,
            )
            return True
        return False

    def _known_targets(self) -> Iterable[str]:
        with translated_errors("listing known targets"):
            return [text(t) for t in self._warming.client.smembers(keys.KNOWN_TARGETS)]

    def _recently_planned(self) -> set[str]:
        cutoff = time.time() - REPLAN_S
        recent = set()
        for target in self._targets:
            created = self._warming.created_at(target.id)
            if created is not None and created >= cutoff:
                recent.add(target.id)
        return recent

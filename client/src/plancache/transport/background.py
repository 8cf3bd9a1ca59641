"""A prefetch that runs while the node does other start-up work.

    pending = client.prefetch_in_background(manifest, load=True)
    weights = load_weights()               # the node's own start-up, meanwhile
    plan = pending.wait_for(0)             # one plan, as soon as it is ready
    result = pending.wait()                # or all of them

One thread fetches, verifies and (with `load`) deserializes the plans as
they arrive, in the order the server streams them; the node's thread only
waits for what it needs when it needs it. One thread, not several: on an
H200, deserializing from four threads was slower than from one (0.49x).
That thread's CUDA work runs on a stream of its own, never on the legacy
default stream the program's own work runs on (plancache.run.execution.
on_own_stream says why).

`start_loading(after)` turns deserializing on for a prefetch begun `held`
(a workload's stream whose record is not settled, once the program's
graphs have taken it in order: plancache.transport.workload):
the plans already here past entry `after` are deserialized on a thread of
their own, in order, and the rest as they arrive; `stop_loading()` turns
it off for good.
`cancel()` ends the stream early (what came is kept); `skip(i)` says entry
i is not wanted from it any more (its caller fetched it itself: it is not
deserialized when it comes); `position(i)` says how far the stream is from
entry i and how fast it has been coming (plancache.transport.workload
decides from it whether a graph waits for the stream or asks the service).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from plancache.errors import PlanCacheError

if TYPE_CHECKING:
    from plancache.run.plan import Plan
    from plancache.transport.results import PrefetchResult

log = logging.getLogger(__name__)

# A caller waits for entry i when it is among the stream's next STREAM_FREE_AHEAD (the pace unknown, or no
# slower than asking) or is expected within STREAM_WAIT_S at the stream's pace so far; else it asks the service
# (a hit: one round trip and its deserialization) rather than wait behind plans it does not need now.
STREAM_FREE_AHEAD = 2
STREAM_WAIT_S = 0.05

OnPlan = Callable[[int, "Plan"], None]


class BackgroundPrefetch:
    def __init__(
        self,
        run: Callable[[OnPlan], PrefetchResult],
        load: bool,
        stop: Callable[[], None] | None = None,
        *,
        held: bool = False,
    ) -> None:
        """`run(on_plan)` does the prefetch, calling `on_plan(index, plan)`
        for each plan as it arrives; `load` deserializes each one there
        (with `held`, only from start_loading() on); `stop()` (cancel's)
        ends `run` early."""
        self._run = run
        self._may_load = load
        self._load = load and not held
        self._load_stopped = False  # stop_loading() is final: start_loading() does not undo it
        self._stop = stop
        self._changed = threading.Condition()
        self._ready: dict[int, Plan] = {}
        self._load_errors: dict[int, Exception] = {}
        self._skipped: set[int] = set()  # entries the caller fetched itself (skip())
        self._cancelled = False
        self._landed: set[int] = set()  # entries that came (kept, skipped or failing to load)
        self._first_landed_at: float | None = None
        self._last_landed_at: float | None = None
        self._result: PrefetchResult | None = None
        self._failure: BaseException | None = None
        self.started_at = time.perf_counter()
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._main, name="plancache-prefetch", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            result = self._run(self._arrived)
        except BaseException as e:  # reported by wait(): the node's thread decides what to do
            log.warning("background prefetch failed: %s", e)
            with self._changed:
                self._failure = e
                self.finished_at = time.perf_counter()
                self._changed.notify_all()
            return
        with self._changed:
            unwanted = [i for i in result.plans if i in self._skipped or (self._cancelled and i not in self._ready)]
            for index in unwanted:  # fetched by its caller (skip), or came after cancel(): not kept
                result.plans.pop(index)
                if index not in self._skipped:
                    result.stopped += 1
            for index, error in self._load_errors.items():
                result.plans.pop(index, None)
                result.errors[index] = (
                    error if isinstance(error, PlanCacheError) else PlanCacheError(f"deserializing failed: {error}")
                )
            self._result = result
            self.finished_at = time.perf_counter()
            self._changed.notify_all()

    def _arrived(self, index: int, plan: Plan) -> None:
        with self._changed:
            unwanted = self._cancelled or index in self._skipped
        if unwanted:  # nothing deserialized for it
            self._landed_now(index)
            return
        if self._load:
            try:
                from plancache.run.execution import on_own_stream

                on_own_stream()  # never on the stream the program's own work runs on (see on_own_stream)
                self._load_plan(plan)
            except Exception as e:  # a plan that does not load is that entry's error, not the prefetch's
                with self._changed:
                    self._load_errors[index] = e
                self._landed_now(index)
                return
        with self._changed:
            if index not in self._skipped:
                self._ready[index] = plan
        self._landed_now(index)

    def _landed_now(self, index: int) -> None:
        now = time.perf_counter()
        with self._changed:
            self._landed.add(index)
            if self._first_landed_at is None:
                self._first_landed_at = now
            self._last_landed_at = now
            self._changed.notify_all()

    def cancel(self) -> None:
        """End the prefetch: its stream's call cancelled; nothing that comes
        after is deserialized or kept; plans already here stay; wait() returns
        what came (the rest in `result.stopped`)."""
        with self._changed:
            self._cancelled = True
        if self._stop is not None:
            self._stop()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def stop_loading(self) -> None:
        """From now on, plans are fetched and kept but not deserialized here (each at its first use instead)."""
        self._load_stopped = True
        self._load = False

    def start_loading(self, after: int = -1) -> None:
        """A `held` prefetch's plans are deserialized here from now on as they arrive, and those already here
        past entry `after` (the caller's position: the plans up to it were asked already) on a thread of its
        own, in order; nothing without `load`, or once stop_loading() was called. A plan its caller
        deserializes meanwhile is deserialized once (Plan.load's lock)."""
        with self._changed:
            if self._load or not self._may_load or self._load_stopped or self._cancelled:
                return
            self._load = True
            backlog = sorted(i for i in self._ready if i > after)
        if backlog:
            threading.Thread(target=self._load_backlog, args=(backlog,), name="plancache-load", daemon=True).start()

    def _load_backlog(self, indices: list[int]) -> None:
        from plancache.run.execution import on_own_stream

        try:
            on_own_stream()
        except Exception as e:  # no CUDA after all: each plan is deserialized at its first use
            log.debug("plans already fetched are left to their first use: %s", e)
            return
        for index in indices:
            with self._changed:
                if not self._load or self._cancelled:  # stop_loading() or cancel() meanwhile
                    return
                plan = self._ready.get(index)
            if plan is None:
                continue
            try:
                self._load_plan(plan)
            except Exception as e:  # its caller's own load raises it, where it is used
                log.debug("plan %d did not deserialize ahead of its use: %s", index, e)

    def _load_plan(self, plan: Plan) -> None:
        """A plan deserialized by the stream's own threads (not by a caller at first use, which calls
        plan.load() itself): one place, where a test or benchmark clocks the stream's deserializations alone."""
        plan.load()

    @property
    def loading(self) -> bool:
        return self._load

    def skip(self, index: int) -> None:
        """Entry `index` is not wanted from this prefetch (its caller fetched it itself): not deserialized,
        not kept when it comes; wait_for(index) raises at once."""
        with self._changed:
            if index not in self._ready:
                self._skipped.add(index)
                self._changed.notify_all()

    def position(self, index: int) -> tuple[int, float | None]:
        """How far entry `index` is: the entries up to it, itself included,
        that have not come yet (0: it is here, or the prefetch is over), and
        the seconds the stream has taken per entry so far (None before any
        came); entries come in the manifest's order."""
        with self._changed:
            if index in self._landed or self._result is not None or self._failure is not None:
                return 0, self._pace()
            ahead = index + 1 - sum(1 for i in self._landed if i <= index)
            return ahead, self._pace()

    def worth_waiting(self, index: int) -> bool:
        """Whether a caller needing entry `index` now should wait for it here
        (STREAM_FREE_AHEAD, STREAM_WAIT_S) rather than fetch it itself; if
        not, the caller fetches it and says so with skip(index)."""
        ahead, pace = self.position(index)
        return ahead <= STREAM_FREE_AHEAD or (pace is not None and ahead * pace <= STREAM_WAIT_S)

    def _pace(self) -> float | None:
        count, first, last = len(self._landed), self._first_landed_at, self._last_landed_at
        if first is None or last is None:
            return None
        if count == 1:
            return first - self.started_at
        return (last - first) / (count - 1)

    def done(self) -> bool:
        return self._result is not None or self._failure is not None

    def ready(self, index: int) -> Plan | None:
        """Entry `index`'s plan if it is fetched, verified (and loaded), else None."""
        with self._changed:
            return self._ready.get(index)

    def wait_for(self, index: int, timeout: float | None = None) -> Plan:
        """Entry `index`'s plan, waiting for it; its error if it failed;
        TimeoutError past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                if index in self._ready:
                    return self._ready[index]
                if index in self._skipped:
                    raise PlanCacheError(f"plan {index} was fetched by its caller, not by this prefetch")
                if self._cancelled and index in self._landed:
                    raise PlanCacheError(f"plan {index} came after the prefetch was cancelled")
                if index in self._load_errors:
                    raise PlanCacheError(f"plan {index} did not deserialize: {self._load_errors[index]}")
                if self._failure is not None:
                    raise self._failure
                if self._result is not None:
                    raise self._result.errors.get(index) or PlanCacheError(f"entry {index} has no plan")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"plan {index} is not ready yet")
                self._changed.wait(left)

    def wait(self, timeout: float | None = None) -> PrefetchResult:
        """Every entry's plan or error, once the prefetch is over."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._result is None and self._failure is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("the prefetch is still under way")
                self._changed.wait(left)
            if self._failure is not None:
                raise self._failure
            assert self._result is not None
            return self._result

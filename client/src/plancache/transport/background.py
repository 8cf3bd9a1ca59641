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

OnPlan = Callable[[int, "Plan"], None]


class BackgroundPrefetch:
    def __init__(self, run: Callable[[OnPlan], PrefetchResult], load: bool) -> None:
        """`run(on_plan)` does the prefetch, calling `on_plan(index, plan)`
        for each plan as it arrives; `load` deserializes each one there."""
        self._run = run
        self._load = load
        self._changed = threading.Condition()
        self._ready: dict[int, Plan] = {}
        self._load_errors: dict[int, Exception] = {}
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
            for index, error in self._load_errors.items():
                result.plans.pop(index, None)
                result.errors[index] = (
                    error if isinstance(error, PlanCacheError) else PlanCacheError(f"deserializing failed: {error}")
                )
            self._result = result
            self.finished_at = time.perf_counter()
            self._changed.notify_all()

    def _arrived(self, index: int, plan: Plan) -> None:
        if self._load:
            try:
                from plancache.run.execution import on_own_stream

                on_own_stream()  # never on the stream the program's own work runs on (see on_own_stream)
                plan.load()
            except Exception as e:  # a plan that does not load is that entry's error, not the prefetch's
                with self._changed:
                    self._load_errors[index] = e
                    self._changed.notify_all()
                return
        with self._changed:
            self._ready[index] = plan
            self._changed.notify_all()

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

"""A manifest's plans in one streaming call (Client.prefetch).

What the disk cache holds costs no call; the rest is asked for in ONE
Prefetch stream: stored plans at once, then (with compile_missing) each
build as it finishes. Refs the server refuses for now (admission control)
are asked for again after its retry delay, within the deadline. Failures
are collected per entry, never raised: a node starts with what came. A
`PrefetchStop` called from another thread ends it early: the stream's call
is cancelled, nothing more is asked, what came is kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from plancache.errors import PlanCacheError, error_from_status
from plancache.keys.target import Target
from plancache.run.plan import Plan
from plancache.transport.calls import remaining, retry_pause, typed
from plancache.transport.connection import Connection
from plancache.transport.intake import PlanIntake
from plancache.transport.manifest import Manifest
from plancache.transport.results import PrefetchResult
from plancache.trust.answers import Asked
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.rich_status import seconds_of

OnPlan = Callable[[int, Plan], None]
Progress = Callable[[int, int], None]


class PrefetchStop:
    """Ends a prefetch from another thread (`stop()`): its stream's call
    cancelled at once, no further attempt; entries that had not come are
    neither plans nor errors (`PrefetchResult.stopped`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._calls: list[Any] = []
        self._event = threading.Event()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        with self._lock:
            self._stopped, calls, self._calls = True, self._calls, []
        self._event.set()
        for call in calls:
            call.cancel()

    def pause(self, seconds: float) -> None:
        """Sleep `seconds` (a retry's delay), or less: until stop()."""
        self._event.wait(seconds)

    def watch(self, call: Any) -> None:
        """`call` (a gRPC streaming call) is cancelled by stop(), at once if it was called already."""
        with self._lock:
            if not self._stopped:
                self._calls.append(call)
                return
        call.cancel()

    def unwatch(self, call: Any) -> None:
        with self._lock:
            if call in self._calls:
                self._calls.remove(call)


class ManifestPrefetch:
    """One prefetch of one manifest: what it asked for and what came (`result`)."""

    def __init__(
        self,
        connection: Connection,
        intake: PlanIntake,
        manifest: Manifest,
        target: Target | None,
        *,
        compile_missing: bool,
        tuned_only: bool,
        progress: Progress | None,
        on_plan: OnPlan | None,
        stop: PrefetchStop | None = None,
    ) -> None:
        self._connection, self._intake, self._manifest, self._target = connection, intake, manifest, target
        self._compile_missing, self._tuned_only = compile_missing, tuned_only
        self._progress, self._on_plan = progress, on_plan
        self._stop = stop
        self.result = PrefetchResult(total=len(manifest.entries))
        self._held: dict[int, Plan] = {}  # provisional plans of the disk cache: kept if nothing better comes

    def run(self, budget: float | None) -> PrefetchResult:
        """The disk cache first, then the stream, within `budget` seconds."""
        refs = self._refs()
        self._report_progress()
        deadline = None if budget is None else time.monotonic() + budget
        attempt = 0
        while refs and not self._stopped():
            refused = self._stream(refs, deadline)
            if self._stopped():
                break
            delay = max(e.retry_after or 0.0 for _, _, e in refused) if refused else None
            pause = retry_pause(delay, attempt, deadline) if refused else None
            if pause is None:
                for index, _, error in refused:
                    self.result.errors[index] = error
                break
            if self._stop is not None:
                self._stop.pause(pause)  # a stop ends the pause, and the loop's test the prefetch
            else:
                time.sleep(pause)
            refs, attempt = [(index, ref) for index, ref, _ in refused], attempt + 1
        for index, plan in self._held.items():
            if index not in self.result.plans:  # the server had nothing better (or could not be asked)
                self.result.errors.pop(index, None)
                self._keep(index, plan, from_cache=True)
        if self._stopped():
            self.result.stopped = self.result.total - self.result.done
        return self.result

    def _stopped(self) -> bool:
        return self._stop is not None and self._stop.stopped

    def _refs(self) -> list[tuple[int, pb.PlanRef]]:
        """Every entry the disk cache cannot answer, as what the stream asks for."""
        refs: list[tuple[int, pb.PlanRef]] = []
        for index, entry in enumerate(self._manifest.entries):
            try:
                query = self._manifest.query_of(entry, self._target) if entry.spec is not None else None
                key = query.key if query is not None else self._manifest.key_of(entry, self._target)
            except PlanCacheError as e:
                self.result.errors[index] = e
                continue
            self.result.keys[index] = key
            cached = self._intake.cached(key, self._tuned_only, refresh=False)
            if cached is not None and not cached.provisional:
                self._keep(index, cached, from_cache=True)
                continue
            if cached is not None:
                self._held[index] = cached  # asked for again below
            if self._compile_missing and query is not None:
                refs.append((index, pb.PlanRef(query=query.to_proto())))
            else:
                refs.append((index, pb.PlanRef(key=key)))
        return refs

    def _stream(
        self, refs: list[tuple[int, pb.PlanRef]], deadline: float | None
    ) -> list[tuple[int, pb.PlanRef, PlanCacheError]]:
        """One streaming call; the refs refused with a retry delay, with their errors."""
        refused: list[tuple[int, pb.PlanRef, PlanCacheError]] = []
        answered: set[int] = set()
        request = pb.PrefetchRequest(
            refs=[ref for _, ref in refs], compile_missing=self._compile_missing, tuned_only=self._tuned_only
        )
        connection = self._connection
        call = connection.stub.Prefetch(request, timeout=remaining(deadline), metadata=connection.metadata)
        if self._stop is not None:
            self._stop.watch(call)
        try:
            for item in call:
                if self._stopped():
                    break
                if not 0 <= item.index < len(refs) or item.index in answered:
                    continue  # not an answer to anything asked
                answered.add(item.index)
                index, ref = refs[item.index]
                error = self._take(index, item)
                if error is not None and error.retry_after is not None:
                    refused.append((index, ref, error))
                elif error is not None:
                    self.result.errors[index] = error
                self._report_progress()
        except grpc.RpcError as exc:
            if self._stopped():  # cancelled by the stop: what had not come is neither a plan nor an error
                return []
            error = typed(exc)
            for position, (index, ref) in enumerate(refs):
                if position not in answered:
                    if error.retry_after is not None:
                        refused.append((index, ref, error))
                    else:
                        self.result.errors[index] = error
        finally:
            if self._stop is not None:
                self._stop.unwatch(call)
        return refused

    def _take(self, index: int, item: pb.PrefetchItem) -> PlanCacheError | None:
        """Keep the plan of an answer; the error it carries, if any."""
        if item.WhichOneof("result") == "error":
            code = getattr(grpc.StatusCode, item.error.code, grpc.StatusCode.UNKNOWN)
            retry_after = seconds_of(item.error.retry_delay) if item.error.HasField("retry_delay") else None
            return error_from_status(code, item.error.message, item.error.error_class, retry_after)
        try:
            plan = self._intake.answer(item.plan, item.source, Asked(self.result.keys[index]))
        except PlanCacheError as e:  # a blob that does not match its sha256, or an untrusted signature
            return e
        self._keep(index, plan, from_cache=False)
        return None

    def _keep(self, index: int, plan: Plan, *, from_cache: bool) -> None:
        self.result.plans[index] = plan
        if from_cache:
            self.result.from_cache += 1
        elif plan.source in ("compiled", "joined", "provisional"):
            self.result.compiled += 1
        else:
            self.result.fetched += 1
        if self._on_plan is not None:
            self._on_plan(index, plan)

    def _report_progress(self) -> None:
        if self._progress is not None:
            self._progress(self.result.done, self.result.total)

"""The hedged miss: a node's own build raced against the service's, as
Bazel's dynamic execution races a local and a remote spawn.

A hedged compile asks as a hit is asked, one unary Compile on the caller's
thread, with `answer_miss_at_once`: a hit answers the plan and that is all
(a hit never starts a local build, and costs what it cost before: no
thread, no stream). On a miss the server starts or joins the build and
answers at once that it is building; the node then builds the plan itself
on the caller's thread, while the race asks again (`counted`: the same
build, counted once) and verifies the service's answer (signature, and
that it answers what was asked) when it comes, on the kept thread its
Compile waits on (`WaitingCalls`). An
expected miss skips the first answer (plancache.transport.hedged_calls).
When the node's build returns:

- the service's verified plan came first: it runs (the service won);
- else the node's plan runs (source "local"), and the service's replaces it
  at its next safe point (plancache.run.local), the tuned plan later as
  always (`compile()` again, or a prefetch, asks for the key once more).

Why the local build is not on a thread of its own, to return the service's
plan the moment it lands: the frontend holds the GIL while it builds (its
bindings never release it), so the caller would be stalled all the same; and
the program's build runs where the program would have run it, with its
handle. So a node waits at most its own build, plus the round trip in which
the server says "miss" (none for an expected miss).

A service that refuses the graph itself (SpecError, InvalidRequest: its
limits narrower than this client's) is raised when it says so in its first
answer; when it says so after the node began building (its first answer
came by the caller's key, before it validated the spec: the miss's fixed
cost, issue 41), the node's plan runs, as it would without plancache, and
the refusal is logged (once a minute) and counted as the service failing.

Failures never hide the other side: a service that fails (down, refusing,
timing out, no worker, a plan failing verification, which is never
deserialized) leaves the node's plan; a local build that fails waits for the
service's answer (within the call's deadline). Both failing raises the
service's error, the local one in its message. The first answer is awaited
HEDGE_AFTER_S at most (PLANCACHE_HEDGE_AFTER_S): a server that cannot say
hit or miss by then is treated as a miss (every wait has a bound).

The outcome of each race is counted per path (`race_stats()`: compile,
cudnn, functional) and reported to the service in the background
(plancache.transport.reports: ReportFirstUses, best effort), which shows
what share of first uses it served, and the races won and lost.

Off by `Client(hedge=False)`, `compile(..., hedge=False)` or the
environment (PLANCACHE_HEDGE=0); on by default where the node can build: the
process has loaded torch (a fetcher or tool that never does is not made to),
the frontend imports, a GPU is there, and the target is this GPU's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import grpc

from plancache.env import env_bool
from plancache.errors import InvalidRequest, PlanCacheError, SpecError, Unavailable, UntrustedPlan
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.log_limits import LogLimiter
from plancache.run.execution import process
from plancache.run.local import build_local, can_build_here
from plancache.run.plan import Plan
from plancache.transport.calls import remaining, retry_pause, typed
from plancache.trust.answers import satisfies
from plancache.v1 import plancache_pb2 as pb

log = logging.getLogger(__name__)
_refusals = LogLimiter(log)  # a service refusing the graphs a node builds itself: one line a minute

HEDGE_ENV = "PLANCACHE_HEDGE"
HEDGE_AFTER_ENV = "PLANCACHE_HEDGE_AFTER_S"
# Longest wait for the server to say hit or miss before the node starts its own build.
HEDGE_AFTER_S = 1.0
# Errors that say the request itself is wrong: the node's build would not make it right.
NOT_HEDGED: tuple[type[PlanCacheError], ...] = (SpecError, InvalidRequest)
PATHS = ("compile", "cudnn", "functional")

T = TypeVar("T")


def hedge_default() -> bool:
    """The environment's choice (PLANCACHE_HEDGE, plancache.env's words), on unless it says off."""
    return env_bool(HEDGE_ENV, True)


def hedge_after_s() -> float:
    try:
        return max(0.0, float(os.environ.get(HEDGE_AFTER_ENV, HEDGE_AFTER_S)))
    except ValueError:
        return HEDGE_AFTER_S


# ---- the node's own build ------------------------------------------------------


class LocalBuilder(Protocol):
    """How a node builds a plan itself (the frontend's, or a test's stand-in)."""

    def can_build(self, target: Target) -> bool: ...

    def build(self, query: PlanQuery) -> Plan: ...


class FrontendBuilder:
    """The node's own frontend, on the current GPU: what the program would have built without plancache."""

    def __init__(self) -> None:
        self._answers: dict[
            tuple[str, int], bool
        ] = {}  # (target id, device) -> whether a plan built here is one for it

    def can_build(self, target: Target) -> bool:
        """Whether a plan built here is one for `target` (this GPU satisfies
        it). A process that has not loaded torch runs no plan here (a
        fetcher, a tool): it is not asked to build, nor made to load torch."""
        if "torch" not in sys.modules or not can_build_here():
            return False
        device = process().runtime.current_device()
        found = self._answers.get((target.id, device))
        if found is None:
            from plancache.gpu.target import detect_target

            found = self._answers[(target.id, device)] = satisfies(detect_target(device), target)
        return found

    def build(self, query: PlanQuery) -> Plan:
        return build_local(query)


# ---- counters ---------------------------------------------------------------------


@dataclass
class RaceCounts:
    """How one path's hedged misses ended."""

    local_won: int = 0  # the node's own build was ready first: its plan ran
    service_won: int = 0  # the service's verified plan came before the node's build returned
    local_failed: int = 0  # the node's build failed: the service's answer was waited for
    service_failed: int = 0  # the service failed (or its plan failed verification): the node's plan ran
    replaced: int = 0  # node plans the service's plan later took over from
    # Expected misses (plancache.transport.hedged_calls): the node's build started without a first answer.
    at_once: int = 0
    stored_after_all: int = 0  # of those, graphs the service had stored (the node's build was not needed)
    record_disbelieved: int = 0  # clients whose workload record was proven wrong by one of those (hedged_calls)


_COUNTS: dict[str, RaceCounts] = {}
_counts_lock = threading.Lock()


def counts(path: str) -> RaceCounts:
    found = _COUNTS.get(path)
    if found is None:
        with _counts_lock:
            found = _COUNTS.setdefault(path, RaceCounts())
    return found


def race_stats() -> dict[str, RaceCounts]:
    """Races of this process per path (compile, cudnn, functional), a copy."""
    return {path: dataclasses.replace(counts(path)) for path in PATHS}


def reset_race_stats() -> None:
    with _counts_lock:
        _COUNTS.clear()


def refused_plan(error: PlanCacheError) -> None:
    """A service plan this client refused (UntrustedPlan: a key not trusted yet, a forged plan) while the
    node's own plan runs: said once a minute, with its remedy (`plancache trust`): a newcomer's program
    runs, and the log says why the service's plans do not."""
    if isinstance(error, UntrustedPlan):
        _refusals.warning(
            "untrusted", "the service's plan was refused; this node runs its own build: %s", error.message[:500]
        )


# ---- one race -----------------------------------------------------------------------


@dataclass(frozen=True)
class CompileAsk:
    """The Compile a race sends (its answer waits for the build the first request started or joined, or is the
    plan itself where the service has one), through `method`, a stub's Compile: waited for on a kept thread
    (`call`) or as gRPC's future."""

    method: grpc.UnaryUnaryMultiCallable[pb.CompileRequest, pb.CompileResponse]
    request: pb.CompileRequest
    metadata: tuple[tuple[str, str], ...] | None

    def call(self, timeout: float | None) -> pb.CompileResponse:
        return self.method(self.request, timeout=timeout, metadata=self.metadata)

    def future(self, timeout: float | None) -> grpc.Future[pb.CompileResponse]:
        return self.method.future(self.request, timeout=timeout, metadata=self.metadata)

    def waiting(self) -> CompileAsk:
        """The same Compile from a caller that now waits for the plan (its own build failed): without
        `builds_itself`, so the service stops letting the build wait for callers that build it themselves."""
        request = pb.CompileRequest()
        request.CopyFrom(self.request)
        request.builds_itself = False
        return CompileAsk(self.method, request, self.metadata)


class Race:
    """The service's side of one hedged miss. `ask` sends a Compile;
    `remember(response)` verifies the answer and makes its Plan
    (PlanCacheError when it does not verify). The Compile waits on one of
    the process's kept daemon threads (`WaitingCalls`: handing it over costs
    the caller ~20 µs, where gRPC's `future()` started a thread of its own
    for a call alone on its channel, ~0.4-0.6 ms of every miss,
    bench/miss_cost.py and GPU run 40), which verifies the answer when it
    comes; past the kept threads' bound it goes as gRPC's future, whose
    callback hands the verification to a small pool shared by every race (a
    thread started per miss cost the caller 0.3-0.4 ms, GPU run 27). A
    refusal for now (admission control) is asked again after the server's
    delay, within `deadline`, while the node builds. `building`: the service
    said it was building the plan, or was asked while the node began its
    build (it knows this miss). `on_answer(race, response)`, when given,
    sees each answer before it is verified. Without `ask`, the race is over
    before it began: `error` says why."""

    def __init__(
        self,
        ask: CompileAsk | None,
        remember: Callable[[pb.CompileResponse], Plan],
        path: str,
        deadline: float | None,
        *,
        building: bool,
        error: PlanCacheError | None = None,
        on_answer: Callable[[Race, pb.CompileResponse], None] | None = None,
    ) -> None:
        self._ask = ask
        self._remember = remember
        self.path = path
        self._deadline = deadline
        self.building = building
        self._on_answer = on_answer
        self._plan: Plan | None = None
        self.error = error
        self.answered_at: float | None = None  # monotonic, when the answer (or the failure) came
        self._future: grpc.Future[pb.CompileResponse] | None = None
        self._attempt = 0
        self._done = threading.Event()
        self._cancelled = False
        if ask is None:
            self._finish()
        else:
            self._send()

    @property
    def plan(self) -> Plan | None:
        return self._plan

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._done.wait(timeout)

    def adopted(self) -> None:
        counts(self.path).replaced += 1

    def hurry(self) -> None:
        """The node's own build failed: it now waits for the service's plan. A Compile that says so (not
        `builds_itself`) is sent beside the race's own, on a kept thread, its answer left unread: the service
        then builds at once what it let wait for this node (plancache_server.worker.lanes.YieldGate), and the
        race's own Compile brings the plan."""
        ask = self._ask
        if ask is None or self.done() or not ask.request.builds_itself:
            return
        waiting = ask.waiting()

        def send() -> None:
            try:
                waiting.call(remaining(self._deadline))
            except Exception as e:  # the race's own Compile says what the service says
                log.debug("a hedged miss's hurry went unanswered: %s", e)

        if not waiting_calls.get().submit(send):
            log.debug("no kept thread free to hurry the service; the race's own Compile waits for it")

    def cancel(self) -> None:
        """No more asking (a refusal for now is not asked again); a future is cancelled, a call waiting on a kept
        thread ends at its deadline (the race's: it was sent with what was left of it)."""
        self._cancelled = True
        if self._future is not None:
            self._future.cancel()

    def _send(self) -> None:
        if waiting_calls.get().submit(self._wait):
            return
        assert self._ask is not None
        try:
            self._future = self._ask.future(remaining(self._deadline))
        except Exception as e:  # e.g. a closed channel
            self.error = Unavailable(f"the service could not be asked: {type(e).__name__}: {e}")
            self._finish()
            return
        self._future.add_done_callback(self._answered)

    def _wait(self) -> None:
        """On a kept thread: the Compile, then its answer verified here."""
        ask = self._ask
        assert ask is not None
        self._take(lambda: ask.call(remaining(self._deadline)))

    def _answered(self, future: grpc.Future[pb.CompileResponse]) -> None:
        """On gRPC's thread (or the asker's, when already done): the verification goes to the pool."""
        try:
            _answer_pool.get().submit(self._settle, future)
        except RuntimeError:  # the interpreter is shutting down: no pool any more
            self._settle(future)

    def _settle(self, future: grpc.Future[pb.CompileResponse]) -> None:
        self._take(future.result)

    def _take(self, answer: Callable[[], pb.CompileResponse]) -> None:
        """The service's answer, from `answer()`: verified, or the call's failure (asked again where it says so)."""
        try:
            response = answer()
        except grpc.RpcError as exc:
            self._failed(typed(exc))
            return
        except Exception as e:  # e.g. a closed channel, or the call cancelled
            self.error = Unavailable(f"the service's answer did not come: {type(e).__name__}: {e}")
            self._finish()
            return
        self._accept(response)

    def _accept(self, response: pb.CompileResponse) -> None:
        try:
            if self._on_answer is not None:
                self._on_answer(self, response)
            self._plan = self._remember(response)
        except PlanCacheError as e:  # the answer did not verify: never deserialized, never run
            self.error = e
            refused_plan(e)
        except Exception as e:  # e.g. a message this client cannot read
            self.error = Unavailable(f"the service's answer did not come: {type(e).__name__}: {e}")
        self._finish()

    def _failed(self, error: PlanCacheError) -> None:
        """A failed call: asked again after the server's delay (a refusal for now), else the race's error."""
        if isinstance(error, NOT_HEDGED):  # told after the node began its build (a claimed or expected miss)
            _refusals.warning("refused", "the service refuses a graph this node builds itself: %s", error.message[:300])
        pause = None if self._cancelled else retry_pause(error.retry_after, self._attempt, self._deadline)
        if pause is None:
            self.error = error
            self._finish()
            return
        self._attempt += 1
        retry = threading.Timer(pause, self._send)  # rare (admission control): a timer thread for the pause
        retry.daemon = True
        retry.start()

    def _finish(self) -> None:
        if self._plan is None and self.error is None:
            self.error = Unavailable("the service's answer did not come")
        self.answered_at = time.monotonic()
        self._done.set()


class WaitingCalls:
    """Kept daemon threads on which races' Compiles wait for the service's builds, started as needed up to
    `limit` (each waits in gRPC with the interpreter released; a process's misses in flight at once are few: one
    per thread that compiles). A thread that takes work while none is left idle starts a spare first, so that the
    next miss hands its call over (~20 µs) instead of starting a thread on the caller's thread (~0.4 ms: GPU run
    41 measured 0.3-0.8 ms on every other miss, where the previous miss's call still waited). Daemon threads: a
    process may exit while one waits (its call ends with it), as with gRPC's own threads; concurrent.futures'
    would be joined at exit, up to the call's deadline."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        # Threads waiting for work minus work queued (a thread that finishes, or a spare being started, counts
        # itself in before it waits): above 0, work put now is taken at once; at 0 it needs a new thread.
        self._idle = 0

    def submit(self, work: Callable[[], None]) -> bool:
        """Run `work` on a kept thread, at once; False when all `limit` threads are busy (nothing is queued
        behind a waiting call)."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                start = False
            elif self._threads < self.limit:
                self._threads += 1
                start = True
            else:
                return False
        self._queue.put(work)
        if start:
            self._start_thread()
        return True

    def _start_thread(self) -> None:
        threading.Thread(target=self._serve, name="plancache-race-wait", daemon=True).start()

    def _keep_a_spare(self) -> None:
        """On a kept thread that just took work: a spare started where none is idle (within `limit`)."""
        with self._lock:
            if self._idle > 0 or self._threads >= self.limit:
                return
            self._threads += 1
            self._idle += 1
        self._start_thread()

    def _serve(self) -> None:
        while True:
            work = self._queue.get()
            self._keep_a_spare()
            try:
                work()
            except Exception:  # a race settles its own failures: this is a bug, not the service's answer
                log.exception("a hedged miss's call failed on its waiting thread")
            with self._lock:
                self._idle += 1


class PerProcess(Generic[T]):
    """One `make()` per process, made at its first use; a forked child has none of its parent's threads and makes
    its own. `use(value)` puts another in its place (a benchmark's or a test's; None: made again at next use)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> T:
        value = self._value
        if value is None:
            with self._lock:
                value = self._value
                if value is None:
                    value = self._value = self._make()
        return value

    def use(self, value: T | None) -> None:
        self._value = value

    def _forget(self) -> None:
        self._value, self._lock = None, threading.Lock()


# At most this many of a process's misses wait on kept threads at once; more go as gRPC futures.
WAITING_THREADS = 32
waiting_calls: PerProcess[WaitingCalls] = PerProcess(lambda: WaitingCalls(WAITING_THREADS))
# Verifies the service's answers to hedged misses that went as gRPC futures (signature, question): a few
# hundred microseconds each, off the caller's thread; the threads are kept.
ANSWER_THREADS = 2
_answer_pool: PerProcess[ThreadPoolExecutor] = PerProcess(
    lambda: ThreadPoolExecutor(ANSWER_THREADS, thread_name_prefix="plancache-race")
)


@dataclass
class Raced(Generic[T]):
    """What runs after a hedged compile: the service's plan, or the node's own build (with the race still running)."""

    plan: Plan | None = None
    local: T | None = None
    race: Race | None = None  # the service's side, when the node's own build runs
    key: str = ""  # with `race`: the plan key the service builds (what a later call of the graph fetches)


def run_race(
    race: Race, build: Callable[[], T], deadline: float | None, report: Callable[[str, bool], None], key: str
) -> Raced[T]:
    """The node's `build()`, on this thread, against the service's `race`
    (started: the service said it misses, or failed). See the module
    docstring for who wins."""
    tally = counts(race.path)
    try:
        local, local_error = build(), None
    except Exception as e:
        local, local_error = None, e
    built_at = time.monotonic()
    if race.plan is not None and race.answered_at is not None and race.answered_at <= built_at:
        tally.service_won += 1
        if race.building:
            report(key, False)
        return Raced(plan=race.plan)
    if local_error is None:
        if race.done() and race.plan is None:
            tally.service_failed += 1
            log.debug("plan %s: the service failed (%s); this node's own build runs", key, race.error)
        else:
            tally.local_won += 1
            if race.building:  # the service knows this miss: it can count it
                report(key, True)
        return Raced(local=local, race=race, key=key)
    tally.local_failed += 1
    race.hurry()
    race.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if race.plan is not None:
        if race.building:
            report(key, False)
        return Raced(plan=race.plan)
    race.cancel()
    error = race.error or Unavailable("the service did not answer within the deadline")
    error.message = (
        f"{error.message} (and this node's own build failed: {type(local_error).__name__}: {str(local_error)[:300]})"
    )
    raise error from local_error

"""A workload's start-up with nothing to configure: a process streams the
plans its workload's earlier processes used, before its graphs ask.

The service keeps, per workload and target, the stored plans that
workload's processes used, in the order they first used them (bounded,
least recently used out: plancache_server.store.workloads). At a client's
first call (Client.compile, Client.race: every front door, plancache.cudnn's
build step and plancache.functional's first call included), a thread asks
for that record (GetWorkload) and streams its plans (one Prefetch),
verifying each as it arrives, and deserializes each on its own thread, on a
CUDA stream that thread made: at once where the record is settled (its last
processes said the stream served them: plancache_server.store.workloads),
else once the process's graphs have taken the record in order
(LOAD_AFTER_IN_ORDER: another program's record under the same name, or one
interleaving another program's first uses, then costs fetches only) (on the
default stream, beside
the program's own CUDA work, it broke a program's first step on the H200:
GPU run 27; on a stream of its own it ran every time, and took the training
step's first step from 1.62-2.32x torch's to 0.67-0.73x: run 29).
PLANCACHE_WORKLOAD_DESERIALIZE=first-use deserializes each at its first
use, on the caller's thread instead, and so does a stream the drop-in
began: its build steps deserialize each plan on the program's handle, so a
load on the stream was done twice (its start 0.45-0.54x its local builds
streamed against 0.32-0.38x at first use: run 29).
A graph whose key is in the record then waits for its plan there instead
of asking the service, when the stream is about to bring it: it is among
the stream's next plans, or the plans still ahead of it come within 50 ms
at the stream's pace so far (BackgroundPrefetch.worth_waiting; the wait
itself bounded by the client's timeout). A graph listed further back asks
the service itself (one hit), and the stream skips deserializing it
(`asked_ahead`). Any other graph is expected to miss, and the node's own
build of it starts at once beside its ask (plancache.transport.
hedged_calls); a graph asking before the record is known does not wait for
it. The process's own first uses go back to the record with its background
reports (plancache.transport.reports).

A record is not trusted: every call still keys its own graph, a prefetched
plan is taken only for that exact key and checked against the call's whole
question (spec hash, target, options), and a process prefetches at most
PLANCACHE_WORKLOAD_PLANS plans (default 512) of its own target. A stale or
forged record costs fetches and memory within that bound, counted as
wasted; a prefetch that fails costs the time it took, and each graph asks
the service as it would have.

The workload's name: PLANCACHE_WORKLOAD, `Client(workload=...)` or
`plancache.functional.configure(..., workload=...)`; by default the
program's: `python -m pkg.train` is "pkg.train", `python jobs/train.py` is
"jobs/train" (the script and its folder: the same on every node whatever the
checkout's path), an interactive interpreter "python". Processes of one
name share one record per target (a collision: two programs with one name
stream each other's plans too, counted as wasted, never run). A stream
that brought none of the first COLLISION_ASKS graphs the process asked
while it ran (none listed, or each listed too far back) is another
program's, or out of date: it stops there (state "stopped", `stopped`:
the listed plans it did not bring), so a collision costs at most the plans
streamed until then. A record that mixes another program's plans with this
one's (the program's asks jump over PASSED_OVER listed plans, as many as
the stream served it) keeps streaming but deserializes nothing more: each
plan at its first use, the other program's costing a fetch only. Give each
program its own name where that matters. On where this process can run
plans (torch loaded, a GPU: as the hedge) unless PLANCACHE_WORKLOAD_PREFETCH
says (0: off, 1: on, fetching without deserializing where no GPU is);
`Client(workload_prefetch=...)` overrides it. Uses are reported whenever
reports are on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from plancache.env import env_bool
from plancache.errors import InvalidRequest, PlanCacheError, UntrustedPlan
from plancache.keys.plankey import parse_key
from plancache.keys.target import Target
from plancache.keys.workload_names import clean_name
from plancache.transport.manifest import Manifest, ManifestEntry
from plancache.trust.answers import Asked
from plancache.v1 import plancache_pb2 as pb

if TYPE_CHECKING:
    from plancache.run.plan import Plan
    from plancache.transport.background import BackgroundPrefetch
    from plancache.transport.connection import Connection

log = logging.getLogger(__name__)

WORKLOAD_ENV = "PLANCACHE_WORKLOAD"
PREFETCH_ENV = "PLANCACHE_WORKLOAD_PREFETCH"
PLANS_ENV = "PLANCACHE_WORKLOAD_PLANS"
DESERIALIZE_ENV = "PLANCACHE_WORKLOAD_DESERIALIZE"
# Where the stream's plans are deserialized: on the stream's thread as they arrive, on a CUDA stream of that
# thread's own (the default: plancache.run.execution.on_own_stream; before a graph asks where the record is
# settled), the same but never before the process's graphs took the record in order ("listed": a settled record
# not trusted), or at each plan's first use, on the caller's thread. The first two ran on the H200 (run 29);
# the default is the one a training step's start needs.
DESERIALIZE_CHOICES = ("stream", "listed", "first-use")
# Plans one process prefetches at most (the record holds up to the service's --workload-plans).
DEFAULT_PLANS = 512
# Keys of a record kept to say which graphs it does not list (lists()); a longer record says nothing.
RECORD_KEYS_KEPT = 16_384
# Seconds a call waits for the record's list while it is being read (one round trip, normally).
LIST_WAIT_S = 2.0
# Graphs asked while the stream runs, none of them brought by it: the record is not this program's; it stops.
COLLISION_ASKS = 4
# A process's verdict that its stream served it: it did not stop, and at most this share of the plans it listed
# were never used by the process (whether the stream or the service brought them) when it ended.
SERVED_UNUSED_SHARE = 0.25
# A record not settled is deserialized ahead once the process asked this many of its listed graphs in the record's
# order, none passed over. Not at the first listed graph: the record may interleave another program's first uses
# with the process's (CPU, stand-in, a record of two programs, every plan fetched while the program set up: every
# plan past the first listed graph deserialized took its start to 1.4x no stream).
LOAD_AFTER_IN_ORDER = 2
# Listed plans the program's asks passed over (a graph asked further back in the record than the last, the plans
# between never asked): at least this many and as many as it took, the record mixes another program's plans with
# this one's, and the stream stops deserializing (each plan then at its first use: the others cost a fetch only).
PASSED_OVER = 8
# First uses one process reports for its record, and per report (the service takes 512 a report).
USES_KEPT = 4096
USES_PER_REPORT = 512


def default_name() -> str:
    """The program's name (module doc): its module under -m, else its script and folder, else "python"."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name and name != "__main__":
        return clean_name(name)
    script = getattr(main, "__file__", None)
    if not script:
        return "python"
    path = Path(script)
    return clean_name(f"{path.parent.name}/{path.stem}" if path.parent.name else path.stem)


def workload_name(explicit: str | None = None) -> str:
    """The workload this process is one of: `explicit`, PLANCACHE_WORKLOAD, or the program's."""
    chosen = explicit if explicit is not None else os.environ.get(WORKLOAD_ENV, "")
    return clean_name(chosen) if chosen else default_name()


def deserialize_setting() -> str:
    """PLANCACHE_WORKLOAD_DESERIALIZE: "stream" (the default), "listed" or "first-use" (DESERIALIZE_CHOICES);
    another value is refused naming the setting."""
    chosen = os.environ.get(DESERIALIZE_ENV, "").strip() or DESERIALIZE_CHOICES[0]
    if chosen not in DESERIALIZE_CHOICES:
        raise InvalidRequest(f"{DESERIALIZE_ENV}={chosen!r}: expected one of {', '.join(DESERIALIZE_CHOICES)}")
    return chosen


def plans_bound() -> int:
    try:
        return max(0, int(os.environ.get(PLANS_ENV, DEFAULT_PLANS)))
    except ValueError:
        return DEFAULT_PLANS


@dataclass
class WorkloadStats:
    """One client's start-up prefetch (plancache.workload_stats() sums a process's)."""

    workload: str = ""
    target_id: str = ""
    state: str = "off"  # off, idle (no call yet), listing, streaming, done, stopped, failed
    listed: int = 0  # keys the service's record listed (of this target, within the bound)
    prefetched: int = 0  # plans fetched, verified (and deserialized) before a graph asked
    used: int = 0  # prefetched plans a graph of this process took
    failed: int = 0  # listed plans that could not be fetched or deserialized
    asked_ahead: int = 0  # listed graphs that asked the service: the stream was too far from their plans
    stopped: int = 0  # listed plans the stream did not bring: it stopped (state "stopped")
    settled: bool = False  # the record was settled: its plans deserialized as they came, before a graph asked
    error: str = ""  # why the record or the stream failed (state "failed"), or stopped (state "stopped")

    @property
    def wasted(self) -> int:
        """Prefetched plans no graph took (yet)."""
        return max(0, self.prefetched - self.used)


# (the record's plans, their target, whether to deserialize them, whether only once the graphs proved it theirs)
StartPrefetch = Callable[[Manifest, Target, bool, bool], "BackgroundPrefetch"]


class WorkloadStart:
    """One client's workload: its start-up prefetch and its first uses."""

    def __init__(
        self,
        connection: Connection,
        start_prefetch: StartPrefetch,
        *,
        name: str,
        prefetch: Callable[[], bool],
        report: bool,
        timeout: float | None,
    ) -> None:
        self._connection = connection
        self._start_prefetch = start_prefetch
        self.name = name
        self._prefetch_on = prefetch
        self._report_on = report
        self._timeout = timeout
        self._lock = threading.Lock()
        self._begun = False
        self._load = True  # whether the stream may deserialize at all (begin's `load`; when: settled or held)
        self._target_id = ""
        self._expected: dict[str, int] = {}  # listed key -> its index in the prefetch
        self._listed_keys: list[str] = []  # the same, in the prefetch's order
        self._record: frozenset[str] | None = None  # every key the record lists for the target (lists())
        self._listed = threading.Event()  # the record's list is known (or will never be)
        self._pending: BackgroundPrefetch | None = None
        self._taken: set[int] = set()
        self._stream_brought = False  # the stream brought a graph's plan: it is this program's
        self._not_brought = 0  # graphs asked while it ran that it did not bring (COLLISION_ASKS)
        self._stopping = ""  # why the stream was cancelled (_judge), once it was
        self._furthest = -1  # the furthest listed index a graph asked
        self._passed_over = 0  # listed plans between asked ones that no graph asked (PASSED_OVER)
        self._in_order = 0  # listed graphs asked in the record's order (LOAD_AFTER_IN_ORDER)
        self._list_late = False  # a call waited LIST_WAIT_S for the record in vain: later ones do not wait
        self._uses: list[pb.WorkloadUse] = []  # first uses not reported yet
        self._seen: set[str] = set()
        self._sent_prefetched = self._sent_used = 0  # counts already reported
        self._sent_wasted = False  # the final report (with the wasted count) went
        self._sent_stopped = False  # the report saying the stream stopped went
        self._sent_verdict = False  # the final report said whether the stream served this process
        self.stats = WorkloadStats(workload=name, state="idle")
        self.wake: Callable[[], None] = lambda: None  # the reports' thread, started at a first use
        _OPEN.add(self)

    def rename(self, name: str) -> None:
        """Another workload name (plancache.functional.configure's), before the first call."""
        with self._lock:
            if self._begun:
                raise InvalidRequest(
                    f"this client already streams workload {self.name!r}: name the workload before its first call"
                )
            self.name = self.stats.workload = workload_name(name)

    # ---- at a call -----------------------------------------------------------------

    def begin(self, target: Target, *, load: bool = True) -> bool:
        """The client's first call: the record asked for and streamed on a
        thread (once per client). Whether this call began it. `load`: whether
        the stream may deserialize its plans as they arrive (where
        PLANCACHE_WORKLOAD_DESERIALIZE says so); False where the first caller
        runs plans in graphs of its own (plancache.cudnn: the program's handle
        deserializes each again, so a load on the stream would be done twice)."""
        if not self._claim(load):
            return False
        if self._aim(target):
            threading.Thread(
                target=self._list_and_stream, args=(target,), name="plancache-workload", daemon=True
            ).start()
        return True

    def begin_in_background(self, target_of: Callable[[], Target], *, load: bool = True) -> None:
        """As begin, before any call (a front door configured, a graph made):
        the target too is found on the thread (`target_of()` may initialize
        CUDA, which the process is about to do anyway)."""
        if not self._claim(load):
            return

        def run() -> None:
            if not self._prefetch_on():  # before the target: finding it may start CUDA, for nothing
                with self._lock:
                    self.stats.state = "off"
                self._listed.set()
                return
            try:
                target = target_of()
            except Exception as e:  # e.g. no GPU after all: every graph asks as before
                self._failed(f"no target to stream for: {type(e).__name__}: {e}")
                return
            if self._aim(target):
                self._list_and_stream(target)

        threading.Thread(target=run, name="plancache-workload", daemon=True).start()

    def _claim(self, load: bool) -> bool:
        if self._begun:
            return False
        with self._lock:
            if self._begun:
                return False
            self._begun, self._load = True, load
            return True

    def _aim(self, target: Target) -> bool:
        """The target this client's record is of; whether to stream it."""
        with self._lock:
            self._target_id = self.stats.target_id = target.id
            if not self._prefetch_on():  # asked now: torch may have been loaded after the client was made
                self.stats.state = "off"
                self._listed.set()
                return False
            self.stats.state = "listing"
            return True

    def take(self, asked: Asked, *, began: bool = False) -> Plan | None:
        """The prefetched plan of `asked.key` (waited for while the stream
        brings it, bounded by the client's timeout), or None: not listed,
        or not fetched (the caller asks the service). A call after the one
        that `began` the prefetch waits for the record's list while it is
        being read (one round trip, at most LIST_WAIT_S: the first call's own
        round trip covers it; once one call waited that long in vain, no
        later call waits for it); the call that began it does not wait."""
        # One call waits for a slow record at most LIST_WAIT_S; after it, none waits for it again (a service
        # that takes seconds to answer would otherwise cost every graph asked meanwhile LIST_WAIT_S each).
        if not began and not self._listed.is_set() and (self._list_late or not self._listed.wait(LIST_WAIT_S)):
            self._list_late = True
            log.debug("workload %s: its record is not read yet; plan %s asked for as usual", self.name, asked.key)
        index = self._expected.get(asked.key)
        pending = self._pending
        if pending is None:
            return None
        if index is None:
            self._judge(pending, brought=False)
            return None
        # A graph of this process is listed. A record not settled is deserialized ahead (the plans past this
        # graph, on a thread of their own) once the process's asks have taken it in order, LOAD_AFTER_IN_ORDER
        # listed graphs and none passed over: another program's first uses interleaved with its own never do.
        if self._passed(pending, index) >= LOAD_AFTER_IN_ORDER:
            pending.start_loading(after=index)
        if not pending.worth_waiting(index):
            pending.skip(index)  # asked of the service: not deserialized again when it comes
            with self._lock:
                self.stats.asked_ahead += 1
            log.debug("workload %s: plan %s is far back in the stream; asking the service", self.name, asked.key)
            self._judge(pending, brought=False)
            return None
        try:
            plan = pending.wait_for(index, timeout=self._timeout)
            asked.check(plan.metadata)  # listed by key: the call's whole question is checked here
        except UntrustedPlan as e:
            log.warning("workload %s: prefetched plan %s refused: %s", self.name, asked.key, e.message)
            return None
        except (PlanCacheError, TimeoutError) as e:
            log.debug("workload %s: plan %s not prefetched (%s); asking the service", self.name, asked.key, e)
            self._judge(pending, brought=False)
            return None
        with self._lock:
            if index not in self._taken:
                self._taken.add(index)
                self.stats.used += 1
        self._judge(pending, brought=True)
        return plan

    def _passed(self, pending: BackgroundPrefetch, index: int) -> int:
        """A graph asked listed plan `index`: the listed plans it jumped over since the furthest asked are
        counted, and a stream passed over as much as it served stops deserializing (PASSED_OVER). How many
        listed graphs the process asked in the record's order, none passed over (0 once one was)."""
        with self._lock:
            if index <= self._furthest:
                return self._in_order if not self._passed_over else 0
            # Listed plans jumped over that no graph of the process asked (the first graphs asked the service
            # before the record was read: asked all the same).
            self._passed_over += sum(
                1 for i in range(self._furthest + 1, index) if self._listed_keys[i] not in self._seen
            )
            self._furthest = index
            self._in_order += 1
            in_order = self._in_order if not self._passed_over else 0
            mixed = self._passed_over >= PASSED_OVER and self._passed_over >= self.stats.used and pending.loading
        if mixed:
            pending.stop_loading()
            log.info(
                "workload %s: its record mixes other plans with this process's (%d passed over, %d used): the "
                "stream deserializes nothing more (each plan at its first use)",
                self.name,
                self._passed_over,
                self.stats.used,
            )
        return in_order

    def _judge(self, pending: BackgroundPrefetch, *, brought: bool) -> None:
        """Whether the stream serves this program (module doc): stopped once
        COLLISION_ASKS graphs asked while it ran got none of their plans from it."""
        with self._lock:
            if self._stream_brought or self._stopping or self.stats.state != "streaming":
                return
            if brought:
                self._stream_brought = True
                return
            self._not_brought += 1
            if self._not_brought < COLLISION_ASKS:
                return
            self._stopping = (
                f"the stream brought none of the first {COLLISION_ASKS} graphs this process asked: its record is "
                "another program's under this workload name, or out of date"
            )
        log.info("workload %s: start-up stream stopped: %s", self.name, self._stopping)
        pending.cancel()  # the stream's thread ends, and says "stopped" with what it brought

    def lists(self, key: str) -> bool | None:
        """Whether the workload's record lists `key` (a stored plan this
        workload's processes used); None where no record speaks for it: not
        read (yet), empty (a new workload), not complete (it let plans go for
        its bound, or the server does not say), or longer than RECORD_KEYS_KEPT.
        A key it does not list is expected to miss (plancache.transport.
        hedged_calls): a forged record can only make this process build a
        graph itself, as it would without plancache."""
        record = self._record
        return None if record is None else key in record

    def used(self, key: str, target_id: str) -> None:
        """A plan a graph of this process ran, or asked for stored-only and not found (the service builds it)
        (first use: recorded for the workload's record, where reports are on; kept either way, for the stream's
        judgements and the process's verdict)."""
        if key in self._seen or target_id != (self._target_id or target_id):
            return
        with self._lock:
            if not self._target_id:  # begun without one (prefetch off): the first use's target is the record's
                self._target_id = self.stats.target_id = target_id
            if key in self._seen or len(self._seen) >= USES_KEPT:
                return
            if self._report_on:
                self._uses.append(pb.WorkloadUse(plan_key=key, order=len(self._seen)))
            self._seen.add(key)
            # Not while the stream runs: starting the reports' thread waits until it runs, and on a node's start
            # the stream's deserializations hold the interpreter (GPU run 34's profile: the first uses of a
            # stored decode step waited in Thread.start); the stream wakes it as it ends (_streamed).
            streaming = self.stats.state in ("listing", "streaming")
        if self._report_on and not streaming:
            self.wake()

    def stats_now(self) -> WorkloadStats:
        with self._lock:
            return dataclasses.replace(self.stats)

    # ---- the thread ----------------------------------------------------------------

    def _list_and_stream(self, target: Target) -> None:
        connection = self._connection
        try:
            response = connection.call(
                connection.stub.GetWorkload,
                pb.GetWorkloadRequest(name=self.name, target_id=target.id),
                connection.timeout,
            )
        except PlanCacheError as e:  # e.g. a server without records: every graph asks as before
            self._failed(f"the record could not be read: {type(e).__name__}: {e.message}")
            return
        except ValueError as e:  # the client was closed before its record was asked for (grpc: a closed channel)
            self._failed(f"the record could not be read: {e}")
            return
        listed = _of_target(response.plan_keys, target.id, plans_bound())
        if response.complete and 0 < len(response.plan_keys) <= RECORD_KEYS_KEPT:
            self._record = frozenset(_of_target(response.plan_keys, target.id, RECORD_KEYS_KEPT)) or None
        with self._lock:
            self.stats.listed = len(listed)
            self.stats.state = "streaming" if listed else "done"
            self.stats.settled = bool(listed) and response.settled
        if not listed:
            self._listed.set()
            self._streamed()
            return
        try:
            # Deserializing holds the interpreter: unless the record is settled, nothing is deserialized until a
            # graph of this process proved it theirs (take: start_loading), so another program's record under this
            # name costs fetches only (GPU run 37: a collided decode step's start deserialized 13 plans it never
            # used, 1.46x torch's step). A settled one is deserialized as it comes, before the graphs ask.
            manifest = Manifest(entries=[ManifestEntry(key=k) for k in listed])
            pending = self._start_prefetch(manifest, target, self._load, not response.settled)
        except Exception as e:  # never the caller's failure
            self._failed(f"the prefetch did not start: {type(e).__name__}: {e}")
            return
        self._expected = {key: index for index, key in enumerate(listed)}
        self._listed_keys = listed
        self._pending = pending  # after the keys: a call that sees the stream sees what it lists
        self._listed.set()
        try:
            result = pending.wait(None if self._timeout is None else max(self._timeout, 60.0) * 10)
        except Exception as e:
            self._failed(f"the prefetch failed: {type(e).__name__}: {e}")
            return
        with self._lock:
            self.stats.prefetched = len(result.plans)
            self.stats.failed = len(result.errors)
            self.stats.stopped = result.stopped
            self.stats.state = "stopped" if self._stopping else "done"
            self.stats.error = self._stopping
        log.debug("workload %s: %d of %d listed plans prefetched", self.name, len(result.plans), len(listed))
        self._streamed()

    def _failed(self, why: str) -> None:
        log.info("workload %s: start-up prefetch off for this process: %s", self.name, why)
        with self._lock:
            self.stats.state, self.stats.error = "failed", why[:500]
        self._listed.set()
        self._streamed()

    def _streamed(self) -> None:
        """The stream ended (or never ran): the first uses it held back go to the reports' thread."""
        with self._lock:
            waiting = bool(self._uses)
        if waiting:
            self.wake()

    # ---- reports -------------------------------------------------------------------

    def take_report(self, final: bool) -> pb.WorkloadUses | None:
        """What to add to the next report: first uses since the last one, and
        the prefetch's counts since; `final` (the client closing, the process
        exiting) adds the plans never used (wasted). None: nothing to say."""
        if not self._report_on or not self._target_id:
            return None
        with self._lock:
            uses, self._uses = self._uses[:USES_PER_REPORT], self._uses[USES_PER_REPORT:]
            now = self.stats
            prefetched, used = now.prefetched - self._sent_prefetched, now.used - self._sent_used
            self._sent_prefetched, self._sent_used = now.prefetched, now.used
            wasted = 0
            if final and not self._sent_wasted:  # once, at the end
                wasted, self._sent_wasted = now.wasted, True
            stopped = 0
            if now.state == "stopped" and not self._sent_stopped:  # once, when it is known
                stopped, self._sent_stopped = 1, True
            verdict = pb.STREAM_VERDICT_UNSPECIFIED
            if final and not self._sent_verdict and now.state in ("done", "stopped") and self._expected:
                self._sent_verdict = True
                unused = sum(1 for key in self._expected if key not in self._seen)
                served = now.state == "done" and unused <= SERVED_UNUSED_SHARE * len(self._expected)
                verdict = pb.STREAM_VERDICT_SERVED if served else pb.STREAM_VERDICT_MIXED
        if not uses and not prefetched and not used and not wasted and not stopped and not verdict:
            return None
        return pb.WorkloadUses(
            name=self.name,
            target_id=self._target_id,
            uses=uses,
            prefetched=max(0, prefetched),
            used=max(0, used),
            wasted=wasted,
            stopped=stopped,
            verdict=verdict,
        )


def _of_target(keys: Iterable[str], target_id: str, bound: int) -> list[str]:
    """The listed keys a process takes: its target's, parsed, each once, at most `bound`."""
    out: list[str] = []
    seen: set[str] = set()
    for key in keys:
        if len(out) >= bound:
            break
        if not isinstance(key, str) or key in seen:
            continue
        try:
            if parse_key(key).target.id != target_id:
                continue  # another target's plan: never this process's
        except PlanCacheError:
            continue
        seen.add(key)
        out.append(key)
    return out


_OPEN: weakref.WeakSet[WorkloadStart] = weakref.WeakSet()


def workload_stats() -> WorkloadStats:
    """This process's start-up prefetches (every client's, summed; the first
    client's workload, target and state)."""
    starts = sorted(_OPEN, key=lambda w: w.stats.state == "off")
    total = WorkloadStats()
    for start in starts:
        s = start.stats
        if not total.workload:
            total.workload, total.target_id, total.state, total.error = s.workload, s.target_id, s.state, s.error
            total.settled = s.settled
        total.listed += s.listed
        total.prefetched += s.prefetched
        total.used += s.used
        total.failed += s.failed
        total.asked_ahead += s.asked_ahead
        total.stopped += s.stopped
    return total


def prefetch_default(can_run_plans: Callable[[], bool]) -> bool:
    """PLANCACHE_WORKLOAD_PREFETCH's choice; unset: where this process runs plans (`can_run_plans()`)."""
    if os.environ.get(PREFETCH_ENV, "").strip() == "":
        return can_run_plans()
    return env_bool(PREFETCH_ENV, True)

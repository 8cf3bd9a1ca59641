"""What a client tells the service in the background (ReportFirstUses):
first uses of plans after a hedged miss (plancache.transport.hedge), and
what the process counted since its last report: its graphs' outcomes
(plancache.transport.outcomes) and its races won and lost (race_stats()).

Best effort and cheap for the caller: counting is a dict update; sending
happens on one thread per client, in batches, first uses about every
INTERVAL_S and counts at most every `PLANCACHE_REPORT_INTERVAL_S` (rate
limited), and what is left when the client closes or the process exits.
A report that fails is lost, and nothing else: no error raised to anyone,
no growth (at most MAX_QUEUED first uses wait). Counts a server certainly
did not take (it could not be reached, or refused the call) go back to be
sent with the next report, by this client or another of the process. Off with
`Client(report=False)` or PLANCACHE_REPORT=0 (counting goes on: the
process's own `outcome_stats()` still read it).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import grpc

from plancache.transport import outcomes
from plancache.transport.hedge import PATHS, RaceCounts, race_stats
from plancache.v1 import plancache_pb2 as pb

log = logging.getLogger(__name__)

INTERVAL_ENV = "PLANCACHE_REPORT_INTERVAL_S"
# Seconds between two reports of counts at most (a fleet of 10,000 nodes: 1,000 small calls a second).
COUNTS_INTERVAL_S = 10.0
# What one report may carry (the server refuses more: see its service).
MAX_OUTCOMES = 256
_RACE_RESULTS = {
    "local_won": pb.RACE_RESULT_LOCAL_WON,
    "service_won": pb.RACE_RESULT_SERVICE_WON,
    "local_failed": pb.RACE_RESULT_LOCAL_FAILED,
    "service_failed": pb.RACE_RESULT_SERVICE_FAILED,
    "replaced": pb.RACE_RESULT_REPLACED,
}

# Failures after which the server certainly counted nothing: what was sent is sent again later.
_NOT_COUNTED = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)
_races_lock = threading.Lock()
_races_reported: dict[str, RaceCounts] = {}


def counts_interval_s() -> float:
    try:
        return max(0.05, float(os.environ.get(INTERVAL_ENV, COUNTS_INTERVAL_S)))
    except ValueError:
        return COUNTS_INTERVAL_S


def take_races() -> list[pb.RaceCount]:
    """Races counted since the previous take, process-wide (so a process reports each once)."""
    now = race_stats()
    out = []
    with _races_lock:
        for path in PATHS:
            before = _races_reported.get(path, RaceCounts())
            for name, result in _RACE_RESULTS.items():
                delta = getattr(now[path], name) - getattr(before, name)
                if delta > 0:
                    out.append(pb.RaceCount(path=path, result=result, count=delta))
            _races_reported[path] = now[path]
    return out


def give_back_races(races: list[pb.RaceCount]) -> None:
    """Races a report did not deliver: taken again by the next one."""
    names = {result: name for name, result in _RACE_RESULTS.items()}
    with _races_lock:
        for race in races:
            reported = _races_reported.setdefault(race.path, RaceCounts())
            name = names[race.result]
            _races_reported[race.path] = dataclasses.replace(reported, **{name: getattr(reported, name) - race.count})


class Reports:
    """One client's background reports. `send(request)` makes the call."""

    MAX_QUEUED = 4096
    BATCH = 256
    INTERVAL_S = 1.0

    def __init__(
        self,
        send: Callable[[pb.ReportFirstUsesRequest], Any],
        *,
        enabled: bool = True,
        workload: Callable[[bool], pb.WorkloadUses | None] | None = None,
    ) -> None:
        """`workload(final)`: the workload's first uses and prefetch counts to add to a report (None: nothing)."""
        self._send = send
        self.enabled = enabled
        self._workload = workload
        self._counts_every = counts_interval_s()
        self._counts_sent_at = time.monotonic()
        self._queue: queue.SimpleQueue[pb.FirstUse] = queue.SimpleQueue()
        self._queued = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        # A process that ends without closing its client (plancache.cudnn's and plancache.functional's
        # are never closed) sends what is left as it exits; held weakly: the client may go first.
        _OPEN.add(self)

    def add(self, plan_key: str, local: bool) -> None:
        """A first use after a hedged miss: the node's own plan ran first (`local`), or the service's."""
        with self._lock:
            if self._queued >= self.MAX_QUEUED or not self.enabled:
                return
            self._queued += 1
        self._queue.put(pb.FirstUse(plan_key=plan_key, local=local))
        self.wake()

    def wake(self) -> None:
        """Make sure the thread runs (started at the first thing to report, not before)."""
        if self._thread is None and self.enabled and not self._stopped.is_set():
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="plancache-reports", daemon=True)
                    self._thread.start()

    def flush(self, counts: bool = True, final: bool = False) -> None:
        """Send what is queued now (on the caller's thread); with `counts`, the
        counts too; `final`: the client closes (the workload's last counts)."""
        uses: list[pb.FirstUse] = []
        while len(uses) < self.BATCH:
            try:
                uses.append(self._queue.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            self._queued -= len(uses)
        tallied: list[tuple[outcomes.OutcomeKey, int]] = []
        races: list[pb.RaceCount] = []
        if counts and self.enabled:
            self._counts_sent_at = time.monotonic()
            tallied = list(outcomes.TALLY.take().items())
            races = take_races()
        workload = self._workload(final) if self._workload is not None and self.enabled else None
        while uses or tallied or races or workload is not None:
            batch, tallied = tallied[:MAX_OUTCOMES], tallied[MAX_OUTCOMES:]
            request = pb.ReportFirstUsesRequest(uses=uses, outcomes=[key.to_proto(n) for key, n in batch], races=races)
            if workload is not None:
                request.workload.CopyFrom(workload)
            if not self._post(request):
                outcomes.TALLY.give_back(dict(batch))
                give_back_races(races)
            uses, races, workload = [], [], None
        if not self._queue.empty():
            self.flush(counts=False)

    def close(self) -> None:
        self._stopped.set()
        self.flush(final=True)

    def _post(self, request: pb.ReportFirstUsesRequest) -> bool:
        """Send one report; False when the server certainly counted none of it (its counts may go again)."""
        try:
            self._send(request)
            return True
        except Exception as e:  # best effort: the service counts what reaches it
            log.debug(
                "report of %d first use(s) and %d count(s) not sent: %s",
                len(request.uses),
                len(request.outcomes) + len(request.races),
                e,
            )
            code = e.code() if isinstance(e, grpc.RpcError) and callable(getattr(e, "code", None)) else None
            return code not in _NOT_COUNTED

    def _run(self) -> None:
        while not self._stopped.wait(self.INTERVAL_S):
            self.flush(counts=time.monotonic() - self._counts_sent_at >= self._counts_every)


_OPEN: weakref.WeakSet[Reports] = weakref.WeakSet()


def _wake_all() -> None:
    for reports in list(_OPEN):
        reports.wake()


outcomes.TALLY.on_first_pending = _wake_all


@atexit.register
def _flush_at_exit() -> None:
    """One exit hook for every client's reports (not one per client: a process may make many)."""
    for reports in list(_OPEN):
        if not reports._stopped.is_set():
            reports.close()

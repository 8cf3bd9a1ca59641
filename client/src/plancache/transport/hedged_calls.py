"""A client's hedged misses: one Compile asked as a hit is, and on a miss
the node's own build beside the service's (plancache.transport.hedge has
the race itself), and the plans this node built, held for the next call of
the same key while the service's plan is on its way to them.

An expected miss skips the first answer: where this process knows a graph
is not stored, waiting one round trip to hear "building" before its own
build starts is the whole fixed cost of a miss (1.8-1.9 ms a graph on the
H200's host, GPU run 27). It knows so when its workload's record
(plancache.transport.workload) was read, is complete (it never let a plan
go for its bound) and does not list the graph's key, or, with no such
record, when the client's last MISSES_BEFORE_EXPECTING graphs
that asked all missed (a first node of a new model). Then the node's build
starts at once, beside one Compile that waits for the service's build; a
graph that was stored after all is the service's plan as soon as the node's
build returns (the race's rule) and ends the run of misses: the next graph
asks first again. The cost of a wrong guess is the node's own build, what
the node would have paid without plancache; the plan run is still the one
for the graph's own key, checked as every answer is.

A record proven wrong once is not believed again by this client: a graph
it did not list that was stored after all (a graph family's member an
operator or another process built, another workload's plan, a sibling
process's build that just landed) says the record does not know this
process's misses, and from then on the run-of-misses rule decides alone.
Believing it went on costing every such graph the node's own build (GPU run
36: a prefill process meeting 15 stored bucket lengths its record did not
list built each itself, 65-86 ms and 859 ms for the longest, where a hit
took ~12 ms in run 24).

A graph the service may be building ahead for this process is never
expected to miss (`ask_first(key)`: a member of a graph family the process
asked for, plancache.frontdoors.families): a sweep through a family's sizes
misses until its members land, and an expected miss then built every size
itself although the service had it (GPU run 31: sizes whose two graphs
were both stored took 490 ms, the node's own builds, not the ~30 ms of a
hit). Asking first costs such a graph one round trip; other graphs keep
their expected misses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

import grpc

from plancache.errors import CompileFailed, CompileTimeout, NotStored, PlanCacheError
from plancache.run.local import LocalPlan
from plancache.run.plan import Plan
from plancache.transport.calls import typed
from plancache.transport.connection import Connection
from plancache.transport.hedge import (
    NOT_HEDGED,
    CompileAsk,
    Race,
    RaceCounts,
    Raced,
    counts,
    hedge_after_s,
    refused_plan,
    run_race,
    waiting_calls,
)
from plancache.transport.intake import PlanIntake
from plancache.transport.reports import Reports
from plancache.trust.answers import Asked
from plancache.v1 import plancache_pb2 as pb

T = TypeVar("T")
log = logging.getLogger(__name__)

# Plans this node built itself (hedged misses), held for a compile() of the same key again.
LOCAL_PLANS_HELD = 1024
# Keys kept that ask first (graph families' members met; least recently marked out first).
ASK_FIRST_KEPT = 4096
# How long closing a client waits for its stored-only asks sent in the background (each answered at once).
SETTLE_ASKS_S = 2.0
# Misses in a row (each graph asked first) after which a graph no workload record speaks for is expected to miss.
MISSES_BEFORE_EXPECTING = 2
# What a workload's record says of a key: listed (True), not listed (False), or nothing (None: no record read).
Listed = Callable[[str], "bool | None"]


class HedgedCalls:
    def __init__(
        self, connection: Connection, intake: PlanIntake, reports: Reports, listed: Listed = lambda key: None
    ) -> None:
        self._connection, self._intake, self._reports = connection, intake, reports
        self._listed = listed
        self.hedge_after_s = hedge_after_s()
        self._local_plans: OrderedDict[str, LocalPlan] = OrderedDict()
        self.misses_in_a_row = 0  # graphs that asked first and missed, since the last one that did not
        self._ask_first: OrderedDict[str, None] = OrderedDict()  # keys the service may be building ahead
        self.record_believed = True  # no graph the workload's record did not list was stored after all (doc)
        # Graphs a stored-only ask in the background found rejected by cuDNN (key -> the service's reason): asked
        # again, they are CompileFailed here, as a graph asked on the caller's thread is (least recent out).
        self._rejected: OrderedDict[str, str] = OrderedDict()
        # Stored-only asks sent on kept threads and not answered yet (close() lets them reach the service).
        self._behind = 0
        self._behind_done = threading.Condition()

    def _first_answer_s(self, budget: float | None) -> float:
        """How long a miss's first answer is waited for: a server that cannot say hit or miss within hedge_after_s
        is as good as a miss."""
        return self.hedge_after_s if budget is None else min(self.hedge_after_s, budget)

    def ask_first(self, key: str) -> None:
        """A graph of `key` may be built ahead for this process (a graph
        family's member): it asks first, never expected to miss (module doc)."""
        self._ask_first[key] = None
        self._ask_first.move_to_end(key)
        while len(self._ask_first) > ASK_FIRST_KEPT:
            self._ask_first.popitem(last=False)

    def expects_miss(self, key: str) -> bool:
        """Whether a graph of `key` (not in the disk cache, not prefetched) is expected to miss (module doc)."""
        if key in self._ask_first:
            return False
        listed = self._listed(key) if self.record_believed else None
        if listed is not None:
            return not listed
        return self.misses_in_a_row >= MISSES_BEFORE_EXPECTING

    def stored(
        self,
        request: pb.CompileRequest,
        asked: Asked,
        budget: float | None,
        remember: Callable[[pb.CompileResponse], Plan],
        path: str,
    ) -> Plan:
        """compile(stored_only=True)'s ask of the service (`request`: answer_miss_at_once, so a miss starts or
        joins the build and is answered at once): the stored plan (`remember(response)`: verified), or NotStored.
        A graph expected to miss (module doc) is not waited for at all: its Compile goes on a kept thread and
        NotStored is raised at once (GPU run 56: a served GPT-2's first process with nothing stored asked ~20
        graphs in its first step, one round trip each); a wrong guess costs the call torch's function, what it
        runs without plancache, and its answer (a hit) ends the run of misses as the hedge's does."""
        rejected = self._rejected.get(asked.key)
        if rejected is not None:
            raise CompileFailed(rejected)
        if self.expects_miss(asked.key) and self._ask_behind(request, asked, budget, remember, counts(path)):
            raise NotStored(f"plan {asked.key} is not stored (expected to miss): the service is asked to build it")
        first = self._first_answer_s(budget)
        response = self._connection.call(self._connection.stub.Compile, request, first)
        if response.source == pb.COMPILE_SOURCE_BUILDING:
            self.misses_in_a_row += 1
            raise NotStored(f"plan {asked.key} is not stored yet: the service is building it")
        self.misses_in_a_row = 0
        return remember(response)

    def _ask_behind(
        self,
        request: pb.CompileRequest,
        asked: Asked,
        budget: float | None,
        remember: Callable[[pb.CompileResponse], Plan],
        tally: RaceCounts,
    ) -> bool:
        """`request` sent on a kept thread, its answer read there (a hit: stored after all, verified and kept
        as any answer); False where no kept thread is free (the caller asks itself)."""
        ask = CompileAsk(self._connection.stub.Compile, request, self._connection.metadata)
        timeout = self._first_answer_s(budget)

        def send() -> None:
            try:
                try:
                    response = ask.call(timeout)
                except grpc.RpcError as e:
                    raise typed(e) from e
                if response.source != pb.COMPILE_SOURCE_BUILDING:
                    self._stored_after_all(asked.key, tally)
                    remember(response)
            except CompileFailed as e:  # cuDNN rejected it (the service's negative cache): said at the next ask
                self._rejected[asked.key] = e.message
                while len(self._rejected) > ASK_FIRST_KEPT:
                    self._rejected.popitem(last=False)
            except Exception as e:  # an ask nobody waits for: what it failed is the next call's to meet
                log.debug("plan %s: the stored-only ask in the background failed: %s: %s", asked.key, type(e), e)
            finally:
                with self._behind_done:
                    self._behind -= 1
                    self._behind_done.notify_all()

        with self._behind_done:
            self._behind += 1
        if waiting_calls.get().submit(send):
            return True
        with self._behind_done:
            self._behind -= 1
        return False

    def settle_asks(self, timeout: float) -> bool:
        """Wait, at most `timeout` s, until every stored-only ask sent in the background was answered (the client
        closes: a process that exits right after its last graphs still has the service build them). Whether
        none is left."""
        with self._behind_done:
            return self._behind_done.wait_for(lambda: self._behind <= 0, timeout)

    def _stored_after_all(self, key: str, tally: RaceCounts) -> None:
        """A graph expected to miss was stored: the next graph asks first again, and a workload record that did
        not list it is not believed from now on (module doc)."""
        tally.stored_after_all += 1
        self.misses_in_a_row = 0
        if self.record_believed and self._listed(key) is False:
            self.record_believed = False
            tally.record_disbelieved += 1
            log.info(
                "plan %s was stored though this workload's record did not list it: the record no longer "
                "says which graphs will miss in this process",
                key,
            )

    def compile(
        self, request: pb.CompileRequest, asked: Asked, budget: float | None, build: Callable[[], Plan], path: str
    ) -> Plan:
        """The plan of a hedged Compile: the service's, or this node's own
        (`build`), held until the service's takes over."""
        held = self._local_plans.get(asked.key)
        if held is not None and held.local and held.waiting:
            return held  # the service's plan is on its way to it

        def own() -> Plan:
            if held is not None and held.local:  # the service failed it: asked again, this node's plan reused
                return held
            return build()

        raced = self.race(request, asked, budget, own, path)
        if raced.plan is not None:
            return raced.plan
        plan = raced.local
        assert plan is not None and raced.race is not None
        if isinstance(plan, LocalPlan):
            plan.replace_with(raced.race)
            self._hold(plan)
        return plan

    def race(
        self, request: pb.CompileRequest, asked: Asked, budget: float | None, build: Callable[[], T], path: str
    ) -> Raced[T]:
        """A hedged miss (plancache.transport.hedge): `request` (with
        answer_miss_at_once) asked as a hit is, one unary Compile on this
        thread; on a miss, `build()` here while a thread waits for the
        service's plan (a second Compile, for the same build, counted once)."""
        deadline = None if budget is None else time.monotonic() + budget
        connection = self._connection

        def remember(response: pb.CompileResponse) -> Plan:
            return self._intake.answer(response.plan, response.source, asked)

        if self.expects_miss(asked.key):
            return self._race_at_once(request, asked, deadline, remember, build, path)
        error: PlanCacheError | None = None
        try:
            # Bounded: a server that cannot say hit or miss within hedge_after_s is as good as a miss.
            first = self._first_answer_s(budget)
            response = connection.call(connection.stub.Compile, request, first)
            if response.source != pb.COMPILE_SOURCE_BUILDING:
                self.misses_in_a_row = 0
                return Raced(plan=remember(response))  # a hit (or a plan the server had at once): nothing to race
            self.misses_in_a_row += 1
        except PlanCacheError as e:  # down, refusing, slow, or a hit that failed verification
            if isinstance(e, NOT_HEDGED):
                raise
            refused_plan(e)
            error = e
        follow = _follow_up(request, counted=error is None)
        ask = None
        # The service may still answer: a build under way, a refusal for now, a build slower than the first call.
        if error is None or error.retry_after is not None or isinstance(error, CompileTimeout):
            ask = self._asker(follow)
        race = Race(ask, remember, path, deadline, building=error is None, error=error)
        return run_race(race, build, deadline, self._reports.add, asked.key)

    def _race_at_once(
        self,
        request: pb.CompileRequest,
        asked: Asked,
        deadline: float | None,
        remember: Callable[[pb.CompileResponse], Plan],
        build: Callable[[], T],
        path: str,
    ) -> Raced[T]:
        """An expected miss (module doc): one Compile that waits for the
        service's build (counted as any Compile: a miss, or a hit after
        all), and the node's build started at once, on this thread."""
        tally = counts(path)
        tally.at_once += 1

        def answered(race: Race, response: pb.CompileResponse) -> None:
            if response.source == pb.COMPILE_SOURCE_HIT:  # stored after all: the next graph asks first
                self._stored_after_all(asked.key, tally)
                race.building = False  # the service counted a hit, not a miss to report on

        race = Race(
            self._asker(_follow_up(request, counted=False)), remember, path, deadline, building=True, on_answer=answered
        )
        return run_race(race, build, deadline, self._reports.add, asked.key)

    def _asker(self, request: pb.CompileRequest) -> CompileAsk:
        return CompileAsk(self._connection.stub.Compile, request, self._connection.metadata)

    def _hold(self, plan: LocalPlan) -> None:
        self._local_plans[plan.key] = plan
        self._local_plans.move_to_end(plan.key)
        while len(self._local_plans) > LOCAL_PLANS_HELD:
            self._local_plans.popitem(last=False)


def _follow_up(request: pb.CompileRequest, *, counted: bool) -> pb.CompileRequest:
    """`request` as a Compile that waits for the build (`counted`: its first ask counted the miss)."""
    follow = pb.CompileRequest()
    follow.CopyFrom(request)
    follow.answer_miss_at_once, follow.counted, follow.claimed_key = False, counted, ""
    return follow

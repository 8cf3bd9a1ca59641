"""A client's hedged misses: one Compile asked as a hit is, and on a miss
the node's own build beside the service's (plancache.transport.hedge has
the race itself), and the plans this node built, held for the next call of
the same key while the service's plan is on its way to them."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from plancache.errors import CompileTimeout, PlanCacheError
from plancache.run.local import LocalPlan
from plancache.run.plan import Plan
from plancache.transport.connection import Connection
from plancache.transport.hedge import NOT_HEDGED, Race, Raced, hedge_after_s, run_race
from plancache.transport.intake import PlanIntake
from plancache.transport.reports import Reports
from plancache.trust.answers import Asked
from plancache.v1 import plancache_pb2 as pb

T = TypeVar("T")

# Plans this node built itself (hedged misses), held for a compile() of the same key again.
LOCAL_PLANS_HELD = 1024


class HedgedCalls:
    def __init__(self, connection: Connection, intake: PlanIntake, reports: Reports) -> None:
        self._connection, self._intake, self._reports = connection, intake, reports
        self.hedge_after_s = hedge_after_s()
        self._local_plans: OrderedDict[str, LocalPlan] = OrderedDict()

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

        error: PlanCacheError | None = None
        try:
            # Bounded: a server that cannot say hit or miss within hedge_after_s is as good as a miss.
            first = self.hedge_after_s if budget is None else min(self.hedge_after_s, budget)
            response = connection.call(connection.stub.Compile, request, first)
            if response.source != pb.COMPILE_SOURCE_BUILDING:
                return Raced(plan=remember(response))  # a hit (or a plan the server had at once): nothing to race
        except PlanCacheError as e:  # down, refusing, slow, or a hit that failed verification
            if isinstance(e, NOT_HEDGED):
                raise
            error = e
        follow = pb.CompileRequest()
        follow.CopyFrom(request)
        follow.answer_miss_at_once, follow.counted = False, error is None
        ask = None
        # The service may still answer: a build under way, a refusal for now, a build slower than the first call.
        if error is None or error.retry_after is not None or isinstance(error, CompileTimeout):
            stub, metadata = connection.stub, connection.metadata
            ask = lambda timeout: stub.Compile.future(follow, timeout=timeout, metadata=metadata)  # noqa: E731
        race = Race(ask, remember, path, deadline, building=error is None, error=error)
        return run_race(race, build, deadline, self._reports.add, asked.key)

    def _hold(self, plan: LocalPlan) -> None:
        self._local_plans[plan.key] = plan
        self._local_plans.move_to_end(plan.key)
        while len(self._local_plans) > LOCAL_PLANS_HELD:
            self._local_plans.popitem(last=False)

"""A hedged miss's first answer (answer_miss_at_once) does not wait for the
build to be queued: the node's own build starts after that answer, so any
time the gateway spends on the lease and the job is time added to every miss
(issue 41). The build is still queued, once, after the answer; what keeps it
from being queued answers the follow-up, not the first ask."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from plancache.errors import TargetUnavailable
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.service import BUILDING, MAX_DEFERRED, PlanService


class SlowQueue:
    """STAND-IN for PlanLookups: nothing stored; queueing a build takes `queue_s` (a slow Redis)."""

    def __init__(self, queue_s: float, error: Exception | None = None) -> None:
        self.queue_s, self.error = queue_s, error
        self.started: list[str] = []
        self.yields: list[bool] = []  # each queued build's: whether its caller builds it itself
        self.released = 0
        self.looked_up = 0

    async def lookup(self, *args: Any, **kwargs: Any) -> None:
        self.looked_up += 1

    async def known_failure(self, plan_key: str) -> str | None:
        return None  # no build of it was rejected (tests/integration/test_hedge.py reads a real negative cache)

    async def start_build(
        self, resolved: Any, tuned_only: bool = False, count: bool = True, yields: bool = False
    ) -> Any:
        await asyncio.sleep(self.queue_s)
        if self.error is not None:
            raise self.error
        self.started.append(resolved.key)
        self.yields.append(yields)
        lookups = self

        class Waiter:
            def release(self) -> None:
                lookups.released += 1

        return Waiter()


class Resolved:
    key = "k/target/opt-x"
    op_family = "matmul"

    class target:  # noqa: N801 - a stand-in for the resolved query's Target
        id = "target"


class Resolver:
    """STAND-IN for QueryResolver: deriving the key takes `resolve_s` (a large spec's validation and hash)."""

    def __init__(self, resolve_s: float = 0.0) -> None:
        self.resolve_s = resolve_s
        self.resolved = 0

    async def resolve(self, *args: Any) -> Resolved:
        await asyncio.sleep(self.resolve_s)
        self.resolved += 1
        return Resolved()


class EmptyStore:
    """STAND-IN for the plan store: nothing stored."""

    def cached(self, plan_key: str) -> None:
        return None

    async def get(self, plan_key: str) -> None:
        return None


def _sent(callback: Callable[[], None]) -> None:
    """STAND-IN for the servicer's when_sent: the answer is written 10 ms later."""
    asyncio.get_running_loop().call_later(0.01, callback)


def _service(lookups: SlowQueue, resolver: Resolver | None = None) -> PlanService:
    return PlanService(store=EmptyStore(), resolver=resolver or Resolver(), lookups=lookups)  # type: ignore[arg-type]


def test_the_first_answer_comes_before_the_build_is_queued() -> None:
    async def main() -> tuple[float, SlowQueue]:
        lookups = SlowQueue(queue_s=0.5)
        service = _service(lookups)
        loop = asyncio.get_running_loop()
        started = loop.time()
        answer = await service.compile(pb.CompileRequest(answer_miss_at_once=True, builds_itself=True), None, _sent)
        took = loop.time() - started
        assert answer == BUILDING
        assert lookups.started == []  # not queued yet: the answer did not wait for it
        await asyncio.sleep(0.7)
        return took, lookups

    took, lookups = asyncio.run(main())
    assert took < 0.3, f"the first answer waited {took:.3f} s for the build to be queued"  # queuing: 0.5 s
    assert lookups.started == [Resolved.key]  # queued once, after the answer
    assert lookups.yields == [True]  # as a build its caller builds itself (the worker lets it wait)
    assert lookups.released == 1  # and nobody waits on this gateway for it: the follow-up joins


def test_a_build_that_cannot_be_queued_is_the_follow_ups_answer() -> None:
    async def main() -> None:
        lookups = SlowQueue(queue_s=0.0, error=TargetUnavailable("no worker serves this target"))
        service = _service(lookups)
        answer = await service.compile(pb.CompileRequest(answer_miss_at_once=True), None, _sent)
        assert answer == BUILDING
        await asyncio.sleep(0.05)  # the background start meets the refusal: logged, not raised anywhere
        with pytest.raises(TargetUnavailable):
            await service.compile(pb.CompileRequest(counted=True), None, _sent)

    asyncio.run(main())


def test_a_miss_by_the_callers_claimed_key_is_told_before_the_key_is_derived() -> None:
    claimed = "0" * 64 + "/sm_90/cudnn-91900/fe-1.32.0/dev-x/sms-132/opt-0123456789abcdef"

    async def main() -> tuple[float, Resolver, SlowQueue]:
        lookups, resolver = SlowQueue(queue_s=0.0), Resolver(resolve_s=0.5)
        service = _service(lookups, resolver)
        loop = asyncio.get_running_loop()
        started = loop.time()
        request = pb.CompileRequest(answer_miss_at_once=True, claimed_key=claimed)
        answer = await service.compile(request, None, _sent)
        took = loop.time() - started
        assert answer == BUILDING and resolver.resolved == 0
        await asyncio.sleep(0.7)
        return took, resolver, lookups

    took, resolver, lookups = asyncio.run(main())
    assert took < 0.3, f"the answer waited {took:.3f} s for the key to be derived"  # deriving: 0.5 s
    # Then derived by the gateway itself (a claim is never the key a build is queued under), counted, queued.
    assert resolver.resolved == 1 and lookups.looked_up == 1 and lookups.started == [Resolved.key]


def test_a_claim_that_is_no_plan_key_is_answered_as_any_request() -> None:
    async def main() -> Resolver:
        lookups, resolver = SlowQueue(queue_s=0.0), Resolver()
        request = pb.CompileRequest(answer_miss_at_once=True, claimed_key="../../not a key")
        assert await _service(lookups, resolver).compile(request, None, _sent) == BUILDING
        return resolver

    assert asyncio.run(main()).resolved == 1  # derived before the answer, as without a claim


def test_past_the_bound_of_deferred_work_a_caller_waits_for_its_own() -> None:
    """A flood of first asks cannot pile up deferred tasks: past MAX_DEFERRED the answer comes after the work."""
    claimed = "0" * 64 + "/sm_90/cudnn-91900/fe-1.32.0/dev-x/sms-132/opt-0123456789abcdef"

    async def main() -> tuple[float, SlowQueue]:
        lookups = SlowQueue(queue_s=0.3)
        service = _service(lookups)
        service._deferred = MAX_DEFERRED  # as if that many answered misses were still being queued
        loop = asyncio.get_running_loop()
        started = loop.time()
        request = pb.CompileRequest(answer_miss_at_once=True, claimed_key=claimed)
        assert await service.compile(request, None, _sent) == BUILDING
        return loop.time() - started, lookups

    took, lookups = asyncio.run(main())
    assert took >= 0.3 and lookups.started == [Resolved.key]  # queued before the answer: back-pressure

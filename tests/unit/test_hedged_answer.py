"""A hedged miss's first answer (answer_miss_at_once) does not wait for the
build to be queued: the node's own build starts after that answer, so any
time the gateway spends on the lease and the job is time added to every miss
(issue 41). The build is still queued, once, after the answer; what keeps it
from being queued answers the follow-up, not the first ask."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from plancache.errors import TargetUnavailable
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.service import BUILDING, PlanService


class SlowQueue:
    """STAND-IN for PlanLookups: nothing stored; queueing a build takes `queue_s` (a slow Redis)."""

    def __init__(self, queue_s: float, error: Exception | None = None) -> None:
        self.queue_s, self.error = queue_s, error
        self.started: list[str] = []
        self.released = 0

    async def lookup(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def start_build(self, resolved: Any, tuned_only: bool = False, count: bool = True) -> Any:
        await asyncio.sleep(self.queue_s)
        if self.error is not None:
            raise self.error
        self.started.append(resolved.key)
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
    async def resolve(self, *args: Any) -> Resolved:
        return Resolved()


def _service(lookups: SlowQueue) -> PlanService:
    return PlanService(store=None, resolver=Resolver(), lookups=lookups)  # type: ignore[arg-type]


def test_the_first_answer_comes_before_the_build_is_queued() -> None:
    async def main() -> tuple[float, SlowQueue]:
        lookups = SlowQueue(queue_s=0.5)
        service = _service(lookups)
        loop = asyncio.get_running_loop()
        started = loop.time()
        answer = await service.compile(pb.CompileRequest(answer_miss_at_once=True), None, lambda callback: None)
        took = loop.time() - started
        assert answer == BUILDING
        assert lookups.started == []  # not queued yet: the answer did not wait for it
        await asyncio.sleep(0.7)
        return took, lookups

    took, lookups = asyncio.run(main())
    assert took < 0.1, f"the first answer waited {took:.3f} s for the build to be queued"
    assert lookups.started == [Resolved.key]  # queued once, after the answer
    assert lookups.released == 1  # and nobody waits on this gateway for it: the follow-up joins


def test_a_build_that_cannot_be_queued_is_the_follow_ups_answer() -> None:
    async def main() -> None:
        lookups = SlowQueue(queue_s=0.0, error=TargetUnavailable("no worker serves this target"))
        service = _service(lookups)
        answer = await service.compile(pb.CompileRequest(answer_miss_at_once=True), None, lambda callback: None)
        assert answer == BUILDING
        await asyncio.sleep(0.05)  # the background start meets the refusal: logged, not raised anywhere
        with pytest.raises(TargetUnavailable):
            await service.compile(pb.CompileRequest(counted=True), None, lambda callback: None)

    asyncio.run(main())

"""The job streams and build marks against a real Redis: a stopping worker hands back the job it took, and a
yielding job's mark is taken once, for that job alone."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from plancache.keys.query import PlanQuery
from plancache_server.store import keys
from plancache_server.store.jobs import Job
from plancache_server.worker.worker_queue import WorkerQueue
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET


@pytest.mark.parametrize(("waited", "yields"), [(True, True), (False, False), (True, False)])
def test_a_job_handed_back_keeps_every_field_it_had(redis_client: redis.Redis, waited: bool, yields: bool) -> None:
    """A stopping worker's unstarted job goes back to the stream as it came: its callers' claim that they wait
    (`waited`: dropped by the next worker once none does) and that they build it themselves (`yields`: the next
    worker lets it wait for them) included. Without them, the next worker built a hedged node's plan at once,
    beside the node's own build, and built one its callers had left for no one."""
    query = PlanQuery.of(matmul_spec(), TARGET)
    job = Job(job_id="job-1", plan_key=query.key, query=query.proto, waited=waited, yields=yields)
    queue = WorkerQueue(redis_client)
    queue.join([TARGET])
    redis_client.xadd(keys.job_stream(TARGET), job.encode())  # type: ignore[arg-type]

    (taken,) = queue.read("stopping-worker", [TARGET], block_ms=None)
    queue.hand_back(taken)

    (again,) = queue.read("next-worker", [TARGET], block_ms=None)
    assert again.job == job
    assert again.entry_id != taken.entry_id
    assert redis_client.xlen(keys.job_stream(TARGET)) == 1  # the taken entry acknowledged and deleted


def test_a_yield_mark_is_taken_once_and_only_for_the_job_it_names(redis_server: Any, redis_client: redis.Redis) -> None:
    """Anyone can write to Redis: a mark naming another job (forged, or a later build's) is not taken for this one,
    and a job's own mark is taken once, however many callers on however many gateways ask (one hurry per job)."""
    import asyncio

    from plancache_server.gateway.build_states import BuildStates
    from plancache_server.store.redis_conn import connect_async

    async def run() -> list[bool]:
        client = connect_async(redis_server.url)
        try:
            states = BuildStates(client, lease_s=30.0, gateway_id="g1")
            await states.mark_yields("plan-a", "job-1")
            redis_client.set(keys.job_yields("plan-b"), "job-forged")
            return [
                await states.take_yields("plan-b", "job-2"),  # names another job: not taken
                await states.take_yields("plan-a", "job-1"),
                await states.take_yields("plan-a", "job-1"),  # taken already
            ]
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [False, True, False]
    assert redis_client.get(keys.job_yields("plan-b")) == b"job-forged"  # left as found
    assert not redis_client.exists(keys.job_yields("plan-a"))

"""A worker's side of the job streams against a real Redis: what a stopping worker hands back is the job it took."""

from __future__ import annotations

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

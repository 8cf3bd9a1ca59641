"""What a background prefetch deserializes on its own thread: every plan but
the frontend's Python-engine plans, which are built again when deserialized
(resources on the legacy stream, captures) and so are deserialized at their
first use on the caller's thread (GPU run 27: a decode step failed with
"operation would make the legacy stream depend on a capturing blocking
stream" while its plans loaded in the background)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from plancache.run import execution
from plancache.run.plan import PYTHON_PLAN_MAGIC, Plan
from plancache.transport.background import BackgroundPrefetch
from plancache.transport.results import PrefetchResult
from plancache.v1 import plancache_pb2 as pb
from tests.support.fake_gpu import FakeRuntime


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    fake = FakeRuntime()
    execution.use_runtime(fake)
    yield fake
    execution.use_runtime(None)


def test_python_engine_plans_are_deserialized_at_first_use_not_in_the_background(runtime: FakeRuntime) -> None:
    def plan(key: str, blob: bytes) -> Plan:
        return Plan(blob, pb.PlanMetadata(key=key, blob_sha256=hashlib.sha256(blob).hexdigest()))

    plans = [plan("a", b"classic backend plan"), plan("b", PYTHON_PLAN_MAGIC + b"header and kernels")]

    def run(on_plan: object) -> PrefetchResult:
        result = PrefetchResult(total=2)
        for index, plan in enumerate(plans):
            on_plan(index, plan)  # type: ignore[operator]
            result.plans[index] = plan
        return result

    pending = BackgroundPrefetch(run, load=True)
    pending.wait(timeout=10)
    assert [g.blob for g in runtime.graphs] == [b"classic backend plan"]  # the Python plan: not yet
    pending.wait_for(1).load()  # its first use, on this thread
    assert len(runtime.graphs) == 2

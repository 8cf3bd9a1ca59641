"""What a finished call held is freed when it ends, not at the next full collection.

The gateway runs full garbage collections rarely (plancache_server.main.GC_THRESHOLDS),
so anything a call leaves in a reference cycle stays in memory long after: a
miss's flight, waiter and plan (blob and encoded response) did, and the
gateway's RSS grew ~270 MB an hour under bench/soak.py's mix."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter

from plancache import Client
from tests.conftest import Stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET

# What a miss holds on the gateway: none of it may be left for the collector.
HELD_BY_A_MISS = {"StoredPlan", "Flight", "Waiter", "PlanMetadata"}
MISSES = 30


def test_a_miss_leaves_nothing_for_the_garbage_collector(stack: Stack) -> None:
    with Client(stack.address, cache=False, hedge=False) as client:
        client.compile(matmul_spec(m=8), STANDIN_TARGET, timeout=30)  # connections and caches made
        gc.collect()
        flags = gc.get_debug()
        gc.set_debug(gc.DEBUG_SAVEALL)  # unreachable objects kept in gc.garbage, to be named
        try:
            for m in range(16, 16 + MISSES):
                assert not client.compile(matmul_spec(m=m), STANDIN_TARGET, timeout=30).provisional
            gc.collect()
            left = Counter(type(o).__name__ for o in gc.garbage)
            tasks = sorted(o.get_name() for o in gc.garbage if isinstance(o, asyncio.Task))
        finally:
            gc.set_debug(flags)
            gc.garbage.clear()
    assert {name: count for name, count in left.items() if name in HELD_BY_A_MISS} == {}
    # A miss's own task is named after its plan key. Other tasks of this in-process
    # stack (client, worker, background loops) can end in a cycle now and then (CI
    # once left one); a leak per miss would leave about one per miss.
    assert [name for name in tasks if name.startswith("flight ")] == []
    assert len(tasks) < MISSES // 10, tasks

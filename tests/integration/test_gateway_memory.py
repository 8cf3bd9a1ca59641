"""What a finished call held is freed when it ends, not at the next full collection.

The gateway runs full garbage collections rarely (plancache_server.main.GC_THRESHOLDS),
so anything a call leaves in a reference cycle stays in memory long after: a
miss's flight, waiter and plan (blob and encoded response) did, and the
gateway's RSS grew ~270 MB an hour under bench/soak.py's mix."""

from __future__ import annotations

import gc
from collections import Counter

from plancache import Client
from tests.conftest import Stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET

# What a miss holds on the gateway: none of it may be left for the collector.
HELD_BY_A_MISS = {"StoredPlan", "Flight", "Waiter", "PlanMetadata", "Task"}


def test_a_miss_leaves_nothing_for_the_garbage_collector(stack: Stack) -> None:
    with Client(stack.address, cache=False, hedge=False) as client:
        client.compile(matmul_spec(m=8), STANDIN_TARGET, timeout=30)  # connections and caches made
        gc.collect()
        flags = gc.get_debug()
        gc.set_debug(gc.DEBUG_SAVEALL)  # unreachable objects kept in gc.garbage, to be named
        try:
            for m in range(16, 16 + 30):
                assert not client.compile(matmul_spec(m=m), STANDIN_TARGET, timeout=30).provisional
            gc.collect()
            left = Counter(type(o).__name__ for o in gc.garbage)
        finally:
            gc.set_debug(flags)
            gc.garbage.clear()
    assert {name: count for name, count in left.items() if name in HELD_BY_A_MISS} == {}

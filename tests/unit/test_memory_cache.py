"""The front end's memory cache: bounded by bytes, LRU, TTL, misses not cached."""

from __future__ import annotations

import hashlib

from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import MemoryCachedStore, StoredPlan


class DictStore:
    def __init__(self) -> None:
        self.plans: dict[str, StoredPlan] = {}
        self.reads = 0

    def get(self, plan_key: str) -> StoredPlan | None:
        self.reads += 1
        return self.plans.get(plan_key)

    def put(self, plan: StoredPlan) -> None:
        self.plans[plan.metadata.key] = plan

    def delete(self, plan_key: str) -> None:
        self.plans.pop(plan_key, None)


def plan(key: str, size: int) -> StoredPlan:
    blob = key.encode() * (size // len(key))
    return StoredPlan(blob, pb.PlanMetadata(key=key, blob_sha256=hashlib.sha256(blob).hexdigest()))


def test_hits_do_not_read_the_inner_store() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=60)
    cache.put(plan("a", 1000))
    assert cache.get("a") is not None and cache.get("a") is not None
    assert inner.reads == 0


def test_misses_are_not_cached() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=60)
    assert cache.get("a") is None
    inner.put(plan("a", 1000))
    assert cache.get("a") is not None
    assert inner.reads == 2


def test_least_recently_used_goes_first_when_over_the_byte_bound() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=2_500, ttl_s=60)
    for key in ("a", "b"):
        cache.put(plan(key, 1000))
    cache.get("a")  # b is now the least recently used
    cache.put(plan("c", 1000))
    reads = inner.reads
    cache.get("a"), cache.get("c")
    assert inner.reads == reads
    cache.get("b")
    assert inner.reads == reads + 1


def test_entries_expire_and_oversized_plans_are_not_kept() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=0.0)
    cache.put(plan("a", 1000))
    cache.get("a")
    assert inner.reads == 1
    small = MemoryCachedStore(inner, max_bytes=500, ttl_s=60)
    small.put(plan("big", 1000))
    small.get("big")
    assert inner.reads == 2


def test_delete_evicts() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=60)
    cache.put(plan("a", 1000))
    cache.delete("a")
    assert cache.get("a") is None

"""The gateway's memory cache: bounded by bytes, LRU, TTL, misses not cached."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway import memory_cache
from plancache_server.gateway.memory_cache import MemoryCachedStore
from plancache_server.store.plans import StoredPlan


class DictStore:
    """An in-memory inner store that counts its reads."""

    def __init__(self) -> None:
        self.plans: dict[str, StoredPlan] = {}
        self.reads = 0

    def cached(self, plan_key: str) -> StoredPlan | None:
        return None

    async def get(self, plan_key: str) -> StoredPlan | None:
        self.reads += 1
        return self.plans.get(plan_key)

    async def fresh(self, plan_key: str) -> StoredPlan | None:
        return await self.get(plan_key)

    def forget(self, plan_key: str) -> None:
        pass

    async def keys_of_spec(self, spec_hash: str) -> list[str]:
        return []

    async def keys_of_target(self, target_id: str) -> list[str]:
        return []


def plan(key: str, size: int, provisional: bool = False) -> StoredPlan:
    blob = key.encode() * (size // len(key))
    return StoredPlan(
        blob, pb.PlanMetadata(key=key, blob_sha256=hashlib.sha256(blob).hexdigest(), provisional=provisional)
    )


def get(cache: MemoryCachedStore, key: str) -> StoredPlan | None:
    return asyncio.run(cache.get(key))


def test_hits_do_not_read_the_inner_store() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=60)
    cache.remember(plan("a", 1000))
    assert get(cache, "a") is not None and cache.cached("a") is not None
    assert inner.reads == 0


def test_misses_are_not_cached() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=60)
    assert get(cache, "a") is None
    inner.plans["a"] = plan("a", 1000)
    assert get(cache, "a") is not None
    assert inner.reads == 2
    assert cache.cached("a") is not None  # what was read is kept


def test_least_recently_used_goes_first_when_over_the_byte_bound() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=int(2.5 * plan("x", 1000).size), ttl_s=60)  # room for two
    for key in ("a", "b"):
        cache.remember(plan(key, 1000))
    get(cache, "a")  # b is now the least recently used
    cache.remember(plan("c", 1000))
    assert cache.cached("a") is not None and cache.cached("c") is not None
    assert cache.cached("b") is None


def test_a_plans_size_counts_the_encodings_a_hot_plan_keeps() -> None:
    """The blob, GetPlan's response and Prefetch's item: each a copy of the plan (bench/soak.py found the cache
    holding three to four times its bound when only the blob was counted)."""
    p = plan("a", 30_000)
    p.get_plan_response, p.prefetch_item(0, "a", 0)
    assert p.size >= len(p.blob) + len(p.get_plan_response) + len(p.prefetch_item(0, "a", 0))


def test_entries_expire_and_oversized_plans_are_not_kept() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=0.0)
    cache.remember(plan("a", 1000))
    get(cache, "a")
    assert inner.reads == 1
    small = MemoryCachedStore(inner, max_bytes=500, ttl_s=60)
    small.remember(plan("big", 1000))
    assert small.cached("big") is None


def test_a_plan_deleted_elsewhere_is_forgotten() -> None:
    """Invalidate deletes through the janitor (plancache_server.store.lifecycle), then forgets."""
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=60)
    cache.remember(plan("a", 1000))
    inner.plans.pop("a", None)
    cache.forget("a")
    assert cache.cached("a") is None and get(cache, "a") is None


def test_provisional_plans_are_kept_briefly_and_dropped_when_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=60)
    clock = [1000.0]
    monkeypatch.setattr(memory_cache.time, "monotonic", lambda: clock[0])
    cache.remember(plan("p", 1000, provisional=True))
    cache.remember(plan("t", 1000))
    clock[0] += memory_cache.PROVISIONAL_TTL_S - 0.01
    assert cache.cached("p") is not None
    clock[0] += 0.02
    assert cache.cached("p") is None  # the tuned plan may have replaced it in Redis
    assert cache.cached("t") is not None  # a final plan keeps the full TTL
    # The replacement's event drops it at once, whatever its age.
    cache.remember(plan("p", 1000, provisional=True))
    cache.forget("p")
    assert cache.cached("p") is None


def test_fresh_reads_past_the_cache_and_keeps_what_it_read() -> None:
    inner = DictStore()
    cache = MemoryCachedStore(inner, max_bytes=10_000, ttl_s=60)
    cache.remember(plan("a", 1000, provisional=True))
    inner.plans["a"] = plan("a", 1000)
    assert get(cache, "a").provisional  # type: ignore[union-attr]
    fresh = asyncio.run(cache.fresh("a"))
    assert fresh is not None and not fresh.provisional and inner.reads == 1
    assert not cache.cached("a").provisional  # type: ignore[union-attr]

"""The disk cache's size bound is kept without listing the folder at every
put (a listing at every plan grew with the cache, on the path of each plan
to its caller), and it still holds when other processes write to the same
folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from plancache.run.plan import Plan
from plancache.trust import disk_cache
from plancache.trust.disk_cache import DiskCache
from plancache.v1 import plancache_pb2 as pb


def plan(i: int, size: int = 10_000) -> Plan:
    blob = bytes([i % 251]) * size
    return Plan(blob, pb.PlanMetadata(key=f"plan-{i}", blob_sha256=hashlib.sha256(blob).hexdigest()))


def folder_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.plan"))


def count_listings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    listings: list[int] = []
    real_glob = Path.glob

    def glob(self: Path, pattern: str, **kwargs: object):  # type: ignore[no-untyped-def]
        if pattern == "*/*.plan":
            listings.append(1)
        return real_glob(self, pattern, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "glob", glob)
    return listings


def test_puts_within_the_bound_list_the_folder_once_per_rescan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listings = count_listings(monkeypatch)
    cache = DiskCache(tmp_path, max_bytes=10**9)
    for i in range(100):
        cache.put(plan(i))
    assert len(listings) == 1  # the first put learns the folder's size; the next 99 add to it
    assert all(cache.get(f"plan-{i}") is not None for i in range(100))


def test_the_bound_holds_least_recently_used_out(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=55_000)  # about five 10 KB plans
    for i in range(40):
        cache.put(plan(i))
        assert folder_size(tmp_path) <= 55_000
    assert cache.get("plan-39") is not None and cache.get("plan-0") is None


def test_the_bound_holds_with_another_process_writing_the_same_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each cache counts only its own puts: the folder is listed again every RESCAN_PUTS puts, so another
    process's plans are counted within that many."""
    monkeypatch.setattr(disk_cache, "RESCAN_PUTS", 8)
    mine, theirs = DiskCache(tmp_path, max_bytes=200_000), DiskCache(tmp_path, max_bytes=200_000)
    for i in range(60):
        (mine if i % 2 else theirs).put(plan(i))
    assert folder_size(tmp_path) <= 200_000 + 8 * 2 * 10_100  # within a rescan's puts of the bound
    mine.put(plan(1000))
    for i in range(8):
        mine.put(plan(2000 + i))
    assert folder_size(tmp_path) <= 200_000

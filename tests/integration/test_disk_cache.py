"""The client's disk cache: no network for plans a node holds, corruption
detected and refetched, bounded size, atomic writes."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from plancache import Client, CompileOptions
from plancache.log_limits import LogLimiter
from plancache.trust import disk_cache
from plancache.trust.disk_cache import DiskCache
from plancache_server.store.embedded_redis import free_port
from tests.conftest import Stack
from tests.support.filesystems import read_only_folder
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET


def test_warm_cache_needs_no_server(stack: Stack, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache")
    with Client(stack.address, cache=cache) as client:
        compiled = client.compile(matmul_spec(), TARGET)
    assert compiled.source == "compiled"
    # A restarting node: the server is unreachable, the plans it holds still load.
    with Client(f"127.0.0.1:{free_port()}", cache=cache, timeout=1) as offline:
        started = time.perf_counter()
        again = offline.compile(matmul_spec(), TARGET)
        by_key = offline.get(compiled.key)
        by_spec = offline.get(spec=matmul_spec(), target=TARGET)
        elapsed = time.perf_counter() - started
    assert again.source == by_key.source == by_spec.source == "cache"
    assert again.blob == by_key.blob == by_spec.blob == compiled.blob
    assert elapsed < 2.0
    assert len(stack.compiler.builds) == 1


def test_other_options_or_targets_are_not_served_from_the_cache(stack: Stack, tmp_path: Path) -> None:
    with Client(stack.address, cache=DiskCache(tmp_path)) as client:
        client.compile(matmul_spec(), TARGET)
        assert client.compile(matmul_spec(), TARGET, CompileOptions(autotune=False)).source == "compiled"
        assert client.compile(matmul_spec(), TARGET.generic()).source == "compiled"


@pytest.mark.parametrize("damage", ["flip a blob byte", "truncate", "garbage", "another plan"])
def test_corrupt_cache_files_are_discarded_and_refetched(stack: Stack, tmp_path: Path, damage: str) -> None:
    cache = DiskCache(tmp_path)
    with Client(stack.address, cache=cache) as client:
        plan = client.compile(matmul_spec(), TARGET)
        other = client.compile(matmul_spec(m=64), TARGET)
        path = cache._path(plan.key)
        data = path.read_bytes()
        corrupt = {
            "flip a blob byte": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:],
            "truncate": data[: len(data) // 2],
            "garbage": b"\x00\xff" * 100,
            "another plan": cache._path(other.key).read_bytes(),
        }[damage]
        path.write_bytes(corrupt)
        refetched = client.compile(matmul_spec(), TARGET)
    assert refetched.source == "hit" and refetched.blob == plan.blob
    assert cache.get(plan.key) is not None  # rewritten, verified again


def test_cache_stays_within_its_size_bound_least_recently_used_first(stack: Stack, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=250_000)  # room for three 75 KB plans
    with Client(stack.address, cache=cache) as client:
        plans = [client.compile(matmul_spec(m=16 * (i + 1)), TARGET) for i in range(3)]
        time.sleep(0.02)
        cache.get(plans[0].key)  # plans[1] is now the least recently used
        time.sleep(0.02)
        client.compile(matmul_spec(m=16 * 9), TARGET)
    sizes = sum(p.stat().st_size for p in tmp_path.rglob("*.plan"))
    assert sizes <= 250_000
    assert cache.get(plans[0].key) is not None and cache.get(plans[1].key) is None
    assert not list(tmp_path.rglob(".tmp-*"))


def test_unwritable_cache_does_not_break_the_client(stack: Stack, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with Client(stack.address, cache=DiskCache(blocker / "cache")) as client:
        assert client.compile(matmul_spec(), TARGET).source == "compiled"


def test_a_read_only_cache_serves_every_plan_and_says_so_once(
    stack: Stack, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: 60 plans through a cache on a read-only file system: every
    plan right, no error, one warning (not one per plan)."""
    monkeypatch.setattr(disk_cache, "_faults", LogLimiter(disk_cache.log))  # this test's minute, not an earlier test's
    specs = [matmul_spec(m=8 * (i + 1)) for i in range(60)]
    with Client(stack.address, cache=False) as seeder:
        expected = {p.key: p.blob for p in (seeder.compile(s, TARGET) for s in specs)}
    with (
        read_only_folder(tmp_path / "ro") as folder,
        Client(stack.address, cache=DiskCache(folder)) as client,
        caplog.at_level(logging.WARNING, logger=disk_cache.log.name),
    ):
        served = [client.compile(s, TARGET) for s in specs]
    assert [p.blob == expected[p.key] for p in served] == [True] * 60
    lines = [r.getMessage() for r in caplog.records if r.name == disk_cache.log.name]
    assert len(lines) == 1 and "cannot write" in lines[0] and "Read-only file system" in lines[0], lines

"""Start-up prefetch: one streaming call for a manifest, the disk cache first,
failures reported per entry; ListTargets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plancache import (
    Client,
    CompileFailed,
    DiskCache,
    InvalidRequest,
    Manifest,
    ManifestEntry,
    NotFound,
    Target,
    TargetUnavailable,
)
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import REJECTED_NAME, StandInCompiler
from tests.support.standin import STANDIN_TARGET as TARGET


def _specs(n: int) -> list:
    return [matmul_spec(m=16 * (i + 1), name=f"layer{i}") for i in range(n)]


def test_prefetch_streams_stored_plans_and_reports_missing_ones(stack: Stack, tmp_path: Path) -> None:
    specs = _specs(6)
    with stack.client() as warm:
        stored = [warm.compile(s, TARGET) for s in specs[:3]]
    manifest = Manifest.from_specs(specs, TARGET)
    seen: list[tuple[int, int]] = []
    with Client(stack.address, cache=DiskCache(tmp_path)) as node:
        result = node.prefetch(manifest, progress=lambda done, total: seen.append((done, total)))
    assert (result.from_cache, result.fetched, result.compiled, result.failed) == (0, 3, 0, 3)
    assert [result.plans[i].blob for i in range(3)] == [p.blob for p in stored]
    assert all(isinstance(result.errors[i], NotFound) for i in range(3, 6))
    assert seen[0] == (0, 6) and seen[-1] == (6, 6) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(stack.compiler.builds) == 3


def test_prefetch_compiles_missing_plans_then_serves_them_from_disk_offline(stack: Stack, tmp_path: Path) -> None:
    specs = [*_specs(4), matmul_spec(m=8, name=REJECTED_NAME)]
    manifest = Manifest.from_specs(specs, TARGET)
    cache = DiskCache(tmp_path)
    with Client(stack.address, cache=cache) as node:
        first = node.prefetch(manifest, compile_missing=True)
    assert (first.compiled, first.failed) == (4, 1)
    assert isinstance(first.errors[4], CompileFailed) and "cuDNN_STATUS_NOT_SUPPORTED" in first.errors[4].message
    # The node restarts while the server is down: everything it holds loads from disk.
    with Client(f"127.0.0.1:{free_port()}", cache=cache, timeout=1) as offline:
        again = offline.prefetch(Manifest.from_specs(specs[:4], TARGET))
    assert (again.from_cache, again.failed) == (4, 0)
    assert [again.plans[i].blob for i in range(4)] == [first.plans[i].blob for i in range(4)]


def test_prefetch_by_key_and_per_entry_errors(stack: Stack) -> None:
    with stack.client() as client:
        plan = client.compile(matmul_spec(), TARGET)
        other_target = Target("sm_100", 91900, "1.32.0")
        manifest = Manifest(
            target=TARGET,
            entries=[ManifestEntry(key=plan.key), ManifestEntry(key=plan.key.replace(plan.key[:6], "000000"))],
        )
        result = client.prefetch(manifest, compile_missing=True)
        assert result.plans[0].blob == plan.blob
        assert isinstance(result.errors[1], NotFound) and "send its spec" in result.errors[1].message
        unbuildable = client.prefetch(Manifest.from_specs(_specs(2), other_target), compile_missing=True)
        assert all(isinstance(e, TargetUnavailable) for e in unbuildable.errors.values()) and unbuildable.failed == 2


def test_manifest_round_trip_and_refusals(tmp_path: Path) -> None:
    manifest = Manifest.from_specs(_specs(2), TARGET)
    again = Manifest.from_json(manifest.to_json())
    assert (
        [e.key for e in again.entries] == [e.key for e in manifest.entries]
        and again.target is not None
        and again.target.id == TARGET.id
    )
    assert [e.name for e in again.entries] == ["layer0", "layer1"]
    for text, message in [
        ("[]", "version"),
        ('{"version": 1, "entries": [{"name": "x"}]}', "needs a key or a spec"),
        ('{"version": 1, "entries": [{"key": "nope"}]}', "is not like"),
        ('{"version": 1, "colour": 1}', "unknown field"),
    ]:
        with pytest.raises(InvalidRequest, match=message):
            Manifest.from_json(text)
    tampered = manifest.to_json().replace(manifest.entries[0].key or "", manifest.entries[1].key or "", 1)
    with pytest.raises(InvalidRequest, match=r"entry 0 \(layer0\).*does not match its spec"):
        Manifest.from_json(tampered)


def test_list_targets_names_live_workers(stack: Stack) -> None:
    with stack.client() as client:
        targets = {t.target_id: t for t in client.admin.list_targets()}
    assert targets[TARGET.id].live_workers == 1 and targets[TARGET.id].worker_ids == ("test-worker",)
    assert targets[TARGET.generic().id].live_workers == 1


def test_a_background_prefetch_cancelled_mid_stream_stops_at_once_and_keeps_what_came(
    redis_server: EmbeddedRedis, redis_client: object
) -> None:
    """cancel() ends the stream's call while it waits for builds (not at their end): wait() returns at once,
    with the entries that had not come counted as stopped, neither plans nor errors."""
    stack, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=2.0), pool_size=1)
    try:
        with stack.client(hedge=False) as node:
            pending = node.prefetch_in_background(Manifest.from_specs(_specs(4), TARGET), compile_missing=True)
            time.sleep(0.3)  # the stream is open, waiting for the first build
            started = time.monotonic()
            pending.cancel()
            result = pending.wait(timeout=5)
            assert time.monotonic() - started < 1.0, "the call was cancelled, not waited out"
            assert pending.cancelled
            assert (len(result.plans), result.failed, result.stopped) == (0, 0, 4)
    finally:
        stop()

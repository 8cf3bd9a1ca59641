"""Bundles on real redis-servers: server → bundle → another server's store
and → a node's disk cache (then no network call), backup and restore, and
damaged, foreign-signed or truncated bundles refused with the entry named."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from plancache import Client, DiskCache, IntegrityError, Manifest, ManifestEntry
from plancache.cli import main as cli
from plancache.trust.bundle import read_bundle, write_bundle
from plancache.trust.signing import Signer, TrustPolicy, generate_keypair
from plancache_server.bundle_import import import_bundle
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_bias_relu_spec, matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "keys")


@pytest.fixture
def signed_stack(redis_server: EmbeddedRedis, redis_client: redis.Redis, keypair: tuple[Path, Path]) -> Iterator[Stack]:
    s, stop = start_stack(
        redis_server.url, StandInCompiler(), signer=Signer.from_file(keypair[0]), memory_cache_bytes=0
    )
    yield s
    stop()


def _compiled(stack: Stack, public: Path) -> dict[str, bytes]:
    with Client(stack.address, cache=False, trusted_keys=[public], allow_unsigned=False) as c:
        plans = [c.compile(spec, TARGET) for spec in (matmul_spec(), matmul_spec(m=64), matmul_bias_relu_spec())]
    return {p.key: p.blob for p in plans}


def _export(stack: Stack, public: Path, out: Path, *scope: str) -> None:
    assert (
        cli(
            ["export", *scope, "--out", str(out), "--server", stack.address, "--no-cache", "--trusted-key", str(public)]
        )
        == 0
    )


def test_a_bundle_moves_plans_to_another_store_byte_for_byte(
    signed_stack: Stack, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    blobs = _compiled(signed_stack, keypair[1])
    bundle = tmp_path / "all.plans"
    _export(signed_stack, keypair[1], bundle, "--all")
    other_redis = EmbeddedRedis(tmp_path / "other-redis", persist=False).start()
    try:
        assert import_bundle(bundle, other_redis.url, [keypair[1]], allow_unsigned=False) == 3
        other, stop = start_stack(other_redis.url, None)  # no worker: it can only serve what the bundle brought
        try:
            with Client(other.address, cache=False, trusted_keys=[keypair[1]], allow_unsigned=False) as c:
                assert {key: c.get(key).blob for key in blobs} == blobs
                (row,) = [r for r in c.admin.stats() if r.stored_plans]
                assert row.stored_plans == 3
        finally:
            stop()
    finally:
        other_redis.stop()


def test_a_node_with_a_bundle_in_its_image_starts_without_the_network(
    signed_stack: Stack, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    blobs = _compiled(signed_stack, keypair[1])
    manifest = tmp_path / "node.manifest.json"
    manifest.write_text(Manifest(entries=[ManifestEntry(key=k) for k in blobs]).to_json())
    bundle = tmp_path / "node.plans"
    _export(signed_stack, keypair[1], bundle, "--manifest", str(manifest))
    cache_dir = tmp_path / "image-cache"
    assert cli(["import", str(bundle), "--cache-dir", str(cache_dir), "--trusted-key", str(keypair[1])]) == 0
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: any network call would fail
    with Client(
        nowhere, cache=DiskCache(cache_dir), trusted_keys=[keypair[1]], allow_unsigned=False, timeout=2
    ) as node:
        result = node.prefetch(Manifest.load(manifest))
        assert not result.errors and result.from_cache == 3
        assert {key: node.get(key).blob for key in blobs} == blobs


def test_backup_wipe_restore_serves_every_plan_with_the_same_bytes(
    signed_stack: Stack,
    keypair: tuple[Path, Path],
    redis_client: redis.Redis,
    redis_server: EmbeddedRedis,
    tmp_path: Path,
) -> None:
    blobs = _compiled(signed_stack, keypair[1])
    backup = tmp_path / "backup.plans"
    _export(signed_stack, keypair[1], backup, "--target", TARGET.id)
    redis_client.flushall()
    with Client(signed_stack.address, cache=False, trusted_keys=[keypair[1]], allow_unsigned=False) as c:
        assert c.admin.list_plans() == []
        assert import_bundle(backup, redis_server.url, [keypair[1]], allow_unsigned=False) == 3
        assert {key: c.get(key).blob for key in blobs} == blobs


@pytest.fixture
def bundle(signed_stack: Stack, keypair: tuple[Path, Path], tmp_path: Path) -> Path:
    _compiled(signed_stack, keypair[1])
    path = tmp_path / "b.plans"
    _export(signed_stack, keypair[1], path, "--all")
    return path


def test_a_damaged_bundle_is_refused_naming_the_entry(bundle: Path, keypair: tuple[Path, Path]) -> None:
    trust = TrustPolicy.create([keypair[1]], allow_unsigned=False)
    plans = read_bundle(bundle, trust)
    data = bytearray(bundle.read_bytes())
    at = data.index(plans[1].blob[:64]) + 10  # a byte inside entry 1's blob
    data[at] ^= 0x01
    bundle.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"entry 1: .*sha256"):
        read_bundle(bundle, trust)


def test_a_foreign_signature_is_refused_naming_the_entry(
    signed_stack: Stack, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    _compiled(signed_stack, keypair[1])
    foreign = generate_keypair(tmp_path / "foreign")
    plans = read_bundle(
        _bundle_of(signed_stack, keypair, tmp_path), TrustPolicy.create([keypair[1]], allow_unsigned=False)
    )
    plans[2].signature = Signer.from_file(foreign[0]).sign(plans[2].metadata)
    forged = tmp_path / "forged.plans"
    write_bundle(forged, plans)  # a well-formed file whose trailer matches: only the signature betrays it
    with pytest.raises(IntegrityError, match=rf"entry 2 \({plans[2].key}\): .*does not trust"):
        read_bundle(forged, TrustPolicy.create([keypair[1]], allow_unsigned=False))
    assert cli(["import", str(forged), "--cache-dir", str(tmp_path / "c"), "--trusted-key", str(keypair[1])]) == 1


def _bundle_of(stack: Stack, keypair: tuple[Path, Path], tmp_path: Path) -> Path:
    path = tmp_path / "src.plans"
    _export(stack, keypair[1], path, "--all")
    return path


@pytest.mark.parametrize(
    ("cut", "message"),
    [(10, "trailer is damaged"), (60, r"entry 2: truncated \(\d+ of \d+ bytes"), (None, r"entry 2: truncated")],
)
def test_a_truncated_bundle_is_refused(bundle: Path, keypair: tuple[Path, Path], cut: int | None, message: str) -> None:
    data = bundle.read_bytes()
    trust = TrustPolicy.create([keypair[1]], allow_unsigned=False)
    if cut is None:  # in the middle of the last plan
        last = read_bundle(bundle, trust)[2]
        data = data[: data.index(last.blob[:64]) + 100]
    else:
        data = data[:-cut]
    bundle.write_bytes(data)
    with pytest.raises(IntegrityError, match=message):
        read_bundle(bundle, trust)


def test_a_bundle_file_is_written_atomically_and_hashes_its_content(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    path = tmp_path / "empty.plans"
    assert write_bundle(path, []) == 0
    data = path.read_bytes()
    assert data.startswith(b"plancache-bundle/v1\n") and data[-32:] == hashlib.sha256(b"plancache-bundle/v1\n").digest()
    assert read_bundle(path, TrustPolicy.create([keypair[1]], allow_unsigned=False)) == []
    assert not (tmp_path / "empty.plans.partial").exists()

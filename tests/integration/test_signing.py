"""Signed plans: workers sign, clients verify before anything can deserialize
a blob; key rotation; forged, altered and unsigned plans refused."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plancache import Client, DiskCache, UntrustedPlan
from plancache.trust.signing import Signer, TrustPolicy, generate_keypair
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack
from tests.support.processes import child_env
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler


@pytest.fixture
def keypairs(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    return {name: generate_keypair(tmp_path / name) for name in ("old", "new", "stranger")}


@pytest.fixture
def signed_stack(
    redis_server: EmbeddedRedis, redis_client: object, keypairs: dict[str, tuple[Path, Path]]
) -> Iterator[Stack]:
    s, stop = start_stack(
        redis_server.url, StandInCompiler(), signer=Signer.from_file(keypairs["new"][0]), memory_cache_bytes=0
    )
    yield s
    stop()


def client(stack: Stack, *trusted: Path, **kwargs: object) -> Client:
    return Client(stack.address, cache=False, trusted_keys=list(trusted), allow_unsigned=False, **kwargs)  # type: ignore[arg-type]


def test_signed_plans_verify_and_rotation_keeps_working(
    signed_stack: Stack, keypairs: dict[str, tuple[Path, Path]]
) -> None:
    with client(signed_stack, keypairs["new"][1]) as c:
        plan = c.compile(matmul_spec(), TARGET)
    assert plan.signature is not None and plan.signature.key_id == Signer.from_file(keypairs["new"][0]).key_id
    with client(
        signed_stack, keypairs["old"][1], keypairs["new"][1]
    ) as rotating:  # during a rotation both keys are trusted
        assert rotating.get(plan.key).blob == plan.blob
    with client(signed_stack, keypairs["old"][1]) as stale, pytest.raises(UntrustedPlan, match="does not trust"):
        stale.get(plan.key)


def test_altered_plans_are_refused(signed_stack: Stack, keypairs: dict[str, tuple[Path, Path]]) -> None:
    import hashlib

    with client(signed_stack, keypairs["new"][1]) as c:
        plan = c.compile(matmul_spec(), TARGET)
        # An attacker with Redis access swaps the blob and fixes its sha256 in
        # the metadata; the worker's signature no longer verifies.
        evil = b"\x7fELF" + plan.blob[4:]
        meta = pb.PlanMetadata()
        meta.CopyFrom(plan.metadata)
        meta.blob_sha256 = hashlib.sha256(evil).hexdigest()
        signed_stack.redis.hset(keys.plan(plan.key), mapping={"blob": evil, "meta": meta.SerializeToString()})
        with pytest.raises(UntrustedPlan, match="differs from the signed metadata"):
            c.get(plan.key)
        # ... and puts the same metadata into the signature's signed bytes.
        assert plan.signature is not None
        tampered = pb.PlanSignature(
            key_id=plan.signature.key_id, signature=plan.signature.signature, signed_metadata=meta.SerializeToString()
        )
        signed_stack.redis.hset(keys.plan(plan.key), "sig", tampered.SerializeToString())
        with pytest.raises(UntrustedPlan, match="does not verify"):
            c.get(plan.key)
        # A signature made with a key the client does not trust.
        forged = Signer(Ed25519PrivateKey.generate()).sign(meta)
        signed_stack.redis.hset(keys.plan(plan.key), "sig", forged.SerializeToString())
        with pytest.raises(UntrustedPlan, match="does not trust"):
            c.get(plan.key)


def test_unsigned_plans_only_when_allowed(stack: Stack, keypairs: dict[str, tuple[Path, Path]]) -> None:
    with client(stack, keypairs["new"][1]) as strict, pytest.raises(UntrustedPlan, match="not signed"):
        strict.compile(matmul_spec(), TARGET)
    with Client(stack.address, cache=False, allow_unsigned=True) as lenient:
        assert lenient.compile(matmul_spec(), TARGET).signature is None


def test_disk_cache_keeps_signatures_and_rechecks_them(
    signed_stack: Stack, keypairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    cache = DiskCache(tmp_path / "cache")
    with Client(signed_stack.address, cache=cache, trusted_keys=[keypairs["new"][1]], allow_unsigned=False) as c:
        plan = c.compile(matmul_spec(), TARGET)
        assert c.get(plan.key).source == "cache"
    stranger = Client(signed_stack.address, cache=cache, trusted_keys=[keypairs["stranger"][1]], allow_unsigned=False)
    with stranger, pytest.raises(UntrustedPlan):  # the cached copy is not trusted here, and neither is the server's
        stranger.get(plan.key)


def test_trust_policy_from_the_environment(
    keypairs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", f"{keypairs['old'][1]}:{keypairs['new'][1]}")
    monkeypatch.setenv("PLANCACHE_ALLOW_UNSIGNED", "0")
    policy = TrustPolicy.create()
    assert len(policy.keys) == 2 and not policy.allow_unsigned


def test_private_key_is_owner_only(keypairs: dict[str, tuple[Path, Path]]) -> None:
    assert keypairs["new"][0].stat().st_mode & 0o777 == 0o600


def test_worker_refuses_to_start_without_a_key_or_explicit_unsigned() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache_server.worker_main",
            "--redis-url",
            "redis://127.0.0.1:1/0",
            "--device",
            "0",
            "--compiler",
            "tests.support.standin:factory",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3 and "needs --signing-key" in proc.stderr

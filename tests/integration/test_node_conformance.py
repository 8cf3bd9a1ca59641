"""A client in another language, written from the contract alone, agrees with
Python: Node (@grpc/grpc-js, protobufjs, node:crypto) recomputes every key
vector, compiles, fetches and prefetches every example from a real server
with a signing stand-in worker, verifies each signature from the envelope
documented in the .proto, and tells error classes apart by ErrorInfo.

Node and the pinned packages (tests/conformance/node/package-lock.json) are
installed by `make setup-test`."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plancache import Client
from plancache.trust.signing import Signer, generate_keypair
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack
from tests.support.processes import REPO
from tests.support.standin import STANDIN_TARGET, StandInCompiler

NODE_DIR = REPO / "tests" / "conformance" / "node"
VECTORS = REPO / "proto" / "plancache" / "v1" / "key-vectors.json"
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.json"))


def run_node(*args: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, "node is missing: `make setup-test` installs it (nodejs from the OS packages)"
    assert (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(), "the Node packages are missing: `make setup-test` runs npm ci in tests/conformance/node"
    from google.rpc import status_pb2

    googleapis = Path(status_pb2.__file__).resolve().parents[2]  # site-packages: google/rpc/*.proto
    proc = subprocess.run(
        [node, str(NODE_DIR / "conformance.mjs"), "--vectors", str(VECTORS), "--proto-dir", str(REPO / "proto"), "--googleapis", str(googleapis), *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.stdout, f"the Node client printed nothing: {proc.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(proc.stdout)
    assert proc.returncode == 0 and not result["failures"], f"{result['failures']}\n{proc.stderr[-2000:]}"
    return result


def test_node_recomputes_every_key_vector() -> None:
    result = run_node()
    assert [row["name"] for row in result["keys"]] == EXAMPLES
    vectors = {c["name"]: c for c in json.loads(VECTORS.read_text())["cases"]}
    for row in result["keys"]:
        assert row["canonical_matches"] and row["reparsed_matches"], row["name"]
        assert row["spec_hash"] == vectors[row["name"]]["spec_hash"]
        assert row["keys"] == [k["key"] for k in vectors[row["name"]]["keys"]]


@pytest.fixture
def signed_stack(redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path) -> Iterator[tuple[Stack, Path]]:
    private, public = generate_keypair(tmp_path / "keys")
    s, stop = start_stack(redis_server.url, StandInCompiler(), signer=Signer.from_file(private))
    yield s, public
    stop()


def test_node_compiles_fetches_and_verifies_what_python_does(signed_stack: tuple[Stack, Path]) -> None:
    stack, public = signed_stack
    target = {"compute_capability": STANDIN_TARGET.compute_capability, "cudnn_version": STANDIN_TARGET.cudnn_version,
              "frontend_version": STANDIN_TARGET.frontend_version, "device_name": STANDIN_TARGET.device_name, "sm_count": STANDIN_TARGET.sm_count}  # fmt: skip
    result = run_node("--server", stack.address, "--public-key", str(public), "--target", json.dumps(target))
    assert [row["name"] for row in result["live"]] == EXAMPLES
    with Client(stack.address, cache=False, trusted_keys=[public], allow_unsigned=False) as python:
        for row in result["live"]:
            plan = python.get(row["expected_key"])  # the key Node computed is the one Python's request found, signature checked
            digest = hashlib.sha256(plan.blob).hexdigest()
            assert row["compile"]["blob_sha256"] == row["get"]["blob_sha256"] == row["prefetch"]["blob_sha256"] == digest, row["name"]
    errors = result["errors"]
    assert errors["not_found"] == {"code": "NOT_FOUND", "status_code": 5, "reason": "NotFound", "domain": "plancache.v1"}
    assert errors["target_unavailable"]["code"] == errors["compile_failed"]["code"] == "FAILED_PRECONDITION"
    assert errors["target_unavailable"]["reason"] == "TargetUnavailable"
    assert errors["compile_failed"]["reason"] == "CompileFailed"

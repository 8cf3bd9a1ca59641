"""A client in another language, written from the contract alone, agrees with
Python: Node (@grpc/grpc-js, protobufjs, node:crypto) recomputes every key
vector, compiles, fetches and prefetches every example from a real server
with a signing stand-in worker, verifies each signature from the envelope
documented in the .proto, and tells error classes apart by ErrorInfo. From
docs/canonical-form.md and catalog.json alone it normalizes graphs of the
frontend's own ops (a layernorm backward, an rmsnorm backward) to the keys
Python computes, and the server refuses bad specs for new ops naming the node.

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
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import make_key
from plancache.keys.target import Target
from plancache.trust.key_ring import KeyRing
from plancache.trust.signing import Signer, generate_keypair
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack
from tests.support.processes import REPO
from tests.support.standin import STANDIN_TARGET, StandInCompiler

NODE_DIR = REPO / "tests" / "conformance" / "node"
VECTORS = REPO / "proto" / "plancache" / "v1" / "key-vectors.json"
CATALOG = REPO / "proto" / "plancache" / "v1" / "catalog.json"
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.json"))


def run_node(*args: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, "node is missing: `make setup-test` installs it (nodejs from the OS packages)"
    assert (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "the Node packages are missing: `make setup-test` runs npm ci in tests/conformance/node"
    )
    from google.rpc import status_pb2

    googleapis = Path(status_pb2.__file__).resolve().parents[2]  # site-packages: google/rpc/*.proto
    proc = subprocess.run(
        [
            node,
            str(NODE_DIR / "conformance.mjs"),
            "--vectors",
            str(VECTORS),
            "--proto-dir",
            str(REPO / "proto"),
            "--googleapis",
            str(googleapis),
            "--catalog",
            str(CATALOG),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
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


def norm_backward(op: str, has_dbias: bool | None = None) -> GraphSpec:
    """The graphs conformance.mjs builds by itself, built with Python's builder."""
    g = GraphSpec(io_data_type="half")
    dy = g.tensor([8, 64, 1, 1], uid=1, name="dY")
    x = g.tensor([8, 64, 1, 1], uid=0, name="X")
    scale = g.tensor([1, 64, 1, 1], uid=2, name="scale")
    inv_variance = g.tensor([8, 1, 1, 1], data_type="float", uid=4, name="inv_variance")
    if op == "layernorm_backward":
        mean = g.tensor([8, 1, 1, 1], data_type="float", uid=3, name="mean")
        dx, dscale, dbias = g.node(op, grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_variance)
    else:
        dx, dscale, dbias = g.node(op, grad=dy, input=x, scale=scale, inv_variance=inv_variance, has_dbias=has_dbias)
    assert dx is not None and dscale is not None
    dx.set_output(True).set_uid(5)
    dscale.set_output(True).set_uid(6).set_data_type("float")
    if has_dbias is False:
        assert dbias is None, "rmsnorm_backward(has_dbias=False) has no DBias"
    else:
        assert dbias is not None
        dbias.set_output(True).set_uid(7).set_data_type("float")
    return g


def test_node_keys_frontend_ops_as_python_does() -> None:
    result = run_node()
    vectors = json.loads(VECTORS.read_text())
    t = vectors["target"]
    target = Target(t["compute_capability"], t["cudnn_version"], t["frontend_version"], t["device_name"], t["sm_count"])
    python = {
        "layernorm_backward_fp16": norm_backward("layernorm_backward"),
        "rmsnorm_backward_no_dbias_fp16": norm_backward("rmsnorm_backward", has_dbias=False),
    }
    node = {row["name"]: row for row in result["frontend_ops"]}
    assert sorted(node) == sorted(python)
    for name, spec in python.items():
        assert node[name]["spec_hash"] == spec.spec_hash(), name
        assert node[name]["key"] == make_key(spec.spec_hash(), target, CompileOptions()), name
    assert '"outputs":{"DScale":6,"DX":5}' in node["rmsnorm_backward_no_dbias_fp16"]["canonical_bytes"]
    # Node's normalizer refuses the bad specs too, naming the node (or, for a bad dim, the tensor and its reader).
    refused = result["refused_by_client"]
    assert "node 0 (lnb_missing_mean)" in refused["missing_port"] and "mean" in refused["missing_port"]
    assert "node 0 (transpose_hostile)" in refused["hostile_param"] and "permutation" in refused["hostile_param"]
    assert "node 0 (rope_zero_dim)" in refused["zero_dim"]
    assert "node 0 (rmsb_dbias_number)" in refused["bool_as_number"] and "has_dbias" in refused["bool_as_number"]


@pytest.fixture
def signed_stack(redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path) -> Iterator[tuple[Stack, Path]]:
    private, public = generate_keypair(tmp_path / "keys")
    s, stop = start_stack(redis_server.url, StandInCompiler(), signer=Signer.from_file(private), signing_key=private)
    KeyRing(private).stage()  # a rotation under way: GetSigningKeys serves the next key too, endorsed
    yield s, public
    stop()


def test_node_compiles_fetches_and_verifies_what_python_does(signed_stack: tuple[Stack, Path]) -> None:
    stack, public = signed_stack
    target = {
        "compute_capability": STANDIN_TARGET.compute_capability,
        "cudnn_version": STANDIN_TARGET.cudnn_version,
        "frontend_version": STANDIN_TARGET.frontend_version,
        "device_name": STANDIN_TARGET.device_name,
        "sm_count": STANDIN_TARGET.sm_count,
    }
    result = run_node("--server", stack.address, "--public-key", str(public), "--target", json.dumps(target))
    assert [row["name"] for row in result["live"]] == EXAMPLES
    with Client(stack.address, cache=False, trusted_keys=[public], allow_unsigned=False) as python:
        for row in result["live"]:
            plan = python.get(
                row["expected_key"]
            )  # the key Node computed is the one Python's request found, signature checked
            digest = hashlib.sha256(plan.blob).hexdigest()
            assert (
                row["compile"]["blob_sha256"] == row["get"]["blob_sha256"] == row["prefetch"]["blob_sha256"] == digest
            ), row["name"]
    errors = result["errors"]
    assert errors["not_found"] == {
        "code": "NOT_FOUND",
        "status_code": 5,
        "reason": "NotFound",
        "domain": "plancache.v1",
    }
    assert errors["target_unavailable"]["code"] == errors["compile_failed"]["code"] == "FAILED_PRECONDITION"
    assert errors["target_unavailable"]["reason"] == "TargetUnavailable"
    assert errors["compile_failed"]["reason"] == "CompileFailed"
    # A graph of a frontend op that Node normalized: the server keys it as Node did.
    live = result["frontend_live"]
    assert live["server_key"] == live["expected_key"] == live["compile"]["key"]
    assert live["expected_key"].startswith(norm_backward("layernorm_backward").spec_hash() + "/")
    # Bad specs for new ops are refused as SpecErrors naming the node.
    refusals = result["refusals"]
    for name in ("missing_port", "hostile_param", "bool_as_number"):
        refusal = refusals[name]
        assert (refusal["code"], refusal["reason"]) == ("INVALID_ARGUMENT", "SpecError"), (name, refusal)
        assert refusal["node"] in refusal["message"], (name, refusal)
    assert "mean" in refusals["missing_port"]["message"]
    assert "permutation" in refusals["hostile_param"]["message"]
    assert "has_dbias" in refusals["bool_as_number"]["message"]
    assert (refusals["zero_dim"]["code"], refusals["zero_dim"]["reason"]) == ("INVALID_ARGUMENT", "SpecError")
    assert "dims must be >= 1" in refusals["zero_dim"]["message"]
    # The signing keys, recomputed from their PEMs by Node: the current key and the staged one it endorsed.
    current, staged = (k.key_id for k in KeyRing(public.with_name("plan-signing.pem")).read())
    assert result["signing_keys"] == [
        {"key_id": current, "state": "SIGNING_KEY_STATE_CURRENT", "endorsed_by": "", "endorsement_verifies": None},
        {"key_id": staged, "state": "SIGNING_KEY_STATE_NEXT", "endorsed_by": current, "endorsement_verifies": True},
    ]

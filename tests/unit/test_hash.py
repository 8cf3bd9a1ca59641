"""Hashing: invariant to presentation, sensitive to anything that changes the plan."""

from __future__ import annotations

import json
import random

import pytest

from plancache import GraphSpec
from tests.support.specs import matmul_bias_relu_spec, matmul_spec


def _shuffled_json(spec: GraphSpec, seed: int) -> str:
    """The same spec with JSON fields, map entries and the tensor list reordered."""
    rng = random.Random(seed)

    def shuffle(value: object) -> object:
        if isinstance(value, dict):
            items = list(value.items())
            rng.shuffle(items)
            return {k: shuffle(v) for k, v in items}
        if isinstance(value, list) and value and isinstance(value[0], dict) and "uid" in value[0]:
            value = list(value)
            rng.shuffle(value)
        return [shuffle(v) for v in value] if isinstance(value, list) else value

    return json.dumps(shuffle(json.loads(spec.to_json())))


@pytest.mark.parametrize("seed", range(5))
def test_order_of_fields_maps_and_tensors_does_not_matter(seed: int) -> None:
    spec = matmul_bias_relu_spec()
    assert GraphSpec.from_json(_shuffled_json(spec, seed)).spec_hash() == spec.spec_hash()


def test_names_do_not_matter() -> None:
    spec = matmul_bias_relu_spec()
    renamed = matmul_bias_relu_spec()
    renamed.name = "something else"
    for t in renamed.tensors:
        t.name = f"renamed_{t.uid}"
    for n in renamed.nodes:
        n.name = f"node_{n.op}"
    assert renamed.spec_hash() == spec.spec_hash()


def test_explicit_defaults_hash_like_omitted_ones() -> None:
    implicit = matmul_spec()
    explicit = matmul_spec()
    explicit.tensors[0].stride = (256 * 512, 512, 1)
    explicit.tensors[0].data_type = "half"
    explicit.tensors[2].dim = (8, 256, 256)
    explicit.nodes[0].compute_data_type = "float"
    assert explicit.spec_hash() == implicit.spec_hash()


def _variants() -> dict[str, GraphSpec]:
    out: dict[str, GraphSpec] = {}
    g = matmul_spec()
    g.tensors[0].dim, g.tensors[1].dim = (8, 256, 256), (8, 256, 256)
    out["dims"] = g
    g = matmul_spec()
    g.tensors[0].stride = (256 * 512, 1, 256)
    out["strides"] = g
    g = matmul_spec()
    g.tensors[0].data_type = "bfloat16"
    out["input dtype"] = g
    g = matmul_spec()
    g.tensors[2].data_type = "float"
    out["output dtype"] = g
    g = matmul_spec()
    g.tensors[2].uid = 30
    out["uid"] = g
    g = matmul_spec()
    g.nodes[0].compute_data_type = "half"
    out["compute type"] = g
    g = matmul_spec()
    g.nodes[0].attributes["padding"] = 1.0
    out["attribute"] = g
    g = matmul_spec()
    g.intermediate_data_type = "half"
    out["graph intermediate type"] = g
    return out


@pytest.mark.parametrize("change", list(_variants()))
def test_changes_that_change_the_plan_change_the_hash(change: str) -> None:
    assert _variants()[change].spec_hash() != matmul_spec().spec_hash()


def test_op_change_changes_the_hash() -> None:
    a, b = GraphSpec(io_data_type="half"), GraphSpec(io_data_type="half")
    for g, op in ((a, "relu"), (b, "tanh")):
        x = g.tensor([4, 8], name="x", uid=1)
        g.pointwise(op, x).set_output(True).set_uid(2)
    assert a.spec_hash() != b.spec_hash()


def test_hash_is_a_sha256_hex() -> None:
    h = matmul_spec().spec_hash()
    assert len(h) == 64 and int(h, 16) >= 0

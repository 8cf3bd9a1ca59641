"""normalize() copies its input with copy_spec (a quarter of deepcopy's
time: a key is made on every call that keys a graph). The copy must be as
good as a deep copy: the same normal form and key, and the caller's spec
untouched by normalizing, shared tensors (ragged offsets, a tensor feeding
two nodes) still shared in the copy."""

from __future__ import annotations

import copy

from bench.startup_graphs import startup_graphs
from plancache.graphspec.canonical import spec_hash
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.spec_json import to_json as spec_to_json
from plancache.graphspec.validation import normalize
from plancache.graphspec.validation.normal_form import copy_spec
from tests.support.layout_specs import (
    conv_bias_relu,
    layernorm_training_channels_last,
    matmul_bias_first_gelu,
    sdpa_bshd_with_stats,
)
from tests.support.specs import matmul_bias_relu_spec, matmul_spec


def _specs() -> list[GraphSpec]:
    return [
        *startup_graphs(),
        matmul_spec(),
        matmul_bias_relu_spec(),
        conv_bias_relu(None),
        matmul_bias_first_gelu(),
        layernorm_training_channels_last(),
        sdpa_bshd_with_stats(),
    ]


def test_normalizing_leaves_the_callers_spec_as_it_was_and_keys_as_a_deep_copy_would() -> None:
    for spec in _specs():
        before = spec_to_json(spec)
        normal = normalize(spec)
        assert spec_to_json(spec) == before, spec.name  # the caller's spec: untouched
        assert spec_hash(normal) == spec_hash(normalize(copy.deepcopy(spec)))


def test_shared_tensors_stay_shared_and_apart_from_the_original() -> None:
    for spec in _specs():
        copied = copy_spec(spec)
        originals = {id(t) for t in spec.tensors}
        assert not originals & {id(t) for t in copied.tensors}
        by_id = {id(t) for t in copied.tensors}
        for node in copied.nodes:
            for t in [*node.inputs.values(), *node.outputs.values()]:
                assert id(t) in by_id, (spec.name, node.op)  # a node's ports are the copy's own tensors
        for t in copied.tensors:
            assert t.ragged_offset is None or id(t.ragged_offset) in by_id

"""A captured graph is the program's graph, field by field (plancache.frontend_graph).

Random graphs built with the frontend's own API (tests/support/random_pygraphs.py:
every node family, random attributes, uids 0 included, results' dims and
strides set or not, scalars held in the graph, the graph's constructor
arguments) are captured, normalized, rebuilt from the spec the way the
worker builds them, and compared with the program's graph as cuDNN would
receive them: no difference. Then the comparison is shown to see what it
must: a spec changed in any field, or a program's field the capture would
drop, is a difference naming that field. On the CPU this is the frontend's
IR; tests/gpu/test_gpu_frontend_graph.py compares cuDNN's own lowering."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from plancache import GraphSpec
from plancache.frontend_graph import build_pygraph, differences
from plancache.graphspec import spec_io
from plancache.graphspec.subgraph import Subgraph
from plancache.graphspec.validation import normalize
from plancache.v1 import plancache_pb2 as pb
from tests.support.random_pygraphs import FAMILIES, random_graph

cudnn = pytest.importorskip("cudnn", reason="needs the cuDNN frontend's Python IR (nvidia-cudnn-frontend)")
SEEDS = range(60)


class KernelCache:
    """What the IR holds for a kernel cache (creating a real one needs libcudnn)."""


def _roundtrip(g: Any) -> tuple[GraphSpec, Any]:
    spec = normalize(GraphSpec.from_pygraph(g))
    return spec, build_pygraph(spec, cudnn, kernel_cache=KernelCache())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_frontend_graphs_rebuild_into_the_programs_graph(family: str) -> None:
    families_seen = 0
    for seed in SEEDS:
        g, _ = random_graph(cudnn, seed, kernel_cache=KernelCache(), family=family)
        spec, rebuilt = _roundtrip(g)
        assert differences(g, rebuilt) == [], f"seed {seed}: {differences(g, rebuilt)}\n{spec.to_json()}"
        families_seen += 1
    assert families_seen == len(SEEDS)


def test_the_capture_keeps_what_the_last_one_dropped() -> None:
    """The chunked-prefill tests' graph-level flag (the frontend skips them on
    cuDNN < 9.21): captured, in the key, and a spec without it is another graph."""

    def graph(**kwargs: Any) -> Any:
        g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, **kwargs)
        a = g.tensor(name="A", dim=[1, 64, 64], stride=[4096, 64, 1]).set_uid(0)
        g.matmul(A=a, B=a).set_output(True)
        return g

    with_flag, without = GraphSpec.from_pygraph(graph(is_override_shape_enabled=True)), GraphSpec.from_pygraph(graph())
    assert with_flag.is_override_shape_enabled and with_flag.spec_hash() != without.spec_hash()
    dropped = normalize(with_flag)
    dropped.is_override_shape_enabled = False
    assert differences(graph(is_override_shape_enabled=True), build_pygraph(dropped, cudnn)) == [
        "graph is_override_shape_enabled: the program's True, the spec's None"
    ]


def _first(spec: GraphSpec, pick: Callable[[Any], bool]) -> Any:
    return next(t for t in spec.tensors if pick(t))


def _input(spec: GraphSpec, data_type: str | None = None) -> Any:
    """The first graph input (of that data type)."""
    return _first(
        spec, lambda t: not t.is_virtual and not t.is_output and t.constant is None and data_type in (None, t.data_type)
    )


def _reverse_strides(spec: GraphSpec) -> None:
    t = _first(spec, lambda t: len(t.stride) > 1 and not t.is_output and not t.is_virtual)
    t.stride = tuple(reversed(t.stride))


# A change to a spec, and the field the comparison must name.
MUTATIONS: dict[str, tuple[Callable[[GraphSpec], None], str]] = {
    "an input's uid": (lambda s: setattr(_input(s), "uid", 10**6), "not in the"),
    "an input's strides": (_reverse_strides, "stride"),
    "an input's data type": (lambda s: setattr(_input(s, "half"), "data_type", "bfloat16"), "data type"),
    "the compute type": (lambda s: setattr(s.nodes[0], "compute_data_type", "half"), "compute data type"),
    "a graph argument": (lambda s: setattr(s, "sm_count", 7), "sm_count"),
    "an alignment promise": (lambda s: setattr(_input(s), "alignment_value", 16), "alignment_value"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_spec_that_differs_in_any_field_is_a_difference_naming_it(mutation: str) -> None:
    change, named = MUTATIONS[mutation]
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    x = g.tensor(name="x", dim=[2, 64, 32], stride=[2048, 32, 1])
    w = g.tensor(name="w", dim=[2, 32, 16], stride=[512, 16, 1])
    g.relu(input=g.matmul(A=x, B=w)).set_output(True)
    spec = normalize(GraphSpec.from_pygraph(g))
    changed = copy.deepcopy(spec)
    change(changed)
    found = differences(g, build_pygraph(normalize(changed), cudnn))
    assert any(named in d for d in found), found


def test_an_attribute_and_a_result_layout_the_program_set_are_compared() -> None:
    g, _ = random_graph(cudnn, 3, family="sdpa")
    spec = normalize(GraphSpec.from_pygraph(g))
    node = spec.nodes[0]
    changed = copy.deepcopy(spec)
    changed.nodes[0].attributes["attn_scale"] = float(node.attributes["attn_scale"]) * 2
    assert any("parameter 'attn_scale'" in d for d in differences(g, build_pygraph(normalize(changed), cudnn)))
    layout = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
    x = layout.tensor(name="x", dim=[4, 8, 16], stride=[128, 16, 1])
    y = layout.transpose(x, permutation=[0, 2, 1])
    y.set_output(True).set_stride([128, 1, 16])  # the program chose the result's layout
    spec = normalize(GraphSpec.from_pygraph(layout))
    assert _first(spec, lambda t: t.is_output).stride == (128, 1, 16)
    spec.tensors[-1].stride = (128, 8, 1)
    assert any(
        "stride [128, 1, 16] (the program sets it)" in d for d in differences(layout, build_pygraph(spec, cudnn))
    )


def test_a_field_the_capture_would_drop_is_a_difference() -> None:
    """What the frontend's tensor holds past what the spec carries (here set
    on the program's graph after the capture) is compared field by field."""
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
    a = g.tensor(name="A", dim=[1, 64, 64], stride=[4096, 64, 1])
    g.matmul(A=a, B=a).set_output(True)
    spec = normalize(GraphSpec.from_pygraph(g))
    a.set_alignment_value(16)
    a.set_reordering_type(cudnn.tensor_reordering.F16x16)
    found = differences(g, build_pygraph(spec, cudnn))
    assert any("alignment_value 16 against 1" in d for d in found) and any(
        "reordering_type 'F16x16' against None" in d for d in found
    )


def test_a_score_modifier_callback_is_recorded_as_the_ops_it_adds() -> None:
    """test_flexible_sdpa's form: a callback closing over graph tensors (a
    softcap, -inf) adds pointwise ops to the scores. Its spec form is those
    ops; they survive both wire forms with the key; the worker's callback
    adds the same ones; another callback is another graph."""
    g, _ = random_graph(cudnn, 11, family="score_mod")
    spec, rebuilt = _roundtrip(g)
    modifier = spec.nodes[0].attributes["score_mod"]
    assert isinstance(modifier, Subgraph) and modifier.ops and differences(g, rebuilt) == []
    read = {t.uid for t in spec.tensors if t.name in ("softcap", "neg_inf")}
    assert modifier.uids() <= read and modifier.uids()  # the tensors it reads are the graph's, bound by the caller
    assert GraphSpec.from_json(spec.to_json()).spec_hash() == spec.spec_hash()
    assert (
        spec_io.from_proto(pb.GraphSpec.FromString(spec_io.to_proto(spec).SerializeToString())).spec_hash()
        == spec.spec_hash()
    )
    other = copy.deepcopy(spec)
    changed = dataclasses.replace(modifier.ops[0], data_type="half")  # the callback set another type on a result
    other.nodes[0].attributes["score_mod"] = Subgraph((changed, *modifier.ops[1:]), modifier.result)
    assert normalize(other).spec_hash() != spec.spec_hash()
    assert differences(g, build_pygraph(normalize(other), cudnn)) != []

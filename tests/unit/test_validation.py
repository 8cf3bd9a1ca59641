"""Validation: every refusal names the node or tensor at fault."""

from __future__ import annotations

import pytest

from plancache import GraphSpec, SpecError
from plancache.graphspec.validation import Limits, normalize
from tests.support.specs import matmul_spec


def _conv(**attrs: object) -> GraphSpec:
    g = GraphSpec(io_data_type="half")
    x = g.tensor([8, 64, 56, 56], name="x")
    w = g.tensor([128, 64, 3, 3], name="w")
    g.conv_fprop(x, w, **attrs).set_output(True).set_name("y")
    return g


def test_normal_form_fills_every_default() -> None:
    n = normalize(_conv(padding=[1, 1]))
    y = next(t for t in n.tensors if t.name == "y")
    assert y.dim == (8, 128, 56, 56)
    # A convolution's result is channels-last, as the cuDNN frontend lays it out (tests/unit/test_layouts.py).
    assert y.data_type == "half" and y.stride == (401408, 1, 7168, 128)
    (node,) = n.nodes
    assert node.attributes == {"padding": (1, 1), "stride": (1, 1), "dilation": (1, 1)}
    assert node.compute_data_type == "float"


def test_strided_conv_output_dims() -> None:
    n = normalize(_conv(padding=[1, 1], stride=[2, 2]))
    assert next(t for t in n.tensors if t.name == "y").dim == (8, 128, 28, 28)


def _expect(spec: GraphSpec, message: str, limits: Limits | None = None) -> None:
    with pytest.raises(SpecError, match=message):
        normalize(spec, limits or Limits())


def test_unknown_op() -> None:
    g = matmul_spec()
    g.nodes[0].op = "matmull"
    _expect(g, "node 0 \\(matmul_0\\): unknown op 'matmull'")


def test_unknown_attribute_and_wrong_type() -> None:
    _expect(_conv(paddin=[1, 1]), "node 0 \\(conv_fprop_0\\): conv_fprop has no attribute 'paddin'")
    _expect(_conv(padding=1), "attribute 'padding': expected int list, got 1")
    g = GraphSpec(io_data_type="half")
    q, k, v = (g.tensor([1, 2, 16, 8], name=n) for n in "qkv")
    o, _ = g.sdpa(q, k, v, use_causal_mask="yes")
    assert o is not None
    o.set_output(True)
    _expect(g, "attribute 'use_causal_mask': expected bool, got 'yes'")


def test_bad_enum_and_missing_required_attribute() -> None:
    g = GraphSpec(io_data_type="float")
    x = g.tensor([4, 8], name="x")
    g.reduction(x, mode="SUMM").set_output(True).set_dim([4, 1])
    _expect(g, "attribute 'mode': 'SUMM' is not one of ADD")
    g2 = GraphSpec(io_data_type="half")
    x2 = g2.tensor([4, 8, 1, 1], name="x")
    s, b = g2.tensor([1, 8, 1, 1], name="s"), g2.tensor([1, 8, 1, 1], name="b")
    e = g2.scalar(1e-5, name="eps")
    y, *_ = g2.layernorm(x2, s, b, e)
    assert y is not None
    y.set_output(True)
    _expect(g2, "missing required attribute 'norm_forward_phase' \\(one of TRAINING, INFERENCE\\)")


def test_shape_mismatches_name_the_node() -> None:
    _expect(matmul_spec(k=512).__class__(), "graph: no nodes")
    g = GraphSpec(io_data_type="half")
    a, b = g.tensor([8, 256, 512], name="A"), g.tensor([8, 256, 256], name="B")
    g.matmul(a, b).set_output(True)
    _expect(g, "node 0 \\(matmul_0\\): A \\[8, 256, 512\\] @ B \\[8, 256, 256\\]: inner dims differ")
    _expect(_conv(padding=[1]), "attribute 'padding' has 1 values but the convolution has 2 spatial dims")
    g = GraphSpec(io_data_type="half")
    x, w = g.tensor([8, 64, 56, 56], name="x"), g.tensor([128, 48, 3, 3], name="w")
    g.conv_fprop(x, w).set_output(True)
    _expect(g, "'image' has 64 channels, not a multiple of 'weight''s 48")


def test_declared_output_dims_must_match() -> None:
    g = matmul_spec()
    g.tensors[2].dim = (8, 256, 255)
    _expect(g, "output 'C' declared with dims \\[8, 256, 255\\] but the op produces \\[8, 256, 256\\]")


def test_pointwise_broadcast_and_rank() -> None:
    g = GraphSpec(io_data_type="half")
    a, b = g.tensor([4, 8], name="a"), g.tensor([4, 1, 8], name="b")
    g.add(a, b).set_output(True)
    _expect(g, "have different ranks")


def test_graph_structure_errors() -> None:
    g = matmul_spec()
    g.tensors[2].uid = 1
    _expect(g, "duplicate uid 1")
    g = matmul_spec()
    g.tensor([3], name="unused")
    _expect(g, "tensor 'unused' \\(uid 4\\): declared but no node uses it")
    g = matmul_spec()
    g.tensors[2].is_output = False
    g.tensors[2].is_virtual = True
    _expect(g, "an intermediate no node consumes")
    g = matmul_spec()
    g.tensors[0].is_virtual = True
    _expect(g, "marked virtual but no node produces it")
    g = matmul_spec()  # a node with no result kept at all is still a mistake
    g.tensors[2].is_output = False
    g.add(g.tensors[0], g.tensors[0]).set_output(True)
    _expect(g, "an intermediate no node consumes")
    g = matmul_spec()
    g.nodes[0].inputs.pop("B")
    _expect(g, "missing required input 'B'")
    g = matmul_spec()
    g.nodes[0].inputs["C"] = g.tensors[0]
    _expect(g, "matmul has no input port 'C'")


def test_consumed_before_produced() -> None:
    g = GraphSpec(io_data_type="half")
    x = g.tensor([4, 8], name="x")
    h = g.relu(x)
    y = g.tanh(h)
    y.set_output(True)
    g.nodes.reverse()
    _expect(g, "node 0 \\(tanh_1\\): input 'input' uses tensor 'relu_0::OUT_0' .* before the node that produces it")


def test_data_type_rules() -> None:
    g = GraphSpec()
    a, b = g.tensor([8, 4, 4], name="A"), g.tensor([8, 4, 4], name="B")
    g.matmul(a, b).set_output(True)
    _expect(g, "tensor 'A' \\(uid 1\\): no data_type, and the graph has no io_data_type")
    g = GraphSpec(io_data_type="half")
    q, k, v = (g.tensor([2, 4, 16, 8], name=n) for n in "qkv")
    lens = [g.tensor([2, 1, 1, 1], name=n) for n in ("lq", "lkv")]
    o, _ = g.sdpa(q, k, v, seq_len_q=lens[0], seq_len_kv=lens[1], use_padding_mask=True)
    assert o is not None
    o.set_output(True)
    _expect(g, "input 'seq_len_q' must have an integer data type")


def test_limits_are_enforced_with_names() -> None:
    _expect(matmul_spec(), "graph: 3 tensors, over the limit of 2", Limits(max_tensors=2))
    _expect(matmul_spec(), "over the limit of 1,000", Limits(max_elements_per_tensor=1000))
    _expect(matmul_spec(), "graph: its tensors need 5,242,880 bytes", Limits(max_total_bytes=10**6))
    g = matmul_spec()
    g.tensors[0].dim = (8, 256, 0)
    _expect(g, "dims must be >= 1")
    g = matmul_spec()
    g.tensors[0].stride = (1, 1)
    _expect(g, "stride \\[1, 1\\] has 2 entries for 3 dims")


def test_sdpa_shape_rules() -> None:
    g = GraphSpec(io_data_type="half")
    q = g.tensor([2, 8, 128, 64], name="q")
    k = g.tensor([2, 3, 128, 64], name="k")
    v = g.tensor([2, 3, 128, 64], name="v")
    o, _ = g.sdpa(q, k, v)
    assert o is not None
    o.set_output(True)
    _expect(g, "head count dividing q's \\(q 8, k 3, v 3\\)")


def test_normalize_does_not_mutate_its_input() -> None:
    g = matmul_spec()
    before = g.to_json()
    normalize(g)
    assert g.to_json() == before


def test_a_spec_the_caller_owns_is_normalized_in_place_to_the_same_normal_form() -> None:
    """plancache.cudnn's capture normalizes the spec it has just read without copying it: the result is the
    spec itself, with the normal form (and the key) a copy gets."""
    copied = normalize(matmul_spec())
    owned = matmul_spec()
    assert normalize(owned, owned=True) is owned
    assert owned.to_json() == copied.to_json()


# ---- every numeric attribute has a range (issue 44) -------------------------------------------------------


def _matmul_padding(value: float) -> GraphSpec:
    g = matmul_spec()
    g.nodes[0].attributes["padding"] = value
    return g


def _sdpa(**attrs: object) -> GraphSpec:
    g = GraphSpec(io_data_type="half")
    q, k, v = (g.tensor([1, 2, 16, 8], name=n) for n in "qkv")
    o, _ = g.sdpa(q, k, v, **attrs)
    assert o is not None
    o.set_output(True)
    return g


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (lambda: _conv(padding=[-1, 1]), r"attribute 'padding': -1 is outside its range \[0, 1,048,576\]"),
        (lambda: _conv(padding=[1, 2**21]), r"attribute 'padding': 2097152 is outside its range \[0, 1,048,576\]"),
        (lambda: _conv(padding=[1, 1], stride=[0, 1]), r"attribute 'stride': 0 is outside its range \[1, 1,048,576\]"),
        (lambda: _conv(padding=[1, 1], dilation=[1, 0]), r"attribute 'dilation': 0 is outside its range"),
        (lambda: _conv(padding=[1, 2**62]), r"attribute 'padding': \[1, 4611686018427387904\] has a value outside"),
        (lambda: _matmul_padding(-1e308), r"attribute 'padding': -1e\+308 is outside its range \[-3.402823e\+38, "),
        (
            lambda: _sdpa(dropout_probability=1.5),
            r"attribute 'dropout_probability': 1.5 is outside its range \[0.0, 1.0\]",
        ),
        (lambda: _sdpa(attn_scale=1e39), r"attribute 'attn_scale': 1e\+39 is outside its range"),
    ],
)
def test_a_numeric_attribute_outside_its_range_is_refused_naming_it_the_value_and_the_range(
    spec: object, message: str
) -> None:
    _expect(spec(), message)  # type: ignore[operator]


def test_values_within_their_ranges_pass() -> None:
    normalize(_conv(padding=[0, 2**20], stride=[1, 2**20], dilation=[2, 1]))
    normalize(_matmul_padding(-3.0e38))
    normalize(_sdpa(attn_scale=0.125))

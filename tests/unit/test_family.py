"""Graph families (plancache.graphspec.family): derived from two graphs of one
program, an instance at any of its sizes is exactly the graph that program
builds at that size (the same plan key), its identity does not depend on
the sizes it was derived from, and what has no form at another size, or
differs beyond dims, is refused naming why."""

from __future__ import annotations

from typing import Any

import pytest

from plancache import SpecError
from plancache.functional._attention import Attention, sdpa_request
from plancache.functional._geometry import Geo
from plancache.functional._linear import linear_request
from plancache.functional._paged_decode import paged_decode_request
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.family import MAX_FAMILY_SIZE, Family, derive
from plancache.graphspec.layouts import row_major
from plancache.graphspec.validation import normalize


def g(name: str, shape: tuple[int, ...], dtype: str = "bfloat16", stride: tuple[int, ...] | None = None) -> Geo:
    return Geo(name, shape, stride or row_major(shape), dtype, f"torch.{dtype}", "cuda")


def decode_linear(batch: int) -> Any:
    return linear_request(g("input", (batch, 1024)), g("weight", (4096, 1024)), g("bias", (4096,)), "gelu").spec


def prefill(length: int, causal: bool = True) -> Any:
    q = g("query", (2, 16, length, 128))  # BHSD, dense: its head stride follows the length
    return sdpa_request((q, q, q, None, None, None), Attention(0.0, causal, None, False, None, False)).spec


def paged(batch: int) -> Any:
    pool, table = g("key_cache", (512, 8, 64, 128)), g("page_table", (batch, 32), "int32")
    return paged_decode_request(
        g("query", (batch, 16, 1, 128)),
        pool,
        pool,
        table,
        table,
        g("seq_lens", (batch,), "int32"),
        scale=None,
        max_seq_len=None,
    ).spec


def key(spec: Any) -> str:
    return hash_normalized(normalize(spec))


@pytest.mark.parametrize(
    "make, first, second",
    [(decode_linear, 8, 17), (prefill, 128, 200), (paged, 8, 33)],
    ids=["decode linear", "prefill sdpa", "paged decode"],
)
def test_an_instance_is_exactly_the_graph_the_program_builds_at_that_size(make: Any, first: int, second: int) -> None:
    family = derive(make(first), make(second), size_range=(1, 300))
    (symbol,) = [v.symbol for v in family.varying]
    for size in (1, 5, first, second, 300):
        assert key(family.instance({symbol: size})) == key(make(size)), size
        assert family.values_of(make(size)) == {symbol: size}
    assert (
        family.family_hash() == derive(make(3), make(250), size_range=(1, 300)).family_hash()
    )  # whatever sizes it was derived from
    assert family.size() == 300 and len(list(family.instances())) == 300


def test_a_size_outside_the_family_or_another_graph_is_not_an_instance() -> None:
    family = derive(decode_linear(8), decode_linear(17), sizes={"d0": [8, 16, 17, 32]})
    with pytest.raises(SpecError, match="size 9 of 'd0' is not one of the family's"):
        family.instance({"d0": 9})
    assert family.values_of(decode_linear(9)) is None
    other = linear_request(g("input", (8, 1024)), g("weight", (4096, 1024)), g("bias", (4096,)), "relu").spec
    assert family.values_of(other) is None  # another activation: another graph, never this family's


def test_graphs_that_differ_beyond_dims_are_not_one_family() -> None:
    with pytest.raises(SpecError, match="differ beyond tensor dims"):
        derive(prefill(128, causal=True), prefill(200, causal=False), size_range=(1, 10))
    with pytest.raises(SpecError, match="no dim varies"):
        derive(prefill(128), prefill(128), size_range=(1, 10))


def test_a_layout_with_no_form_at_another_size_is_refused_naming_the_tensor() -> None:
    """q, k, v sliced out of one fused projection [b, s, 3, h, d]: their strides hold 3 x h x d,
    a gap no size of s derives."""

    def fused(s: int) -> Any:
        stride = (s * 3 * 16 * 128, 128, 3 * 16 * 128, 1)
        q = g("query", (2, 16, s, 128), stride=stride)
        return sdpa_request((q, q, q, None, None, None), Attention(0.0, True, None, False, None, False)).spec

    with pytest.raises(SpecError, match=r"tensor query: strides .* have no form at another size"):
        derive(fused(128), fused(200), size_range=(1, 10))


def test_a_family_is_bounded_and_its_forms_round_trip() -> None:
    with pytest.raises(SpecError, match=f"at most {MAX_FAMILY_SIZE:,} graphs"):
        derive(decode_linear(8), decode_linear(17), size_range=(1, MAX_FAMILY_SIZE + 1))
    family = derive(paged(8), paged(33), size_range=(1, 64))
    assert Family.from_dict(family.to_dict()).family_hash() == family.family_hash()
    assert Family.from_proto(family.to_proto()).family_hash() == family.family_hash()
    forged = family.to_dict()
    forged["varying"][0]["places"].append([1, 7])  # an axis the query does not have
    with pytest.raises(SpecError, match="has no declared axis 7"):
        Family.from_dict(forged)


def layer_of(out_features: int) -> Any:
    """A linear of one row count and another weight: another layer, not another size."""
    return linear_request(
        g("input", (8, 1024)), g("weight", (out_features, 1024)), g("bias", (out_features,)), None
    ).spec


def test_a_family_never_varies_a_parameters_dims() -> None:
    """Issue 43: the weight (uid 2) and bias (uid 3) are a call's parameters; a family over their dims is
    distinct layers. Refused naming the tensor, whether derived here or sent in a family's forms."""
    with pytest.raises(SpecError, match=r"sits in axis \d of 'weight' \(uid 2\), a parameter of the call"):
        derive(layer_of(256), layer_of(768), size_range=(1, 4), fixed=(2, 3))
    family = derive(decode_linear(8), decode_linear(17), size_range=(1, 32), fixed=(2, 3))
    assert family.fixed == (2, 3)
    for form in (Family.from_dict(family.to_dict()), Family.from_proto(family.to_proto())):
        assert form.fixed == (2, 3) and form.family_hash() == family.family_hash()  # the same graphs, one key
    across = derive(layer_of(256), layer_of(768), size_range=(1, 4)).to_dict()
    across["fixed"] = [2]
    with pytest.raises(SpecError, match="a parameter of the call"):
        Family.from_dict(across)
    across["fixed"] = [99]
    with pytest.raises(SpecError, match=r"fixed tensors \[99\] are not tensors of its example"):
        Family.from_dict(across)

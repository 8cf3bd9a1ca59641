"""An operator's signature (plancache.functional._signature): its slots
named once, and the checks that keep a call's tuple, its spec's uids, what
its backward saves and torch's keywords in one order."""

from __future__ import annotations

from typing import Any

import pytest

from plancache.functional import _attention, _batch_norm, _convolution, _linear, _norms, _paged_decode
from plancache.functional._signature import Signature, Slot
from tests.support.frontdoor_standins import StandInTensor

T = StandInTensor
LINEAR = _linear.LINEAR


def test_a_signature_refuses_two_slots_of_one_name_or_uid_and_torchs_slots_after_the_calls_own() -> None:
    with pytest.raises(ValueError, match="two slots of one name or uid"):
        Signature("f", "MATMUL", Slot("input", 1), Slot("input", 2))
    with pytest.raises(ValueError, match="two slots of one name or uid"):
        Signature("f", "MATMUL", Slot("input", 1), Slot("weight", 1))
    with pytest.raises(ValueError, match="torch is given come before"):
        Signature("f", "MATMUL", Slot("seed", 1, to_torch=False), Slot("input", 2))


def test_the_uids_a_spec_binds_are_the_slots_given_in_the_slots_order() -> None:
    assert LINEAR.uids(input=1, weight=1, bias=None) == (1, 2)
    assert LINEAR.uids(bias=1, weight=1, input=1) == (1, 2, 3)  # the keywords' order does not count
    with pytest.raises(TypeError, match="linear has no slot other"):
        LINEAR.uids(input=1, other=1)


def test_a_first_call_binds_its_tuple_by_slot_and_refuses_one_out_of_order() -> None:
    x, w, b = T((4, 64)), T((32, 64)), T((32,))
    bound = LINEAR.bind((x, w, b), input=x, weight=w, bias=b)
    assert bound.names == ("input", "weight", "bias") and bound.uids == (1, 2, 3) and bound.saved == (0, 1)
    assert bound.index("bias") == 2 and bound.tensor("weight") is w and bound.geo("input").shape == (4, 64)
    no_bias = LINEAR.bind((x, w), input=x, weight=w, bias=None)
    assert no_bias.index("bias") is None and no_bias.geo_or_none("bias") is None and no_bias.uids == (1, 2)
    with pytest.raises(RuntimeError, match=r"not its slots \(input, weight, bias\) in order"):
        LINEAR.bind((w, x, b), input=x, weight=w, bias=b)
    with pytest.raises(RuntimeError, match="not its slots"):
        LINEAR.bind((x, w), input=x, weight=w, bias=b)  # a tensor the tuple left out
    with pytest.raises(RuntimeError, match="no weight"):
        LINEAR.bind((x,), input=x)


def test_torchs_function_is_given_the_slots_by_name_or_positionally_when_they_are_its_first_parameters() -> None:
    x, w = T((4, 64)), T((32, 64))
    bound = LINEAR.bind((x, w), input=x, weight=w, bias=None)

    def positional(input: Any, weight: Any, bias: Any = None, *, scale: float = 1.0) -> Any:
        return ("positional", input, weight, bias, scale)

    def by_name(weight: Any, input: Any, bias: Any = None, scale: float = 1.0) -> Any:
        return ("by name", input, weight, bias, scale)

    assert bound.fallback(positional) is positional  # nothing made per call
    assert bound.fallback(positional, scale=2.0)(x, w) == ("positional", x, w, None, 2.0)
    assert bound.fallback(by_name, scale=2.0)(x, w) == ("by name", x, w, None, 2.0)
    seed = T((1, 1, 1, 1), dtype="int64")
    sdpa = _attention.SDPA.bind((x, x, x, seed), query=x, key=x, value=x, dropout_seed=seed)

    def attention(**given: Any) -> Any:
        return sorted(given)

    assert sdpa.fallback(attention, dropout_p=0.1)(x, x, x, seed) == ["dropout_p", "key", "query", "value"]


@pytest.mark.parametrize(
    ("signature", "node_type"),
    [
        (_linear.LINEAR, "MATMUL"),
        (_linear.MATMUL, "MATMUL"),
        (_convolution.CONV2D, "CONV_FPROP"),
        (_norms.LAYER_NORM, "LAYERNORM"),
        (_norms.RMS_NORM, "RMSNORM"),
        (_batch_norm.BATCH_NORM, "BATCHNORM"),
        (_attention.SDPA, "SDPA"),
        (_paged_decode.PAGED_DECODE, "SDPA"),
    ],
)
def test_every_operator_counts_a_geometry_torch_ran_under_its_node_type(signature: Signature, node_type: str) -> None:
    assert signature.node_type == node_type and signature.slots[0].uid == 1

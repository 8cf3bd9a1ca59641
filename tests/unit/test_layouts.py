"""Result strides left out of a spec are the ones the cuDNN frontend infers
(plancache/graphspec/layouts.py): the rules on known cases here, the frontend itself
on the GPU (tests/gpu/test_gpu_layouts.py)."""

from __future__ import annotations

import pytest

from examples.generate import EXAMPLES, nhwc
from plancache import GraphSpec, SpecError
from plancache.graphspec.canonical import spec_hash
from plancache.graphspec.layouts import channels_last, order_of, packed, row_major
from plancache.graphspec.validation import normalize
from tests.support.layout_specs import (
    conv_bias_relu,
    layernorm_training_channels_last,
    matmul_bias_first_gelu,
    sdpa_bshd_with_stats,
    without_result_strides,
)


def strides(spec: GraphSpec) -> dict[str, tuple[int, ...]]:
    return {t.name: t.stride for t in normalize(spec).tensors if t.name}


def test_the_frontends_stride_helpers() -> None:
    assert row_major((2, 3, 4)) == (12, 4, 1)
    assert channels_last((8, 64, 56, 56)) == tuple(nhwc(8, 64, 56, 56))
    assert channels_last((2, 4, 3, 5, 6)) == (360, 1, 120, 24, 4)  # N, C, D, H, W -> NDHWC
    assert packed((2, 3, 4), (2, 0, 1)) == (12, 1, 3)
    # Ties (size-1 axes) keep axis order, as the frontend's sort of short vectors does.
    assert order_of((768, 768, 1), 3) == [1, 2, 0]
    assert order_of((4, 1), 3) == [1, 0, 2]


@pytest.mark.parametrize("x_stride", [nhwc(32, 64, 56, 56), None], ids=["nhwc-input", "nchw-input"])
def test_a_convolution_lays_out_channels_last_and_pointwise_results_follow(x_stride: list[int] | None) -> None:
    """The frontend's conv result is channels-last whatever the input's
    layout; bias and relu keep their same-shaped input's strides."""
    expected = tuple(nhwc(32, 128, 56, 56))
    got = strides(conv_bias_relu(x_stride))
    assert got["conv"] == got["biased"] == got["y"] == expected


def test_leaving_result_strides_out_or_writing_the_inferred_ones_is_one_key() -> None:
    assert spec_hash(conv_bias_relu(nhwc(32, 64, 56, 56))) == spec_hash(
        conv_bias_relu(nhwc(32, 64, 56, 56), nhwc(32, 128, 56, 56))
    )
    # Another layout for the output is another graph.
    contiguous = list(row_major((32, 128, 56, 56)))
    assert spec_hash(conv_bias_relu(nhwc(32, 64, 56, 56))) != spec_hash(
        conv_bias_relu(nhwc(32, 64, 56, 56), contiguous)
    )


def test_matmul_results_are_row_major_and_a_broadcast_bias_does_not_lead() -> None:
    got = strides(matmul_bias_first_gelu())
    assert got["C"] == got["biased"] == got["y"] == (512 * 768, 768, 1)


def test_norm_results_follow_their_input() -> None:
    got = strides(layernorm_training_channels_last())
    assert got["y"] == (1024, 1, 1024, 1024)
    # Statistics (8, 1, 1, 1) packed in x's dim order (C fastest, then N, H, W).
    assert got["mean"] == got["inv_var"] == (1, 1, 8, 8)


def test_sdpa_results_are_row_major() -> None:
    got = strides(sdpa_bshd_with_stats())
    assert got["o"] == row_major((2, 16, 128, 64)) and got["stats"] == (16 * 128, 128, 1, 1)


def test_examples_keep_their_keys_when_their_result_strides_are_left_out() -> None:
    """Every example writes out the strides the frontend would choose (or
    leaves them out): leaving them all out is the same graph."""
    for name, build in EXAMPLES.items():
        assert spec_hash(without_result_strides(build())) == spec_hash(build()), name


def test_an_intermediate_with_another_layout_is_refused() -> None:
    g = conv_bias_relu(nhwc(32, 64, 56, 56))
    next(t for t in g.tensors if t.name == "conv").set_stride(list(row_major((32, 128, 56, 56))))
    with pytest.raises(SpecError, match="cuDNN lays it out as"):
        normalize(g)

"""Graphs whose results' strides are left out, on inputs in several layouts:
the unit tests check the rules on them, tests/gpu the frontend's own layout."""

from __future__ import annotations

from collections.abc import Callable

from examples.generate import nhwc
from plancache import GraphSpec
from plancache.graphspec.ops import CATALOG


def conv_bias_relu(x_stride: list[int] | None, y_stride: list[int] | None = None) -> GraphSpec:
    g = GraphSpec(io_data_type="half")
    x = g.tensor([32, 64, 56, 56], x_stride, name="x")
    w = g.tensor([128, 64, 3, 3], nhwc(128, 64, 3, 3), name="w")
    bias = g.tensor([1, 128, 1, 1], name="bias")
    conv = g.conv_fprop(x, w, padding=[1, 1]).set_name("conv")
    biased = g.bias(conv, bias).set_name("biased")
    y = g.relu(biased).set_output(True).set_name("y")
    if y_stride:
        y.set_stride(y_stride)
    return g


def matmul_bias_first_gelu() -> GraphSpec:
    """Column-major weights; bias(a=bias, b=matmul): the first same-shaped input leads."""
    g = GraphSpec(io_data_type="bfloat16")
    a = g.tensor([1, 512, 1024], name="A")
    b = g.tensor([1, 1024, 768], [1024 * 768, 1, 1024], name="B")
    bias = g.tensor([1, 1, 768], [768, 768, 1], name="bias")
    g.gelu(g.bias(bias, g.matmul(a, b).set_name("C")).set_name("biased")).set_output(True).set_name("y")
    return g


def layernorm_training_channels_last() -> GraphSpec:
    g = GraphSpec(io_data_type="bfloat16")
    x = g.tensor([8, 1024, 1, 1], [1024, 1, 1024, 1024], name="x")
    scale = g.tensor([1, 1024, 1, 1], name="scale", data_type="float")
    bias = g.tensor([1, 1024, 1, 1], name="bias", data_type="float")
    y, mean, inv_var = g.layernorm(x, scale, bias, g.scalar(1e-5, name="eps"), norm_forward_phase="TRAINING")
    assert y is not None and mean is not None and inv_var is not None
    y.set_output(True).set_name("y")
    mean.set_output(True).set_name("mean").set_data_type("float")
    inv_var.set_output(True).set_name("inv_var").set_data_type("float")
    return g


def sdpa_bshd_with_stats() -> GraphSpec:
    g = GraphSpec(io_data_type="half")
    bshd = [16 * 128 * 64, 64, 16 * 64, 1]  # q, k, v in (B, S, H, D) memory
    q, k, v = (g.tensor([2, 16, 128, 64], bshd, name=n) for n in "qkv")
    o, stats = g.sdpa(q, k, v, attn_scale=0.125, generate_stats=True)
    assert o is not None and stats is not None
    o.set_output(True).set_name("o")
    stats.set_output(True).set_name("stats").set_data_type("float")
    return g


LAYOUT_CASES: dict[str, Callable[[], GraphSpec]] = {
    "conv_bias_relu_nhwc_input": lambda: conv_bias_relu(nhwc(32, 64, 56, 56)),
    "conv_bias_relu_nchw_input": lambda: conv_bias_relu(None),
    "matmul_bias_first_gelu": matmul_bias_first_gelu,
    "layernorm_training_channels_last": layernorm_training_channels_last,
    "sdpa_bshd_with_stats": sdpa_bshd_with_stats,
}


def without_result_strides(spec: GraphSpec) -> GraphSpec:
    """The same graph with every classic op's result strides left out, but
    for ragged results (their packed layout is the caller's to declare). A
    frontend op's results keep theirs: strides its program set are part of
    the graph cuDNN receives, not a layout plancache infers."""
    for node in spec.nodes:
        if CATALOG[node.op].derived:
            continue
        for t in node.outputs.values():
            if t.ragged_offset is None:
                t.stride = ()
    return spec

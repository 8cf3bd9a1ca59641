"""GraphSpec.from_pygraph: a graph built with the cuDNN frontend's own API
(on the CPU: only the frontend's IR is used) becomes the same spec as the
one built with plancache's builder."""

from __future__ import annotations

import math

import pytest

from examples.generate import matmul_bias_relu_bf16, nhwc, sdpa_causal_fp16
from plancache import GraphSpec, SpecError
from tests.support.pygraphs import matmul_bias_relu_bf16_pygraph

cudnn = pytest.importorskip("cudnn")
F = cudnn.data_type.FLOAT


def test_fused_matmul_captures_to_the_same_plan_key() -> None:
    g = matmul_bias_relu_bf16_pygraph(cudnn)
    spec = GraphSpec.from_pygraph(g)
    assert [n.op for n in spec.nodes] == ["matmul", "bias", "relu"]
    assert spec.spec_hash() == matmul_bias_relu_bf16().spec_hash()


def test_sdpa_captures_to_the_same_plan_key() -> None:
    half = cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=half, intermediate_data_type=F, compute_data_type=F)
    q, k, v = (g.tensor(name=n, dim=[4, 16, 1024, 64], stride=[1048576, 65536, 64, 1], data_type=half).set_uid(u) for n, u in (("q", 11), ("k", 12), ("v", 13)))
    o, _ = g.sdpa(q=q, k=k, v=v, attn_scale=1 / math.sqrt(64), use_causal_mask=True)
    o.set_output(True).set_uid(14)
    spec = GraphSpec.from_pygraph(g)
    assert spec.spec_hash() == sdpa_causal_fp16().spec_hash()


def test_conv_and_norm_capture_and_validate() -> None:
    half = cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=half, intermediate_data_type=F, compute_data_type=F)
    x = g.tensor(name="x", dim=[8, 64, 56, 56], stride=nhwc(8, 64, 56, 56), data_type=half)
    w = g.tensor(name="w", dim=[64, 64, 3, 3], stride=nhwc(64, 64, 3, 3), data_type=half)
    y = g.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], compute_data_type=F)
    y.set_output(True).set_stride(nhwc(8, 64, 56, 56))
    h = g.tensor(name="h", dim=[64, 1024, 1, 1], stride=[1024, 1, 1, 1], data_type=half)
    scale = g.tensor(name="scale", dim=[1, 1024, 1, 1], stride=[1024, 1, 1, 1], data_type=F)
    eps = g.tensor(name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F, is_pass_by_value=True)
    out, _ = g.rmsnorm(input=h, scale=scale, epsilon=eps, norm_forward_phase=cudnn.norm_forward_phase.INFERENCE)
    out.set_output(True)
    spec = GraphSpec.from_pygraph(g)
    assert [n.op for n in spec.nodes] == ["conv_fprop", "rmsnorm"]
    assert spec.nodes[1].attributes["norm_forward_phase"] == "INFERENCE"
    assert len(spec.spec_hash()) == 64  # validates


def test_unsupported_frontend_ops_are_named() -> None:
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=F, compute_data_type=F)
    x = g.tensor(name="x", dim=[4, 8, 16], stride=[128, 16, 1], data_type=cudnn.data_type.HALF)
    g.transpose(input=x, permutation=[0, 2, 1]).set_output(True)
    with pytest.raises(SpecError, match="TRANSPOSE has no plancache op"):
        GraphSpec.from_pygraph(g)


def test_a_conv_graph_without_output_strides_captures_to_the_frontends_layout() -> None:
    """Before validate() the frontend's graph carries a provisional row-major
    stride on the conv's result; the layout it builds is channels-last. The
    capture leaves unset strides to normalize, which infers that layout: the
    same key as the spec that writes it out, and as the spec that leaves it out."""
    half = cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=half, intermediate_data_type=F, compute_data_type=F)
    x = g.tensor(name="x", dim=[32, 64, 56, 56], stride=nhwc(32, 64, 56, 56), data_type=half).set_uid(1)
    w = g.tensor(name="w", dim=[128, 64, 3, 3], stride=nhwc(128, 64, 3, 3), data_type=half).set_uid(2)
    bias = g.tensor(name="bias", dim=[1, 128, 1, 1], stride=[128, 1, 128, 128], data_type=half).set_uid(3)
    y = g.relu(input=g.bias(input=g.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]), bias=bias))
    y.set_output(True).set_uid(4)
    captured = GraphSpec.from_pygraph(g)

    def built(y_stride: list[int] | None) -> GraphSpec:
        s = GraphSpec(io_data_type="half")
        xs = s.tensor([32, 64, 56, 56], nhwc(32, 64, 56, 56), name="x", uid=1)
        ws = s.tensor([128, 64, 3, 3], nhwc(128, 64, 3, 3), name="w", uid=2)
        bs = s.tensor([1, 128, 1, 1], [128, 1, 128, 128], name="bias", uid=3)
        out = s.relu(s.bias(s.conv_fprop(xs, ws, padding=[1, 1]), bs)).set_output(True).set_uid(4)
        if y_stride:
            out.set_stride(y_stride)
        return s

    assert captured.spec_hash() == built(None).spec_hash() == built(nhwc(32, 128, 56, 56)).spec_hash()

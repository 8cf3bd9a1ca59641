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
    q, k, v = (
        g.tensor(name=n, dim=[4, 16, 1024, 64], stride=[1048576, 65536, 64, 1], data_type=half).set_uid(u)
        for n, u in (("q", 11), ("k", 12), ("v", 13))
    )
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


def test_what_has_no_spec_form_is_named() -> None:
    """A callback that does more than add pointwise ops (here it reads the
    score's dims and branches) and a graph built for a device property
    (deviceless AOT) have no form: refused, naming them."""
    half = cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=half, intermediate_data_type=F, compute_data_type=F)
    q, k, v = (g.tensor(name=n, dim=[1, 2, 64, 64], stride=[8192, 4096, 64, 1], data_type=half) for n in "qkv")
    g.sdpa(
        q=q,
        k=k,
        v=v,
        generate_stats=False,
        score_mod=lambda graph, score: graph.mul(a=score, b=score) if score.get_dim()[2] > 32 else score,
    )[0].set_output(True)
    with pytest.raises(
        SpecError, match="parameter 'score_mod': the callback uses 'get_dim' of a tensor, which plancache cannot record"
    ):
        GraphSpec.from_pygraph(g)
    aot = cudnn.pygraph(io_data_type=half, device_property=object())
    a = aot.tensor(name="a", dim=[1, 8, 8], stride=[64, 8, 1])
    aot.matmul(a, a).set_output(True)
    with pytest.raises(SpecError, match="device_property"):
        GraphSpec.from_pygraph(aot)


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
    y = g.relu(
        input=g.bias(input=g.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]), bias=bias)
    )
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


def _bf16_graph() -> tuple[object, object]:
    bf16 = cudnn.data_type.BFLOAT16
    return cudnn.pygraph(io_data_type=bf16, intermediate_data_type=F, compute_data_type=F), bf16


def test_a_ragged_prefill_captures_to_the_same_plan_key() -> None:
    from examples.generate import sdpa_ragged_prefill_bf16

    g, bf16 = _bf16_graph()
    b, h, s, d = 4, 8, 512, 128
    thd = [s * h * d, d, h * d, 1]
    offsets = g.tensor(
        name="token_offsets", dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32
    ).set_uid(19)
    q, k, v = (
        g.tensor(name=n, dim=[b, h, s, d], stride=thd, data_type=bf16).set_uid(u).set_ragged_offset(offsets)
        for n, u in (("q", 11), ("k", 12), ("v", 13))
    )
    seq_q, seq_kv = (
        g.tensor(name=n, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32).set_uid(u)
        for n, u in (("seq_len_q", 17), ("seq_len_kv", 18))
    )
    o, _ = g.sdpa(
        q=q,
        k=k,
        v=v,
        attn_scale=1 / math.sqrt(d),
        use_causal_mask=True,
        use_padding_mask=True,
        seq_len_q=seq_q,
        seq_len_kv=seq_kv,
        generate_stats=False,
    )
    o.set_output(True).set_uid(14).set_stride(thd).set_ragged_offset(offsets)
    assert GraphSpec.from_pygraph(g).spec_hash() == sdpa_ragged_prefill_bf16().spec_hash()


def _dropout_tensors(g: object) -> tuple[object, object]:
    i64 = cudnn.data_type.INT64
    return tuple(
        g.tensor(name=n, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i64).set_uid(u)
        for n, u in (("dropout_seed", 31), ("dropout_offset", 32))
    )  # type: ignore[attr-defined,return-value]


def test_dropout_forward_and_backward_capture_to_the_same_plan_keys() -> None:
    from examples.generate import sdpa_backward_dropout_bf16, sdpa_dropout_bf16

    g, bf16 = _bf16_graph()
    dims, stride = [2, 8, 128, 128], [131072, 16384, 128, 1]
    q, k, v = (
        g.tensor(name=n, dim=dims, stride=stride, data_type=bf16).set_uid(u)
        for n, u in (("q", 11), ("k", 12), ("v", 13))
    )
    seed, offset = _dropout_tensors(g)
    o, stats = g.sdpa(q=q, k=k, v=v, attn_scale=1 / math.sqrt(128), generate_stats=True, dropout=(0.1, seed, offset))
    o.set_output(True).set_uid(14)
    stats.set_output(True).set_uid(15).set_data_type(F)
    assert GraphSpec.from_pygraph(g).spec_hash() == sdpa_dropout_bf16().spec_hash()

    g, bf16 = _bf16_graph()
    q, k, v, o, d_o = (
        g.tensor(name=n, dim=dims, stride=stride, data_type=bf16).set_uid(u)
        for n, u in (("q", 11), ("k", 12), ("v", 13), ("o", 14), ("dO", 16))
    )
    stats = g.tensor(name="stats", dim=[2, 8, 128, 1], stride=[1024, 128, 1, 1], data_type=F).set_uid(15)
    seed, offset = _dropout_tensors(g)
    grads = g.sdpa_backward(
        q=q, k=k, v=v, o=o, dO=d_o, stats=stats, attn_scale=1 / math.sqrt(128), dropout=(0.1, seed, offset)
    )
    for t, uid in zip(grads, (21, 22, 23), strict=True):
        t.set_output(True).set_uid(uid)
    assert GraphSpec.from_pygraph(g).spec_hash() == sdpa_backward_dropout_bf16().spec_hash()


def test_a_bias_gradient_captures_to_the_same_plan_key() -> None:
    from examples.generate import sdpa_backward_bias_bf16

    g, bf16 = _bf16_graph()
    dims, stride = [2, 8, 256, 64], [131072, 16384, 64, 1]
    q, k, v, o, d_o = (
        g.tensor(name=n, dim=dims, stride=stride, data_type=bf16).set_uid(u)
        for n, u in (("q", 11), ("k", 12), ("v", 13), ("o", 14), ("dO", 16))
    )
    stats = g.tensor(name="stats", dim=[2, 8, 256, 1], stride=[2048, 256, 1, 1], data_type=F).set_uid(15)
    bias = g.tensor(name="bias", dim=[1, 8, 256, 256], stride=[524288, 65536, 256, 1], data_type=bf16).set_uid(17)
    d_bias = g.tensor(name="dBias", dim=[1, 8, 256, 256], stride=[524288, 65536, 256, 1], data_type=bf16).set_uid(24)
    grads = g.sdpa_backward(q=q, k=k, v=v, o=o, dO=d_o, stats=stats, attn_scale=0.125, bias=bias, dBias=d_bias)
    for t, uid in zip(grads, (21, 22, 23), strict=True):
        t.set_output(True).set_uid(uid)
    d_bias.set_output(True)
    assert GraphSpec.from_pygraph(g).spec_hash() == sdpa_backward_bias_bf16().spec_hash()


def test_a_dropout_mask_captures_to_its_ports() -> None:
    g, bf16 = _bf16_graph()
    q, k, v = (
        g.tensor(name=n, dim=[1, 2, 64, 64], stride=[8192, 4096, 64, 1], data_type=bf16).set_uid(u)
        for n, u in (("q", 1), ("k", 2), ("v", 3))
    )
    mask = g.tensor(name="mask", dim=[1, 2, 64, 64], stride=[8192, 4096, 64, 1], data_type=bf16).set_uid(4)
    scale = g.tensor(name="scale", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F).set_uid(5)
    o, _ = g.sdpa(q=q, k=k, v=v, generate_stats=False, dropout=(mask, scale))
    o.set_output(True).set_uid(6)
    (node,) = GraphSpec.from_pygraph(g).nodes
    assert {p: t.uid for p, t in node.inputs.items()} == {"q": 1, "k": 2, "v": 3, "dropout_mask": 4, "dropout_scale": 5}

    spec = GraphSpec(io_data_type="bfloat16")
    tq, tk, tv = (spec.tensor([1, 2, 64, 64], name=n, uid=u) for n, u in (("q", 1), ("k", 2), ("v", 3)))
    t_mask, t_scale = (
        spec.tensor([1, 2, 64, 64], name="mask", uid=4),
        spec.tensor([1, 1, 1, 1], data_type="float", name="scale", uid=5),
    )
    out, _ = spec.sdpa(tq, tk, tv, generate_stats=False, dropout=(t_mask, t_scale))
    assert out is not None
    out.set_output(True).set_uid(6)
    assert GraphSpec.from_pygraph(g).spec_hash() == spec.spec_hash()


def test_a_data_type_read_once_is_read_the_same_and_a_refused_one_stays_refused() -> None:
    """The capture keeps each data type value it read (bench/capture_cost.py): by type and value, so a value of
    another type that compares equal is read afresh, and a refusal is never kept."""
    import torch

    from plancache.graphspec.interop import data_type

    for _ in range(2):  # the second read is the kept one
        assert data_type(cudnn.data_type.HALF, "t") == "half"
        assert data_type(torch.bfloat16, "t") == "bfloat16"
        assert data_type(None, "t") is None
        assert data_type(cudnn.data_type.NOT_SET, "t") is None
        with pytest.raises(SpecError, match=r"data type 3 is not a cudnn\.data_type"):
            data_type(3, "t")
        with pytest.raises(SpecError, match=r"torch data type torch\.complex32 has no cuDNN equivalent"):
            data_type(torch.complex32, "t")
        with pytest.raises(SpecError, match=r"is not a cudnn\.data_type"):
            data_type([cudnn.data_type.HALF], "t")  # unhashable: read, and refused, every time

    class FakeHalf:  # equal to HALF and hashing alike: still not a cudnn.data_type
        name = None

        def __eq__(self, other: object) -> bool:
            return other is cudnn.data_type.HALF or isinstance(other, FakeHalf)

        def __hash__(self) -> int:
            return hash(cudnn.data_type.HALF)

    with pytest.raises(SpecError, match=r"is not a cudnn\.data_type"):
        data_type(FakeHalf(), "t")

"""The spec builder and its two wire forms (JSON, proto)."""

from __future__ import annotations

import json

import pytest

from plancache import GraphSpec, SpecError
from plancache.graphspec import spec_io
from plancache.graphspec.validation import normalize
from tests.support.specs import matmul_bias_relu_spec, matmul_spec


def test_builder_mirrors_frontend_and_returns_output_handles() -> None:
    g = GraphSpec(io_data_type="half")
    q = g.tensor([4, 16, 1024, 64], name="Q", uid=11)
    k = g.tensor([4, 16, 1024, 64], name="K", uid=12)
    v = g.tensor([4, 16, 1024, 64], name="V", uid=13)
    o, stats = g.sdpa(q, k, v, attn_scale=0.125, use_causal_mask=True)
    assert stats is None  # like the frontend: no Stats unless generate_stats
    assert o is not None
    o.set_output(True).set_uid(14)
    (node,) = g.nodes
    assert node.op == "sdpa"
    assert node.inputs == {"q": q, "k": k, "v": v}
    assert node.attributes == {"attn_scale": 0.125, "use_causal_mask": True}
    n = normalize(g)
    out = next(t for t in n.tensors if t.uid == 14)
    assert out.dim == (4, 16, 1024, 64) and out.stride == (1048576, 65536, 64, 1)


def test_generate_stats_adds_the_stats_output() -> None:
    g = GraphSpec(io_data_type="half")
    q, k, v = (g.tensor([2, 4, 128, 64], name=n) for n in "QKV")
    o, stats = g.sdpa(q, k, v, generate_stats=True)
    assert o is not None and stats is not None
    o.set_output(True)
    stats.set_output(True).set_data_type("float")
    n = normalize(g)
    stats_n = next(t for t in n.tensors if t.name == stats.name)
    assert stats_n.dim == (2, 4, 128, 1) and stats_n.data_type == "float"


def test_uids_assigned_deterministically_when_omitted() -> None:
    def build() -> GraphSpec:
        g = GraphSpec(io_data_type="half")
        a = g.tensor([2, 8, 8], name="A", uid=2)
        b = g.tensor([2, 8, 8], name="B")
        g.matmul(a, b).set_output(True)
        return g

    first, second = build(), build()
    first.assign_uids()
    assert [t.uid for t in first.tensors] == [2, 1, 3]
    assert first.spec_hash() == second.spec_hash()


def test_json_round_trip_keeps_the_hash() -> None:
    for spec in (matmul_spec(), matmul_bias_relu_spec()):
        text = spec.to_json()
        again = GraphSpec.from_json(text)
        assert again.spec_hash() == spec.spec_hash()
        assert json.loads(again.to_json()) == json.loads(text)


def test_proto_round_trip_keeps_the_hash() -> None:
    spec = matmul_bias_relu_spec()
    again = spec_io.from_proto(spec_io.to_proto(spec))
    assert again.spec_hash() == spec.spec_hash()
    assert [t.name for t in again.tensors] == [t.name for t in spec.tensors]


def test_pass_by_value_scalar_survives_both_forms() -> None:
    g = GraphSpec(io_data_type="half")
    x = g.tensor([64, 256, 1, 1], name="x")
    scale = g.tensor([1, 256, 1, 1], name="scale", data_type="float")
    bias = g.tensor([1, 256, 1, 1], name="bias", data_type="float")
    eps = g.scalar(1e-5, name="eps")
    y, _, _ = g.layernorm(x, scale, bias, eps, norm_forward_phase="INFERENCE")
    assert y is not None
    y.set_output(True)
    for again in (GraphSpec.from_json(g.to_json()), spec_io.from_proto(spec_io.to_proto(g))):
        (e,) = [t for t in again.tensors if t.name == "eps"]
        assert e.is_pass_by_value and e.scalar_value == 1e-5


class _FakeTorchTensor:
    def __init__(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: str, device: str) -> None:
        self.shape, self._stride, self.dtype, self.device = shape, stride, dtype, device

    def stride(self) -> tuple[int, ...]:
        return self._stride


def test_tensor_like_reads_dims_strides_dtype_and_host_scalars() -> None:
    g = GraphSpec()
    x = g.tensor_like(_FakeTorchTensor((8, 64, 56, 56), (200704, 1, 3584, 64), "torch.float16", "cuda:0"), name="x")
    assert x.dim == (8, 64, 56, 56) and x.stride == (200704, 1, 3584, 64) and x.data_type == "half"
    assert not x.is_pass_by_value
    eps = g.tensor_like(_FakeTorchTensor((1, 1, 1, 1), (1, 1, 1, 1), "torch.float32", "cpu"))
    assert eps.is_pass_by_value
    with pytest.raises(SpecError, match="unsupported torch dtype"):
        g.tensor_like(_FakeTorchTensor((1,), (1,), "torch.complex64", "cuda:0"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"tensors": [], "nodes": [], "colour": 1}', "unknown field\\(s\\) 'colour'"),
        ('{"tensors": [{"name": "A", "dim": [1]}], "nodes": []}', "tensor 0 \\(A\\): missing 'uid'"),
        ('{"tensors": [{"uid": 1, "dim": [1.5]}], "nodes": []}', "tensor 0 dim: expected an integer"),
        (
            '{"tensors": [{"uid": 1, "dim": [1], "data_type": "half"}, {"uid": 1, "dim": [1]}], "nodes": []}',
            "duplicate uid 1",
        ),
        ('{"tensors": [{"uid": 1, "dim": [1], "data_type": "float128"}], "nodes": []}', "unknown data type 'float128'"),
        (
            '{"tensors": [{"uid": 1, "dim": [2, 2]}], "nodes": [{"op": "relu", "inputs": {"input": 1}, "outputs": {"OUT_0": 9}}]}',
            "node 0 \\(relu\\) output 'OUT_0' refers to uid 9, which no tensor declares",
        ),
        ('{"tensors": [], "nodes": [{"op": "relu", "attributes": {"x": {"a": 1}}}]}', "a score modifier is"),
    ],
)
def test_json_errors_name_the_culprit(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        GraphSpec.from_json(text)

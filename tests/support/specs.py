"""Small specs for CPU tests."""

from __future__ import annotations

from plancache import GraphSpec


def matmul_spec(m: int = 256, n: int = 256, k: int = 512, batch: int = 8, name: str = "") -> GraphSpec:
    g = GraphSpec(io_data_type="half", name=name)
    a = g.tensor([batch, m, k], name="A", uid=1)
    b = g.tensor([batch, k, n], name="B", uid=2)
    g.matmul(a, b).set_output(True).set_uid(3).set_name("C")
    return g


def matmul_bias_relu_spec() -> GraphSpec:
    g = GraphSpec(io_data_type="bfloat16")
    a = g.tensor([1, 128, 256], name="A", uid=1)
    b = g.tensor([1, 256, 64], name="B", uid=2)
    bias = g.tensor([1, 1, 64], name="bias", uid=3)
    c = g.matmul(a, b)
    y = g.relu(g.bias(c, bias))
    y.set_output(True).set_uid(4).set_name("Y")
    return g

"""Graphs built with the cuDNN frontend's own API, as existing code builds
them, equal to examples/ graphs built with plancache's builder."""

from __future__ import annotations

from typing import Any


def matmul_bias_relu_bf16_pygraph(cudnn: Any, handle: Any = None) -> Any:
    """The frontend twin of examples/generate.py's matmul_bias_relu_bf16."""
    bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    g = cudnn.pygraph(
        io_data_type=bf16,
        intermediate_data_type=f32,
        compute_data_type=f32,
        **({"handle": handle} if handle is not None else {}),
    )
    a = g.tensor(name="A", dim=[1, 512, 1024], stride=[512 * 1024, 1024, 1], data_type=bf16).set_uid(1)
    b = g.tensor(name="B", dim=[1, 1024, 768], stride=[1024 * 768, 768, 1], data_type=bf16).set_uid(2)
    bias = g.tensor(name="bias", dim=[1, 1, 768], stride=[768, 768, 1], data_type=bf16).set_uid(3)
    g.relu(input=g.bias(input=g.matmul(A=a, B=b, compute_data_type=f32), bias=bias)).set_output(True).set_uid(4)
    return g

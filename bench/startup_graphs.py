"""The start-up benchmark's graphs: what one node needs before it serves.

A transformer layer at sequence 512 and 2048 in bf16 (hidden 1024, 16 heads
of 64, MLP 4096): QKV matmul, causal SDPA, output matmul+bias, MLP up
matmul+bias+gelu, MLP down matmul+bias; and three ResNet 3x3 conv+bias+relu
at batch 32, channels-last fp16. 13 graphs. Results' strides are left out:
they are the frontend's (plancache/graphspec/layouts.py).
"""

from __future__ import annotations

import math

from examples.generate import nhwc
from plancache import GraphSpec

HIDDEN, HEADS, HEAD_DIM, MLP = 1024, 16, 64, 4096


def _matmul(name: str, m: int, k: int, n: int, epilogue: str = "") -> GraphSpec:
    g = GraphSpec(name=name, io_data_type="bfloat16")
    a = g.tensor([1, m, k], name="A")
    w = g.tensor([1, k, n], name="W")
    c = g.matmul(a, w)
    if epilogue:
        c = g.bias(c, g.tensor([1, 1, n], name="bias"))
    if epilogue == "bias_gelu":
        c = g.gelu(c)
    c.set_output(True).set_name("C")
    return g


def _sdpa(name: str, seq: int) -> GraphSpec:
    g = GraphSpec(name=name, io_data_type="bfloat16")
    q, k, v = (g.tensor([1, HEADS, seq, HEAD_DIM], name=n) for n in ("q", "k", "v"))
    o, _ = g.sdpa(q, k, v, attn_scale=1 / math.sqrt(HEAD_DIM), use_causal_mask=True)
    assert o is not None
    o.set_output(True).set_name("o")
    return g


def _conv(name: str, channels: int, size: int) -> GraphSpec:
    g = GraphSpec(name=name, io_data_type="half")
    x = g.tensor([32, channels, size, size], nhwc(32, channels, size, size), name="x")
    w = g.tensor([channels, channels, 3, 3], nhwc(channels, channels, 3, 3), name="w")
    bias = g.tensor([1, channels, 1, 1], name="bias")
    g.relu(g.bias(g.conv_fprop(x, w, padding=[1, 1]), bias)).set_output(True).set_name("y")
    return g


def _layer(seq: int) -> list[GraphSpec]:
    return [
        _matmul(f"qkv_s{seq}", seq, HIDDEN, 3 * HIDDEN),
        _sdpa(f"attention_s{seq}", seq),
        _matmul(f"out_proj_s{seq}", seq, HIDDEN, HIDDEN, "bias"),
        _matmul(f"mlp_up_s{seq}", seq, HIDDEN, MLP, "bias_gelu"),
        _matmul(f"mlp_down_s{seq}", seq, MLP, HIDDEN, "bias"),
    ]


def startup_graphs() -> list[GraphSpec]:
    return [
        *_layer(512),
        *_layer(2048),
        _conv("conv3x3_64_56", 64, 56),
        _conv("conv3x3_128_28", 128, 28),
        _conv("conv3x3_256_14", 256, 14),
    ]


def write_blobs(path: str, blobs: list[bytes]) -> None:
    """Plan blobs in graph order, each after its length (8 bytes, little-endian)."""
    with open(path, "wb") as f:
        for blob in blobs:
            f.write(len(blob).to_bytes(8, "little") + blob)


def read_blobs(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    blobs, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 8], "little")
        blobs.append(data[at + 8 : at + 8 + size])
        at += 8 + size
    return blobs

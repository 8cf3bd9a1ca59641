"""Training steps of a small transformer block, written with plancache.functional.

    make run                                                    # a local server (another shell)
    python examples/train_transformer_block.py --server 127.0.0.1:50051

A pre-norm block: RMSNorm, the QKV projection (one linear), causal
attention over a BSHD view of it, the output projection and the residual;
RMSNorm, an MLP (linear with a fused GELU, then linear) and the residual.
A few AdamW steps regress the block's output onto a random target, once
with plancache.functional (every forward and backward a served cuDNN plan)
and once in torch eager from the same parameters (examples/training_check.py):
the losses, every gradient of the first step and the loss decreasing are
checked; exit 1 past the dtype's tolerance, or with --require-cudnn when a
call ran torch's own function.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client" / "src"))

from examples.training_check import main


@dataclass(frozen=True)
class Config:
    batch: int = 4
    seq: int = 256
    hidden: int = 512
    heads: int = 8
    mlp: int = 2048


CONFIG = Config()


def build(dtype: Any, device: Any, generator: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    import torch

    c = CONFIG

    def randn(*shape: int, scale: float) -> Any:
        return (torch.randn(*shape, device=device, generator=generator) * scale).to(dtype)

    params = {
        "norm1": 1 + randn(c.hidden, scale=0.1),
        "wqkv": randn(3 * c.hidden, c.hidden, scale=c.hidden**-0.5),
        "wo": randn(c.hidden, c.hidden, scale=c.hidden**-0.5),
        "norm2": 1 + randn(c.hidden, scale=0.1),
        "w1": randn(c.mlp, c.hidden, scale=c.hidden**-0.5),
        "b1": randn(c.mlp, scale=0.02),
        "w2": randn(c.hidden, c.mlp, scale=c.mlp**-0.5),
        "b2": randn(c.hidden, scale=0.02),
    }
    batch = (randn(c.batch, c.seq, c.hidden, scale=1.0), randn(c.batch, c.seq, c.hidden, scale=1.0))
    return params, {}, batch


def step(p: dict[str, Any], buffers: dict[str, Any], batch: Any, ops: Any) -> Any:
    c = CONFIG
    x, target = batch
    b, s, h = x.shape
    y = ops.rms_norm(x, (h,), p["norm1"])
    qkv = ops.linear(y, p["wqkv"])
    q, k, v = (
        qkv.view(b, s, 3, c.heads, h // c.heads).permute(2, 0, 3, 1, 4).unbind(0)
    )  # [b, heads, s, d] views (BSHD strides)
    attention = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + ops.linear(attention.transpose(1, 2).reshape(b, s, h), p["wo"])
    y = ops.rms_norm(x, (h,), p["norm2"])
    x = x + ops.linear(ops.linear(y, p["w1"], p["b1"], activation="gelu"), p["w2"], p["b2"])
    return (x.float() - target.float()).pow(2).mean()


def torch_ops() -> Any:
    import torch

    functional = torch.nn.functional

    def linear(x: Any, w: Any, bias: Any = None, *, activation: str | None = None) -> Any:
        y = functional.linear(x, w, bias)
        return y if activation is None else getattr(functional, activation)(y)

    return SimpleNamespace(
        rms_norm=functional.rms_norm,
        linear=linear,
        scaled_dot_product_attention=functional.scaled_dot_product_attention,
    )


if __name__ == "__main__":
    sys.exit(main(__doc__.split("\n\n")[0], build, step, torch_ops))

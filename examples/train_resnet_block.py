"""Training steps of a small ResNet block, written with plancache.functional.

    make run                                                    # a local server (another shell)
    python examples/train_resnet_block.py --server 127.0.0.1:50051

A basic block on a channels-last half-precision batch: 3x3 convolution,
batch norm (training: the batch's statistics, the running ones updated),
ReLU, 3x3 convolution, batch norm, the residual and ReLU; float32 batch
norm parameters and statistics (torch's own mixed precision for a half
model's BatchNorm2d). A few AdamW steps regress the block's output onto a
random target, once with plancache.functional (convolutions, their dgrad
and wgrad, batch norm forward and backward: served cuDNN plans) and once
in torch eager from the same parameters (examples/training_check.py): the
losses, every gradient of the first step, the running statistics after it
and the loss decreasing are checked.
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
    batch: int = 8
    channels: int = 64
    size: int = 32


CONFIG = Config()


def build(dtype: Any, device: Any, generator: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    import torch

    c = CONFIG
    last = torch.channels_last

    def randn(*shape: int, scale: float, kind: Any = None) -> Any:
        return (torch.randn(*shape, device=device, generator=generator) * scale).to(kind or dtype)

    fan_in = c.channels * 9
    params = {
        "w1": randn(c.channels, c.channels, 3, 3, scale=fan_in**-0.5).contiguous(memory_format=last),
        "g1": 1 + randn(c.channels, scale=0.1, kind=torch.float32),
        "b1": randn(c.channels, scale=0.1, kind=torch.float32),
        "w2": randn(c.channels, c.channels, 3, 3, scale=fan_in**-0.5).contiguous(memory_format=last),
        "g2": 1 + randn(c.channels, scale=0.1, kind=torch.float32),
        "b2": randn(c.channels, scale=0.1, kind=torch.float32),
    }
    buffers = {
        "mean1": torch.zeros(c.channels, device=device),
        "var1": torch.ones(c.channels, device=device),
        "mean2": torch.zeros(c.channels, device=device),
        "var2": torch.ones(c.channels, device=device),
    }
    x = randn(c.batch, c.channels, c.size, c.size, scale=1.0).contiguous(memory_format=last)
    target = randn(c.batch, c.channels, c.size, c.size, scale=1.0).contiguous(memory_format=last)
    return params, buffers, (x, target)


def step(p: dict[str, Any], buffers: dict[str, Any], batch: Any, ops: Any) -> Any:
    import torch

    x, target = batch
    y = ops.conv2d(x, p["w1"], None, 1, 1)
    y = torch.relu(
        ops.batch_norm(y, buffers["mean1"], buffers["var1"], p["g1"], p["b1"], training=True, momentum=0.1, eps=1e-5)
    )
    y = ops.conv2d(y, p["w2"], None, 1, 1)
    y = ops.batch_norm(y, buffers["mean2"], buffers["var2"], p["g2"], p["b2"], training=True, momentum=0.1, eps=1e-5)
    out = torch.relu(y + x)
    return (out.float() - target.float()).pow(2).mean()


def torch_ops() -> Any:
    import torch

    return SimpleNamespace(conv2d=torch.nn.functional.conv2d, batch_norm=torch.nn.functional.batch_norm)


if __name__ == "__main__":
    sys.exit(main(__doc__.split("\n\n")[0], build, step, torch_ops))

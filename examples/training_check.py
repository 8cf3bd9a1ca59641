"""What the training examples share: a few optimizer steps of one model run
twice from the same parameters, with plancache.functional and with torch
eager, and compared: the loss of every step, every parameter's gradient at
the first step (max |ours - torch| / max |torch|), the buffers the step
updates (batch norm's running statistics), and that the loss decreased.

The examples (train_transformer_block.py, train_resnet_block.py) give the
model: its parameters and buffers, and `step(params, buffers, batch, ops)`
returning the loss, where `ops` is either namespace of functions.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client" / "src"))

from examples.decoder_step import (
    default_trusted_keys,
    relative_error,
)  # the same comparison and key lookup as the decode example

# Relative error allowed against torch eager in the same dtype: cuDNN's and
# torch's kernels round differently (bfloat16 keeps 8 mantissa bits, float16 11).
TOLERANCE = {"bfloat16": 5e-2, "float16": 2e-2}


@dataclass
class Result:
    losses: list[float]
    grads: dict[str, Any]
    buffers: dict[str, Any]


def train(
    params: dict[str, Any],
    buffers: dict[str, Any],
    batch: Any,
    step: Callable[..., Any],
    ops: Any,
    steps: int,
    lr: float,
) -> Result:
    """`steps` AdamW steps from copies of `params` and `buffers`, with float32
    master weights (mixed precision as torch's AMP does it: the step runs on
    each parameter's own dtype, the optimizer on float32; float16 Adam alone
    overflows its epsilon)."""
    import torch

    masters = {name: p.detach().float().clone().requires_grad_(True) for name, p in params.items()}
    dtypes = {name: p.dtype for name, p in params.items()}
    buffers = copy.deepcopy(buffers)
    optimizer = torch.optim.AdamW(masters.values(), lr=lr)
    losses, grads, first_buffers = [], {}, {}
    for index in range(steps):
        optimizer.zero_grad(set_to_none=True)
        working = {name: m.detach().to(dtypes[name]).requires_grad_(True) for name, m in masters.items()}
        loss = step(working, buffers, batch, ops)
        loss.backward()
        for name, m in masters.items():
            m.grad = working[name].grad.float()
        if index == 0:
            grads = {name: p.grad.detach().clone() for name, p in working.items()}
            first_buffers = {name: b.detach().clone() for name, b in buffers.items()}
        optimizer.step()
        losses.append(float(loss.detach()))
    return Result(losses, grads, first_buffers)


def main(
    description: str,
    build: Callable[[Any, Any, Any], tuple[dict[str, Any], dict[str, Any], Any]],
    step: Callable[..., Any],
    torch_ops: Callable[[], Any],
    argv: list[str] | None = None,
) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--server",
        default=os.environ.get("PLANCACHE_SERVER", "127.0.0.1:50051"),
        help="host:port of plancache-server (env PLANCACHE_SERVER)",
    )
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="bfloat16")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--trusted-key", action="append", default=None, help="public key (PEM) plans must be signed with; repeatable"
    )
    parser.add_argument(
        "--require-cudnn",
        action="store_true",
        help="exit 1 when a call (forward or backward) ran torch's function instead of a plancache plan",
    )
    args = parser.parse_args(argv)

    import torch

    import plancache.functional as pf
    from plancache import Client

    if not torch.cuda.is_available():
        print(f"{description}: needs a CUDA GPU", file=sys.stderr)
        return 2
    pf.configure(Client(args.server, trusted_keys=args.trusted_key or default_trusted_keys()))
    dtype = getattr(torch, args.dtype)
    params, buffers, batch = build(dtype, torch.device("cuda"), torch.Generator(device="cuda").manual_seed(0))
    expected = train(params, buffers, batch, step, torch_ops(), args.steps, args.lr)
    got = train(params, buffers, batch, step, pf, args.steps, args.lr)
    tolerance = TOLERANCE[args.dtype]
    counts = pf.stats()
    print(description)
    for name, s in sorted(counts.items()):
        print(
            f"  {name:36s} cudnn calls {s.cudnn:4d}  torch calls {s.torch:3d}"
            + (f"  (torch: {'; '.join(s.reasons)})" if s.reasons else "")
        )
    print("  step  loss (functional)  loss (torch eager)")
    for index, (ours, theirs) in enumerate(zip(got.losses, expected.losses, strict=True)):
        print(f"  {index:4d}  {ours:17.6f}  {theirs:18.6f}")
    loss_error = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(got.losses, expected.losses, strict=True))
    grad_errors = {name: relative_error(got.grads[name], expected.grads[name]) for name in expected.grads}
    buffer_errors = {name: relative_error(got.buffers[name], expected.buffers[name]) for name in expected.buffers}
    worst = max(grad_errors, key=lambda name: grad_errors[name])
    print(
        f"max rel error vs torch eager: loss {loss_error:.2e}; gradients {grad_errors[worst]:.2e} ({worst}); "
        f"buffers {max(buffer_errors.values(), default=0.0):.2e} (tolerance {tolerance:g})"
    )
    for name, error in sorted(grad_errors.items()):
        print(f"  grad {name:12s} {error:.2e}")
    decreased = got.losses[-1] < got.losses[0] and expected.losses[-1] < expected.losses[0]
    print(f"loss decreased: {decreased} ({got.losses[0]:.5f} -> {got.losses[-1]:.5f})")
    failed = (
        loss_error > tolerance
        or grad_errors[worst] > tolerance
        or any(e > tolerance for e in buffer_errors.values())
        or not decreased
    )
    if args.require_cudnn and any(s.torch for s in counts.values()):
        print("some calls ran torch's own function (--require-cudnn)", file=sys.stderr)
        failed = True
    return 1 if failed else 0

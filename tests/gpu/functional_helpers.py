"""What the plancache.functional GPU tests share (test_gpu_functional.py,
test_gpu_training.py): torch imported when a test runs, random tensors of a
dtype, and the relative error both compare with. Their `pf` fixture is in
conftest.py."""

from __future__ import annotations

from typing import Any


def _t() -> Any:
    import torch

    return torch


def randn(*shape: int, dtype: str, scale: float = 1.0) -> Any:
    torch = _t()
    return (torch.randn(*shape, device="cuda") * scale).to(getattr(torch, dtype))


def rel_err(ours: Any, reference: Any) -> float:
    """max |ours - reference| / max |reference|."""
    return float(
        (ours.detach().float() - reference.detach().float()).abs().max()
        / reference.detach().float().abs().max().clamp_min(1e-30)
    )

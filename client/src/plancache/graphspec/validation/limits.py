"""What a spec may ask for (Limits), and the numbers JSON carries exactly."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from plancache.errors import SpecError
from plancache.graphspec.graph import Tensor
from plancache.graphspec.ops import Dims

# Exact in every JSON implementation (RFC 8785 hashes numbers as IEEE doubles).
MAX_UID = 2**53


@dataclass(frozen=True)
class Limits:
    """What a spec may ask for. The server's limits are configurable."""

    max_tensors: int = 1024
    max_nodes: int = 512
    max_rank: int = 8
    max_name_length: int = 256
    max_list_length: int = 16
    max_elements_per_tensor: int = 2**34
    # Autotuning allocates every non-virtual tensor on the GPU.
    max_total_bytes: int = 32 * 2**30


DEFAULT_LIMITS = Limits()


def storage_elements(dim: Dims, stride: Dims) -> int:
    """Elements a buffer must hold to back this (possibly strided) view."""
    return 1 + sum((d - 1) * s for d, s in zip(dim, stride, strict=True))


def is_exact_int(value: Any) -> bool:
    """An integer JSON carries exactly (the canonical form hashes numbers as IEEE doubles)."""
    return isinstance(value, int) and not isinstance(value, bool) and -MAX_UID <= value <= MAX_UID


def check_dims(t: Tensor, limits: Limits, where: str | None = None) -> None:
    if len(t.dim) > limits.max_rank:
        raise SpecError(f"{where or t.label()}: rank {len(t.dim)} over the limit of {limits.max_rank}")
    if min(t.dim, default=1) < 1:
        raise SpecError(f"{where or t.label()}: dims must be >= 1, got {list(t.dim)}")
    elements = math.prod(t.dim)
    if elements > limits.max_elements_per_tensor:
        raise SpecError(
            f"{where or t.label()}: {elements:,} elements, over the limit of {limits.max_elements_per_tensor:,}"
        )

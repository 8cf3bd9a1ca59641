"""Bucketing, as a policy: pad a varying dim up to the next of given sizes.

    pf.set_buckets([1, 2, 4, 8, 16, 32, 64, 128, 256])   # rows of linear / norms, causal SDPA's sequence
    ...
    pf.bucket_stats()   # calls padded, and the share of the work spent on padding

For what graph families do not cover (a range too wide to build every size
of), a few sizes cover all: a call whose size is not one of them runs at
the next one up, on zero-padded inputs, and returns the caller's part of the
result. Exact, for the functions where padding cannot reach the caller's
part: rows of `linear`, `rms_norm` and `layer_norm` (each row is computed
alone), and the sequence of a causal `scaled_dot_product_attention` without
a mask, lengths or dropout (a query never sees a later key, and the padding
is after every real one). Other calls are not padded. A size past the
largest bucket runs as it is. Padding is torch's (`F.pad`, differentiable),
so autograd flows through it.

The cost is counted: the padded elements against the caller's.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plancache.errors import InvalidRequest

FUNCTIONS = ("linear", "rms_norm", "layer_norm", "scaled_dot_product_attention")


@dataclass(frozen=True)
class BucketStats:
    """Since set_buckets(): calls seen, calls padded, and the elements of the
    padded dim the callers asked for against the ones computed."""

    calls: int = 0
    padded_calls: int = 0
    asked: int = 0  # sizes of the padded dim the callers passed, summed
    computed: int = 0  # sizes run, summed

    @property
    def waste(self) -> float:
        """The share of the computed size that is padding."""
        return 1.0 - self.asked / self.computed if self.computed else 0.0


class Buckets:
    def __init__(self) -> None:
        self.sizes: tuple[int, ...] = ()
        self.functions: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._calls = self._padded = self._asked = self._computed = 0

    def set(self, sizes: Sequence[int] | None, functions: Sequence[str] | None = None) -> None:
        chosen = tuple(functions) if functions is not None else FUNCTIONS
        unknown = set(chosen) - set(FUNCTIONS)
        if unknown:
            raise InvalidRequest(
                f"set_buckets: {', '.join(sorted(unknown))} cannot be padded (only {', '.join(FUNCTIONS)})"
            )
        if sizes is not None and (
            not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)
        ):
            raise InvalidRequest(f"set_buckets: sizes must be positive integers, got {list(sizes)[:16]}")
        with self._lock:
            self.sizes = tuple(sorted(set(sizes))) if sizes is not None else ()
            self.functions = frozenset(chosen) if sizes is not None else frozenset()
            self._calls = self._padded = self._asked = self._computed = 0

    def target(self, function: str, size: int) -> int | None:
        """The bucket `size` runs at, or None (not padded: no policy, a bucket's own size, past the largest)."""
        if function not in self.functions:
            return None
        index = bisect.bisect_left(self.sizes, size)
        padded = self.sizes[index] if index < len(self.sizes) else None
        with self._lock:
            self._calls += 1
            if padded is not None and padded != size:
                self._padded += 1
                self._asked += size
                self._computed += padded
            elif padded == size:
                self._asked += size
                self._computed += size
        return padded if padded is not None and padded != size else None

    def stats(self) -> BucketStats:
        with self._lock:
            return BucketStats(self._calls, self._padded, self._asked, self._computed)


BUCKETS = Buckets()


def pad_rows(function: str, x: Any) -> tuple[Any, int] | None:
    """`x` as [rows, last] zero-padded to the bucket of its rows, and its rows; None: not padded."""
    if not BUCKETS.functions or not hasattr(x, "shape") or len(x.shape) < 2:
        return None
    rows = 1
    for d in x.shape[:-1]:
        rows *= int(d)
    padded = BUCKETS.target(function, rows)
    if padded is None:
        return None
    import torch

    return torch.nn.functional.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, padded - rows)), rows


def pad_sequence(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any, int] | None:
    """q, k, v [b, h, s, d] of one length s, zero-padded along s to its bucket; None: not padded."""
    if "scaled_dot_product_attention" not in BUCKETS.functions or not all(
        len(getattr(t, "shape", ())) == 4 for t in (q, k, v)
    ):
        return None
    length = int(q.shape[2])
    if int(k.shape[2]) != length or int(v.shape[2]) != length:
        return None
    padded = BUCKETS.target("scaled_dot_product_attention", length)
    if padded is None:
        return None
    import torch

    pad = (0, 0, 0, padded - length)
    return torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad), torch.nn.functional.pad(v, pad), length

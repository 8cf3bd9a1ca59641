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

Without a policy, rows are bucketed once they vary (`AUTO`, on by default;
`pf.set_auto_buckets(False)` or PLANCACHE_AUTO_BUCKETS=0 turn it off): a
linear, rms_norm or layer_norm whose first calls met AUTO_AFTER distinct
row counts with everything else equal (the weight's shape, dtypes,
attributes: one layer at many batch sizes, never different layers) runs
each new row count at its auto bucket, the next multiple of 16 below 256,
of 32 below 512, of 64 below 1,024 and so on (from 128 rows on, at most
an eighth of the size is padding; below, at most 15 rows), and a graph family over the
buckets is what the service builds ahead. Per size, a sweep of random row
counts cannot be built ahead usefully (GPU run 36: 20 % hits after the
10th size, 84 % of the members built never fetched); at the buckets it was
90 % hits, 7.7 % never fetched (the same run, with set_buckets). The row
counts met before it kicks in keep their exact graphs; a fixed-shape
program never meets it. Only eager calls of plancache.functional (and
plancache.torch's eager route) are padded, on torch tensors; a call inside
torch.compile's operators runs its own shape.
"""

from __future__ import annotations

import bisect
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from plancache.env import env_bool
from plancache.errors import InvalidRequest

FUNCTIONS = ("linear", "rms_norm", "layer_norm", "scaled_dot_product_attention")
# Rows bucketed once they vary, without a policy (AUTO); causal attention's sequence is not among them (its
# cost grows with the square of the padded length).
AUTO_FUNCTIONS = ("linear", "rms_norm", "layer_norm")
AUTO_ENV = "PLANCACHE_AUTO_BUCKETS"
# Distinct row counts one layer (everything but its rows equal) meets before its new ones are padded.
AUTO_AFTER = 3
# Layers whose row counts are remembered (least recently met out first).
AUTO_LAYERS = 1024
# The largest auto bucket: past it a size runs as it is.
AUTO_LARGEST = 1 << 20
# Geometries (exact keys) whose padding is decided, kept for their next calls' fast path (all forgotten past it).
AUTO_DECIDED = 4096


@dataclass(frozen=True)
class BucketStats:
    """Since set_buckets(): calls seen, calls padded, and the elements of the
    padded dim the callers asked for against the ones computed."""

    calls: int = 0
    padded_calls: int = 0
    asked: int = 0  # sizes of the padded dim the callers passed, summed
    computed: int = 0  # sizes run, summed
    auto_layers: int = 0  # layers whose rows vary, padded to auto buckets (module doc; not reset by set_buckets)

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
        AUTO.forget_decided()  # a policy covers its functions from now on: no auto padding decided before runs

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

    def counted(self, size: int, padded: int) -> None:
        """A call the auto buckets padded from `size` to `padded`."""
        with self._lock:
            self._calls += 1
            self._padded += 1
            self._asked += size
            self._computed += padded

    def stats(self) -> BucketStats:
        with self._lock:
            return BucketStats(self._calls, self._padded, self._asked, self._computed, AUTO.layers())


BUCKETS = Buckets()


def auto_bucket(size: int) -> int:
    """The auto bucket of `size`: the next multiple of 16 below 256, of 32 below 512, of 64 below 1,024, ...
    (a step of an eighth of the size's power of two, 16 at least)."""
    step = max(16, 1 << max(0, size.bit_length() - 4))
    return -(-size // step) * step


def auto_buckets() -> tuple[int, ...]:
    """Every auto bucket up to AUTO_LARGEST, ascending."""
    out, size = [], 1
    while size <= AUTO_LARGEST:
        bucket = auto_bucket(size)
        out.append(bucket)
        size = bucket + 1
    return tuple(out)


class AutoBuckets:
    """Rows bucketed once they vary (module doc): per layer (a call's key without its rows), the row counts
    met, up to AUTO_AFTER."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: OrderedDict[Hashable, set[int] | None] = OrderedDict()  # None: torch runs the layer
        self._padding: set[str] = set()  # functions that padded a call (their families are the buckets)
        # A geometry's key -> the bucket its rows are padded to: its later calls skip the layer's bookkeeping.
        self._decided: dict[Hashable, int] = {}
        self._enabled: bool | None = None  # None: PLANCACHE_AUTO_BUCKETS, read at the first table miss
        self.sizes = auto_buckets()

    @property
    def enabled(self) -> bool:
        """On or off; PLANCACHE_AUTO_BUCKETS read when first asked (not at import: a word that is not a
        boolean fails the first call that would pad, naming the variable, not `import plancache.functional`)."""
        if self._enabled is None:
            self._enabled = env_bool(AUTO_ENV, True)
        return self._enabled

    def set(self, enabled: bool | None) -> None:
        """On or off (None: PLANCACHE_AUTO_BUCKETS, on by default); what was met is forgotten."""
        if enabled is not None and not isinstance(enabled, bool):
            raise InvalidRequest(f"set_auto_buckets: enabled must be True, False or None, got {enabled!r}"[:200])
        with self._lock:
            self._enabled = enabled
            self._rows.clear()
            self._padding.clear()
            self._decided.clear()

    def layers(self) -> int:
        with self._lock:
            return sum(1 for rows in self._rows.values() if rows is not None and len(rows) >= AUTO_AFTER)

    def bucketed(self, function: str) -> bool:
        """Whether `function`'s rows may be auto-bucketed (on, and no policy of set_buckets covers it)."""
        return self.enabled and function in AUTO_FUNCTIONS and function not in BUCKETS.functions

    def unserved(self, layer: Hashable) -> None:
        """`layer`'s geometry is torch's for good (float32, say): its rows are never padded."""
        with self._lock:
            self._rows[layer] = None
            self._rows.move_to_end(layer)
            while len(self._rows) > AUTO_LAYERS:
                self._rows.popitem(last=False)
            self._decided.clear()  # rare (a layer torch runs for good): its geometries' decisions go with the rest

    def pads(self, function: str) -> bool:
        """Whether `function`'s calls are being padded to auto buckets (a layer's rows varied): the graphs
        its family would build ahead are the buckets."""
        return function in self._padding and self.bucketed(function)

    def forget_decided(self) -> None:
        with self._lock:
            self._decided.clear()

    def pad_known(self, key: Hashable, x: Any) -> tuple[Any, int] | None:
        """pad_rows' answer for a geometry (`key`) it padded before, without its layer's bookkeeping (a call
        of a padded row count has no table entry of its own: every call of it comes here); None: not
        decided (pad_rows decides)."""
        padded = self._decided.get(key)
        if padded is None or not self.enabled:
            return None
        rows = _rows(x.shape)
        BUCKETS.counted(rows, padded)
        return _padded(x, rows, padded), rows

    def pad_rows(self, function: str, layer: Hashable, x: Any, key: Hashable = None) -> tuple[Any, int] | None:
        """At a call with no geometry yet: `x` as [rows, last] zero-padded to its rows' auto bucket, and its
        rows, once `layer` met AUTO_AFTER row counts; None: run as it is (too few met yet, a bucket's own
        size, past AUTO_LARGEST, not a torch tensor, off). A padded call's `key` (its geometry) is
        remembered for pad_known."""
        if not self.bucketed(function):
            return None
        torch = sys.modules.get("torch")
        shape: Any = getattr(x, "shape", ())
        if torch is None or not isinstance(x, torch.Tensor) or len(shape) < 2 or not on_gpu(x):
            return None
        rows = _rows(shape)
        with self._lock:
            if layer in self._rows:
                met = self._rows[layer]
                if met is None:  # its geometries are torch's: padding would only add work
                    return None
                self._rows.move_to_end(layer)
            else:
                met = self._rows[layer] = set()
                while len(self._rows) > AUTO_LAYERS:
                    self._rows.popitem(last=False)
            if len(met) < AUTO_AFTER:
                met.add(rows)
            if len(met) < AUTO_AFTER:
                return None
        padded = auto_bucket(rows)
        if padded == rows or rows > AUTO_LARGEST:
            return None
        BUCKETS.counted(rows, padded)
        with self._lock:
            self._padding.add(function)
            if key is not None:
                if len(self._decided) >= AUTO_DECIDED:
                    self._decided.clear()
                self._decided[key] = padded
        return _padded(x, rows, padded), rows


def on_gpu(x: Any) -> bool:
    """Whether `x` is where plans run (a CUDA tensor): a CPU call runs torch's function at its own size."""
    return bool(x.is_cuda)


AUTO = AutoBuckets()


def pad_rows(function: str, x: Any) -> tuple[Any, int] | None:
    """`x` as [rows, last] zero-padded to the bucket of its rows, and its rows; None: not padded."""
    if not BUCKETS.functions or not hasattr(x, "shape") or len(x.shape) < 2:
        return None
    rows = _rows(x.shape)
    padded = BUCKETS.target(function, rows)
    return None if padded is None else (_padded(x, rows, padded), rows)


def _rows(shape: Sequence[int]) -> int:
    """The rows of a [..., last] shape: the product of every dim but the last."""
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    return rows


def _padded(x: Any, rows: int, padded: int) -> Any:
    """`x` as [rows, last], zero rows appended up to `padded` (torch's constant pad, what F.pad runs without its
    Python wrapper: autograd flows through it; a 2-D `x` not reshaped: a padded call's few microseconds)."""
    import torch

    flat = x if len(x.shape) == 2 else x.reshape(rows, x.shape[-1])
    return torch.constant_pad_nd(flat, (0, 0, 0, padded - rows))


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

"""Torch-style functions whose plans come from plancache: no spec to write.

    import plancache.functional as pf
    pf.configure("plancache.internal:50051")      # or PLANCACHE_SERVER=host:port
    y = pf.linear(x, w, b, activation="gelu")     # torch.nn.functional.linear + GELU, one cuDNN plan
    o = pf.scaled_dot_product_attention(q, k, v, is_causal=True)

The first call of a geometry (shapes, strides, dtypes, device, options)
builds the GraphSpec with plancache's builder and gets its plan from the
client (disk cache, then server): the autotuned plan of that GPU kind, or
cuDNN's heuristic one while it is tuned. Later calls are a dict lookup on a
tuple of the tensors' geometry and the plan's execute on the current torch
stream. With autograd (an input that requires grad) a geometry runs its
training forward and its backward graphs, served too, through a
torch.autograd.Function (linear, conv2d, layer_norm, rms_norm,
scaled_dot_product_attention, batch_norm). Whatever cuDNN is not asked for
or cannot build (float32, a boolean mask, a layout it needs a copy for, no
server) runs torch's own function: counted (`stats()`) and logged once per geometry; a
mistake in the arguments raises torch's own error for it (or InvalidRequest
naming the argument, for the options torch lacks and for CPU tensors).

Each operator family is one module, whole: its signature (the tensors a
call binds, by name: _signature), its call, its specs (forward and
backward), its backward rule and torch's function (_linear: linear and
matmul; _convolution, _norms, _batch_norm, _attention, _paged_decode). What
they share is small: a geometry's first call (_first_call), the table
(_table), autograd's Function (_autograd), the graph pieces several specs
use (_requests), the tensors a served call makes (_tensor_ops). A new
operator is a module of its own and its import here.

Owns: the functions, the geometry table (an LRU of `set_max_geometries()`
entries), the graph families of shapes that vary (`families()`: asked
for once a function met 3 graphs of one family), bucketing (`set_buckets()`:
padding a varying size to the next of a few, the waste counted), its
manifest and prefetch (`manifest()`, `prefetch()`: a start-up that loads an
earlier run's plans before the first step) and the service setting both
front doors share (`configure`, the same function as
`plancache.cudnn.configure`). Imports torch only when a call needs it
(plancache stays importable with grpcio and protobuf).
May import: plancache.errors, plancache.env, plancache.dtypes, plancache.graphspec, plancache.keys, plancache.run,
plancache.transport, plancache.wire, plancache.gpu, plancache.frontdoors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from plancache.errors import InvalidRequest
from plancache.frontdoors.buckets import AUTO, BUCKETS, BucketStats
from plancache.frontdoors.families import WATCH, FamilyAsk
from plancache.frontdoors.service import SERVICE, configure
from plancache.functional._attention import scaled_dot_product_attention
from plancache.functional._autograd import Differentiable
from plancache.functional._batch_norm import batch_norm
from plancache.functional._convolution import conv2d
from plancache.functional._linear import linear, matmul
from plancache.functional._manifest import manifest, prefetch
from plancache.functional._norms import layer_norm, rms_norm
from plancache.functional._paged_decode import paged_decode_attention
from plancache.functional._race import KEPT, RACE
from plancache.functional._table import COUNTS, TABLE, Fallback, Racing, Served, TorchFaster, drain_native
from plancache.run.plan import Plan

__all__ = [
    "BucketStats",
    "FamilyAsk",
    "FunctionStats",
    "Geometry",
    "batch_norm",
    "bucket_stats",
    "clear",
    "configure",
    "conv2d",
    "families",
    "geometries",
    "layer_norm",
    "linear",
    "manifest",
    "matmul",
    "paged_decode_attention",
    "prefetch",
    "rms_norm",
    "scaled_dot_product_attention",
    "set_auto_buckets",
    "set_buckets",
    "set_family_threshold",
    "set_max_geometries",
    "set_race_torch",
    "stats",
]


@dataclass(frozen=True)
class FunctionStats:
    """One function's calls since the process started (or `clear()`)."""

    cudnn: int = 0  # calls a plancache plan ran
    torch: int = 0  # calls torch's own function ran (fallbacks)
    geometries: int = 0  # first calls
    torch_geometries: int = 0  # first calls left to torch
    reasons: dict[str, int] = field(default_factory=dict)  # why, geometries per reason
    raced: int = 0  # served geometries raced against torch's function at their first call (set_race_torch)


@dataclass(frozen=True)
class Geometry:
    """One entry of the table: the function, its geometry key, and the plan
    that serves it (with its source: hit, compiled, provisional, cache) or
    why torch runs it; `race`: both times of its race against torch's
    function, whichever won (None: not raced, or its race still to come)."""

    function: str
    key: tuple[object, ...]
    plan: Plan | None
    reason: str | None
    race: str | None = None


def stats() -> dict[str, FunctionStats]:
    """Counters by function name ("linear", "scaled_dot_product_attention", ...)."""
    drain_native()
    return {
        name: FunctionStats(c.cudnn, c.torch, c.geometries, c.torch_geometries, dict(c.reasons), c.raced)
        for name, c in COUNTS.items()
    }


def geometries() -> list[Geometry]:
    """The table's entries, least recently used first."""
    out = []
    for key, table_entry in TABLE.entries():
        parts = key if isinstance(key, tuple) else (key,)
        entry = table_entry.inner if isinstance(table_entry, Racing) else table_entry  # its race still to run
        if isinstance(entry, (Served, Differentiable)):
            won = KEPT.get(key)
            out.append(Geometry(entry.request.function, parts, entry.plan, None, won.describe() if won else None))
        elif isinstance(entry, TorchFaster):
            described = entry.verdict.describe()
            out.append(Geometry(entry.function, parts, None, f"{entry.reason}: {described}", described))
        elif isinstance(entry, Fallback):
            out.append(Geometry(entry.function, parts, None, entry.reason))
    return out


def set_buckets(sizes: Sequence[int] | None, *, functions: Sequence[str] | None = None) -> None:
    """Pad a varying size up to the next of `sizes` (None: stop padding):
    the rows of linear, rms_norm and layer_norm, and the sequence of a causal
    scaled_dot_product_attention without a mask, lengths or dropout (exact:
    padding cannot reach the caller's part). `functions`: a subset of those.
    Sizes past the largest run as they are. Counters start again."""
    BUCKETS.set(sizes, functions)


def set_auto_buckets(enabled: bool | None = True) -> None:
    """Rows bucketed once they vary (on by default; None: as PLANCACHE_AUTO_BUCKETS says): a linear,
    rms_norm or layer_norm layer that met 3 distinct row counts runs each new one padded to its auto bucket
    (the next multiple of 16 below 256, of 32 below 512, ...: plancache.frontdoors.buckets), and the graphs
    built ahead for it are those buckets. A set_buckets policy covers its functions instead. What was met is
    forgotten."""
    AUTO.set(enabled)


def set_race_torch(enabled: bool | None = True) -> None:
    """Race each served geometry's plan against torch's own function, once, at its first call a second or more
    after its first (plancache.functional._race), torch's keeping the geometry where it is faster (on by default;
    None: as PLANCACHE_RACE_TORCH says). Eager calls whose function
    neither writes its arguments nor draws random numbers (not batch_norm, not attention with dropout); the
    verdict holds for the geometry's life in the table. `stats()`: `raced`, and the geometries torch took under
    the reason "torch's function is faster here ..."; `geometries()`: both times."""
    RACE.set(enabled)


def bucket_stats() -> BucketStats:
    """Calls seen and padded since set_buckets() (a policy's, and the auto buckets' padded calls), the share
    of work spent on padding (`waste`), and the layers whose rows are auto-bucketed (`auto_layers`)."""
    return BUCKETS.stats()


def families() -> list[FamilyAsk]:
    """The graph families the functions asked the service to build (shapes
    that vary: plancache.frontdoors.families), or why one was not asked."""
    return list(WATCH.asks)


def set_family_threshold(graphs: int) -> None:
    """Ask for a family once this many graphs of it were met (default 3; 0: never)."""
    if graphs < 0:
        raise InvalidRequest(f"set_family_threshold: graphs must be >= 0, got {graphs}")
    WATCH.threshold = graphs


def set_max_geometries(count: int) -> None:
    """Bound the table (default 512 geometries); the least recently used go first."""
    if count < 1:
        raise InvalidRequest(f"set_max_geometries: count must be >= 1, got {count}")
    TABLE.resize(count)


def clear() -> None:
    """Forget every geometry and counter, and the service setting (tests, a
    new deployment): the next call of each geometry asks again."""
    TABLE.clear()
    drain_native()
    COUNTS.clear()
    WATCH.clear()
    BUCKETS.set(None)
    AUTO.set(None)
    RACE.set(None)
    KEPT.clear()
    SERVICE.reset()

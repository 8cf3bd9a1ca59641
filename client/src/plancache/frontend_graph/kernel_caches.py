"""Norm graphs built with one kernel cache for all their sizes.

Every cuDNN engine for a layer or RMS norm on sm_90 compiles its kernel when
the plan is built (NVRTC: the RUNTIME_COMPILATION behavior note on all ten
entries of their plan lists): 0.28-0.59 s a size, where a linear builds in
milliseconds (scripts/build_time_probe.py, GPU run 32). A family of norm
sizes, a sweep of new row counts, a node's own build of a hedged miss: each
pays it again. Built with dynamic shapes and a kernel cache that earlier
sizes of the same graph filled, a later size reuses their kernel: 34-49 ms
against 340 ms (scripts/dynamic_shapes_probe.py, run 32), computing the same
output as the size's static plan at every size tried (relative error 0.0),
as fast on the GPU, and the plan so built loads and runs in a process that
has no cache.

What is cached: a graph whose every node is a forward layer or RMS norm
(the ops in CACHED_OPS), that the program did not itself build with dynamic
shapes or a kernel cache. A kernel cache gave wrong results for SDPA on
cuDNN 9.19 (run 23), so an op joins CACHED_OPS only once a GPU run has
checked it. One cache per device and layout signature (the graph without
its dims: ops, attributes, dtypes, and each tensor's stride order), at most
MAX_CACHES of them, least recently used out; a cache is used by one build
at a time (`Prepared.lock`).

A cache serves at most BUILDS_PER_CACHE builds, then its layout starts a
fresh one: cuDNN's build from a cache gets slower with every size built
from it (scripts/kernel_cache_growth_probe.py, GPU run 33: rms_norm
[N,1024], 120 sizes through one cache, the plan build 94 ms a size in the
first quarter and 363 ms in the last, slower than without a cache; a
worker's family members showed it, 0.08 s rising to 0.38 s). Renewed every
16 builds: median 48 ms, mean 97 ms over the 120 (one cache: 209 and 245;
no cache: 274), the fresh cache's first build paying the compile again.

The plan is stored and fetched under its graph's own key: each size is
still its own graph with its own plan; only how its kernel was compiled
differs.

Where: a node's own builds (a hedged miss: a provisional plan the
service's tuned one replaces) by default, `PLANCACHE_NORM_KERNEL_CACHE=0`
turns it off: run 32's sweep of new sizes took a median 150 ms a size with
it against 419 ms without. A worker's builds only with
`PLANCACHE_WORKER_NORM_KERNEL_CACHE=1` (its build processes inherit it):
there the plan list a dynamic-shape graph offers is also what plancache.cudnn
answers a program's plan-list queries from, and its autotuned plans are the
ones served for good; neither has been compared on a GPU with the static
graph's (run 32 compared heuristic plans: the same output, GPU time within
noise but one size at 1.8x).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from typing import Any

from plancache.env import env_bool
from plancache.graphspec.family import without_sizes
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.jcs import canonicalize

NORM_KERNEL_CACHE_ENV = "PLANCACHE_NORM_KERNEL_CACHE"
WORKER_NORM_KERNEL_CACHE_ENV = "PLANCACHE_WORKER_NORM_KERNEL_CACHE"
CACHED_OPS = frozenset({"rmsnorm", "layernorm"})
MAX_CACHES = 64
# Builds one cache serves before its layout starts a fresh one (module doc; run 33: 8 gave a mean of 136 ms).
BUILDS_PER_CACHE = 16


def enabled(worker: bool = False) -> bool:
    if worker:
        return env_bool(WORKER_NORM_KERNEL_CACHE_ENV, False)
    return env_bool(NORM_KERNEL_CACHE_ENV, True)


def eligible(spec: GraphSpec, worker: bool = False) -> bool:
    """Whether `spec` is built with a shared kernel cache (the setting on, a forward norm graph of the program's
    own static form); `worker`: a worker's build rather than a node's own."""
    return (
        bool(spec.nodes)
        and all(node.op in CACHED_OPS for node in spec.nodes)
        and not spec.is_dynamic_shape_enabled
        and not spec.is_override_shape_enabled
        and not spec.kernel_cache
        and enabled(worker)
    )


def layout_signature(spec: GraphSpec) -> str:
    """The graph without its sizes (its layout kept): what the sizes sharing one kernel cache have in common."""
    graph, _ = without_sizes(spec)
    return hashlib.sha256(canonicalize(graph)).hexdigest()


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What to build instead: `spec` with dynamic shapes and a kernel cache, the cache, its lock (hold it
    across the build: the graph made, its plans listed and built)."""

    spec: GraphSpec
    cache: Any
    lock: threading.Lock


@dataclasses.dataclass
class _Cache:
    """One layout's cache on one device, its lock, and how many builds it served (BUILDS_PER_CACHE)."""

    cache: Any
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    builds: int = 0


class KernelCaches:
    def __init__(self, max_caches: int = MAX_CACHES, builds_per_cache: int = BUILDS_PER_CACHE) -> None:
        self.max_caches = max_caches
        self.builds_per_cache = builds_per_cache
        self._caches: OrderedDict[tuple[int, str], _Cache] = OrderedDict()  # by (device, layout)
        self._lock = threading.Lock()
        self.builds = self.caches_made = 0

    def prepare(self, spec: GraphSpec, cudnn: Any, device: int, *, worker: bool = False) -> Prepared | None:
        """How to build `spec` with its layout's kernel cache on `device`, or None (build it as it is)."""
        if not eligible(spec, worker):
            return None
        signature = layout_signature(spec)
        key = (device, signature)
        with self._lock:
            found = self._caches.get(key)
            if found is None or found.builds >= self.builds_per_cache:
                # A build still using a renewed cache keeps it (and its lock) until it ends.
                found = self._caches[key] = _Cache(cudnn.create_kernel_cache())
                self.caches_made += 1
                while len(self._caches) > self.max_caches:
                    self._caches.popitem(last=False)
            self._caches.move_to_end(key)
            found.builds += 1
            self.builds += 1
            cache, lock = found.cache, found.lock
        dynamic = dataclasses.replace(spec, is_dynamic_shape_enabled=True, kernel_cache=True)
        return Prepared(dynamic, cache, lock)

    def __len__(self) -> int:
        return len(self._caches)


KERNEL_CACHES = KernelCaches()
"""This process's caches (a node's own builds; in a worker, its build process's)."""

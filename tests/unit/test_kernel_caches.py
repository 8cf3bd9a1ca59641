"""plancache.frontend_graph.kernel_caches: which graphs are built with a
kernel cache shared by their sizes, and which cache. The frontend side (a
later size's build reusing the kernel, its output the static plan's) is GPU
run 32's (scripts/dynamic_shapes_probe.py); here, with a stand-in frontend
module: the decisions and the wiring into a node's own build."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from plancache.frontend_graph import kernel_caches
from plancache.frontend_graph.build import _graph_arguments
from plancache.frontend_graph.kernel_caches import (
    NORM_KERNEL_CACHE_ENV,
    WORKER_NORM_KERNEL_CACHE_ENV,
    KernelCaches,
    eligible,
    layout_signature,
)
from plancache.functional._geometry import Geo
from plancache.functional._linear import linear_request
from plancache.functional._norms import layer_norm_request, rms_norm_request
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.layouts import row_major


def geo(name: str, shape: tuple[int, ...], dtype: str = "bfloat16") -> Geo:
    return Geo(name, shape, row_major(shape), dtype, f"torch.{dtype}", "cuda")


def rms(rows: int, dtype: str = "bfloat16", training: bool = False) -> GraphSpec:
    return rms_norm_request(
        geo("input", (rows, 1024), dtype), (1024,), geo("weight", (1024,), dtype), 1e-5, training=training
    ).spec


class StandInFrontend:
    """STAND-IN for the cudnn module: kernel caches are plain objects, counted."""

    def __init__(self) -> None:
        self.made: list[object] = []
        self.data_type = SimpleNamespace(BFLOAT16="bf16", HALF="fp16", FLOAT="fp32")

    def create_kernel_cache(self) -> object:
        cache = object()
        self.made.append(cache)
        return cache


def test_sizes_of_one_norm_share_a_cache_and_other_layouts_do_not() -> None:
    caches, frontend = KernelCaches(), StandInFrontend()
    first, later = caches.prepare(rms(8), frontend, 0), caches.prepare(rms(100), frontend, 0)
    assert first is not None and later is not None
    assert first.cache is later.cache and first.lock is later.lock and len(frontend.made) == 1
    others = [
        caches.prepare(rms(8, "half"), frontend, 0),  # another dtype
        caches.prepare(rms(8, training=True), frontend, 0),  # the training form: more outputs
        caches.prepare(layer_norm_request(geo("input", (8, 1024)), (1024,), None, None, 1e-5).spec, frontend, 0),
        caches.prepare(rms(8), frontend, 1),  # another GPU
    ]
    assert all(p is not None for p in others)
    assert len({id(p.cache) for p in others if p is not None} | {id(first.cache)}) == 5


def test_the_graph_built_is_the_same_graph_with_dynamic_shapes_and_the_cache() -> None:
    caches, frontend = KernelCaches(), StandInFrontend()
    spec = rms(33)
    prepared = caches.prepare(spec, frontend, 0)
    assert prepared is not None
    assert not spec.is_dynamic_shape_enabled and not spec.kernel_cache  # the program's graph, and its key, untouched
    assert prepared.spec.is_dynamic_shape_enabled and prepared.spec.kernel_cache
    assert prepared.spec.tensors is spec.tensors and prepared.spec.nodes is spec.nodes
    arguments = _graph_arguments(prepared.spec, frontend, None, prepared.cache)
    assert arguments["is_dynamic_shape_enabled"] is True and arguments["kernel_cache"] is prepared.cache


def test_only_the_program_static_forward_norms_are_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    assert eligible(rms(8)) and eligible(rms(8, training=True))
    matmul = linear_request(geo("input", (8, 64)), geo("weight", (32, 64)), None, None).spec
    assert not eligible(matmul)  # builds in milliseconds; and a kernel cache is checked op by op
    own = rms(8)
    own.is_dynamic_shape_enabled = True
    assert not eligible(own)  # the program's own dynamic graph is built as it asked
    assert not eligible(rms(8), worker=True)  # a worker's builds: only when asked for
    monkeypatch.setenv(WORKER_NORM_KERNEL_CACHE_ENV, "1")
    assert eligible(rms(8), worker=True)
    monkeypatch.setenv(NORM_KERNEL_CACHE_ENV, "0")
    assert not eligible(rms(8))
    assert KernelCaches().prepare(rms(8), StandInFrontend(), 0) is None


def test_the_signature_ignores_sizes_only() -> None:
    assert layout_signature(rms(1)) == layout_signature(rms(199))
    assert layout_signature(rms(1)) != layout_signature(rms(1, "half"))
    wide = rms_norm_request(geo("input", (4, 2048)), (2048,), geo("weight", (2048,)), 1e-5).spec
    assert layout_signature(wide) == layout_signature(rms(4))  # the hidden size is a size too: cuDNN decides


def test_the_caches_are_bounded_least_recently_used_out() -> None:
    caches, frontend = KernelCaches(max_caches=2), StandInFrontend()
    a = caches.prepare(rms(8), frontend, 0)
    caches.prepare(rms(8, "half"), frontend, 0)
    assert caches.prepare(rms(9), frontend, 0).cache is a.cache  # type: ignore[union-attr]  # used: now the newest
    caches.prepare(rms(8, training=True), frontend, 0)  # the half one goes
    assert len(caches) == 2 and len(frontend.made) == 3
    assert caches.prepare(rms(10), frontend, 0).cache is a.cache  # type: ignore[union-attr]


def test_a_cache_serves_a_bounded_number_of_builds_then_its_layout_starts_a_fresh_one() -> None:
    """Run 33: cuDNN's build from a kernel cache slows with every size built from it (94 ms a size rising to
    363 ms over 120 sizes); a fresh cache every BUILDS_PER_CACHE builds keeps the median at 48 ms."""
    caches, frontend = KernelCaches(builds_per_cache=3), StandInFrontend()
    used = [caches.prepare(rms(rows), frontend, 0) for rows in range(1, 8)]
    assert all(p is not None for p in used)
    ids = [frontend.made.index(p.cache) for p in used if p is not None]
    assert ids == [0, 0, 0, 1, 1, 1, 2]
    assert caches.caches_made == 3 and len(caches) == 1 and caches.builds == 7
    other = caches.prepare(rms(8, "half"), frontend, 0)  # another layout counts its own builds
    assert other is not None and other.cache is frontend.made[3]


def test_a_nodes_own_build_of_a_norm_uses_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from plancache.keys.options import CompileOptions
    from plancache.keys.query import PlanQuery
    from plancache.run import local
    from plancache.run.execution import use_runtime
    from tests.support.fake_gpu import FakeRuntime
    from tests.support.frontdoor_standins import TARGET

    built: list[tuple[GraphSpec, Any]] = []
    monkeypatch.setattr(
        local,
        "build_pygraph",
        lambda spec, frontend, handle=None, kernel_cache=None: built.append((spec, kernel_cache)) or "graph",
    )
    monkeypatch.setattr(local, "_build_local", lambda query, frontend, g, started: g)
    monkeypatch.setattr(kernel_caches, "KERNEL_CACHES", KernelCaches())
    monkeypatch.setattr(local, "KERNEL_CACHES", kernel_caches.KERNEL_CACHES)
    use_runtime(FakeRuntime())
    try:
        frontend = StandInFrontend()
        for spec in (rms(8), rms(64), linear_request(geo("input", (8, 64)), geo("weight", (32, 64)), None, None).spec):
            local.build_local(PlanQuery.of(spec, TARGET, CompileOptions()), frontend)
    finally:
        use_runtime(None)
    (s8, c8), (s64, c64), (mm, cmm) = built
    assert s8.is_dynamic_shape_enabled and s64.is_dynamic_shape_enabled and c8 is c64 is frontend.made[0]
    assert not mm.is_dynamic_shape_enabled and cmm is None

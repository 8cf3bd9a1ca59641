"""Where a hedged miss's time goes, in a node process of bench/startup_node.py
(PLANCACHE_BENCH_PHASES=1): each step of plancache's miss path is wrapped
once (the wrapping is this benchmark's, never the product's) and every call's
wall time is kept per step, so a miss's fixed cost over the node's own build
is split into its pieces (issue 41):

  compile        Client.compile, the whole call (plancache's front door)
  query          Client._query: the spec checked, normalized and keyed
  disk_cache     PlanIntake.cached: the disk cache asked
  can_build      FrontendBuilder.can_build: whether this node may build
  first_ask      the first Compile (answer_miss_at_once): its round trip, to "building" or a hit
  race_start     Race.__init__: the follow-up Compile's thread started
  local_build    FrontendBuilder.build / the drop-in's own build: the node's build itself
  settle         run_race minus the local build: who won, counted, reported
  hedged         HedgedCalls.compile, the whole hedged part
  verify         PlanIntake.remember: a service answer's signature and question checked (any thread)
  dropin_race    Client.race (plancache.cudnn's build step asks through it)
  dropin_build   plancache.cudnn's whole build step (Serving._build): capture, race, settle, load; less its
                 race_build, what plancache.cudnn's build step adds to the program's own build (issue 41 item 1),
                 measured inside one process, so a host whose CPU speed changes between runs does not blur it
  dropin_capture the program's graph read and normalized (plancache.cudnn._capture.read)
  dropin_prove   the read proven to be the program's graph (plancache.cudnn._capture.prove): inside the build step
                 for a hit or a service plan first, at the take-over for a race the node's build won
  touch          Service.touch: the program's first use (its client made, its workload's stream started)

With PLANCACHE_BENCH_PROFILE=FILE the clocked part also runs under
cProfile, its 40 costliest functions (cumulative) written to FILE.
"""

from __future__ import annotations

import cProfile
import functools
import io
import os
import pstats
import threading
import time
from collections.abc import Callable
from typing import Any

_TIMES: dict[str, list[float]] = {}
_lock = threading.Lock()
_local = threading.local()


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - started
            with _lock:
                _TIMES.setdefault(name, []).append(elapsed)

    return wrapper


def _timed_outermost(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """_timed, counting only the outermost call of a thread (a build step that calls the build step again, e.g.
    build_plans then build, is one graph's)."""
    timed = _timed(name, fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, name, False):
            return fn(*args, **kwargs)
        setattr(_local, name, True)
        try:
            return timed(*args, **kwargs)
        finally:
            setattr(_local, name, False)

    return wrapper


def install(*, dropin: bool = False) -> bool:
    """Wrap plancache's miss path (PLANCACHE_BENCH_PHASES=1); whether it did. `dropin`: plancache.cudnn's build
    step too (imported here: a node of another path does not import it)."""
    if os.environ.get("PLANCACHE_BENCH_PHASES") != "1":
        return False
    from plancache.frontdoors import service
    from plancache.transport import client as client_module
    from plancache.transport import hedge, hedged_calls, intake

    client_cls = client_module.Client
    client_cls.compile = _timed("compile", client_cls.compile)  # type: ignore[method-assign]
    client_cls._query = _timed("query", client_cls._query)  # type: ignore[method-assign]
    client_cls.race = _timed("dropin_race", client_cls.race)  # type: ignore[method-assign]
    intake.PlanIntake.cached = _timed("disk_cache", intake.PlanIntake.cached)  # type: ignore[method-assign]
    intake.PlanIntake.remember = _timed("verify", intake.PlanIntake.remember)  # type: ignore[method-assign]
    hedge.FrontendBuilder.can_build = _timed("can_build", hedge.FrontendBuilder.can_build)  # type: ignore[method-assign]
    hedge.FrontendBuilder.build = _timed("local_build", hedge.FrontendBuilder.build)  # type: ignore[method-assign]
    hedged_calls.HedgedCalls.compile = _timed("hedged", hedged_calls.HedgedCalls.compile)  # type: ignore[method-assign]
    hedge.Race.__init__ = _timed("race_start", hedge.Race.__init__)  # type: ignore[method-assign]
    service_cls = service.Service
    service_cls.touch = _timed("touch", service_cls.touch)  # type: ignore[method-assign]
    if dropin:
        from plancache.cudnn import _serving

        _serving.Serving._build = _timed_outermost("dropin_build", _serving.Serving._build)  # type: ignore[method-assign]
        if hasattr(_serving, "read"):
            _serving.read = _timed("dropin_capture", _serving.read)  # type: ignore[attr-defined]
            _serving.prove = _timed("dropin_prove", _serving.prove)  # type: ignore[attr-defined]
        else:  # a client before the proof was deferred (bench/dropin_own.py's arms): read and proof in one
            _serving.capture = _timed("dropin_capture", _serving.capture)  # type: ignore[attr-defined]

    original_run_race = hedge.run_race

    def run_race(race: Any, build: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
        spent: list[float] = []

        def timed_build() -> Any:
            started = time.perf_counter()
            try:
                return build()
            finally:
                spent.append(time.perf_counter() - started)

        started = time.perf_counter()
        try:
            return original_run_race(race, timed_build, *args, **kwargs)
        finally:
            total = time.perf_counter() - started
            with _lock:
                _TIMES.setdefault("race_build", []).append(sum(spent))
                _TIMES.setdefault("settle", []).append(total - sum(spent))

    hedged_calls.run_race = run_race  # type: ignore[assignment]

    connection_cls = hedged_calls.Connection
    original_call = connection_cls.call

    def call(self: Any, method: Any, request: Any, timeout: float | None) -> Any:
        started = time.perf_counter()
        try:
            return original_call(self, method, request, timeout)
        finally:
            if getattr(request, "answer_miss_at_once", False):
                with _lock:
                    _TIMES.setdefault("first_ask", []).append(time.perf_counter() - started)

    connection_cls.call = call  # type: ignore[method-assign]
    return True


class Profile:
    """cProfile over the clocked part when PLANCACHE_BENCH_PROFILE names a file."""

    def __init__(self) -> None:
        self.path = os.environ.get("PLANCACHE_BENCH_PROFILE", "")
        self._profile = cProfile.Profile() if self.path else None

    def __enter__(self) -> Profile:
        if self._profile is not None:
            self._profile.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._profile is None:
            return
        self._profile.disable()
        text = io.StringIO()
        stats = pstats.Stats(self._profile, stream=text)
        stats.sort_stats("cumulative").print_stats(60)
        stats.sort_stats("tottime").print_stats(30)
        stats.dump_stats(f"{self.path}.{os.getpid()}.prof")  # the whole profile, for pstats or snakeviz later
        with open(self.path, "a") as out:
            out.write(f"==== pid {os.getpid()}\n{text.getvalue()}\n")


def phases() -> dict[str, dict[str, float]]:
    """Per step: calls, total and median milliseconds."""
    with _lock:
        found = {name: list(values) for name, values in _TIMES.items()}
    return {
        name: {
            "calls": len(values),
            "total_ms": round(sum(values) * 1e3, 3),
            "median_ms": round(sorted(values)[len(values) // 2] * 1e3, 3),
            "each_ms": [round(v * 1e3, 3) for v in values][:40],  # in call order
        }
        for name, values in found.items()
        if values
    }


def take() -> dict[str, list[float]]:
    """Every step's clocked seconds so far, the clocks then emptied (a benchmark's modes, one after the other)."""
    with _lock:
        found = {name: list(values) for name, values in _TIMES.items()}
        _TIMES.clear()
    return found

"""STAND-IN COMPILER for tests and CPU benchmarks: no GPU, no cuDNN.

It fabricates a deterministic blob (~75 KB, the size of a real SDPA plan)
from the spec's canonical hash, after an optional sleep that plays the
build: PLANCACHE_STANDIN_BUILD_SECONDS for the heuristic plan and, with
PLANCACHE_STANDIN_TUNE_SECONDS, that long again for the other candidates
together (PLANCACHE_STANDIN_CANDIDATES of them, 10 by default), each built
apart as a worker's build pool builds them. The product never uses it; GPU claims are proven by tests/gpu on a
real GPU. Plug it into a worker with `--compiler tests.support.standin:factory`.
With PLANCACHE_STANDIN_BUILD_LOG=<path> set, every build appends one JSON line
{"spec_hash", "started", "ended"} (wall clock) to that file: benchmarks count
builds per key from it (bench/herd.py). With PLANCACHE_STANDIN_STARTED_DIR=<dir>
set, a heuristic build creates <dir>/<spec hash> as it starts: a test can wait
until a build is under way in a worker process, not only taken.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence

from plancache.errors import CompileFailed
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache_server.worker.compiler.base import BuiltPlan, CandidateResult, CompiledPlan, Heuristic, compile_inline

STANDIN_TARGET = Target("sm_90", 91900, "1.32.0", "StandIn GPU", 132)
# The target of `make demo`'s stand-in (examples/try_without_gpu.py, demo_factory). Its plans must be usable
# on no GPU: a worker also serves its target's generic form (no device name), so the device name alone is
# not enough. No GPU has compute capability sm_00, and no frontend is version 0.0.0-cpu-standin, so no
# real node's target, generic or not, ever names these plans.
CPU_DEMO_TARGET = Target("sm_00", 91900, "0.0.0-cpu-standin", "CPU stand-in, not a GPU")
# Graphs with this name are "rejected by cuDNN", to exercise failure paths.
REJECTED_NAME = "standin-reject"
# Graphs with this name fail while autotuning (after their provisional plan).
TUNE_FAILS_NAME = "standin-tune-fails"
# GPU faults, played in a build process with the words CUDA and torch use
# (plancache_server.worker.compiler.faults reads them): the device out of
# memory; the context lost (an Xid), after which the GPU is gone for every
# process until PLANCACHE_STANDIN_GPU_GONE (a file the build creates) is
# removed; and the kernel's OOM killer (SIGKILL) ending the build process.
GPU_OOM_NAME = "standin-gpu-oom"
GPU_LOST_NAME = "standin-gpu-lost"
OOM_KILLED_NAME = "standin-oom-killed"
GPU_GONE_ENV = "PLANCACHE_STANDIN_GPU_GONE"
# Candidates of an autotuned build, unless PLANCACHE_STANDIN_CANDIDATES says otherwise.
DEFAULT_CANDIDATES = 10


class StandInCompiler:
    # Its builds only sleep: a worker may run them on threads (ThreadBuildPool).
    thread_safe = True

    def __init__(
        self,
        target: Target = STANDIN_TARGET,
        build_seconds: float = 0.0,
        blob_size: int = 75_000,
        build_log: str | None = None,
        tune_seconds: float | None = None,
        candidates: int = DEFAULT_CANDIDATES,
        started_dir: str | None = None,
    ) -> None:
        """`tune_seconds`: None builds one plan (after `build_seconds`); a
        number plays the heuristic-first path: a provisional plan after
        `build_seconds`, then `candidates` - 1 more candidates whose builds
        take `tune_seconds` together (one process building them one by one
        would take that long), the fastest of them candidate 7 (or the last)."""
        self._target = target
        self.build_seconds = build_seconds
        self.tune_seconds = tune_seconds
        self.candidates = candidates if tune_seconds is not None else 1
        self.blob_size = blob_size
        self.build_log = build_log
        self.started_dir = started_dir
        self._lock = threading.Lock()
        self.builds: list[str] = []  # spec hashes, one per heuristic build, in order
        self.intervals: list[tuple[str, float, float]] = []  # (spec hash, start, end) of each heuristic build
        self.candidate_builds: list[tuple[str, int]] = []  # (spec hash, index)

    @property
    def target(self) -> Target:
        return self._target

    @property
    def fastest(self) -> int:
        return min(7, self.candidates - 1)

    def compile(self, query: PlanQuery) -> CompiledPlan:
        *_, final = compile_inline(self, query)
        return final

    def compile_phases(self, query: PlanQuery) -> Iterator[CompiledPlan]:
        return compile_inline(self, query)

    def heuristic(self, query: PlanQuery) -> Heuristic:
        spec, options, digest = query.spec, query.options, query.spec_hash
        with self._lock:
            self.builds.append(digest)
        if self.started_dir:
            open(os.path.join(self.started_dir, digest), "w").close()
        started, began = time.time(), time.monotonic()
        try:
            time.sleep(self.build_seconds)
        finally:
            self._log_build(digest, started, time.time())
            with self._lock:
                self.intervals.append((digest, began, time.monotonic()))
        if spec.name == REJECTED_NAME:
            raise CompileFailed("stand-in: cuDNN_STATUS_NOT_SUPPORTED (graphs named standin-reject are refused)")
        _play_gpu_fault(spec.name)
        if self.tune_seconds is None or not options.autotune:
            # One plan, final at once; it reports two timings as an untuned build of the real compiler would not.
            plan = self._plan(digest, options, 7, "standin_eng7_k3", {"TILE_SIZE": 3})
            timings = [CandidateResult(0, "standin_eng0", 0, 0.020), CandidateResult(1, "standin_eng7_k3", 7, 0.015)]
            return Heuristic(plan, 1, self.build_seconds, timings)
        return Heuristic(self._plan(digest, options, 0, "standin_eng0", {}), self.candidates, self.build_seconds)

    def candidate(self, query: PlanQuery, index: int) -> BuiltPlan:
        digest = query.spec_hash
        seconds = (self.tune_seconds or 0.0) / max(1, self.candidates - 1)
        with self._lock:
            self.candidate_builds.append((digest, index))
        time.sleep(seconds)
        plan = self._plan(
            digest,
            query.options,
            index,
            f"standin_eng{index}" if index != self.fastest else "standin_eng7_k3",
            {"TILE_SIZE": 3},
        )
        return dataclasses.replace(plan, seconds=seconds)

    def time_plans(self, query: PlanQuery, plans: Sequence[BuiltPlan]) -> list[CandidateResult]:
        if query.spec.name == TUNE_FAILS_NAME:
            raise RuntimeError("stand-in: the GPU fell off the bus while autotuning")
        return [
            CandidateResult(
                p.index, p.plan_name, p.engine_id, 0.015 if p.index == self.fastest else 0.020, timing="cuda-graph"
            )
            for p in plans
        ]

    def _plan(self, digest: str, options: CompileOptions, index: int, name: str, knobs: dict[str, int]) -> BuiltPlan:
        """A deterministic blob per (spec, target, options, candidate)."""
        label = "/provisional" if index == 0 else f"/candidate-{index}"
        seed = hashlib.sha256(f"{digest}/{self._target.id}/{options.id}{label}".encode()).digest()
        blob = (seed * (self.blob_size // len(seed) + 1))[: self.blob_size]
        return BuiltPlan(
            index, blob, name, 7 if name == "standin_eng7_k3" else index, knobs, 1024, False, self.build_seconds
        )

    def _log_build(self, digest: str, started: float, ended: float) -> None:
        """One line per build, written whole in one O_APPEND write under the lock
        (so workers of several processes can share the file)."""
        if not self.build_log:
            return
        line = json.dumps({"spec_hash": digest, "started": started, "ended": ended}) + "\n"
        with self._lock:
            fd = os.open(self.build_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)


def _play_gpu_fault(name: str) -> None:
    if name == GPU_OOM_NAME:
        raise RuntimeError(
            "CUDA out of memory. Tried to allocate 160.00 GiB (GPU 0; 139.81 GiB total capacity) [stand-in]"
        )
    if name == GPU_LOST_NAME:
        gone = os.environ.get(GPU_GONE_ENV)
        if gone:
            open(gone, "w").close()
        raise RuntimeError("CUDA error: unspecified launch failure (Xid 79: GPU has fallen off the bus) [stand-in]")
    if name == OOM_KILLED_NAME:
        os.kill(os.getpid(), signal.SIGKILL)


def demo_factory(device: int) -> StandInCompiler:
    """Entry point for `make demo` (`--compiler tests.support.standin:demo_factory`): builds of
    PLANCACHE_STANDIN_BUILD_SECONDS (default 1 s, so a hit is seen to be faster) for CPU_DEMO_TARGET.
    The worker says in its log that it builds with a stand-in (plancache_server.worker_main)."""
    return StandInCompiler(
        target=CPU_DEMO_TARGET, build_seconds=float(os.environ.get("PLANCACHE_STANDIN_BUILD_SECONDS") or "1.0")
    )


def factory(device: int) -> StandInCompiler:
    """Entry point for `plancache-worker --compiler tests.support.standin:factory`."""
    gone = os.environ.get(GPU_GONE_ENV)
    if gone and os.path.exists(gone):
        raise RuntimeError("CUDA error: no CUDA-capable device is detected [stand-in: the GPU is gone]")
    tune = os.environ.get("PLANCACHE_STANDIN_TUNE_SECONDS")
    return StandInCompiler(
        build_seconds=float(os.environ.get("PLANCACHE_STANDIN_BUILD_SECONDS", "0")),
        build_log=os.environ.get("PLANCACHE_STANDIN_BUILD_LOG") or None,
        tune_seconds=float(tune) if tune else None,
        candidates=int(os.environ.get("PLANCACHE_STANDIN_CANDIDATES") or DEFAULT_CANDIDATES),
        started_dir=os.environ.get("PLANCACHE_STANDIN_STARTED_DIR") or None,
    )

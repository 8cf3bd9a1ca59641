"""STAND-IN COMPILER for tests and CPU benchmarks: no GPU, no cuDNN.

It fabricates a deterministic blob (~75 KB, the size of a real SDPA plan)
from the spec's canonical hash, after an optional sleep that plays the
build. The product never uses it; GPU claims are proven by tests/gpu on a
real GPU. Plug it into a worker with `--compiler tests.support.standin:factory`.
With PLANCACHE_STANDIN_BUILD_LOG=<path> set, every build appends one JSON line
{"spec_hash", "started", "ended"} (wall clock) to that file: benchmarks count
builds per key from it (bench/herd.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator

from plancache.canonical import hash_normalized
from plancache.errors import CompileFailed
from plancache.options import CompileOptions
from plancache.spec import GraphSpec
from plancache.target import Target
from plancache_server.compiler import CandidateResult, CompiledPlan

STANDIN_TARGET = Target("sm_90", 91900, "1.32.0", "StandIn GPU", 132)
# Graphs with this name are "rejected by cuDNN", to exercise failure paths.
REJECTED_NAME = "standin-reject"
# Graphs with this name fail while autotuning (after their provisional plan).
TUNE_FAILS_NAME = "standin-tune-fails"


class StandInCompiler:
    def __init__(
        self, target: Target = STANDIN_TARGET, build_seconds: float = 0.0, blob_size: int = 75_000, build_log: str | None = None,
        tune_seconds: float | None = None,
    ) -> None:
        """`tune_seconds`: None builds one plan (after `build_seconds`); a
        number plays the heuristic-first path: a provisional plan after
        `build_seconds`, the tuned one `tune_seconds` later."""
        self._target = target
        self.build_seconds = build_seconds
        self.tune_seconds = tune_seconds
        self.blob_size = blob_size
        self.build_log = build_log
        self._lock = threading.Lock()
        self.builds: list[str] = []  # spec hashes, in build order

    @property
    def target(self) -> Target:
        return self._target

    def compile(self, spec: GraphSpec, options: CompileOptions) -> CompiledPlan:
        *_, final = self.compile_phases(spec, options)
        return final

    def compile_phases(self, spec: GraphSpec, options: CompileOptions) -> Iterator[CompiledPlan]:
        digest = hash_normalized(spec)
        with self._lock:
            self.builds.append(digest)
        started = time.time()
        try:
            time.sleep(self.build_seconds)
        finally:
            self._log_build(digest, started, time.time())
        if spec.name == REJECTED_NAME:
            raise CompileFailed("stand-in: cuDNN_STATUS_NOT_SUPPORTED (graphs named standin-reject are refused)")
        if self.tune_seconds is None or not options.autotune:
            yield self._plan(digest, options, provisional=False)
            return
        yield self._plan(digest, options, provisional=True)
        time.sleep(self.tune_seconds)
        if spec.name == TUNE_FAILS_NAME:
            raise RuntimeError("stand-in: the GPU fell off the bus while autotuning")
        yield self._plan(digest, options, provisional=False)

    def _plan(self, digest: str, options: CompileOptions, provisional: bool) -> CompiledPlan:
        """A deterministic blob per (spec, target, options), another one for the provisional plan."""
        seed = hashlib.sha256(f"{digest}/{self._target.id}/{options.id}{'/provisional' if provisional else ''}".encode()).digest()
        blob = (seed * (self.blob_size // len(seed) + 1))[: self.blob_size]
        return CompiledPlan(
            blob=blob,
            workspace_size=1024,
            engine_id=0 if provisional else 7,
            knobs={} if provisional else {"TILE_SIZE": 3},
            plan_name="standin_eng0" if provisional else "standin_eng7_k3",
            is_python_engine=False,
            candidates=[CandidateResult(index=0, plan_name="standin_eng0", engine_id=0, median_ms=None)]
            if provisional
            else [
                CandidateResult(index=0, plan_name="standin_eng0", engine_id=0, median_ms=0.020),
                CandidateResult(index=1, plan_name="standin_eng7_k3", engine_id=7, median_ms=0.015),
            ],
            build_seconds=self.build_seconds,
            autotune_seconds=0.0 if provisional else self.tune_seconds or 0.0,
            provisional=provisional,
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


def factory(device: int) -> StandInCompiler:
    """Entry point for `plancache-worker --compiler tests.support.standin:factory`."""
    tune = os.environ.get("PLANCACHE_STANDIN_TUNE_SECONDS")
    return StandInCompiler(
        build_seconds=float(os.environ.get("PLANCACHE_STANDIN_BUILD_SECONDS", "0")),
        build_log=os.environ.get("PLANCACHE_STANDIN_BUILD_LOG") or None,
        tune_seconds=float(tune) if tune else None,
    )

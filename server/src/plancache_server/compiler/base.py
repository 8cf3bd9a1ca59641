"""What a compiler returns, and the protocol every compiler implements."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from plancache.options import CompileOptions
from plancache.spec import GraphSpec
from plancache.target import Target

# How a worker times candidate plans (compiler/timing.py says how each works).
AUTOTUNE_STRATEGIES = ("screened", "exhaustive")


@dataclass(frozen=True)
class CandidateResult:
    index: int
    plan_name: str
    engine_id: int
    median_ms: float | None  # None: did not build or run
    error: str = ""
    timing: str = ""


@dataclass(frozen=True)
class CompiledPlan:
    blob: bytes
    workspace_size: int
    engine_id: int
    knobs: dict[str, int]
    plan_name: str
    is_python_engine: bool
    candidates: list[CandidateResult] = field(default_factory=list)
    build_seconds: float = 0.0
    autotune_seconds: float = 0.0
    # A heuristic plan stored at once while the autotuned one is built.
    provisional: bool = False


class Compiler(Protocol):
    """Builds plans for one GPU. Raises CompileFailed when cuDNN rejects a graph."""

    @property
    def target(self) -> Target: ...

    def compile_phases(self, spec: GraphSpec, options: CompileOptions) -> Iterator[CompiledPlan]:
        """The plan as it gets better: with autotuning (and more than one
        candidate), first cuDNN's heuristic choice, untimed and `provisional`,
        then the autotuned plan; otherwise the one plan. An error raised
        after the provisional plan is the autotuning's."""
        ...

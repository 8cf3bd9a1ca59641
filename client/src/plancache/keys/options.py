"""Compile options: the part of a plan key that is neither spec nor target."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from plancache.errors import InvalidRequest
from plancache.spec.jcs import canonicalize
from plancache.v1 import plancache_pb2 as pb

HEURISTIC_MODES = ("A", "B", "FALLBACK")
BEHAVIOR_NOTES = (
    "RUNTIME_COMPILATION",
    "REQUIRES_FILTER_INT8x32_REORDER",
    "REQUIRES_BIAS_INT8x32_REORDER",
    "SUPPORTS_CUDA_GRAPH_NATIVE_API",
    "CUBLASLT_DEPENDENCY",
)


@dataclass(frozen=True)
class CompileOptions:
    """How to build: autotune or take the heuristics' first plan, which
    heuristic modes rank the candidates, and which plans to exclude."""

    autotune: bool = True
    heuristic_modes: tuple[str, ...] = ("A", "FALLBACK")
    workspace_limit: int = 0
    excluded_behavior_notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        modes = tuple(dict.fromkeys(m.upper() for m in self.heuristic_modes)) or ("A", "FALLBACK")
        for mode in modes:
            if mode not in HEURISTIC_MODES:
                raise InvalidRequest(f"options: unknown heuristic mode {mode!r} (one of {', '.join(HEURISTIC_MODES)})")
        notes = tuple(sorted({n.upper().replace("INT8X32", "INT8x32") for n in self.excluded_behavior_notes}))
        for note in notes:
            if note not in BEHAVIOR_NOTES:
                raise InvalidRequest(f"options: unknown behavior note {note!r} (one of {', '.join(BEHAVIOR_NOTES)})")
        if self.workspace_limit < 0:
            raise InvalidRequest("options: workspace_limit must be >= 0 (0 means no limit)")
        object.__setattr__(self, "heuristic_modes", modes)
        object.__setattr__(self, "excluded_behavior_notes", notes)

    @property
    def id(self) -> str:
        canonical = canonicalize(
            {
                "autotune": self.autotune,
                "heuristic_modes": list(self.heuristic_modes),
                "workspace_limit": self.workspace_limit,
                "excluded_behavior_notes": list(self.excluded_behavior_notes),
            }
        )
        return "opt-" + hashlib.sha256(canonical).hexdigest()[:16]

    def to_proto(self) -> pb.CompileOptions:
        return pb.CompileOptions(
            autotune=self.autotune,
            heuristic_modes=self.heuristic_modes,
            workspace_limit=self.workspace_limit,
            excluded_behavior_notes=self.excluded_behavior_notes,
        )

    @classmethod
    def from_proto(cls, msg: pb.CompileOptions) -> CompileOptions:
        return cls(
            autotune=msg.autotune if msg.HasField("autotune") else True,
            heuristic_modes=tuple(msg.heuristic_modes),
            workspace_limit=msg.workspace_limit,
            excluded_behavior_notes=tuple(msg.excluded_behavior_notes),
        )

"""Compile options: the part of a plan key that is neither spec nor target."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any

from plancache.errors import InvalidRequest
from plancache.graphspec.jcs import canonicalize
from plancache.v1 import plancache_pb2 as pb

HEURISTIC_MODES = ("A", "B", "FALLBACK")
NUMERICAL_NOTES = (
    "TENSOR_CORE",
    "DOWN_CONVERT_INPUTS",
    "REDUCED_PRECISION_REDUCTION",
    "FFT",
    "NONDETERMINISTIC",
    "WINOGRAD",
    "WINOGRAD_TILE_4x4",
    "WINOGRAD_TILE_6x6",
    "WINOGRAD_TILE_13x13",
    "STRICT_NAN_PROP",
)
# A program's own plan list: bounds on what options may carry of it.
MAX_PINNED_PLANS = 4096
MAX_KNOBS = 64
MAX_ENGINE_NAMES = 64
BEHAVIOR_NOTES = (
    "RUNTIME_COMPILATION",
    "REQUIRES_FILTER_INT8x32_REORDER",
    "REQUIRES_BIAS_INT8x32_REORDER",
    "SUPPORTS_CUDA_GRAPH_NATIVE_API",
    "CUBLASLT_DEPENDENCY",
)


Knobs = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class PinnedPlan:
    """A program's create_execution_plan(engine_id, knobs): knobs by cudnn.knob_type name."""

    engine_id: int
    knobs: Knobs = ()


@dataclass(frozen=True)
class NoteFilter:
    """select_/deselect_behavior_notes or select_/deselect_numeric_notes."""

    kind: str  # "behavior" or "numeric"
    keep: bool  # select (keep only plans with these notes), or deselect
    notes: tuple[str, ...]


@dataclass(frozen=True)
class CompileOptions:
    """How to build: autotune or take the heuristics' first plan, which
    heuristic modes rank the candidates, and which plans to exclude; and the
    plan-list calls a program made (plancache.cudnn records them): plans it
    pinned by engine and knobs, engines it deselected, note filters, the plan
    it selected. The worker replays those before it builds, in that order."""

    autotune: bool = True
    heuristic_modes: tuple[str, ...] = ("A", "FALLBACK")
    workspace_limit: int = 0
    excluded_behavior_notes: tuple[str, ...] = field(default=())
    pinned_plans: tuple[PinnedPlan, ...] = ()
    pinned_only: bool = False  # the plan list is the pinned plans alone (no heuristics asked)
    deselected_engines: tuple[str, ...] = ()
    note_filters: tuple[NoteFilter, ...] = ()
    selected_plan: int | None = None

    def __post_init__(self) -> None:
        self._check_plan_list()
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

    def _check_plan_list(self) -> None:
        if len(self.pinned_plans) > MAX_PINNED_PLANS:
            raise InvalidRequest(
                f"options: {len(self.pinned_plans)} pinned plans, over the limit of {MAX_PINNED_PLANS}"
            )
        for plan in self.pinned_plans:
            if len(plan.knobs) > MAX_KNOBS or any(not isinstance(v, int) or isinstance(v, bool) for _, v in plan.knobs):
                raise InvalidRequest(
                    f"options: pinned plan of engine {plan.engine_id}: at most {MAX_KNOBS} knobs, each an integer"
                )
            object.__setattr__(plan, "knobs", tuple(sorted(plan.knobs)))
        if self.pinned_only and not self.pinned_plans:
            raise InvalidRequest("options: pinned_only needs pinned plans")
        if len(self.deselected_engines) > MAX_ENGINE_NAMES or any(
            not name or len(name) > 256 for name in self.deselected_engines
        ):
            raise InvalidRequest(
                f"options: at most {MAX_ENGINE_NAMES} deselected engine names, each 1 to 256 characters"
            )
        object.__setattr__(self, "deselected_engines", tuple(sorted(set(self.deselected_engines))))
        for f in self.note_filters:
            known = BEHAVIOR_NOTES if f.kind == "behavior" else NUMERICAL_NOTES if f.kind == "numeric" else None
            if known is None or not f.notes or any(n not in known for n in f.notes):
                raise InvalidRequest(
                    f"options: a note filter needs kind behavior or numeric and notes among its cudnn names, got {f}"
                )
        if self.selected_plan is not None and (self.selected_plan < 0 or self.autotune):
            raise InvalidRequest("options: selected_plan is an index >= 0 and fixes the plan (autotune must be false)")

    @property
    def drives_plan_list(self) -> bool:
        """Whether the program made plan-list calls beyond heuristic modes and exclusions."""
        return bool(self.pinned_plans or self.deselected_engines or self.note_filters or self.selected_plan is not None)

    def canonical(self) -> dict[str, Any]:
        """The options as the id hashes them; the plan-list members only when
        set, so options without them keep the ids they always had."""
        found: dict[str, Any] = {
            "autotune": self.autotune,
            "heuristic_modes": list(self.heuristic_modes),
            "workspace_limit": self.workspace_limit,
            "excluded_behavior_notes": list(self.excluded_behavior_notes),
        }
        if self.pinned_plans:
            found["pinned_plans"] = [
                {"engine_id": p.engine_id, "knobs": [[k, v] for k, v in p.knobs]} for p in self.pinned_plans
            ]
        if self.pinned_only:
            found["pinned_only"] = True
        if self.deselected_engines:
            found["deselected_engines"] = list(self.deselected_engines)
        if self.note_filters:
            found["note_filters"] = [
                {"kind": f.kind, "keep": f.keep, "notes": list(f.notes)} for f in self.note_filters
            ]
        if self.selected_plan is not None:
            found["selected_plan"] = self.selected_plan
        return found

    @functools.cached_property
    def id(self) -> str:
        """`opt-` and the canonical form's hash, made once per instance (a query's key and the check of the plan
        that answers it each read it: a canonical form and a hash apiece, on every graph's miss path)."""
        return "opt-" + hashlib.sha256(canonicalize(self.canonical())).hexdigest()[:16]

    def to_proto(self) -> pb.CompileOptions:
        return pb.CompileOptions(
            autotune=self.autotune,
            heuristic_modes=self.heuristic_modes,
            workspace_limit=self.workspace_limit,
            excluded_behavior_notes=self.excluded_behavior_notes,
            pinned_plans=[
                pb.PinnedPlan(engine_id=p.engine_id, knobs=[pb.Knob(name=k, value=v) for k, v in p.knobs])
                for p in self.pinned_plans
            ],
            pinned_only=self.pinned_only,
            deselected_engines=self.deselected_engines,
            note_filters=[pb.NoteFilter(kind=f.kind, keep=f.keep, notes=f.notes) for f in self.note_filters],
            selected_plan=self.selected_plan,
        )

    @classmethod
    def from_proto(cls, msg: pb.CompileOptions) -> CompileOptions:
        return cls(
            autotune=msg.autotune if msg.HasField("autotune") else True,
            heuristic_modes=tuple(msg.heuristic_modes),
            workspace_limit=msg.workspace_limit,
            excluded_behavior_notes=tuple(msg.excluded_behavior_notes),
            pinned_plans=tuple(
                PinnedPlan(p.engine_id, tuple((k.name, k.value) for k in p.knobs)) for p in msg.pinned_plans
            ),
            pinned_only=msg.pinned_only,
            deselected_engines=tuple(msg.deselected_engines),
            note_filters=tuple(NoteFilter(f.kind, f.keep, tuple(f.notes)) for f in msg.note_filters),
            selected_plan=msg.selected_plan if msg.HasField("selected_plan") else None,
        )

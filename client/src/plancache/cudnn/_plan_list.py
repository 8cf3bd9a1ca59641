"""A program's plan-list calls on its graph, and the answers plancache gives.

Calls that shape the plan a program's build would run are recorded while
plancache may serve the graph and sent as the plan's options (the worker
replays them, plancache_server.worker.compiler.plan_list):
`create_execution_plan(engine_id, knobs)`, `select_plan(index)`,
`deselect_engines(names)` and the four note filters. A program that pins,
selects or inspects its plan list gets the plan its own build would run
(the options ask for no autotuning); one that only filters gets the fastest
plan among those it allows.

Queries about the list (`get_execution_plan_count`, and per index the plan's
name, engine and knobs, workspace and behavior notes) are answered from what
the worker recorded of every candidate when it built the graph (the served
plan's metadata), without building anything here. A query the records
cannot answer (an old server; the workspace of a candidate nobody built)
sends the graph to a local build, which answers as the frontend would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from plancache.keys.options import CompileOptions, NoteFilter, PinnedPlan
from plancache.v1 import plancache_pb2 as pb

# The frontend's calls that address the ranked plan list by index.
QUERIES = (
    "get_execution_plan_count",
    "get_plan_name_at_index",
    "get_engine_and_knobs_at_index",
    "get_workspace_size_plan_at_index",
    "get_behavior_notes_for_plan_at_index",
)
# Calls by which a program builds or runs candidates itself (an autotuner of its own): those build locally.
DRIVES = ("build_plan_at_index", "execute_plan_at_index")


def _name(value: Any) -> str:
    name = getattr(value, "name", None)
    if not isinstance(name, str):
        raise ValueError(f"{value!r} is not a cudnn enum member")
    return name


@dataclass
class PlanList:
    """What a program asked of its graph's plan list, in order."""

    pinned: list[PinnedPlan] = field(default_factory=list)
    deselected: list[str] = field(default_factory=list)
    note_filters: list[NoteFilter] = field(default_factory=list)
    selected: int | None = None
    inspected: bool = False  # a query about the list: the program cares which plan runs

    @property
    def untouched(self) -> bool:
        """No plan-list call was made: the options are the plan calls' alone."""
        return not (self.pinned or self.deselected or self.note_filters or self.inspected) and self.selected is None

    def pin(self, engine_id: Any, knobs: Any) -> None:
        self.pinned.append(PinnedPlan(int(engine_id), tuple((_name(k), int(v)) for k, v in dict(knobs or {}).items())))

    def filter_notes(self, kind: str, keep: bool, notes: Sequence[Any]) -> None:
        self.note_filters.append(NoteFilter(kind, keep, tuple(_name(n) for n in notes)))

    def options(self, base: CompileOptions, planned: bool) -> CompileOptions:
        """`base` with this list's calls; `planned`: the program asked for the heuristics' plans too."""
        fixes_plan = bool(self.pinned) or self.selected is not None or self.inspected
        return replace(
            base,
            autotune=base.autotune and not fixes_plan,
            pinned_plans=tuple(self.pinned),
            pinned_only=bool(self.pinned) and not planned,
            deselected_engines=tuple(self.deselected),
            note_filters=tuple(self.note_filters),
            selected_plan=self.selected,
        )


class Records:
    """The plan list the worker recorded, answering the frontend's queries (None: it cannot)."""

    def __init__(self, metadata: pb.PlanMetadata, frontend: Any) -> None:
        self._by_index = {c.index: c for c in metadata.candidates}
        self._frontend = frontend
        count = len(self._by_index)
        # Complete only when every entry was described (a worker before this recorded only some).
        self.complete = (
            count > 0 and set(self._by_index) == set(range(count)) and all(c.plan_name for c in metadata.candidates)
        )

    def answer(self, query: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """(answered, value)."""
        if not self.complete:
            return False, None
        if query == "get_execution_plan_count":
            return True, len(self._by_index)
        index = args[0] if args else kwargs.get("index")
        record = self._by_index.get(index) if isinstance(index, int) else None
        if record is None:
            return False, None  # the frontend's own IndexError, from the local graph
        if query == "get_plan_name_at_index":
            return True, record.plan_name
        if query == "get_engine_and_knobs_at_index":
            return True, (
                int(record.engine_id),
                {getattr(self._frontend.knob_type, k.name): int(k.value) for k in record.knobs},
            )
        if query == "get_behavior_notes_for_plan_at_index":
            return True, [getattr(self._frontend.behavior_note, n) for n in record.behavior_notes]
        if (
            query == "get_workspace_size_plan_at_index"
            and record.HasField("workspace_size")
            and len(args) <= 1
            and not kwargs
        ):
            return True, int(record.workspace_size)
        return False, None

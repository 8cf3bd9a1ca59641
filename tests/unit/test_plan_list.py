"""The worker replays a program's plan-list calls in the program's order
(plancache_server.worker.compiler.plan_list), on a recorder standing in for
the frontend's graph: heuristics unless the program pinned plans alone,
engine and note filters, pinned plans (one the frontend refuses is skipped,
as the program's own loop skips it), the selected plan; and it describes
every entry from the frontend's answers."""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any

import pytest

from plancache import CompileFailed
from plancache.frontend_graph.plan_list import first_index, make_plan_list
from plancache.keys.options import CompileOptions, NoteFilter, PinnedPlan
from plancache_server.worker.compiler.plan_list import describe

Knob = enum.Enum("knob_type", "TILE_SIZE SPLIT_K")
Note = enum.Enum("behavior_note", "RUNTIME_COMPILATION CUBLASLT_DEPENDENCY")
Numeric = enum.Enum("numerical_note", "TENSOR_CORE FFT")
Mode = enum.Enum("heur_mode", "A B FALLBACK")
FRONTEND = SimpleNamespace(knob_type=Knob, behavior_note=Note, numerical_note=Numeric, heur_mode=Mode)


class Graph:
    """What the worker calls on a frontend graph, recorded; engine 13 refuses its knobs."""

    def __init__(self, count: int = 3) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.count = count

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append((name, args[0] if args else None))
            if name == "create_execution_plan" and args[0] == 13:
                raise RuntimeError("engine 13 has no such knob")
            return None

        return call

    def get_execution_plan_count(self) -> int:
        return self.count

    def get_plan_name_at_index(self, index: int) -> str:
        return f"eng{index}_k{index}"

    def get_engine_and_knobs_at_index(self, index: int) -> tuple[int, dict[Any, int]]:
        return index, {Knob.TILE_SIZE: index + 1}

    def get_behavior_notes_for_plan_at_index(self, index: int) -> list[Any]:
        if index == 2:
            raise RuntimeError("a delegating entry")
        return [Note.RUNTIME_COMPILATION] if index == 0 else []


def test_the_programs_calls_are_replayed_in_its_order() -> None:
    g = Graph()
    options = CompileOptions(
        autotune=False,
        heuristic_modes=("A",),
        pinned_plans=(PinnedPlan(13, (("SPLIT_K", 4),)), PinnedPlan(7, (("TILE_SIZE", 2),))),
        deselected_engines=("eng3",),
        note_filters=(NoteFilter("numeric", False, ("FFT",)),),
        selected_plan=1,
        workspace_limit=1 << 20,
    )
    make_plan_list(g, FRONTEND, options, "sm_90/test")
    names = [name for name, _ in g.calls]
    assert names == [
        "validate",
        "build_operation_graph",
        "create_execution_plans",
        "deselect_engines",
        "deselect_numeric_notes",
        "deselect_workspace_greater_than",
        "create_execution_plan",
        "create_execution_plan",
        "select_plan",
        "check_support",
    ]
    assert dict(g.calls)["create_execution_plans"] == [Mode.A] and dict(g.calls)["deselect_numeric_notes"] == [
        Numeric.FFT
    ]
    assert first_index(options) == 1


def test_a_pinned_only_list_asks_no_heuristics_and_an_empty_one_fails() -> None:
    g = Graph()
    make_plan_list(
        g, FRONTEND, CompileOptions(autotune=False, pinned_plans=(PinnedPlan(7),), pinned_only=True), "sm_90/test"
    )
    assert "create_execution_plans" not in [name for name, _ in g.calls]
    with pytest.raises(CompileFailed, match="offers no execution plan"):
        make_plan_list(Graph(count=0), FRONTEND, CompileOptions(), "sm_90/test")


def test_each_entry_is_described_from_the_frontend_and_unknowns_stay_empty() -> None:
    g = Graph()
    first, last = describe(g, 0), describe(g, 2)
    assert (first.plan_name, first.engine_id, first.knobs, first.behavior_notes) == (
        "eng0_k0",
        0,
        {"TILE_SIZE": 1},
        ("RUNTIME_COMPILATION",),
    )
    assert last.behavior_notes == () and last.median_ms is None

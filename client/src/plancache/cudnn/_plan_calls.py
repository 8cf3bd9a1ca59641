"""A graph's plan calls, deferred while plancache may serve it, and made on the program's graph when it builds locally.

`create_execution_plans` and `check_support` plan and check locally, which
a served plan makes needless: they are recorded, as are the heuristic modes,
workspace limit and behavior notes they ask for (the plan's options,
plancache.cudnn._capture.options) and the plan-list calls
(plancache.cudnn._plan_list.PlanList). A graph that builds locally makes
them in the program's order (`make_deferred`), the build itself being its
caller's (`make_builds`: a served graph the program then drives builds as
it asked). `frontend` is the frontend's methods on the program's graph (a
bound `super()` of the drop-in's pygraph).
"""

from __future__ import annotations

from typing import Any

from plancache.cudnn._capture import options
from plancache.cudnn._plan_list import PlanList
from plancache.keys.options import CompileOptions

# The calls that build the graph (the frontend's build step): made by whoever builds, not by `make_deferred`.
BUILDS = ("build", "build_plans")
# One call on the program's graph: (method, args, kwargs).
Call = tuple[str, tuple[Any, ...], dict[str, Any]]
# The options of graphs whose plan list the program left alone, by what they were made from: a program's graphs
# mostly share their plan calls, and making (and checking) a CompileOptions twice was ~35 µs of every graph's
# build step (issue 41). Bounded: a program varying its calls without end recomputes past it.
_PLAIN_OPTIONS: dict[tuple[Any, ...], CompileOptions] = {}
_PLAIN_OPTIONS_HELD = 256


class PlanCalls:
    """The plan calls a program made on its graph, in order, and what they ask of its plan."""

    __slots__ = ("checked", "excluded_notes", "heuristics", "plan_list", "planned", "replay", "workspace_limit")

    def __init__(self) -> None:
        self.planned = False
        self.checked = False
        self.heuristics: Any = None
        self.workspace_limit: int | None = None
        self.excluded_notes: list[Any] = []
        self.plan_list = PlanList()
        # Deferred plan-list calls, replayed in order on the program's graph if it builds locally.
        self.replay: list[Call] = []

    def plan(self, heuristics: Any) -> None:
        """create_execution_plans(heuristics), deferred."""
        if self.planned or self.plan_list.pinned:
            raise RuntimeError(
                "create_execution_plans() was already called on this graph; planning is one-shot (the frontend's rule)"
            )
        self.planned, self.heuristics = True, heuristics
        self.replay.append(("create_execution_plans", (heuristics,), {}))

    def check(self) -> None:
        """check_support(), deferred."""
        self.checked = True
        self.replay.append(("check_support", (), {}))

    def pinned(self, frontend: Any, engine_id: int, knobs: Any) -> Any:
        """create_execution_plan(engine_id, knobs), its plan pinned already (PlanList.pin), made now: after
        the heuristics' plans a deferred create_execution_plans asked for, and unpinned if the frontend refuses it."""
        planned: Call = ("create_execution_plans", (self.heuristics,), {})
        if planned in self.replay:  # the heuristics' plans come first in the program's list
            self.replay.remove(planned)
            frontend.create_execution_plans(self.heuristics)
        try:
            return frontend.create_execution_plan(engine_id, knobs)
        except Exception:
            self.plan_list.pinned.pop()  # refused here: not in the program's list, nor in the worker's
            raise

    def select(self, index: int) -> None:
        self.plan_list.selected = index
        self.replay.append(("select_plan", (index,), {}))

    def deselect_engines(self, engine_names: Any) -> None:
        names = [str(n) for n in engine_names]
        self.plan_list.deselected.extend(names)
        self.replay.append(("deselect_engines", (names,), {}))

    def filter_notes(self, method: str, kind: str, keep: bool, notes: list[Any]) -> None:
        """A note filter (`method`, one of the four), deferred; ValueError: notes plancache cannot name."""
        self.plan_list.filter_notes(kind, keep, notes)
        self.replay.append((method, (notes,), {}))

    def options(self, base: CompileOptions | None) -> CompileOptions:
        """The plan's options: `base` (configure's) with what the program's plan calls ask for."""
        memo_key = self._plain_key(base)
        if memo_key is not None:
            found = _PLAIN_OPTIONS.get(memo_key)
            if found is not None:
                return found
        made = self.plan_list.options(
            options(base, self.heuristics, self.workspace_limit, self.excluded_notes), self.planned
        )
        if memo_key is not None:
            if len(_PLAIN_OPTIONS) >= _PLAIN_OPTIONS_HELD:
                _PLAIN_OPTIONS.clear()
            _PLAIN_OPTIONS[memo_key] = made
        return made

    def _plain_key(self, base: CompileOptions | None) -> tuple[Any, ...] | None:
        """What the options are made from, when the plan list is untouched and every part hashes (else None)."""
        if not self.plan_list.untouched:
            return None
        heuristics = self.heuristics
        parts = (
            base,
            tuple(heuristics) if isinstance(heuristics, list | tuple) else heuristics,
            self.workspace_limit,
            tuple(self.excluded_notes),
            self.planned,
        )
        try:
            hash(parts)
        except TypeError:
            return None
        return parts

    def make_deferred(self, frontend: Any) -> None:
        """The deferred plan calls, made now on the program's graph, in order (the build itself is the caller's)."""
        for name, args, kwargs in self.replay:
            if name not in BUILDS:
                getattr(frontend, name)(*args, **kwargs)

    def make_builds(self, frontend: Any) -> None:
        """The program's build step, made now on its own graph as its calls asked for it."""
        for call, args, kwargs in self.replay:
            if call in BUILDS:
                getattr(frontend, call)(*args, **kwargs)

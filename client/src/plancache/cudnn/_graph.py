"""The drop-in's graph class: cudnn.pygraph, its build step asking plancache (plancache.cudnn._serving).

Only the frontend's own method names are here, the calls a program makes:
each hands its graph and the frontend's methods on it (`super()`) to the
graph's Serving (`self._plancache`). The calls that run the plan read the
served graph and run it, or the frontend's, with nothing else in between:
`execute` is a program's hot path.
"""

from __future__ import annotations

from typing import Any

import cudnn as _frontend

from plancache.cudnn._built import Built
from plancache.cudnn._plan_list import DRIVES, QUERIES
from plancache.cudnn._serving import Serving, pack
from plancache.frontdoors.service import SERVICE


class pygraph(_frontend.pygraph):  # type: ignore[misc]  # noqa: N801 - the frontend's name
    """cudnn.pygraph, built through plancache (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plancache = Serving()
        if not SERVICE.touched:  # the program's first graph: its workload's plans stream from now on
            SERVICE.touch(load=False)  # each deserialized on the program's handle at its graph's build (_serving)

    @property
    def plancache(self) -> Built | None:
        """How this graph was built (None before its build step)."""
        return self._plancache.built

    # ---- the build step ------------------------------------------------------------

    def create_execution_plans(self, heuristics: Any = None) -> None:
        return self._plancache.create_execution_plans(super(), heuristics)

    def check_support(self) -> None:
        return self._plancache.check_support(super())

    def create_execution_plan(self, engine_id: int, knobs: Any = None) -> Any:
        """Recorded as the plan's options, and made here too: the frontend
        checks the engine and its knobs now (no build), and a program that
        catches its refusals (an engine sweep) sees them as it would."""
        return self._plancache.create_execution_plan(self, super(), engine_id, knobs)

    def select_plan(self, index: int) -> Any:
        return self._plancache.select_plan(self, super(), index)

    def deselect_engines(self, engine_names: Any) -> Any:
        return self._plancache.deselect_engines(self, super(), engine_names)

    def build_plans(self, *args: Any, **kwargs: Any) -> None:
        return self._plancache.build_plans(self, super(), args, kwargs)

    def build(self, heuristics: Any = None, ctx: Any = None) -> None:
        return self._plancache.build(self, super(), heuristics, ctx)

    def deselect_workspace_greater_than(self, workspace_limit: int) -> Any:
        return self._plancache.deselect_workspace_greater_than(super(), workspace_limit)

    def deselect_behavior_notes(self, notes: Any) -> Any:
        return self._plancache.deselect_behavior_notes(super(), notes)

    def select_behavior_notes(self, notes: Any) -> Any:
        return self._plancache.note_filter(self, super(), "behavior", True, notes)

    def deselect_numeric_notes(self, notes: Any) -> Any:
        return self._plancache.note_filter(self, super(), "numeric", False, notes)

    def select_numeric_notes(self, notes: Any) -> Any:
        return self._plancache.note_filter(self, super(), "numeric", True, notes)

    # ---- what runs the plan -----------------------------------------------------------

    def execute(self, tensor_dict: Any, workspace: Any = None, handle: Any = None, *args: Any, **kwargs: Any) -> None:
        s = self._plancache
        if s.pending and not self.__dict__.get("_is_built", False):
            s.serve(self, super())  # the frontend builds on a first execute; plancache is asked first
        if s.race is not None:
            s.adopt(self, workspace)
        if s.served is not None:
            return s.served.execute(  # type: ignore[no-any-return]
                pack(self, tensor_dict), workspace, handle, *args, **kwargs
            )
        return super().execute(tensor_dict, workspace, handle, *args, **kwargs)  # type: ignore[no-any-return]

    def get_workspace_size(self, *args: Any, **kwargs: Any) -> int:
        served = self._plancache.served
        return int(
            served.get_workspace_size(*args, **kwargs)
            if served is not None
            else super().get_workspace_size(*args, **kwargs)
        )

    def serialize(self, *, as_bytes: bool = False, include_kernels: bool = True) -> Any:
        """The served plan's own blob (what the worker serialized), or the frontend's serialize."""
        built = self._plancache.built
        if built is not None and built.plan is not None:
            return built.plan.blob if as_bytes else list(built.plan.blob)
        return super().serialize(as_bytes=as_bytes, include_kernels=include_kernels)

    def populate_cuda_graph(self, handle: Any, variant_pack: Any, workspace: Any, cuda_graph: Any) -> Any:
        served = self._plancache.served
        if served is not None:
            return served.populate_cuda_graph(handle, pack(self, variant_pack), workspace, cuda_graph)
        return super().populate_cuda_graph(handle, variant_pack, workspace, cuda_graph)

    def update_cuda_graph(self, handle: Any, variant_pack: Any, workspace: Any, cuda_graph: Any) -> Any:
        served = self._plancache.served
        if served is not None:
            return served.update_cuda_graph(handle, pack(self, variant_pack), workspace, cuda_graph)
        return super().update_cuda_graph(handle, variant_pack, workspace, cuda_graph)

    def get_behavior_notes(self, *args: Any, **kwargs: Any) -> Any:
        served = self._plancache.served
        return (
            served.get_behavior_notes(*args, **kwargs)
            if served is not None
            else super().get_behavior_notes(*args, **kwargs)
        )


def _plan_list_query(name: str) -> Any:
    def call(self: pygraph, *args: Any, **kwargs: Any) -> Any:
        s = self._plancache
        if s.pending:
            return s.query(self, super(pygraph, self), name, args, kwargs)
        return s.call(super(pygraph, self), name, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(getattr(_frontend.pygraph, name, None), "__doc__", None)
    return call


def _plan_list_driver(name: str) -> Any:
    def call(self: pygraph, *args: Any, **kwargs: Any) -> Any:
        frontend = super(pygraph, self)
        self._plancache.drives(self, frontend, name)
        return self._plancache.call(frontend, name, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(getattr(_frontend.pygraph, name, None), "__doc__", None)
    return call


for _name in QUERIES:
    setattr(pygraph, _name, _plan_list_query(_name))
for _name in DRIVES:
    setattr(pygraph, _name, _plan_list_driver(_name))

"""A node's own build of a plan: the other side of a hedged miss.

When the service holds no plan for a graph, the node builds the graph itself
as the program would have without plancache: the frontend's graph made from
the spec (plancache.frontend_graph), the plan list its options make (the
list the worker starts from), the first entry that builds, on the calling
thread's handle on the current device. The result is a `LocalPlan`: it runs
as any plan does (execute, bind, capture), its source is "local", and it has
no blob: a plan a node built is never stored, neither on the server nor in
the disk cache (nodes are not trusted writers).

When the service's plan arrives, verified (plancache.transport.hedge), it
replaces the local one at the next safe point: the next execute, bind,
capture or load. A BoundPlan or CapturedPlan made before keeps running the
plan it was made with; bind again to move to the service's.

Needs the [gpu] extra (torch and the cuDNN frontend).
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Mapping
from typing import Any, Protocol

from plancache.errors import CompileFailed, InvalidRequest
from plancache.frontend_graph.build import build_pygraph
from plancache.frontend_graph.defects import check_known_defects
from plancache.frontend_graph.kernel_caches import KERNEL_CACHES
from plancache.frontend_graph.plan_list import first_index, make_plan_list, resolved_geometry
from plancache.keys.query import PlanQuery
from plancache.run.bound import BoundPlan, CapturedPlan
from plancache.run.execution import handle_state, process
from plancache.run.plan import Plan
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.bindings import ResolvedGeometry
from plancache.wire.metadata import Built, plan_metadata

BUILT_BY = "this node (its own build of a hedged miss)"


class Replacement(Protocol):
    """The service's answer to a hedged miss, as a LocalPlan waits for it."""

    def done(self) -> bool: ...

    @property
    def plan(self) -> Plan | None: ...  # None: the service did not answer with a plan

    def adopted(self) -> None: ...  # its plan took over (counted)


@functools.cache
def can_build_here() -> bool:
    """Whether this process can build plans itself: the frontend and torch import and a GPU is there."""
    try:
        import cudnn  # noqa: F401
        import torch
    except Exception:  # not installed, or a broken install: the service alone answers
        return False
    return bool(torch.cuda.is_available())


class LocalGraph:
    """A frontend graph this node built, running the plan at `index` of its list."""

    __slots__ = ("graph", "index")

    def __init__(self, graph: Any, index: int) -> None:
        self.graph, self.index = graph, index

    def execute(self, pack: Mapping[int, Any], workspace: Any, handle: Any = None) -> None:
        self.graph.execute_plan_at_index(pack, workspace, self.index, handle=handle)


class LocalPlan(Plan):
    """This node's own heuristic plan, standing in until the service's arrives."""

    def __init__(self, graph: LocalGraph, metadata: pb.PlanMetadata, device: int) -> None:
        super().__init__(b"", metadata, "local")
        self._local: LocalGraph | None = graph
        self._device = device
        self._replacement: Replacement | None = None
        self.replaced_at: float | None = None  # monotonic seconds, when the service's plan took over

    def replace_with(self, replacement: Replacement) -> None:
        """The service's answer, to run instead once it is there (and is a plan)."""
        self._replacement = replacement

    @property
    def waiting(self) -> bool:
        """The service's answer is still to come (False: it came, or failed, or was never asked)."""
        pending = self._replacement
        return pending is not None and not pending.done()

    @property
    def local(self) -> bool:
        """Still this node's own build (the service's plan has not taken over)."""
        self._adopt()
        return self._local is not None

    def load(self, handle: Any = None) -> Any:
        self._adopt()
        built = self._local
        if built is None:
            return super().load(handle)
        device = process().runtime.current_device()
        if device != self._device:
            raise InvalidRequest(
                f"plan {self.key}: this node built it on GPU {self._device}; "
                f"run it there (the current device is {device})"
            )
        return built

    def execute(self, tensors: Mapping[str | int, Any], *, handle: Any = None) -> None:
        self._adopt()
        super().execute(tensors, handle=handle)

    def bind(self, tensors: Mapping[str | int, Any]) -> BoundPlan:
        self._adopt()
        return super().bind(tensors)

    def capture(self, tensors: Mapping[str | int, Any]) -> CapturedPlan:
        self._adopt()
        return super().capture(tensors)

    def to_bytes(self) -> bytes:
        self._adopt()
        if self._local is not None:
            raise InvalidRequest(
                f"plan {self.key}: this node built it (a hedged miss); a node's own plan has no stored form"
            )
        return super().to_bytes()

    def _adopt(self) -> bool:
        """Take the service's plan if it is there now; whether it was taken."""
        pending = self._replacement
        if pending is None or not pending.done():
            return False
        with self._lock:
            if self._replacement is not pending:
                return False
            self._replacement = None
            plan = pending.plan
            if plan is None:  # the service failed: this node's plan keeps running
                return False
            self.blob, self.metadata, self.signature, self.source = (
                plan.blob,
                plan.metadata,
                plan.signature,
                plan.source,
            )
            self._graphs, self._tables, self._local = {}, None, None
            self.replaced_at = time.monotonic()
        pending.adopted()
        return True


def build_local(query: PlanQuery, frontend: Any = None) -> LocalPlan:
    """The plan this node's own build makes of `query`: as the program
    would build it, on this thread's handle on the current GPU.
    CompileFailed with the frontend's reasons when no entry builds."""
    if frontend is None:
        frontend = importlib.import_module("cudnn")
    started = time.perf_counter()
    spec = query.spec
    check_known_defects(spec, query.target, served=False)  # a graph cuDNN computes wrongly is refused as by a worker
    state = handle_state()
    # A norm graph: built with its layout's kernel cache, one build at a time per cache
    # (plancache.frontend_graph.kernel_caches: later sizes reuse the kernel earlier ones compiled).
    prepared = KERNEL_CACHES.prepare(spec, frontend, state.device)
    if prepared is None:
        return _build_local(query, frontend, build_pygraph(spec, frontend, handle=state.handle), started)
    with prepared.lock:
        g = build_pygraph(prepared.spec, frontend, handle=state.handle, kernel_cache=prepared.cache)
        return _build_local(query, frontend, g, started)


def _build_local(query: PlanQuery, frontend: Any, g: Any, started: float) -> LocalPlan:
    """The first entry of `g`'s plan list that builds (the program's selected plan, strictly)."""
    spec, options = query.spec, query.options
    state = handle_state()
    make_plan_list(g, frontend, options, f"this node's GPU {state.device}")
    count = int(g.get_execution_plan_count())
    start = first_index(options)
    failures: list[str] = []
    for index in range(start, count if options.selected_plan is None else start + 1):
        try:
            g.build_plan_at_index(index)
        except Exception as e:  # the next entry, as the program's build_plans() would
            failures.append(f"plan {index}: {type(e).__name__}: {str(e)[:200]}")
            continue
        try:
            name = str(g.get_plan_name_at_index(index))
        except Exception:  # a plan the frontend cannot name
            name = f"plan {index}"
        built = local_build(
            query,
            resolved_geometry(g, spec),
            int(g.get_workspace_size_plan_at_index(index)),
            name,
            time.perf_counter() - started,
        )
        return LocalPlan(LocalGraph(g, index), plan_metadata(query, built), state.device)
    which = "the selected plan" if options.selected_plan is not None else "any plan"
    raise CompileFailed(f"this node could not build {which}: {'; '.join(failures)[:1000]}")


def local_build(
    query: PlanQuery, geometry: ResolvedGeometry, workspace_size: int, plan_name: str, build_seconds: float
) -> Built:
    """What this node's own build says of its plan (plancache.wire.metadata
    makes the metadata a worker's plan carries from it): no blob, built here
    for the query's target, provisional (a heuristic plan, never a tuned one)."""
    return Built(
        blob=b"",
        geometry=geometry,
        workspace_size=workspace_size,
        plan_name=plan_name,
        built_by=BUILT_BY,
        built_on=query.target.to_proto(),
        provisional=True,
        build_seconds=build_seconds,
    )

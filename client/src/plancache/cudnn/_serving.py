"""A drop-in graph's plan: served by plancache, raced with the program's own build, or built locally.

Each pygraph holds one Serving (`g._plancache`): its plan calls
(plancache.cudnn._plan_calls, deferred while plancache may serve), how it
was built (plancache.cudnn._built.Built) and the served graph that runs
its plan. Its methods take the program's graph and `frontend`, the
frontend's methods on that graph (a bound `super()` of the drop-in's
pygraph, so a call is the frontend's exactly as the subclass made it); it
holds no reference to the graph, which is freed when the program drops
it, as a frontend graph is.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import cudnn as _frontend

from plancache.cudnn._built import (
    HEDGED,
    NO_PLAN,
    Built,
    Local,
    count_local,
    count_served,
    node_types,
    recording,
    refused,
    relabel_local,
    uncount_served,
)
from plancache.cudnn._capture import current_device, prove, read
from plancache.cudnn._plan_calls import PlanCalls
from plancache.cudnn._plan_list import Records
from plancache.errors import PlanCacheError, SpecError
from plancache.frontdoors.families import WATCH
from plancache.frontdoors.service import SERVICE, describe
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.run.plan import Plan
from plancache.transport.hedge import Race
from plancache.wire import outcome_labels

log = logging.getLogger("plancache.cudnn")  # the drop-in's one logger, whichever of its modules logs


class Serving:
    """A graph's plan calls (deferred while plancache may serve), its outcome, and the graph that runs its plan."""

    __slots__ = ("built", "calls", "own_built", "race", "race_key", "records", "served", "unproven")

    def __init__(self) -> None:
        self.built: Built | None = None
        self.served: Any = None
        self.calls = PlanCalls()
        # The plan fetched to answer the program's queries about its plan list (and its options).
        self.records: tuple[CompileOptions, Plan] | None = None
        # A hedged miss the program's own build won: the service's answer, to take over at a later execute.
        self.race: Race | None = None
        self.race_key = ""  # the plan key that race asked the service for
        # That race's spec, proven to be the program's graph only when the service's plan is about to take over
        # (plancache.cudnn._capture: the proof is not paid inside the program's build).
        self.unproven: GraphSpec | None = None
        self.own_built = False  # the program's own build ran (in a race) and succeeded: never built twice

    @property
    def pending(self) -> bool:
        return self.built is None

    # ---- the plan calls ------------------------------------------------------------

    def create_execution_plans(self, frontend: Any, heuristics: Any) -> None:
        if not self.pending:
            return frontend.create_execution_plans(heuristics)  # type: ignore[no-any-return]
        self.calls.plan(heuristics)
        return None

    def check_support(self, frontend: Any) -> None:
        if not self.pending:
            return frontend.check_support()  # type: ignore[no-any-return]
        self.calls.check()
        return None

    def create_execution_plan(self, graph: Any, frontend: Any, engine_id: int, knobs: Any) -> Any:
        if not self.pending:
            return self.call(frontend, "create_execution_plan", engine_id, knobs)
        try:
            self.calls.plan_list.pin(engine_id, knobs)
        except (ValueError, TypeError):  # knobs that are not cudnn.knob_type members (a python engine's own object)
            self.drives(graph, frontend, "create_execution_plan")
            return frontend.create_execution_plan(engine_id, knobs)
        return self.calls.pinned(frontend, engine_id, knobs)

    def select_plan(self, graph: Any, frontend: Any, index: int) -> Any:
        if self.pending and isinstance(index, int) and not isinstance(index, bool):
            self.calls.select(index)
            return graph
        return self.call(frontend, "select_plan", index)

    def deselect_engines(self, graph: Any, frontend: Any, engine_names: Any) -> Any:
        if self.pending:
            self.calls.deselect_engines(engine_names)
            return graph
        return self.call(frontend, "deselect_engines", engine_names)

    def deselect_workspace_greater_than(self, frontend: Any, workspace_limit: int) -> Any:
        self.calls.workspace_limit = int(workspace_limit)
        return frontend.deselect_workspace_greater_than(workspace_limit)

    def deselect_behavior_notes(self, frontend: Any, notes: Any) -> Any:
        notes = list(notes)
        self.calls.excluded_notes.extend(notes)
        return frontend.deselect_behavior_notes(notes)

    def note_filter(self, graph: Any, frontend: Any, kind: str, keep: bool, notes: Any) -> Any:
        method = f"{'select' if keep else 'deselect'}_{'behavior' if kind == 'behavior' else 'numeric'}_notes"
        notes = list(notes)
        if self.pending:
            try:
                self.calls.filter_notes(method, kind, keep, notes)
            except ValueError:
                self.drives(graph, frontend, method)
            else:
                return graph
        return self.call(frontend, method, notes)

    def call(self, frontend: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        """A plan-list call once the graph is served (the served graph's) or built locally (the frontend's)."""
        served = self.served
        if served is not None:
            return getattr(served, name)(*args, **kwargs)
        return getattr(frontend, name)(*args, **kwargs)

    def query(self, graph: Any, frontend: Any, query: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A question about the plan list before the build: answered from the
        candidates the worker recorded, else by the program's own graph, built here."""
        self.calls.plan_list.inspected = True
        if self.records is None:
            spec, plan, local = self._fetch(graph, frontend)
            if plan is None:
                local = local or NO_PLAN
                self._local(
                    frontend, Built(name_of(graph), spec, reason=local.reason, node_types=node_types(graph)), local
                )
                return getattr(frontend, query)(*args, **kwargs)
            self.records = (self.calls.options(SERVICE.options), plan)
        answered, value = Records(self.records[1].metadata, _frontend).answer(query, args, kwargs)
        if answered:
            return value
        self.drives(graph, frontend, query, f"{query}() (the worker's record of the plan list cannot answer it)")
        return getattr(frontend, query)(*args, **kwargs)

    # ---- the build step --------------------------------------------------------------

    def build_plans(self, graph: Any, frontend: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # build_plans(ALL) too: the plan it leaves selected is the one a plain build runs (a program
        # that then runs another candidate itself switches to a local build, see drives).
        self.calls.replay.append(("build_plans", args, kwargs))
        return self._build(graph, frontend, functools.partial(frontend.build_plans, *args, **kwargs))

    def build(self, graph: Any, frontend: Any, heuristics: Any, ctx: Any) -> None:
        calls = self.calls
        if self.pending:
            if not graph.__dict__.get("_is_validated", False):
                graph.validate()
            graph.build_operation_graph()
            if not calls.planned:
                calls.planned, calls.heuristics = True, heuristics
        calls.replay.append(("build", (heuristics, ctx), {}))
        return self._build(graph, frontend, functools.partial(frontend.build, heuristics, ctx))

    def _build(self, graph: Any, frontend: Any, build: Callable[[], Any]) -> None:
        """The program's build step: served, raced (a hedged miss), or the program's own build."""
        if self.serve(graph, frontend, build):
            return
        with recording(self.built):
            build()

    def _own_build(self, frontend: Any, build: Callable[[], Any]) -> None:
        """The program's build as its side of a race: the deferred plan calls, then the build."""
        try:
            self.calls.make_deferred(frontend)
            build()
        except BaseException:
            self.calls.replay.clear()  # made already: a local build after the race does not make them again
            raise
        self.calls.replay.clear()
        self.own_built = True

    def _fetch(
        self, graph: Any, frontend: Any, build: Callable[[], Any] | None = None
    ) -> tuple[GraphSpec | None, Plan | None, Local | None]:
        """(spec, plan, None), or why not: (spec or None, None, Local: the reason,
        its logging key, whether it is about this graph, its class).
        With `build` (the program's own build step), a miss races it
        (plancache.transport.hedge): when it ran first, (spec, None, None)
        with the race kept for the service's plan to take over later."""
        if not graph.__dict__.get("_is_validated", False):
            graph.validate()  # the IR's inferred dims, and the program's own errors, as its build would raise them
        spec, stage = None, "capturing the graph"
        try:
            spec = read(graph)
            stage = "asking plancache"
            wanted = self.calls.options(SERVICE.options)
            if self.records is not None and self.records[0] == wanted:
                prove(graph, spec, _frontend)
                return spec, self.records[1], None  # the plan that answered the program's queries is the one it builds
            ahead = WATCH.asked_for(spec)  # a member of a family the service may be building ahead: asked first
            # Proven before asking where the program would wait for the service's plan: a graph the capture
            # misreads is then not asked for (nor waited for). A race's program builds meanwhile: proven later.
            proven = build is None or not SERVICE.hedges()
            if proven:
                prove(graph, spec, _frontend)
            if build is None:
                plan = SERVICE.compile(spec, current_device(), wanted, path="cudnn", normalized=True, ask_first=ahead)
                return spec, plan, None
            own_build = functools.partial(self._own_build, frontend, build)
            raced = SERVICE.race(
                spec, current_device(), wanted, own_build, path="cudnn", normalized=True, ask_first=ahead
            )
            if raced.plan is not None:  # a hit, or the service's plan first: proven before it runs
                if not proven:
                    prove(graph, spec, _frontend)
                return spec, raced.plan, None
            # The program's own build ran and runs: its graph is proven when the service's plan comes (adopt).
            self.race, self.race_key, self.unproven = raced.race, raced.key, spec
            return spec, None, None
        except PlanCacheError as e:
            return spec, None, refused(e)
        except Exception as e:  # e.g. a frontend error: the program's own build runs and says it
            reason = f"{stage} failed: {type(e).__name__}: {e}"
            return spec, None, Local(reason, reason, True, "no_spec_form" if spec is None else outcome_labels.OTHER)

    def serve(self, graph: Any, frontend: Any, build: Callable[[], Any] | None = None) -> bool:
        """Whether plancache serves this graph, or the program's own build
        ran in a race it won (asked once; a local build replays the deferred calls)."""
        if not self.pending:
            return self.served is not None or self.race is not None
        name = name_of(graph)
        # The local build runs outside the handlers: its own errors are the
        # frontend's, not chained to why plancache did not serve.
        spec, plan, local = self._fetch(graph, frontend, build)
        race = self.race
        if plan is None and local is None and race is not None:  # the program's own build ran in the race, and runs
            failed = race.error if race.done() and race.plan is None else None
            if failed is None:
                built = Built(
                    name,
                    spec,
                    reason=HEDGED,
                    node_types=node_types(graph),
                    local_built=True,
                    hedged=True,
                    key=self.race_key or None,
                )
                self._count_local(built, Local(HEDGED, "hedged", False, "hedged"), level=logging.INFO)
            else:  # the service failed: said as when nothing was raced
                self.race = None
                built = Built(name, spec, reason=describe(failed), node_types=node_types(graph), local_built=True)
                self._count_local(built, refused(failed))
            return True
        if plan is not None:
            try:
                served = _load(graph, plan)
            except Exception as e:  # e.g. a blob this frontend cannot load: the program's own build runs
                reason = f"loading the served plan failed: {type(e).__name__}: {e}"
                local = Local(reason, reason, True, "load_failed")
        if local is not None or plan is None:
            local = local or NO_PLAN
            built = Built(name, spec, reason=local.reason, node_types=node_types(graph))
            if self.own_built:  # built in a race whose plan was refused: the program's own plan runs, built once
                built.local_built = True
                self._count_local(built, local)
                return True
            self._local(frontend, built, local)
            return False
        self.served, self.built = served, Built(name, spec, plan, node_types=node_types(graph))
        count_served(self.built, plan)
        if spec is not None:  # a program meeting its graph at many sizes: the family built ahead
            WATCH.seen("cudnn", spec, current_device())
        log.debug("plancache.cudnn: graph %r served by plan %s (%s)", name, plan.key, plan.source)
        return True

    def _local(self, frontend: Any, built: Built, why: Local) -> None:
        """Build locally from here on: the deferred plan calls are made now, in order."""
        self._count_local(built, why)
        try:
            self.calls.make_deferred(frontend)
        except BaseException:
            built.local_built = False  # the frontend refuses it too
            raise

    def _count_local(self, built: Built, why: Local, level: int = logging.WARNING) -> None:
        self.built = built
        count_local(built, why, level)

    # ---- what runs the plan ------------------------------------------------------------

    def adopt(self, graph: Any, workspace: Any) -> None:
        """The service's plan takes over from the program's own build (a
        race it won) at this execute, once it is there and verified, and
        when the workspace the program passes is large enough for it (a
        program sizes its workspace by get_workspace_size() after its build)."""
        race = self.race
        if race is None or not race.done():
            return
        plan = race.plan
        if plan is None:  # the service failed: the program's own plan keeps running
            self.race = None
            return
        size = _bytes_of(workspace)
        if size is None or size < plan.metadata.workspace_size:
            return  # asked again at the next execute (the program may pass a larger one)
        self.race = None
        if not self._proven(graph):
            return
        try:
            served = _load(graph, plan)
        except Exception as e:  # a blob this frontend cannot load: the program's own plan keeps running
            log.debug(
                "plancache.cudnn: graph %r keeps its own plan: loading the service's failed: %s", name_of(graph), e
            )
            return
        previous = self.built
        if previous is not None:  # the same graph's record, now with the plan that runs it
            previous.plan = plan
        self.served = served
        race.adopted()

    def _proven(self, graph: Any) -> bool:
        """Whether the race's spec is the program's graph (plancache.cudnn._capture.prove), proven once, before the
        service's plan first runs; when it is not, the program's own plan keeps running and the graph's record
        says why (a capture that differs is refused, as it is before a build)."""
        spec, self.unproven = self.unproven, None
        if spec is None:
            return True
        try:
            prove(graph, spec, _frontend)
        except SpecError as e:
            why = refused(e)
        except Exception as e:  # the rebuild itself failed (a frontend error): not proven either
            reason = f"proving the graph failed: {type(e).__name__}: {e}"
            why = Local(reason, reason, True, outcome_labels.OTHER)
        else:
            return True
        if self.built is not None:
            relabel_local(self.built, why)
        return False

    def drives(self, graph: Any, frontend: Any, name: str, what: str | None = None) -> None:
        """A call by which the program builds or runs candidates itself (an
        autotuner of its own): its plans are built here. A graph already
        served switches: its own plans are made and built as the program's
        calls asked, and the served plan is dropped (counted as local)."""
        if self.pending:
            built = Built(
                name_of(graph), reason=f"the program calls {what or name + '()'}", node_types=node_types(graph)
            )
            self._local(frontend, built, Local(built.reason or "", f"drives:{name}", True, "program_drives"))
            return
        if self.served is None or self.built is None:
            return
        uncount_served()
        self.served, previous = None, self.built
        built = Built(
            previous.name,
            previous.spec,
            reason=f"the program calls {what or name + '()'} after it was served",
            node_types=previous.node_types,
        )
        self._local(frontend, built, Local(built.reason or "", f"drives:{name}", True, "program_drives"))
        self.calls.make_builds(frontend)  # its build, as the program asked for it


def name_of(graph: Any) -> str:
    """The program's name for its graph (pygraph(name=...))."""
    return str(graph.__dict__.get("_cpp_graph_kwargs", {}).get("name", "graph"))


def pack(graph: Any, tensor_dict: Any) -> Any:
    """The program's pack keyed by uid (tensor handles and names are this
    graph's; the served graph knows uids), with the tensors this graph
    bound when an op was given a framework tensor."""
    if not isinstance(tensor_dict, dict):
        return tensor_dict  # the ordered form, with tensor_uids=
    pack = dict(graph.__dict__.get("_data_bindings") or {})
    for key, data in tensor_dict.items():
        if isinstance(key, str):
            found = graph.find_tensor(key)
            if found is None:
                raise KeyError(key)
            pack[found.uid] = data
        elif isinstance(key, _frontend.Tensor):
            pack[key.uid] = data
        elif key is not None:  # a uid (None: an optional tensor the frontend lets a pack leave out)
            pack[key] = data
    return pack


def _load(graph: Any, plan: Plan) -> Any:
    """The served plan in a graph of its own, on the program's handle (so a
    `g.execute(pack, ws)` without a handle runs on that handle's stream, as
    the program's graph would have). Deserializing into a fresh graph is the
    path every plancache plan takes (Plan.load); the program's graph keeps its
    IR untouched, so a local build stays possible."""
    handle = graph.__dict__.get("_handle")
    served = _frontend.pygraph(handle=handle) if handle is not None else _frontend.pygraph()
    if handle is None:
        from plancache.run.gpu import cudnn_handle

        handle = cudnn_handle()
    served.deserialize(handle, plan.blob)
    return served


def _bytes_of(workspace: Any) -> int | None:
    """The size of a workspace the program passes (a torch tensor), or None when it cannot be told."""
    try:
        return int(workspace.numel()) * int(workspace.element_size())
    except Exception:
        return None

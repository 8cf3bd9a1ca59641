"""The cuDNN frontend, with its plans from plancache: change one line.

    import plancache.cudnn as cudnn       # was: import cudnn

Everything of the real `cudnn` module is here under the same names, except
`pygraph`, a subclass whose build step asks plancache. When the program
builds a graph (`build_plans`, or `build`), its graph is captured
(`GraphSpec.from_pygraph`), the plan is asked for through a
`plancache.Client` (its disk cache first, then the server) and the served
plan is deserialized and held by the program's own graph object, so its
`g.execute(pack, ws)`, `get_workspace_size()` and `serialize()` work as
before, with the same tensor handles. `create_execution_plans` and
`check_support` are deferred to the build step (they plan and check
locally, which a served plan makes needless) and replayed when the graph
builds locally.

Every graph the frontend's API can build is captured (GraphSpec.from_pygraph),
and proven: the graph rebuilt from the spec must equal the program's, field
by field, or the graph builds locally naming the difference.

A program's plan-list calls are part of what it asks for
(cudnn/_plan_list.py): plans it pins (create_execution_plan), the plan it
selects, engines and notes it deselects; its queries about the list (the
count, each plan's name, engine and knobs, workspace, notes) are answered
from the candidates the worker recorded. A program that builds or runs
candidates itself (build_plan_at_index, execute_plan_at_index,
build_plans(ALL)) builds locally, told once why.

The graph builds locally, exactly as the program would have, when the
service cannot serve it: no server configured (`configure(...)` or
PLANCACHE_SERVER=host:port), the server down, a graph with no spec form (a
score_mod callback, a deviceless AOT graph), no worker for the target, any
other PlanCacheError, or a plan failing verification (UntrustedPlan,
IntegrityError: such a plan is never deserialized). Why is logged once per
reason; `stats()` counts, `graphs()` lists the latest graphs and how each
was built, with their frontend node types.

Not `serve_frontend(client)`, which would patch the real class: see
docs/design.md, "Frontend code, one line changed".

Owns: the frontend's graph class, served by plancache.
May import: plancache.errors, plancache.graphspec, plancache.keys, plancache.run, plancache.transport, plancache.wire, plancache.frontdoors, plancache.frontend_graph.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cudnn as _frontend

from plancache.cudnn._capture import capture, options
from plancache.cudnn._plan_list import DRIVES, QUERIES, PlanList, Records
from plancache.errors import PlanCacheError
from plancache.frontdoors.families import WATCH
from plancache.frontdoors.service import ABOUT_THE_GRAPH, SERVICE, Once, configure, describe, reason_key
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.run.plan import Plan
from plancache.transport import outcomes
from plancache.transport.hedge import Race
from plancache.wire import outcome_labels

log = logging.getLogger(__name__)
_once = Once()

# The real module's names, bound here as they are there (lazy ones through __getattr__).
_LAZY = {"Graph", "wrapper"}
globals().update(
    {
        name: getattr(_frontend, name)
        for name in getattr(_frontend, "__all__", ())
        if name not in _LAZY and hasattr(_frontend, name)
    }
)


def __getattr__(name: str) -> Any:
    return getattr(_frontend, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_frontend)))


@dataclass
class Built:
    """How one graph was built: served by plancache (its plan) or locally (why)."""

    name: str
    spec: GraphSpec | None = field(default=None, repr=False)
    plan: Plan | None = None
    reason: str | None = None
    # The frontend's node types of the graph, in order (pointwise ones as "POINTWISE:<mode>").
    node_types: tuple[str, ...] = ()
    # Built locally: whether the program's own build succeeded (None: not known yet, or served).
    local_built: bool | None = None
    # The program's own build won a hedged miss (its plan ran first; `plan`, once set, took over later).
    hedged: bool = False

    @property
    def source(self) -> str:
        """The plan's source ("hit", "compiled", "provisional", "cache", ...) or "local"."""
        return self.plan.source if self.plan is not None else "local"


@dataclass
class Stats:
    served: int = 0
    local: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


_STATS = Stats()
_RECENT: deque[Built] = deque(maxlen=256)


def stats() -> Stats:
    """Graphs served and built locally since the process started, and why."""
    return Stats(_STATS.served, _STATS.local, dict(_STATS.reasons))


def graphs() -> list[Built]:
    """The latest graphs built (up to 256), oldest first."""
    return list(_RECENT)


def _current_device() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.current_device()) if torch.cuda.is_available() else 0


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


def node_types(graph: Any) -> tuple[str, ...]:
    """The graph's frontend node types in order, a pointwise node's with its mode."""
    found = []
    for node in getattr(graph, "nodes", ()):
        kind = str(getattr(node.node_type, "name", node.node_type))
        found.append(f"{kind}:{node.params.get('mode')}" if kind == "POINTWISE" else kind)
    return tuple(found)


class _State:
    """A graph's plan calls (deferred while plancache may serve) and outcome."""

    __slots__ = (
        "built",
        "checked",
        "excluded_notes",
        "heuristics",
        "plan_list",
        "planned",
        "race",
        "records",
        "replay",
        "served",
        "workspace_limit",
    )

    def __init__(self) -> None:
        self.built: Built | None = None
        self.served: Any = None
        self.planned = False
        self.checked = False
        self.heuristics: Any = None
        self.workspace_limit: int | None = None
        self.excluded_notes: list[Any] = []
        self.plan_list = PlanList()
        # Deferred plan-list calls, replayed in order on the program's graph if it builds locally.
        self.replay: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        # The plan fetched to answer the program's queries about its plan list (and its options).
        self.records: tuple[CompileOptions, Plan] | None = None
        # A hedged miss the program's own build won: the service's answer, to take over at a later execute.
        self.race: Race | None = None

    @property
    def pending(self) -> bool:
        return self.built is None


class pygraph(_frontend.pygraph):  # type: ignore[misc]  # noqa: N801 - the frontend's name
    """cudnn.pygraph, built through plancache (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plancache = _State()

    @property
    def plancache(self) -> Built | None:
        """How this graph was built (None before its build step)."""
        return self._plancache.built

    # ---- the build step ------------------------------------------------------------

    def create_execution_plans(self, heuristics: Any = None) -> None:
        s = self._plancache
        if not s.pending:
            return super().create_execution_plans(heuristics)  # type: ignore[no-any-return]
        if s.planned or s.plan_list.pinned:
            raise RuntimeError(
                "create_execution_plans() was already called on this graph; planning is one-shot (the frontend's rule)"
            )
        s.planned, s.heuristics = True, heuristics
        s.replay.append(("create_execution_plans", (heuristics,), {}))
        return None

    def check_support(self) -> None:
        s = self._plancache
        if not s.pending:
            return super().check_support()  # type: ignore[no-any-return]
        s.checked = True
        s.replay.append(("check_support", (), {}))
        return None

    def create_execution_plan(self, engine_id: int, knobs: Any = None) -> Any:
        """Recorded as the plan's options, and made here too: the frontend
        checks the engine and its knobs now (no build), and a program that
        catches its refusals (an engine sweep) sees them as it would."""
        s = self._plancache
        if not s.pending:
            return self._plancache_call("create_execution_plan", engine_id, knobs)
        try:
            s.plan_list.pin(engine_id, knobs)
        except (ValueError, TypeError):  # knobs that are not cudnn.knob_type members (a python engine's own object)
            self._plancache_drives("create_execution_plan")
            return super().create_execution_plan(engine_id, knobs)
        if (
            "create_execution_plans",
            (s.heuristics,),
            {},
        ) in s.replay:  # the heuristics' plans come first in the program's list
            s.replay.remove(("create_execution_plans", (s.heuristics,), {}))
            super().create_execution_plans(s.heuristics)
        try:
            return super().create_execution_plan(engine_id, knobs)
        except Exception:
            s.plan_list.pinned.pop()  # refused here: not in the program's list, nor in the worker's
            raise

    def select_plan(self, index: int) -> Any:
        s = self._plancache
        if s.pending and isinstance(index, int) and not isinstance(index, bool):
            s.plan_list.selected = index
            s.replay.append(("select_plan", (index,), {}))
            return self
        return self._plancache_call("select_plan", index)

    def deselect_engines(self, engine_names: Any) -> Any:
        s = self._plancache
        if s.pending:
            names = [str(n) for n in engine_names]
            s.plan_list.deselected.extend(names)
            s.replay.append(("deselect_engines", (names,), {}))
            return self
        return self._plancache_call("deselect_engines", engine_names)

    def build_plans(self, *args: Any, **kwargs: Any) -> None:
        # build_plans(ALL) too: the plan it leaves selected is the one a plain build runs (a program
        # that then runs another candidate itself switches to a local build, see _plancache_drives).
        self._plancache.replay.append(("build_plans", args, kwargs))
        return self._plancache_build(functools.partial(super().build_plans, *args, **kwargs))

    def build(self, heuristics: Any = None, ctx: Any = None) -> None:
        s = self._plancache
        if s.pending:
            if not self.__dict__.get("_is_validated", False):
                self.validate()
            self.build_operation_graph()
            if not s.planned:
                s.planned, s.heuristics = True, heuristics
        s.replay.append(("build", (heuristics, ctx), {}))
        return self._plancache_build(functools.partial(super().build, heuristics, ctx))

    def deselect_workspace_greater_than(self, workspace_limit: int) -> Any:
        self._plancache.workspace_limit = int(workspace_limit)
        return super().deselect_workspace_greater_than(workspace_limit)

    def deselect_behavior_notes(self, notes: Any) -> Any:
        notes = list(notes)
        self._plancache.excluded_notes.extend(notes)
        return super().deselect_behavior_notes(notes)

    def select_behavior_notes(self, notes: Any) -> Any:
        return self._plancache_note_filter("behavior", True, notes)

    def deselect_numeric_notes(self, notes: Any) -> Any:
        return self._plancache_note_filter("numeric", False, notes)

    def select_numeric_notes(self, notes: Any) -> Any:
        return self._plancache_note_filter("numeric", True, notes)

    # ---- what runs the plan -----------------------------------------------------------

    def execute(self, tensor_dict: Any, workspace: Any = None, handle: Any = None, *args: Any, **kwargs: Any) -> None:
        s = self._plancache
        if s.pending and not self.__dict__.get("_is_built", False):
            self._plancache_serve()  # the frontend builds on a first execute; plancache is asked first
        if s.race is not None:
            self._plancache_adopt(workspace)
        if s.served is not None:
            return s.served.execute(self._plancache_pack(tensor_dict), workspace, handle, *args, **kwargs)  # type: ignore[no-any-return]
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
            return served.populate_cuda_graph(handle, self._plancache_pack(variant_pack), workspace, cuda_graph)
        return super().populate_cuda_graph(handle, variant_pack, workspace, cuda_graph)

    def update_cuda_graph(self, handle: Any, variant_pack: Any, workspace: Any, cuda_graph: Any) -> Any:
        served = self._plancache.served
        if served is not None:
            return served.update_cuda_graph(handle, self._plancache_pack(variant_pack), workspace, cuda_graph)
        return super().update_cuda_graph(handle, variant_pack, workspace, cuda_graph)

    def get_behavior_notes(self, *args: Any, **kwargs: Any) -> Any:
        served = self._plancache.served
        return (
            served.get_behavior_notes(*args, **kwargs)
            if served is not None
            else super().get_behavior_notes(*args, **kwargs)
        )

    # ---- plancache ------------------------------------------------------------------------

    def _plancache_pack(self, tensor_dict: Any) -> Any:
        """The program's pack keyed by uid (tensor handles and names are this
        graph's; the served graph knows uids), with the tensors this graph
        bound when an op was given a framework tensor."""
        if not isinstance(tensor_dict, dict):
            return tensor_dict  # the ordered form, with tensor_uids=
        pack = dict(self.__dict__.get("_data_bindings") or {})
        for key, data in tensor_dict.items():
            if isinstance(key, str):
                found = self.find_tensor(key)
                if found is None:
                    raise KeyError(key)
                pack[found.uid] = data
            elif isinstance(key, _frontend.Tensor):
                pack[key.uid] = data
            elif key is not None:  # a uid (None: an optional tensor the frontend lets a pack leave out)
                pack[key] = data
        return pack

    def _plancache_name(self) -> str:
        return str(self.__dict__.get("_cpp_graph_kwargs", {}).get("name", "graph"))

    def _plancache_options(self) -> CompileOptions:
        s = self._plancache
        base = options(SERVICE.options, s.heuristics, s.workspace_limit, s.excluded_notes)
        return s.plan_list.options(base, s.planned)

    def _plancache_fetch(
        self, build: Callable[[], Any] | None = None
    ) -> tuple[GraphSpec | None, Plan | None, Local | None]:
        """(spec, plan, None), or why not: (spec or None, None, Local: the reason, its logging key, whether it is about this graph, its class).
        With `build` (the program's own build step), a miss races it
        (plancache.transport.hedge): when it ran first, (spec, None, None)
        with the race kept for the service's plan to take over later."""
        s = self._plancache
        if not self.__dict__.get("_is_validated", False):
            self.validate()  # the IR's inferred dims, and the program's own errors, as its build would raise them
        spec, stage = None, "capturing the graph"
        try:
            spec = capture(self, _frontend)
            stage = "asking plancache"
            wanted = self._plancache_options()
            if s.records is not None and s.records[0] == wanted:
                return spec, s.records[1], None  # the plan that answered the program's queries is the one it builds
            if build is None:
                return spec, SERVICE.compile(spec, _current_device(), wanted, path="cudnn"), None
            raced = SERVICE.race(
                spec, _current_device(), wanted, functools.partial(self._plancache_own_build, build), path="cudnn"
            )
            s.race = raced.race
            return spec, raced.plan, None
        except PlanCacheError as e:
            return spec, None, Local(describe(e), reason_key(e), isinstance(e, ABOUT_THE_GRAPH), outcomes.reason_of(e))
        except Exception as e:  # e.g. a frontend error: the program's own build runs and says it
            reason = f"{stage} failed: {type(e).__name__}: {e}"
            return spec, None, Local(reason, reason, True, "no_spec_form" if spec is None else outcome_labels.OTHER)

    def _plancache_build(self, build: Callable[[], Any]) -> None:
        """The program's build step: served, raced (a hedged miss), or the program's own build."""
        if self._plancache_serve(build):
            return
        with self._plancache_local_build():
            build()

    def _plancache_own_build(self, build: Callable[[], Any]) -> None:
        """The program's build as its side of a race: the deferred plan calls, then the build."""
        try:
            self._plancache_replay()
            build()
        except BaseException:
            self._plancache.replay.clear()  # made already: a local build after the race does not make them again
            raise
        self._plancache.replay.clear()

    def _plancache_serve(self, build: Callable[[], Any] | None = None) -> bool:
        """Whether plancache serves this graph, or the program's own build
        ran in a race it won (asked once; a local build replays the deferred calls)."""
        s = self._plancache
        if not s.pending:
            return s.served is not None or s.race is not None
        name = self._plancache_name()
        # The local build runs outside the handlers: its own errors are the
        # frontend's, not chained to why plancache did not serve.
        spec, plan, local = self._plancache_fetch(build)
        race = s.race
        if plan is None and local is None and race is not None:  # the program's own build ran in the race, and runs
            failed = race.error if race.done() and race.plan is None else None
            if failed is None:
                built = Built(name, spec, reason=HEDGED, node_types=node_types(self), local_built=True, hedged=True)
                self._plancache_count_local(built, Local(HEDGED, "hedged", False, "hedged"), level=logging.INFO)
            else:  # the service failed: said as when nothing was raced
                s.race = None
                built = Built(name, spec, reason=describe(failed), node_types=node_types(self), local_built=True)
                self._plancache_count_local(
                    built,
                    Local(
                        describe(failed),
                        reason_key(failed),
                        isinstance(failed, ABOUT_THE_GRAPH),
                        outcomes.reason_of(failed),
                    ),
                )
            return True
        if plan is not None:
            try:
                served = _load(self, plan)
            except Exception as e:  # e.g. a blob this frontend cannot load: the program's own build runs
                reason = f"loading the served plan failed: {type(e).__name__}: {e}"
                local = Local(reason, reason, True, "load_failed")
        if local is not None or plan is None:
            local = local or NO_PLAN
            self._plancache_local(Built(name, spec, reason=local.reason, node_types=node_types(self)), local)
            return False
        s.served, s.built = served, Built(name, spec, plan, node_types=node_types(self))
        _STATS.served += 1
        _RECENT.append(s.built)
        outcomes.record(
            "cudnn",
            outcomes.target_of(plan.key),
            outcomes.served_outcome(plan.source),
            outcome_labels.anchor_node_type(s.built.node_types),
        )
        if spec is not None:
            WATCH.seen(
                "cudnn", spec, _current_device()
            )  # a program meeting its graph at many sizes: the family built ahead
        log.debug("plancache.cudnn: graph %r served by plan %s (%s)", name, plan.key, plan.source)
        return True

    def _plancache_query(self, query: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A question about the plan list before the build: answered from the
        candidates the worker recorded, else by the program's own graph, built here."""
        s = self._plancache
        s.plan_list.inspected = True
        if s.records is None:
            spec, plan, local = self._plancache_fetch()
            if plan is None:
                local = local or NO_PLAN
                self._plancache_local(
                    Built(self._plancache_name(), spec, reason=local.reason, node_types=node_types(self)), local
                )
                return getattr(super(), query)(*args, **kwargs)
            s.records = (self._plancache_options(), plan)
        answered, value = Records(s.records[1].metadata, _frontend).answer(query, args, kwargs)
        if answered:
            return value
        self._plancache_drives(query, f"{query}() (the worker's record of the plan list cannot answer it)")
        return getattr(super(), query)(*args, **kwargs)

    def _plancache_note_filter(self, kind: str, keep: bool, notes: Any) -> Any:
        s = self._plancache
        method = f"{'select' if keep else 'deselect'}_{'behavior' if kind == 'behavior' else 'numeric'}_notes"
        notes = list(notes)
        if s.pending:
            try:
                s.plan_list.filter_notes(kind, keep, notes)
            except ValueError:
                self._plancache_drives(method)
            else:
                s.replay.append((method, (notes,), {}))
                return self
        return self._plancache_call(method, notes)

    @contextlib.contextmanager
    def _plancache_local_build(self) -> Iterator[None]:
        """The program's own build of a graph plancache did not serve: whether
        it built is recorded (a graph the frontend cannot build either is not
        one plancache failed to serve)."""
        built = self._plancache.built
        try:
            yield
        except BaseException:
            if built is not None:
                built.local_built = False
            raise
        if built is not None:
            built.local_built = True

    def _plancache_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """A plan-list call once the graph is served (the served graph's) or built locally (the frontend's)."""
        served = self._plancache.served
        if served is not None:
            return getattr(served, name)(*args, **kwargs)
        return getattr(super(), name)(*args, **kwargs)

    def _plancache_local(self, built: Built, why: Local) -> None:
        """Build locally from here on: the deferred plan calls are made now, in order."""
        self._plancache_count_local(built, why)
        try:
            self._plancache_replay()
        except BaseException:
            built.local_built = False  # the frontend refuses it too
            raise

    def _plancache_count_local(self, built: Built, why: Local, level: int = logging.WARNING) -> None:
        self._plancache.built = built
        _STATS.local += 1
        reason = built.reason or "unknown"
        _STATS.reasons[reason] = _STATS.reasons.get(reason, 0) + 1
        _RECENT.append(built)
        spec_hash = hash_normalized(built.spec) if built.spec is not None and outcomes.reports_specs() else ""
        outcomes.record(
            "cudnn",
            SERVICE.known_target_id(_current_device()),
            outcomes.Outcome.LOCAL,
            outcome_labels.anchor_node_type(built.node_types),
            reason=why.reason_class,
            spec_hash=spec_hash,
        )
        what = f"graph {built.name!r}" if why.about_the_graph else "graphs"
        _once(log, why.key, "plancache.cudnn: %s built locally: %s", what, reason, level=level)

    def _plancache_replay(self) -> None:
        """The deferred plan calls, made now on the program's graph, in order (the build itself is the caller's)."""
        for name, args, kwargs in self._plancache.replay:
            if name not in _BUILDS:
                getattr(super(), name)(*args, **kwargs)

    def _plancache_adopt(self, workspace: Any) -> None:
        """The service's plan takes over from the program's own build (a
        race it won) at this execute, once it is there and verified, and
        when the workspace the program passes is large enough for it (a
        program sizes its workspace by get_workspace_size() after its build)."""
        s = self._plancache
        race = s.race
        if race is None or not race.done():
            return
        plan = race.plan
        if plan is None:  # the service failed: the program's own plan keeps running
            s.race = None
            return
        size = _bytes_of(workspace)
        if size is None or size < plan.metadata.workspace_size:
            return  # asked again at the next execute (the program may pass a larger one)
        s.race = None
        try:
            served = _load(self, plan)
        except Exception as e:  # a blob this frontend cannot load: the program's own plan keeps running
            log.debug(
                "plancache.cudnn: graph %r keeps its own plan: loading the service's failed: %s",
                self._plancache_name(),
                e,
            )
            return
        previous = s.built
        if previous is not None:  # the same graph's record, now with the plan that runs it
            previous.plan = plan
        s.served = served
        race.adopted()

    def _plancache_drives(self, name: str, what: str | None = None) -> None:
        """A call by which the program builds or runs candidates itself (an
        autotuner of its own): its plans are built here. A graph already
        served switches: its own plans are made and built as the program's
        calls asked, and the served plan is dropped (counted as local)."""
        s = self._plancache
        if s.pending:
            built = Built(
                self._plancache_name(), reason=f"the program calls {what or name + '()'}", node_types=node_types(self)
            )
            self._plancache_local(built, Local(built.reason or "", f"drives:{name}", True, "program_drives"))
            return
        if s.served is None or s.built is None:
            return
        _STATS.served -= 1
        s.served, previous = None, s.built
        built = Built(
            previous.name,
            previous.spec,
            reason=f"the program calls {what or name + '()'} after it was served",
            node_types=previous.node_types,
        )
        self._plancache_local(built, Local(built.reason or "", f"drives:{name}", True, "program_drives"))
        for call, args, kwargs in s.replay:  # its build, as the program asked for it
            if call in _BUILDS:
                getattr(super(), call)(*args, **kwargs)


@dataclass(frozen=True)
class Local:
    """Why a graph builds locally: the reason (stats(), graphs()), its key for
    logging once, whether it is about this graph (else about the service),
    and its reason class (what the service is told: outcome_labels.REASONS)."""

    reason: str
    key: str
    about_the_graph: bool
    reason_class: str


NO_PLAN = Local("no plan", "no plan", True, outcome_labels.OTHER)
_BUILDS = ("build", "build_plans")
HEDGED = "hedged miss: the service was building it and this program's own build was ready first (the service's plan takes over at a later execute)"


def _bytes_of(workspace: Any) -> int | None:
    """The size of a workspace the program passes (a torch tensor), or None when it cannot be told."""
    try:
        return int(workspace.numel()) * int(workspace.element_size())
    except Exception:
        return None


def _plan_list_query(name: str) -> Any:
    def call(self: pygraph, *args: Any, **kwargs: Any) -> Any:
        s = self._plancache
        if s.pending:
            return self._plancache_query(name, args, kwargs)
        return self._plancache_call(name, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(getattr(_frontend.pygraph, name, None), "__doc__", None)
    return call


def _plan_list_driver(name: str) -> Any:
    def call(self: pygraph, *args: Any, **kwargs: Any) -> Any:
        self._plancache_drives(name)
        return self._plancache_call(name, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(getattr(_frontend.pygraph, name, None), "__doc__", None)
    return call


for _name in QUERIES:
    setattr(pygraph, _name, _plan_list_query(_name))
for _name in DRIVES:
    setattr(pygraph, _name, _plan_list_driver(_name))

__all__ = [
    str(n) for n in getattr(_frontend, "__all__", ()) if n != "pygraph"
]  # the frontend's names, as it lists them
__all__ += ["Built", "Stats", "configure", "graphs", "pygraph", "stats"]

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

The graph builds locally, exactly as the program would have, when the
service cannot serve it: no server configured (`configure(...)` or
PLANCACHE_SERVER=host:port), the server down, a graph the capture does not
cover, no worker for the target, any other PlanCacheError, or a plan
failing verification (UntrustedPlan, IntegrityError: such a plan is never
deserialized). Why is logged once per reason; `stats()` counts, `graphs()`
lists the latest graphs and how each was built. A program that drives the
plan list itself (select_plan, build_plan_at_index, execute_plan_at_index,
get_execution_plan_count before building ...) builds locally too.

Not `serve_frontend(client)`, which would patch the real class: see
docs/design.md, "Frontend code, one line changed".

Owns: the frontend's graph class, served by plancache.
May import: plancache.errors, plancache.spec, plancache.keys, plancache.run, plancache.transport, plancache.functional.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import cudnn as _frontend

from plancache.cudnn._capture import capture, options
from plancache.errors import PlanCacheError
from plancache.functional._service import ABOUT_THE_GRAPH, SERVICE, Once, configure, describe, reason_key
from plancache.run.plan import Plan
from plancache.spec.graph import GraphSpec

log = logging.getLogger(__name__)
_once = Once()

# The real module's names, bound here as they are there (lazy ones through __getattr__).
_LAZY = {"Graph", "wrapper"}
globals().update({name: getattr(_frontend, name) for name in getattr(_frontend, "__all__", ()) if name not in _LAZY and hasattr(_frontend, name)})


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


class _State:
    """A graph's plan calls (deferred while plancache may serve) and outcome."""

    __slots__ = ("built", "checked", "excluded_notes", "heuristics", "planned", "served", "workspace_limit")

    def __init__(self) -> None:
        self.built: Built | None = None
        self.served: Any = None
        self.planned = False
        self.checked = False
        self.heuristics: Any = None
        self.workspace_limit: int | None = None
        self.excluded_notes: list[Any] = []

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
        if s.planned:
            raise RuntimeError("create_execution_plans() was already called on this graph; planning is one-shot (the frontend's rule)")
        s.planned, s.heuristics = True, heuristics
        return None

    def check_support(self) -> None:
        s = self._plancache
        if not s.pending:
            return super().check_support()  # type: ignore[no-any-return]
        s.checked = True
        return None

    def build_plans(self, *args: Any, **kwargs: Any) -> None:
        if self._plancache_serve():
            return None
        return super().build_plans(*args, **kwargs)  # type: ignore[no-any-return]

    def build(self, heuristics: Any = None, ctx: Any = None) -> None:
        s = self._plancache
        if s.pending:
            if not self.__dict__.get("_is_validated", False):
                self.validate()
            self.build_operation_graph()
            if not s.planned:
                s.planned, s.heuristics = True, heuristics
        if self._plancache_serve():
            return None
        return super().build(heuristics, ctx)  # type: ignore[no-any-return]

    def deselect_workspace_greater_than(self, workspace_limit: int) -> Any:
        self._plancache.workspace_limit = int(workspace_limit)
        return super().deselect_workspace_greater_than(workspace_limit)

    def deselect_behavior_notes(self, notes: Any) -> Any:
        notes = list(notes)
        self._plancache.excluded_notes.extend(notes)
        return super().deselect_behavior_notes(notes)

    # ---- what runs the plan -----------------------------------------------------------

    def execute(self, tensor_dict: Any, workspace: Any = None, handle: Any = None, *args: Any, **kwargs: Any) -> None:
        s = self._plancache
        if s.pending and not self.__dict__.get("_is_built", False):
            self._plancache_serve()  # the frontend builds on a first execute; plancache is asked first
        if s.served is not None:
            return s.served.execute(self._plancache_pack(tensor_dict), workspace, handle, *args, **kwargs)  # type: ignore[no-any-return]
        return super().execute(tensor_dict, workspace, handle, *args, **kwargs)  # type: ignore[no-any-return]

    def get_workspace_size(self, *args: Any, **kwargs: Any) -> int:
        served = self._plancache.served
        return int(served.get_workspace_size(*args, **kwargs) if served is not None else super().get_workspace_size(*args, **kwargs))

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
        return served.get_behavior_notes(*args, **kwargs) if served is not None else super().get_behavior_notes(*args, **kwargs)

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

    def _plancache_serve(self) -> bool:
        """Whether plancache serves this graph (asked once; a local build replays the deferred calls)."""
        s = self._plancache
        if not s.pending:
            return s.served is not None
        if not self.__dict__.get("_is_validated", False):
            self.validate()  # the IR's inferred dims, and the program's own errors, as its build would raise them
        name, spec = self._plancache_name(), None
        # The local build runs outside the handlers: its own errors are the
        # frontend's, not chained to why plancache did not serve.
        local: tuple[str, str, bool] | None = None  # (reason, its logging key, about this graph)
        stage = "capturing the graph"
        try:
            spec = capture(self)
            stage = "asking plancache"
            plan = SERVICE.compile(spec, _current_device(), options(SERVICE.options, s.heuristics, s.workspace_limit, s.excluded_notes))
            stage = "loading the served plan"
            served = _load(self, plan)
        except PlanCacheError as e:
            local = (describe(e), reason_key(e), isinstance(e, ABOUT_THE_GRAPH))
        except Exception as e:  # e.g. a blob this frontend cannot load: the program's own build runs
            reason = f"{stage} failed: {type(e).__name__}: {e}"
            local = (reason, reason, True)
        if local is not None:
            self._plancache_local(Built(name, spec, reason=local[0]), local[1], about_the_graph=local[2])
            return False
        s.served, s.built = served, Built(name, spec, plan)
        _STATS.served += 1
        _RECENT.append(s.built)
        log.debug("plancache.cudnn: graph %r served by plan %s (%s)", name, plan.key, plan.source)
        return True

    def _plancache_local(self, built: Built, key: str, *, about_the_graph: bool) -> None:
        """Build locally from here on: the deferred plan calls are made now, in order."""
        s = self._plancache
        s.built = built
        _STATS.local += 1
        reason = built.reason or "unknown"
        _STATS.reasons[reason] = _STATS.reasons.get(reason, 0) + 1
        _RECENT.append(built)
        what = f"graph {built.name!r}" if about_the_graph else "graphs"
        _once(log, key, "plancache.cudnn: %s built locally: %s", what, reason)
        if s.planned:
            super().create_execution_plans(s.heuristics)
        if s.checked:
            super().check_support()

    def _plancache_drives(self, name: str) -> None:
        """A call that addresses the plan list itself: the program manages its
        plans (an autotuner, a pinned plan), so they are built here."""
        if self._plancache.pending:
            self._plancache_local(Built(self._plancache_name(), reason=f"the program calls {name}()"), f"drives:{name}", about_the_graph=True)


# Calls that address the ranked plan list: a graph whose program makes them
# before its build step builds locally; once served, they ask the served graph.
_PLAN_LIST_CALLS = (
    "get_execution_plan_count", "get_plan_name_at_index", "get_engine_and_knobs_at_index", "get_workspace_size_plan_at_index",
    "get_behavior_notes_for_plan_at_index", "build_plan_at_index", "execute_plan_at_index", "select_plan", "create_execution_plan",
    "deselect_engines", "select_behavior_notes", "deselect_numeric_notes", "select_numeric_notes",
)  # fmt: skip


def _plan_list_call(name: str) -> Any:
    def call(self: pygraph, *args: Any, **kwargs: Any) -> Any:
        served = self._plancache.served
        if served is not None:
            return getattr(served, name)(*args, **kwargs)
        self._plancache_drives(name)
        return getattr(super(pygraph, self), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(getattr(_frontend.pygraph, name, None), "__doc__", None)
    return call


for _name in _PLAN_LIST_CALLS:
    setattr(pygraph, _name, _plan_list_call(_name))

__all__ = [str(n) for n in getattr(_frontend, "__all__", ()) if n != "pygraph"]  # the frontend's names, as it lists them
__all__ += ["Built", "Stats", "configure", "graphs", "pygraph", "stats"]

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

This module is the namespace only: the graph class is cudnn/_graph.py,
what serves a graph (its plan fetched, raced, loaded or built locally)
cudnn/_serving.py, the plan calls it defers cudnn/_plan_calls.py, and how
each graph was built, with the counts `stats()` and `graphs()` read,
cudnn/_built.py.

Not `serve_frontend(client)`, which would patch the real class: see
docs/design.md, "Frontend code, one line changed".

Owns: the frontend's graph class, served by plancache.
May import: plancache.errors, plancache.graphspec, plancache.keys, plancache.run, plancache.transport,
plancache.wire, plancache.frontdoors, plancache.frontend_graph.
"""

from __future__ import annotations

from typing import Any

import cudnn as _frontend

from plancache.cudnn._built import Built, Stats, graphs, stats
from plancache.cudnn._graph import pygraph
from plancache.frontdoors.service import configure

# The real module's names, bound here as they are there (lazy ones through __getattr__), but for ours.
_LAZY = {"Graph", "wrapper"}
_OURS = {"Built", "Stats", "configure", "graphs", "pygraph", "stats"}
globals().update(
    {
        name: getattr(_frontend, name)
        for name in getattr(_frontend, "__all__", ())
        if name not in _LAZY and name not in _OURS and hasattr(_frontend, name)
    }
)


def __getattr__(name: str) -> Any:
    return getattr(_frontend, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_frontend)))


__all__ = [
    str(n) for n in getattr(_frontend, "__all__", ()) if n != "pygraph"
]  # the frontend's names, as it lists them
__all__ += ["Built", "Stats", "configure", "graphs", "pygraph", "stats"]

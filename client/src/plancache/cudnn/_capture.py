"""What plancache is asked for a program's pygraph: its spec, options and device.

The spec is `GraphSpec.from_pygraph` (plancache.graphspec.interop), normalized,
and then proven: the frontend graph rebuilt from it (plancache.frontend_graph,
the code every worker builds plans with) is compared with the program's,
field by field, as cuDNN would receive them. A capture that differs
anywhere is refused naming the difference (SpecError: the graph builds
locally), so a plan is never served for a graph other than the one the
program declared, even for an attribute a newer frontend adds. The proof
comes before any plan of the service's runs, not before it is asked for:
a hedged miss that the program's own build wins proves its graph when the
service's plan is about to take over (plancache.cudnn._serving), so that
a first node's build step does not pay for it (issue 41: 0.2-0.4 ms of a
graph's 1.2-1.8 ms on the CPU machine, ~0.3 ms on an H100, GPU run 47).

The uids are the IR's own: it gives every tensor one when the tensor is made
(from 1, in creation order, skipping those a program sets; 0 too when a
program sets it), so the plan's uids are those of the tensor objects the
program passes to execute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plancache.errors import SpecError
from plancache.frontend_graph import build_pygraph, differences
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.validation import normalize
from plancache.keys.options import HEURISTIC_MODES, CompileOptions


def capture(graph: Any, frontend: Any) -> GraphSpec:
    """The normalized spec of `graph`, proven to rebuild into it (SpecError naming what has no form or differs)."""
    spec = read(graph)
    prove(graph, spec, frontend)
    return spec


def read(graph: Any) -> GraphSpec:
    """The normalized spec of `graph`, not yet proven: enough to key it and ask for its plan, never to run a plan
    (`prove` first). A hedged miss the program's own build wins proves it when the service's plan is about to take
    over (plancache.cudnn._serving): most of a first node's graphs never pay for the proof inside their build."""
    return normalize(GraphSpec.from_pygraph(graph), owned=True)  # a spec made here: normalized in place


def prove(graph: Any, spec: GraphSpec, frontend: Any) -> None:
    """SpecError naming the first difference unless the frontend graph rebuilt from `spec` is the program's `graph`."""
    # The rebuilt graph is compared, never built: it may hold the program's own kernel cache.
    rebuilt = build_pygraph(
        spec, frontend, kernel_cache=graph.__dict__.get("_cpp_graph_kwargs", {}).get("kernel_cache")
    )
    found = differences(graph, rebuilt)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise SpecError(f"the spec plancache captured differs from the program's graph: {found[0]}{more}")


def _names(values: Sequence[Any], what: str) -> tuple[str, ...]:
    names = []
    for v in values:
        name = getattr(v, "name", None)
        if not isinstance(name, str):
            raise SpecError(f"{what} {v!r} has no name plancache knows")
        names.append(name)
    return tuple(names)


def options(
    base: CompileOptions | None,
    heuristics: Sequence[Any] | None,
    workspace_limit: int | None,
    excluded_notes: Sequence[Any],
) -> CompileOptions:
    """The CompileOptions of the plan calls the program made: its heuristic
    modes (create_execution_plans / build), its workspace limit and the
    behavior notes it deselects; the rest from `base` (configure's)."""
    start = base or CompileOptions()
    modes = _names(heuristics, "heuristic mode") if heuristics else start.heuristic_modes
    unknown = [m for m in modes if m.upper() not in HEURISTIC_MODES]
    if unknown:
        raise SpecError(
            f"heuristic modes {', '.join(unknown)}: plancache's workers rank with {', '.join(HEURISTIC_MODES)}"
        )
    notes = tuple(sorted({*start.excluded_behavior_notes, *_names(excluded_notes, "behavior note")}))
    limit = workspace_limit if workspace_limit is not None else start.workspace_limit
    return CompileOptions(
        autotune=start.autotune, heuristic_modes=modes, workspace_limit=limit, excluded_behavior_notes=notes
    )


def current_device() -> int:
    """The GPU the program's graph is for: torch's current device (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.current_device()) if torch.cuda.is_available() else 0

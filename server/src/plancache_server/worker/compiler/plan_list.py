"""What the frontend says of each entry of a graph's plan list.

`describe` reads each entry's name, engine, knobs and behavior notes: the
records plancache.cudnn answers a program's plan-list queries from. The
list itself is made by plancache.frontend_graph.plan_list (shared with a
node's own build).

Torch-free: the frontend module is passed in, so this is tested on the CPU
against a recorder.
"""

from __future__ import annotations

from typing import Any

from plancache_server.worker.compiler.base import CandidateResult


def describe(g: Any, index: int) -> CandidateResult:
    """What the frontend says of entry `index` before anything is built (unknown parts left empty)."""
    name, engine_id, knobs, notes = f"plan {index}", -1, {}, tuple[str, ...]()
    try:
        name = str(g.get_plan_name_at_index(index))
    except Exception:  # a plan the frontend cannot name (an error or a delegate)
        pass
    try:
        engine, found = g.get_engine_and_knobs_at_index(index)
        engine_id, knobs = int(engine), {getattr(k, "name", str(k)): int(v) for k, v in (found or {}).items()}
    except Exception:
        pass
    try:
        notes = tuple(sorted(str(getattr(n, "name", n)) for n in g.get_behavior_notes_for_plan_at_index(index)))
    except Exception:
        pass
    return CandidateResult(index, name, engine_id, None, knobs=knobs, behavior_notes=notes)

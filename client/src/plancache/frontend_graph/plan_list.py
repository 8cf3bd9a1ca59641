"""A graph's plan list as the program would have made it.

`make_plan_list` validates the graph and replays, in the program's order,
the plan-list calls its options carry (plancache.cudnn records them): the
heuristics' plans (unless the program pinned plans alone), the engines and
notes it deselected or selected, the plans it pinned by engine and knobs,
the plan it selected. `resolved_geometry` reads the dims and strides cuDNN
gave the tensors a spec leaves to it. The worker builds from this list, and
so does a node's own build of a hedged miss (plancache.run.local): both
start where the program's build would.

Torch-free: the frontend module is passed in, so this is tested on the CPU
against a recorder.
"""

from __future__ import annotations

import logging
from typing import Any

from plancache.errors import CompileFailed
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions

log = logging.getLogger(__name__)


def make_plan_list(g: Any, cudnn: Any, options: CompileOptions, where: str) -> None:
    """Validate `g` and build its plan list; CompileFailed with cuDNN's reason."""
    try:
        g.validate()
        g.build_operation_graph()
        if not options.pinned_only:
            g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in options.heuristic_modes])
        if options.deselected_engines:
            g.deselect_engines(list(options.deselected_engines))
        for f in options.note_filters:
            notes = [getattr(cudnn.behavior_note if f.kind == "behavior" else cudnn.numerical_note, n) for n in f.notes]
            getattr(g, f"{'select' if f.keep else 'deselect'}_{f.kind}_notes")(notes)
        if options.excluded_behavior_notes:
            g.deselect_behavior_notes([getattr(cudnn.behavior_note, n) for n in options.excluded_behavior_notes])
        if options.workspace_limit:
            g.deselect_workspace_greater_than(options.workspace_limit)
        for plan in options.pinned_plans:
            try:
                g.create_execution_plan(plan.engine_id, {getattr(cudnn.knob_type, k): v for k, v in plan.knobs})
            except Exception as e:  # the program's own loop skips an engine that refuses its knobs: so does this
                log.debug("pinned plan (engine %d, knobs %s) refused: %s", plan.engine_id, plan.knobs, e)
        if options.selected_plan is not None:
            g.select_plan(options.selected_plan)
        g.check_support()
    except Exception as e:  # cuDNN's reason is the message the user needs
        raise CompileFailed(f"cuDNN does not support this graph on {where}: {e}") from e
    if g.get_execution_plan_count() == 0:
        raise CompileFailed(f"cuDNN offers no execution plan for this graph on {where}")


def first_index(options: CompileOptions) -> int:
    """Where the program's build would start in its list: its selected plan, else the first."""
    return options.selected_plan if options.selected_plan is not None else 0


def resolved_geometry(g: Any, spec: GraphSpec) -> dict[int, tuple[list[int], list[int]]]:
    """uid -> (dims, strides) cuDNN gave each bound tensor whose dims or strides the spec leaves to it
    (read after build_operation_graph, which writes the backend's layout back into the frontend's graph)."""
    found: dict[int, tuple[list[int], list[int]]] = {}
    for t in spec.tensors:
        if t.is_virtual or (t.dim and t.stride) or t.uid is None:
            continue
        ir = g.find_tensor(t.uid)
        if ir is not None and ir.dim and ir.stride:
            found[t.uid] = ([int(d) for d in ir.dim], [int(s) for s in ir.stride])
    return found

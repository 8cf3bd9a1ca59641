"""What plancache is asked for a program's pygraph: its spec and options.

The spec is `GraphSpec.from_pygraph` (plancache.spec.interop) with what the
frontend's IR records in spellings the catalog does not use:

- `sdpa(..., is_inference=...)`: the classic switch for the softmax stats,
  stored by the IR as a param; the catalog's is `generate_stats` (the IR's
  own rule: stats when generate_stats says so, else when not is_inference);
- data types given as torch dtypes (`data_type=x.dtype`, which the IR keeps
  as given and converts only when it lowers): the catalog's names.

A tensor made with `tensor_scalar` keeps its value inside the graph, which a
spec has no form for (a spec's scalars are bound at execute): SpecError, so
the graph builds locally.

The uids are the IR's own: it gives every tensor one when the tensor is made
(from 1, in creation order, skipping those a program sets), so the plan's
uids are those of the tensor objects the program passes to execute.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from plancache.errors import SpecError
from plancache.functional._geometry import dtype_name
from plancache.keys.options import HEURISTIC_MODES, CompileOptions
from plancache.spec.graph import GraphSpec
from plancache.spec.validation import normalize

_STATS_OPS = ("sdpa", "sdpa_fp8")


def _ir_tensors(graph: Any) -> Iterator[Any]:
    for node in graph.nodes:
        yield from (t for t in node.inputs.values() if t is not None)
        yield from (t for t in node.outputs.values() if t is not None)


def _data_type(value: Any) -> str | None:
    """A data type as the IR holds it (a cudnn.data_type, or a torch dtype) in plancache's spelling."""
    if value is None or getattr(value, "name", None) == "NOT_SET":
        return None
    if hasattr(value, "name") and not str(value).startswith("torch."):
        return str(value.name).lower()
    return dtype_name(value)


def capture(graph: Any) -> GraphSpec:
    """The normalized-checked spec of `graph` (SpecError naming what has no form)."""
    for t in _ir_tensors(graph):
        if getattr(t, "pass_by_value", None) is not None:
            raise SpecError(f"tensor {t.name!r} holds its value in the graph (tensor_scalar): a spec binds scalars at execute")
    spec = GraphSpec.from_pygraph(graph)
    context = getattr(graph, "_context", None)
    for field in ("io_data_type", "intermediate_data_type", "compute_data_type"):
        raw = getattr(context, field, None)
        if getattr(spec, field) is None and raw is not None:
            setattr(spec, field, _data_type(raw))
    by_uid = {t.uid: t for t in _ir_tensors(graph)}
    for t in spec.tensors:
        source = by_uid.get(t.uid)
        if t.data_type is None and source is not None:
            t.data_type = _data_type(getattr(source, "data_type", None))
    for node, ir_node in zip(spec.nodes, graph.nodes, strict=True):
        if node.compute_data_type is None:
            node.compute_data_type = _data_type(getattr(ir_node, "compute_data_type", None))
        if node.op in _STATS_OPS and "is_inference" in node.attributes:
            inference = node.attributes.pop("is_inference")
            node.attributes.setdefault("generate_stats", not inference)
    normalize(spec)  # refused here, naming the node, rather than by the server
    return spec


def _names(values: Sequence[Any], what: str) -> tuple[str, ...]:
    names = []
    for v in values:
        name = getattr(v, "name", None)
        if not isinstance(name, str):
            raise SpecError(f"{what} {v!r} has no name plancache knows")
        names.append(name)
    return tuple(names)


def options(base: CompileOptions | None, heuristics: Sequence[Any] | None, workspace_limit: int | None, excluded_notes: Sequence[Any]) -> CompileOptions:
    """The CompileOptions of the plan calls the program made: its heuristic
    modes (create_execution_plans / build), its workspace limit and the
    behavior notes it deselects; the rest from `base` (configure's)."""
    start = base or CompileOptions()
    modes = _names(heuristics, "heuristic mode") if heuristics else start.heuristic_modes
    unknown = [m for m in modes if m.upper() not in HEURISTIC_MODES]
    if unknown:
        raise SpecError(f"heuristic modes {', '.join(unknown)}: plancache's workers rank with {', '.join(HEURISTIC_MODES)}")
    notes = tuple(sorted({*start.excluded_behavior_notes, *_names(excluded_notes, "behavior note")}))
    limit = workspace_limit if workspace_limit is not None else start.workspace_limit
    return CompileOptions(autotune=start.autotune, heuristic_modes=modes, workspace_limit=limit, excluded_behavior_notes=notes)

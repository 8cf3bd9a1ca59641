"""Two frontend graphs compared as cuDNN would receive them.

`differences(program, rebuilt)` lists, as readable paths, every way the
graph a spec rebuilds into (plancache.frontend_graph.build) differs from the
program's own, in what the frontend lowers to cuDNN: the graph's
constructor arguments and data types (resolved as the lowering resolves
them), each node's type, compute type, ports and parameters, each tensor's
uid (a tensor the caller binds), data type, flags, ragged offsets,
reordering, alignment, held value and, where the frontend sends them, dims
and strides. Every other attribute of the frontend's tensor is compared as
is, so one a future frontend adds is a difference until plancache knows it.
Names are labels, and intermediates' uids are never bound: both are left
out (intermediates are matched by where they appear).

Two things the spec writes out that the program may have left to the
frontend are not differences: a classic op's result dims and strides
(plancache's layout rules give cuDNN's own, checked on the GPU) and the
catalog's default attribute values (sdpa's use_causal_mask=False, a
convolution's zero padding ...), which mean what leaving them out means.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

from plancache.errors import SpecError
from plancache.graphspec.interop import data_type, trace_callback
from plancache.graphspec.ops import CATALOG, OpSchema
from plancache.graphspec.rules import present

# Tensor attributes compared by their own rules below (or never: labels, and the IR's bookkeeping).
_HANDLED = {
    "name",
    "owner",
    "uid",
    "uid_assigned",
    "dim",
    "stride",
    "dim_assigned",
    "stride_assigned",
    "data_type",
    "ragged_offset",
}
_SDPA_STATS = {"SDPA", "SDPA_FP8", "SDPA_MXFP8"}
_MISSING = object()


def differences(program: Any, rebuilt: Any) -> list[str]:
    """Where `rebuilt` differs from `program` (empty: the same graph to cuDNN)."""
    found: list[str] = []
    a, b = _View(program), _View(rebuilt)
    for key in sorted(set(a.graph) | set(b.graph)):
        if a.graph.get(key) != b.graph.get(key):
            found.append(f"graph {key}: the program's {a.graph.get(key)!r}, the spec's {b.graph.get(key)!r}")
    if len(a.nodes) != len(b.nodes):
        return [*found, f"the program has {len(a.nodes)} nodes, the spec {len(b.nodes)}"]
    for index, (na, nb) in enumerate(zip(a.nodes, b.nodes, strict=True)):
        found += [f"node {index} ({na.name}): {d}" for d in _node_differences(a, b, na, nb)]
    for ref in a.order:
        if ref not in b.tensors:
            found.append(f"tensor {a.label(ref)}: not in the spec's graph")
            continue
        found += [f"tensor {a.label(ref)}: {d}" for d in _tensor_differences(a, b, ref)]
    found += [f"tensor {b.label(ref)}: not in the program's graph" for ref in b.order if ref not in a.tensors]
    return found


class _View:
    """A graph's tensors keyed the same way on both sides: a bound tensor by
    its uid, an intermediate by its order of first appearance."""

    def __init__(self, graph: Any) -> None:
        self.graph_obj = graph
        context = graph._context
        self.io = data_type(context.io_data_type, "io_data_type")
        self.intermediate = data_type(context.intermediate_data_type, "intermediate_data_type") or "float"
        self.compute = data_type(context.compute_data_type, "compute_data_type") or "float"
        kwargs = {k: _plain(v) for k, v in graph._cpp_graph_kwargs.items() if k not in ("name", "handle")}
        if "kernel_cache" in kwargs:
            kwargs["kernel_cache"] = True  # an object of the program's: that one is given is what the graph says
        self.graph: dict[str, Any] = {
            "io_data_type": self.io,
            "intermediate_data_type": self.intermediate,
            "compute_data_type": self.compute,
            **kwargs,
        }
        self.graph["is_cuda_graph_replay_expected"] = bool(getattr(graph, "is_cuda_graph_replay_expected", False))
        self.nodes = list(graph.nodes)
        self.tensors: dict[Any, Any] = {}
        # Each tensor's ref by the object's identity (the objects live in self.tensors as long as the view): a
        # scan of self.tensors per lookup made the comparison quadratic in a graph's tensors (issue 41).
        self._refs: dict[int, Any] = {}
        self.order: list[Any] = []
        self.producer: dict[Any, tuple[OpSchema, str]] = {}
        virtual = 0
        for node in self.nodes:
            for t in [*node.inputs.values(), *node.outputs.values()]:
                if t is None or id(t) in self._refs:
                    continue
                ref: Any = ("v", virtual) if t.is_virtual else ("uid", int(t.uid))
                virtual += 1 if t.is_virtual else 0
                self._add(ref, t)
            schema = _schema(node)
            for port, t in node.outputs.items():
                if t is not None and schema is not None:
                    self.producer[self.ref(t)] = (schema, port)
        for node in self.nodes:  # tensors only a callback reads (a score modifier's scalars and lengths)
            for value in node.params.values():
                if callable(value) and not isinstance(value, type):
                    for t in _callback_tensors(value):
                        if self.ref(t) is None:
                            self._add(("uid", int(t.uid)), t)
        for ref in list(self.order):  # ragged offsets that no node uses
            offsets = getattr(self.tensors[ref], "ragged_offset", None)
            if offsets is not None and self.ref(offsets) is None:
                self._add(("uid", int(offsets.uid)), offsets)

    def _add(self, ref: Any, t: Any) -> None:
        """`t` under `ref`. A ref met again (two tensor objects with one uid) names the latest, and the earlier
        object has no ref any more, as when refs were found by scanning self.tensors."""
        replaced = self.tensors.get(ref)
        if replaced is not None:
            self._refs.pop(id(replaced), None)
        self.tensors[ref] = t
        self._refs[id(t)] = ref
        self.order.append(ref)

    def ref(self, t: Any) -> Any:
        return self._refs.get(id(t))

    def label(self, ref: Any) -> str:
        t = self.tensors[ref]
        return f"{t.name!r} (uid {t.uid})" if ref[0] == "uid" else f"{t.name!r} (an intermediate)"

    def data_type(self, t: Any) -> str | None:
        """The data type the lowering gives the tensor (the IR's inference for one left unset)."""
        found = data_type(t.data_type, f"tensor {t.name!r}")
        if found is not None or getattr(t, "pass_by_value", None) is not None:
            return found
        producer = self.producer.get(self.ref(t))
        if producer is not None and producer[0].node_type in _SDPA_STATS and producer[1] == "Stats":
            return "float"
        return self.intermediate if t.is_virtual else self.io


def _callback_tensors(callback: Any) -> list[Any]:
    """The graph's tensors a callback reads, found by tracing it."""
    found: list[Any] = []

    def uid_of(t: Any) -> int | None:
        if hasattr(t, "uid") and hasattr(t, "dim"):
            found.append(t)
            return int(t.uid)
        return None

    try:
        trace_callback(callback, "a callback", uid_of)
    except SpecError:
        return []
    return found


# The first catalog op of each frontend node type (pointwise ops are told apart by their mode), indexed once: a
# scan of the catalog per node read the node's type through a Python enum property once per op (bench/capture_cost.py).
_FIRST_SCHEMA_OF_NODE_TYPE: dict[str, OpSchema] = {}
for _op in CATALOG.values():
    if _op.node_type:
        _FIRST_SCHEMA_OF_NODE_TYPE.setdefault(_op.node_type, _op)


def _schema(node: Any) -> OpSchema | None:
    node_type = node.node_type.name
    if node_type == "POINTWISE":
        return CATALOG.get(str(node.params.get("mode")))
    return _FIRST_SCHEMA_OF_NODE_TYPE.get(node_type)


def _plain(value: Any) -> Any:
    """A parameter as comparable data: enums by name, slices as triples, sequences as tuples,
    a callback as the ops it adds."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, slice):
        return ("slice", value.start, value.stop, value.step)
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(type(value), "__members__") and hasattr(value, "name"):
        return str(value.name)
    if callable(value):
        try:  # what it would add to cuDNN's graph, with the graph's tensors by uid
            return trace_callback(
                value, "a callback", lambda t: int(t.uid) if hasattr(t, "uid") and hasattr(t, "dim") else None
            ).to_plain(names=False)
        except SpecError as e:
            return ("untraceable callback", str(e))
    return ("object", type(value).__qualname__)


def _params(node: Any, view: _View) -> dict[str, Any]:
    params = {
        k: (view.ref(v) if hasattr(v, "uid") and hasattr(v, "dim") else _plain(v))
        for k, v in node.params.items()
        if v is not None
    }
    if (
        node.node_type.name in _SDPA_STATS
    ):  # the frontend's one rule for the stats: generate_stats, else not is_inference
        params["generate_stats"] = present({"stats": True}, params, set())
        params.pop("is_inference", None)
    return params


def _node_differences(a: _View, b: _View, na: Any, nb: Any) -> Iterator[str]:
    if na.node_type.name != nb.node_type.name:
        yield f"node type {na.node_type.name} against {nb.node_type.name}"
        return
    schema = _schema(na)
    if schema is None or schema.takes_compute_type:
        ca, cb = (
            data_type(na.compute_data_type, "compute") or a.compute,
            data_type(nb.compute_data_type, "compute") or b.compute,
        )
        if ca != cb:
            yield f"compute data type {ca} against {cb}"
    for side, xa, xb in (("input", na.inputs, nb.inputs), ("output", na.outputs, nb.outputs)):
        ports_a = {p: a.ref(t) for p, t in xa.items() if t is not None}
        ports_b = {p: b.ref(t) for p, t in xb.items() if t is not None}
        if ports_a != ports_b:
            yield f"{side}s {_describe(a, ports_a)} against {_describe(b, ports_b)}"
    pa, pb = _params(na, a), _params(nb, b)
    for key in sorted(set(pa) | set(pb)):
        va, vb = pa.get(key, _MISSING), pb.get(key, _MISSING)
        if va == vb or (va is _MISSING and schema is not None and _is_default(schema, na, key, vb)):
            continue
        yield f"parameter {key!r}: the program's {_shown(va)}, the spec's {_shown(vb)}"


def _is_default(schema: OpSchema, node: Any, key: str, value: Any) -> bool:
    """Whether a value the spec writes out means what leaving it out means (the catalog's defaults)."""
    attr = schema.attributes.get(key)
    if attr is not None and attr.default is not None and value == _plain(attr.default):
        return True
    if schema.complete is not None:
        filled: dict[str, Any] = {}
        schema.complete({p: tuple(t.dim) for p, t in node.inputs.items() if t is not None and t.dim}, filled)
        return key in filled and _plain(filled[key]) == value
    return False


def _tensor_differences(a: _View, b: _View, ref: Any) -> Iterator[str]:
    ta, tb = a.tensors[ref], b.tensors[ref]
    if ref[0] == "uid" and int(ta.uid) != int(tb.uid):
        yield f"uid {ta.uid} against {tb.uid}"
    da, db = a.data_type(ta), b.data_type(tb)
    if da != db:
        yield f"data type {da} against {db}"
    oa, ob = getattr(ta, "ragged_offset", None), getattr(tb, "ragged_offset", None)
    if (None if oa is None else a.ref(oa)) != (None if ob is None else b.ref(ob)):
        yield "ragged offsets differ"
    yield from _geometry_differences(a, b, ref)
    for name in _compared_fields(type(ta)):
        va, vb = _plain(getattr(ta, name, None)), _plain(getattr(tb, name, None))
        if va != vb and not (name == "pass_by_value" and _same_number(va, vb)):
            yield f"{name} {va!r} against {vb!r}"


_COMPARED_FIELDS: dict[type, tuple[str, ...]] = {}


def _compared_fields(kind: type) -> tuple[str, ...]:
    """The frontend tensor class's fields compared as they are (not _HANDLED), read once per class."""
    found = _COMPARED_FIELDS.get(kind)
    if found is None:
        found = _COMPARED_FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind) if f.name not in _HANDLED)
    return found


def _same_number(x: Any, y: Any) -> bool:
    """A held scalar: equal, and of the same kind (cuDNN lowers an int and a float apart)."""
    return type(x) is type(y) and (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)))


def _geometry_differences(a: _View, b: _View, ref: Any) -> Iterator[str]:
    """Dims and strides where the frontend sends them to cuDNN (see the module docstring)."""
    ta, tb = a.tensors[ref], b.tensors[ref]
    producer = a.producer.get(ref)
    if producer is None or producer[1] in producer[0].optional_outputs:  # a tensor the program made: sent as made
        for name in ("dim", "stride"):
            if tuple(getattr(ta, name) or ()) != tuple(getattr(tb, name) or ()):
                yield f"{name} {list(getattr(ta, name) or ())} against {list(getattr(tb, name) or ())}"
        return
    schema = producer[0]
    for name, always in (("dim", schema.pushes_output_dims), ("stride", schema.pushes_output_strides)):
        sent_a = bool(getattr(ta, f"{name}_assigned", False)) or always
        sent_b = bool(getattr(tb, f"{name}_assigned", False)) or always
        va, vb = tuple(getattr(ta, name) or ()), tuple(getattr(tb, name) or ())
        if sent_a and (not sent_b or va != vb):
            yield f"{name} {list(va)} (the program sets it) against {list(vb) if sent_b else 'none'}"
        elif sent_b and not sent_a and schema.derived:
            yield f"{name} {list(vb)} set by the spec, left to cuDNN by the program"


def _describe(view: _View, ports: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{p}: {view.label(r) if r is not None else '?'}" for p, r in sorted(ports.items())) + "}"


def _shown(value: Any) -> str:
    return "none" if value is _MISSING else repr(value)

"""From an existing cuDNN frontend graph to a GraphSpec, so code that builds
`cudnn.pygraph`s compiles through plancache with one line:

    spec = GraphSpec.from_pygraph(g)      # g: a cudnn.pygraph, built or not
    plan = client.compile(spec)

Reads the frontend's (1.32) graph IR, every part of it that reaches cuDNN:
the graph's constructor arguments and data types; each node's type, ports,
parameters and compute type; each tensor's uid, dims, strides, data type,
flags, ragged offsets and their unit, reordering, alignment, and a scalar's
value held in the graph. A callback (the SDPA's score_mod) is recorded as
the ops it adds (plancache.graphspec.subgraph). Nothing is approximated: what has
no spec form (a callback doing more than adding pointwise ops, a graph
built for a device property, an argument this version does not know) is
refused with SpecError naming it.
plancache.cudnn also rebuilds the frontend graph from the spec and compares
the two, field by field, before it asks for a plan.

A node's result keeps the dims and strides the frontend would send to cuDNN:
for the classic catalog's ops the dims (their rules check them) and the
strides the program set (the rest is inferred again the frontend's way);
for the others what the frontend lowers: dims and strides the program set,
and every dim and stride of the SDPA family's and of ops whose dims cuDNN
cannot infer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec.frontend_ops import DROPOUT_MASK, DROPOUT_PHILOX
from plancache.graphspec.graph import _TORCH_DTYPES, GraphSpec, Node, Tensor
from plancache.graphspec.ops import CATALOG, OpSchema
from plancache.graphspec.subgraph import Subgraph, trace

# Frontend node types -> catalog ops (pointwise nodes carry their op in params["mode"]).
_BY_NODE_TYPE: dict[str, str] = {
    s.node_type: name for name, s in CATALOG.items() if s.node_type and s.node_type != "POINTWISE"
}
# pygraph constructor arguments that are not graph content (the frontend's own serializer leaves them out too).
_NOT_CONTENT = {"name", "handle"}


# Each data type value met, by its type and value, and its spelling: a graph's capture reads ~30 of them (each
# tensor's, the graph's, each node's compute type), each a Python enum's `name` property and a normalization
# (bench/capture_cost.py). Only what read without error is kept; a value of a new type is read afresh.
_DATA_TYPES: dict[tuple[type, Any], str | None] = {}


def data_type(value: Any, where: str) -> str | None:
    """A data type as the IR holds it (a cudnn.data_type, or a torch dtype) in plancache's spelling."""
    try:
        return _DATA_TYPES[(type(value), value)]
    except (KeyError, TypeError):  # not met yet, or unhashable (read below, where it is refused)
        pass
    found = _read_data_type(value, where)
    if len(_DATA_TYPES) < 256:  # the enum's members and torch's dtypes: a few dozen
        try:
            _DATA_TYPES[(type(value), value)] = found
        except TypeError:
            pass
    return found


def _read_data_type(value: Any, where: str) -> str | None:
    if value is None or getattr(value, "name", None) == "NOT_SET":
        return None
    text = str(value)
    if text.startswith("torch."):
        name = _TORCH_DTYPES.get(text)
        if name is None:
            raise SpecError(f"{where}: torch data type {text} has no cuDNN equivalent plancache knows")
        return name
    member = getattr(value, "name", None)
    if not isinstance(member, str):
        raise SpecError(f"{where}: data type {value!r} is not a cudnn.data_type")
    return dtypes.normalize(member.lower(), where)


def _value(value: Any, where: str) -> Any:
    """A parameter as a spec attribute: enums by member name, lists as tuples, slices as (start, stop, step)."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum) or (hasattr(type(value), "__members__") and hasattr(value, "name")):
        return str(value.name)
    if isinstance(value, slice):
        return (value.start, value.stop, value.step)
    if isinstance(value, list | tuple):
        return tuple(_value(v, where) for v in value)
    if callable(value):
        raise SpecError(f"{where} is Python code (a callback) this parameter cannot carry")
    raise SpecError(f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, which has no spec form")


def pointwise_ports(op: str) -> tuple[str, ...] | None:
    """A pointwise mode's ports, in its method's order (None: not a pointwise op)."""
    schema = CATALOG.get(op)
    return schema.inputs if schema is not None and schema.family == "pointwise" else None


def trace_callback(callback: Any, where: str, uid_of: Any) -> Subgraph:
    """What a program's callback adds to the graph (plancache.graphspec.subgraph.trace), with the
    frontend's spellings."""
    return trace(
        callback,
        where,
        ports=pointwise_ports,
        uid_of=uid_of,
        data_type=lambda v: data_type(v, where),
        plain=lambda v: _value(v, where),
    )


def _graph_arguments(graph: Any, spec: GraphSpec) -> None:
    kwargs: Mapping[str, Any] = getattr(graph, "_cpp_graph_kwargs", {}) or {}
    for key, value in kwargs.items():
        if key in _NOT_CONTENT:
            continue
        if key == "device_property":
            raise SpecError(
                "graph: built for a device_property (deviceless AOT): "
                "plancache builds for the target GPU, so it has no spec form"
            )
        if key == "kernel_cache":
            spec.kernel_cache = value is not None
        elif key in ("sm_count", "sm_version"):
            setattr(spec, key, int(value))
        elif key in ("is_dynamic_shape_enabled", "is_override_shape_enabled"):
            setattr(spec, key, bool(value))
        elif key == "cuda_graph_retention":
            spec.cuda_graph_retention = str(_value(value, "graph: cuda_graph_retention"))
        else:
            raise SpecError(f"graph: constructor argument {key!r} has no spec form in this plancache")
    spec.is_cuda_graph_replay_expected = bool(getattr(graph, "is_cuda_graph_replay_expected", False))


def _dropout(params: dict[str, Any], inputs: dict[str, Any], where: str) -> None:
    """The IR keeps dropout=(...) flattened (param _dropout_n, and dropout_<i>
    params or inputs): the catalog's ports and attribute."""
    count = params.pop("_dropout_n", None)
    if count is None:
        return
    if count == 3 and "dropout_0" in params and "dropout_1" in inputs and "dropout_2" in inputs:
        params["dropout_probability"] = float(params.pop("dropout_0"))
        inputs[DROPOUT_PHILOX[0]], inputs[DROPOUT_PHILOX[1]] = inputs.pop("dropout_1"), inputs.pop("dropout_2")
    elif count == 2 and "dropout_0" in inputs and "dropout_1" in inputs:
        inputs[DROPOUT_MASK[0]], inputs[DROPOUT_MASK[1]] = inputs.pop("dropout_0"), inputs.pop("dropout_1")
    else:
        raise SpecError(
            f"{where}: dropout must be (probability, seed tensor, offset tensor) or (mask tensor, scale tensor)"
        )


class _Capture:
    """One graph's tensors, made once each."""

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec
        self.made: dict[int, Tensor] = {}

    def tensor(self, t: Any, *, keep_dims: bool = True, keep_stride: bool = True) -> Tensor:
        if id(t) in self.made:
            return self.made[id(t)]
        where = f"tensor {t.name!r}"
        constant = getattr(t, "pass_by_value", None)
        if isinstance(constant, bool):
            raise SpecError(f"{where}: a boolean held in the graph has no spec form")
        made = Tensor(
            uid=int(t.uid),
            name=str(t.name or ""),
            dim=tuple(int(d) for d in (t.dim or ())) if keep_dims else (),
            stride=tuple(int(s) for s in (t.stride or ())) if keep_stride else (),
            data_type=data_type(t.data_type, where),
            is_virtual=bool(t.is_virtual),
            is_pass_by_value=bool(t.is_pass_by_value),
            reordering_type=_value(t.reordering_type, f"{where} reordering_type")
            if getattr(t, "reordering_type", None) is not None
            else None,
            ragged_offset_multiplier=int(getattr(t, "ragged_offset_multiplier", 1) or 1),
            alignment_value=int(getattr(t, "alignment_value", 1) or 1),
            constant=constant,
            scalar_type=_value(t.scalar_type, f"{where} scalar_type")
            if getattr(t, "scalar_type", None) is not None
            else None,
        )
        self.made[id(t)] = made
        self.spec.tensors.append(made)
        offsets = getattr(t, "ragged_offset", None)
        if offsets is not None:
            made.ragged_offset = self.tensor(offsets)
        return made

    def uid_of(self, t: Any) -> int | None:
        """A tensor of the program's graph a callback reads: made part of the spec (the caller binds it)."""
        if not (hasattr(t, "uid") and hasattr(t, "dim") and hasattr(t, "is_virtual")):
            return None
        return self.tensor(t).uid

    def result(self, t: Any, schema: OpSchema, port: str) -> Tensor:
        """A node's result, with the dims and strides the frontend sends to cuDNN (see the module docstring)."""
        if (
            port in schema.optional_outputs
        ):  # a tensor the caller made and handed over (dBias=, score_max=...): lowered as made
            made = self.tensor(t)
        elif not schema.derived:
            made = self.tensor(t, keep_stride=bool(t.stride_assigned))
        else:
            made = self.tensor(
                t,
                keep_dims=bool(t.dim_assigned or schema.pushes_output_dims),
                keep_stride=bool(t.stride_assigned or schema.pushes_output_strides),
            )
        made.is_output = not made.is_virtual
        return made


def _op_of(node: Any, index: int) -> tuple[str, OpSchema]:
    kind = node.node_type.name
    op = str(node.params.get("mode")) if kind == "POINTWISE" else _BY_NODE_TYPE.get(kind)
    schema = CATALOG.get(op) if op is not None else None
    if op is None or schema is None:
        raise SpecError(
            f"node {index} ({node.name}): frontend node type {kind}{f' mode {op}' if op else ''} has no plancache op"
        )
    return op, schema


def from_pygraph(graph: Any) -> GraphSpec:
    context = getattr(graph, "_context", None)
    spec = GraphSpec(
        io_data_type=data_type(getattr(context, "io_data_type", None), "graph io_data_type"),
        intermediate_data_type=data_type(
            getattr(context, "intermediate_data_type", None), "graph intermediate_data_type"
        )
        or "float",
        compute_data_type=data_type(getattr(context, "compute_data_type", None), "graph compute_data_type") or "float",
    )
    _graph_arguments(graph, spec)
    spec.name = str((getattr(graph, "_cpp_graph_kwargs", {}) or {}).get("name", "") or "")  # a label, as every name
    capture = _Capture(spec)
    for index, node in enumerate(graph.nodes):
        where = f"node {index} ({node.name})"
        op, schema = _op_of(node, index)
        params = {
            k: v
            for k, v in dict(node.params).items()
            if v is not None and not (k.startswith("_n_") and schema.list_inputs)
        }
        if node.node_type.name == "POINTWISE":
            params.pop("mode")
        inputs = dict(node.inputs)
        if (
            node.node_type.name == "POINTWISE"
        ):  # the IR names pointwise ports IN_0, IN_1: the method's keywords, in order
            inputs = {schema.inputs[int(port.removeprefix("IN_"))]: t for port, t in inputs.items()}
        _dropout(params, inputs, where)
        attributes = {
            k: trace_callback(v, f"{where}: parameter {k!r}", capture.uid_of)
            if k in schema.callables and callable(v)
            else _value(v, f"{where}: parameter {k!r}")
            for k, v in params.items()
        }
        spec.nodes.append(
            Node(
                op=op,
                name=str(node.name),
                inputs={p: capture.tensor(t) for p, t in inputs.items() if t is not None},
                outputs={p: capture.result(t, schema, p) for p, t in node.outputs.items() if t is not None},
                attributes=attributes,
                compute_data_type=data_type(node.compute_data_type, f"{where} compute_data_type"),
            )
        )
    return spec

"""Validate a GraphSpec and bring it to normal form, before any GPU work.

`normalize(spec)` returns a new spec in which every default is explicit
(data types, strides, attribute defaults, inferred output dims), so two specs
that mean the same graph normalize to the same thing. It refuses, with a
message naming the node or tensor, anything cuDNN would reject for a reason
we can see here: unknown ops, ports or attributes, wrong attribute types,
dangling or duplicate uids, rank and shape mismatches, bad data types, and
sizes over the limits.

The client runs it to fail fast; the server runs it again and trusts nothing.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec import layouts
from plancache.graphspec.frontend_ops import recorded
from plancache.graphspec.graph import GraphSpec, Node, Tensor
from plancache.graphspec.ops import CATALOG, AttrKind, AttrSchema, AttrValue, Dims, OpSchema, ShapeError
from plancache.graphspec.subgraph import Subgraph

# Exact in every JSON implementation (RFC 8785 hashes numbers as IEEE doubles).
MAX_UID = 2**53


@dataclass(frozen=True)
class Limits:
    """What a spec may ask for. The server's limits are configurable."""

    max_tensors: int = 1024
    max_nodes: int = 512
    max_rank: int = 8
    max_name_length: int = 256
    max_list_length: int = 16
    max_elements_per_tensor: int = 2**34
    # Autotuning allocates every non-virtual tensor on the GPU.
    max_total_bytes: int = 32 * 2**30


DEFAULT_LIMITS = Limits()


def storage_elements(dim: Dims, stride: Dims) -> int:
    """Elements a buffer must hold to back this (possibly strided) view."""
    return 1 + sum((d - 1) * s for d, s in zip(dim, stride, strict=True))


def normalize(spec: GraphSpec, limits: Limits = DEFAULT_LIMITS) -> GraphSpec:
    out = copy.deepcopy(spec)
    out.assign_uids()
    _check_graph(out, limits)
    producer: dict[int, int] = {}
    consumed: set[int] = set()
    for index, node in enumerate(out.nodes):
        _normalize_node(out, node, index, producer, consumed, limits)
    consumed.update(
        t.ragged_offset.uid for t in out.tensors if t.ragged_offset is not None and t.ragged_offset.uid is not None
    )
    total_bytes = 0
    for tensor in out.tensors:
        _normalize_tensor(out, tensor, producer, consumed, limits)
        if not tensor.is_virtual and tensor.shape:
            stride = tensor.stride or layouts.row_major(tensor.shape)
            total_bytes += storage_elements(tensor.shape, stride) * dtypes.itemsize(tensor.data_type or "float")
    if total_bytes > limits.max_total_bytes:
        raise SpecError(f"graph: its tensors need {total_bytes:,} bytes, over the limit of {limits.max_total_bytes:,}")
    _check_integer_ports(out)
    _check_ragged(out, producer)
    return out


def _check_integer_ports(spec: GraphSpec) -> None:
    """Ports that carry lengths (sdpa's seq_len_q ...) need integer tensors."""
    for index, node in enumerate(spec.nodes):
        schema = CATALOG[node.op]
        for port in (*schema.integer_bounds, *schema.index_bounds, *schema.integer_inputs):
            t = node.inputs.get(port)
            if t is not None and t.data_type not in dtypes.INTEGER_TYPES:
                raise SpecError(
                    f"{node.label(index)}: input {port!r} must have an integer data type, {t.label()} is {t.data_type}"
                )


def _check_ragged(spec: GraphSpec, producer: dict[int, int]) -> None:
    """Ragged tensors: offsets that are integer graph inputs of dims
    [b + 1, 1, ...], on ports that take packed sequences, with the per-batch
    lengths (use_padding_mask) cuDNN needs to read them."""
    ragged = {id(t) for t in spec.tensors if t.ragged_offset is not None}
    for t in spec.tensors:
        offsets = t.ragged_offset
        if offsets is None:
            continue
        where = t.label()
        assert offsets.uid is not None
        if t.is_virtual or t.is_pass_by_value:
            raise SpecError(
                f"{where}: only a tensor the caller binds can be ragged (not an intermediate or a pass-by-value scalar)"
            )
        if offsets.uid in producer or offsets.is_pass_by_value or id(offsets) in ragged:
            raise SpecError(
                f"{where}: its ragged offsets {offsets.label()} must be a GPU tensor the caller binds, not a node's result, a scalar or ragged itself"
            )
        expected = (t.dim[0] + 1, *([1] * (len(t.dim) - 1)))
        if tuple(offsets.dim) != expected:
            raise SpecError(
                f"{where}: its ragged offsets {offsets.label()} must have dims {list(expected)} (one start per batch, and the end), got {list(offsets.dim)}"
            )
        if offsets.data_type not in ("int32", "int64"):
            raise SpecError(
                f"{where}: its ragged offsets {offsets.label()} must be int32 or int64, got {offsets.data_type}"
            )
    for index, node in enumerate(spec.nodes):
        schema = CATALOG[node.op]
        ports = {**node.inputs, **node.outputs}
        packed = [port for port, t in ports.items() if id(t) in ragged]
        for port in packed:
            if port not in schema.ragged_ports:
                allowed = f"only {', '.join(schema.ragged_ports)}" if schema.ragged_ports else "none"
                raise SpecError(
                    f"{node.label(index)}: {port!r} ({ports[port].label()}) is ragged, but {node.op} takes ragged tensors on {allowed}"
                )
        if packed and not node.attributes.get("use_padding_mask"):
            raise SpecError(
                f"{node.label(index)}: ragged {', '.join(map(repr, packed))} need use_padding_mask with seq_len_q and seq_len_kv (each sequence's length)"
            )
        for attr, port in (("max_total_seq_len_q", "q"), ("max_total_seq_len_kv", "k")):
            total = node.attributes.get(attr)
            if total is None:
                continue
            t = node.inputs[port]
            if id(t) not in ragged:
                raise SpecError(f"{node.label(index)}: {attr} is for a ragged {port!r}; {t.label()} is not ragged")
            assert isinstance(total, int)
            if not 1 <= total <= t.dim[0] * t.dim[2]:
                raise SpecError(
                    f"{node.label(index)}: {attr} = {total} must be in [1, {t.dim[0] * t.dim[2]}] (batch × longest sequence of {port!r})"
                )


def _check_graph(spec: GraphSpec, limits: Limits) -> None:
    if not spec.nodes:
        raise SpecError("graph: no nodes")
    if len(spec.tensors) > limits.max_tensors:
        raise SpecError(f"graph: {len(spec.tensors)} tensors, over the limit of {limits.max_tensors}")
    if len(spec.nodes) > limits.max_nodes:
        raise SpecError(f"graph: {len(spec.nodes)} nodes, over the limit of {limits.max_nodes}")
    if len(spec.name) > limits.max_name_length:
        raise SpecError(f"graph: name longer than {limits.max_name_length} characters")
    spec.intermediate_data_type = spec.intermediate_data_type or "float"
    spec.compute_data_type = spec.compute_data_type or "float"
    _check_graph_arguments(spec)
    users: dict[int, str] = {}
    for index, node in reversed(list(enumerate(spec.nodes))):  # the first node that reads a tensor names it
        for port, t in node.inputs.items():
            users[id(t)] = f"{t.label()}, input {port!r} of {node.label(index)}"
    seen: dict[int, Tensor] = {}
    for t in spec.tensors:
        assert t.uid is not None
        if isinstance(t.uid, bool) or not -MAX_UID <= t.uid <= MAX_UID:
            raise SpecError(
                f"{t.label()}: uid must be an integer of magnitude at most 2**53 (0 included, as the frontend allows)"
            )
        if t.uid in seen:
            raise SpecError(f"{t.label()}: duplicate uid {t.uid} (also {seen[t.uid].label()})")
        seen[t.uid] = t
        if len(t.name) > limits.max_name_length:
            raise SpecError(f"{t.label()}: name longer than {limits.max_name_length} characters")
        if t.dim:
            _check_dims(t, limits, users.get(id(t)))
    known = {id(t) for t in spec.tensors}
    for t in spec.tensors:
        if t.ragged_offset is not None and id(t.ragged_offset) not in known:
            raise SpecError(f"{t.label()}: its ragged offsets tensor is not part of this graph")
    for i, node in enumerate(spec.nodes):
        for port, t in [*node.inputs.items(), *node.outputs.items()]:
            if id(t) not in known:
                raise SpecError(f"{node.label(i)}: port {port!r} uses a tensor that is not part of this graph")


def _check_ports(schema: OpSchema, node: Node, where: str) -> None:
    allowed = set(schema.inputs) | set(schema.optional_inputs)
    lists: dict[str, list[int]] = {}
    for port in node.inputs:
        listed = schema.list_port(port)
        if listed is not None:
            lists.setdefault(listed, []).append(int(port[len(listed) + 1 :]))
        elif port not in allowed:
            listing = ", ".join((*schema.inputs, *schema.optional_inputs, *(f"{p}_0.." for p in schema.list_inputs)))
            raise SpecError(f"{where}: {node.op} has no input port {port!r} (ports: {listing})")
    for name, indices in lists.items():
        if sorted(indices) != list(range(len(indices))):
            raise SpecError(
                f"{where}: list input {name!r} must be given as {name}_0 .. {name}_{len(indices) - 1}, got {sorted(indices)}"
            )
    for port in schema.inputs:
        if port not in node.inputs:
            raise SpecError(f"{where}: missing required input {port!r}")
    both = [p for p in schema.tensor_attributes if p in node.inputs and p in node.attributes]
    if both:
        raise SpecError(f"{where}: {both[0]!r} is given both as a tensor and as a value; the frontend takes one")


def _normalize_node(
    spec: GraphSpec, node: Node, index: int, producer: dict[int, int], consumed: set[int], limits: Limits
) -> None:
    where = node.label(index)
    schema = CATALOG.get(node.op)
    if schema is None:
        raise SpecError(f"{where}: unknown op {node.op!r} (known: {', '.join(sorted(CATALOG))})")
    if len(node.name) > limits.max_name_length:
        raise SpecError(f"{where}: name longer than {limits.max_name_length} characters")
    _check_ports(schema, node, where)
    node.attributes = _normalize_attributes(schema, node.attributes, where, limits)
    _subgraph_inputs(spec, node, where, consumed)
    input_dims: dict[str, Dims] = {}
    for port, t in node.inputs.items():
        assert t.uid is not None
        made_by = producer.get(t.uid)
        if made_by is None and any(t is o for later in spec.nodes[index:] for o in later.outputs.values()):
            raise SpecError(
                f"{where}: input {port!r} uses {t.label()} before the node that produces it (nodes run in order)"
            )
        if t.shape:
            input_dims[port] = t.shape
        elif not schema.derived:  # cuDNN infers it; plancache's rules for this op need it
            raise SpecError(
                f"{where}: input {port!r} uses {t.label()}, whose dims cuDNN infers: set them (plancache checks {node.op}'s shapes)"
            )
        consumed.add(t.uid)
    if schema.complete is not None:
        schema.complete(input_dims, node.attributes)
    expected = schema.outputs_for(node.attributes, frozenset(node.inputs))
    for port in node.outputs:
        if port not in expected and port not in schema.optional_outputs:
            extra = f"; on request: {', '.join(schema.optional_outputs)}" if schema.optional_outputs else ""
            raise SpecError(
                f"{where}: {node.op} does not produce {port!r} with these inputs and attributes (it produces {', '.join(expected)}{extra})"
            )
    for port in expected:
        if port not in node.outputs:
            raise SpecError(f"{where}: output {port!r} is not mapped to a tensor")
    declared: dict[str, Dims | None] = {port: (t.dim or None) for port, t in node.outputs.items()}
    try:
        inferred = schema.infer(input_dims, declared, node.attributes)
    except ShapeError as e:
        raise SpecError(f"{where}: {e}") from None
    for port, t in node.outputs.items():
        assert t.uid is not None
        if t.uid in producer:
            raise SpecError(f"{where}: output {port!r} ({t.label()}) is already produced by node {producer[t.uid]}")
        if t.uid in consumed:
            raise SpecError(f"{where}: output {port!r} ({t.label()}) is consumed by an earlier node")
        producer[t.uid] = index
        _result_dims(schema, port, t, inferred.get(port), where)
        _result_type(spec, schema, node, port, t, producer)
    _infer_result_strides(schema, node, where, producer)
    if schema.takes_compute_type:
        node.compute_data_type = node.compute_data_type or spec.compute_data_type
    else:
        node.compute_data_type = None


# The frontend's own type rules for results a spec leaves untyped: SDPA's
# softmax stats are float whatever the graph's types (its IR's rule); some
# results copy an input's type (its `dtype_like`).
_FLOAT_RESULTS = {("sdpa", "Stats"), ("sdpa_fp8", "Stats"), ("sdpa_mxfp8", "Stats")}


def _result_type(spec: GraphSpec, schema: OpSchema, node: Node, port: str, t: Tensor, producer: dict[int, int]) -> None:
    if t.data_type is not None:
        return
    if (schema.name, port) in _FLOAT_RESULTS:
        t.data_type = "float"
        return
    source = node.inputs.get(schema.dtype_like.get(port, ""))
    if source is None or source.data_type is not None:
        t.data_type = source.data_type if source is not None else None
    elif source.uid in producer:  # an untyped result: the graph's intermediate type, or its io type if an output
        t.data_type = spec.io_data_type if source.is_output else spec.intermediate_data_type
    else:  # an untyped graph input: io_data_type (float if pass-by-value), as the frontend makes it
        t.data_type = "float" if source.is_pass_by_value else spec.io_data_type


def _subgraph_inputs(spec: GraphSpec, node: Node, where: str, consumed: set[int]) -> None:
    """Graph tensors a score modifier reads: tensors of this graph, bound by the caller, counted as used."""
    inputs = {t.uid: t for t in spec.tensors}
    for key, value in node.attributes.items():
        if not isinstance(value, Subgraph):
            continue
        for uid in value.uids():
            t = inputs.get(uid)
            if t is None or t.is_virtual or t.is_output:
                raise SpecError(f"{where}: attribute {key!r} reads uid {uid}, which is no input of this graph")
            consumed.add(uid)


def _result_dims(schema: OpSchema, port: str, t: Tensor, inferred: Dims | None, where: str) -> None:
    """A result's dims in the normal form. A classic op writes its rule's
    (which checked any declared ones). A frontend op keeps what the program
    set, as the frontend pushes only those to cuDNN; where the frontend pushes
    its own inference too (the SDPA family, ops cuDNN cannot infer), that
    inference is written out; elsewhere it is kept aside (`inferred_dim`)
    for later nodes' checks."""
    if not schema.derived or port in schema.optional_outputs:
        found = t.dim or inferred
        if not found:
            raise SpecError(f"{where}: output {port!r} ({t.label()}) needs its dims (cuDNN cannot infer them)")
        t.dim = tuple(found)
        return
    if t.dim:
        return
    if schema.pushes_output_dims:
        if not inferred:
            raise SpecError(
                f"{where}: output {port!r} ({t.label()}) needs its dims (the frontend sends them to cuDNN, which cannot infer them)"
            )
        t.dim = inferred
        return
    t.inferred_dim = inferred or ()


def _infer_result_strides(schema: OpSchema, node: Node, where: str, producer: dict[int, int]) -> None:
    """Strides of the node's results as the cuDNN frontend infers them
    (layouts.py), where the spec leaves them out. An intermediate's layout
    is the frontend's to choose (it is not bound, and not sent to cuDNN):
    one written into the spec must be that one. A frontend op's results keep
    the strides the program set (the SDPA family's get row-major, as the
    frontend sends them); so does a classic op fed by a tensor whose layout
    only cuDNN knows."""
    if schema.derived:
        for t in node.outputs.values():
            if not t.stride and schema.pushes_output_strides and t.dim:
                t.stride = layouts.row_major(t.dim)
        return
    if any(not t.stride and t.uid in producer for t in node.inputs.values()):
        return  # an input's layout is cuDNN's choice: so are the results'
    inputs = {port: (t.dim, t.stride or layouts.row_major(t.dim)) for port, t in node.inputs.items()}
    for port, t in node.outputs.items():
        inferred = layouts.result_strides(schema.family, port, t.dim, inputs, schema.inputs + schema.optional_inputs)
        if not t.stride and t.ragged_offset is not None:
            raise SpecError(
                f"{where}: ragged output {port!r} ({t.label()}) needs its strides (the packed layout cuDNN writes through the offsets)"
            )
        if not t.stride:
            t.stride = inferred
        elif not t.is_output and tuple(t.stride) != inferred:
            raise SpecError(
                f"{where}: intermediate {t.label()} has strides {list(t.stride)}, but cuDNN lays it out as {list(inferred)}: "
                "leave an intermediate's strides out, or make it an output"
            )


def _normalize_attributes(
    schema: OpSchema, raw: dict[str, AttrValue], where: str, limits: Limits
) -> dict[str, AttrValue]:
    attrs: dict[str, AttrValue] = {}
    given = dict(raw)
    if schema.prepare is not None:
        schema.prepare(given)
    for key, value in given.items():
        spec_ = schema.attributes.get(key)
        if spec_ is None:
            if key in schema.callables:
                raise SpecError(f"{where}: {key!r} takes Python code (a callback), which a spec cannot carry")
            allowed = ", ".join(sorted(schema.attributes)) or "none"
            raise SpecError(f"{where}: {schema.name} has no attribute {key!r} (attributes: {allowed})")
        attrs[key] = _coerce(value, spec_, f"{where}: attribute {key!r}", limits)
    for key, spec_ in schema.attributes.items():
        if key not in attrs:
            if spec_.required:
                raise SpecError(
                    f"{where}: missing required attribute {key!r}"
                    + (f" (one of {', '.join(spec_.choices)})" if spec_.choices else "")
                )
            if spec_.default is not None:
                attrs[key] = spec_.default
    return attrs


def _is_int(value: Any) -> bool:
    """An integer JSON carries exactly (the canonical form hashes numbers as IEEE doubles)."""
    return isinstance(value, int) and not isinstance(value, bool) and -MAX_UID <= value <= MAX_UID


def _coerce(value: Any, spec_: AttrSchema, where: str, limits: Limits) -> AttrValue:
    kind = spec_.kind
    if kind is AttrKind.BOOL:
        if isinstance(value, bool):
            return value
    elif kind is AttrKind.INT:
        if _is_int(value):
            return int(value)
    elif kind is AttrKind.FLOAT:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif kind is AttrKind.SCALAR:
        # Passed on as given (the frontend types these `object`): an int stays an int.
        if isinstance(value, bool) or _is_int(value) or (isinstance(value, float) and math.isfinite(value)):
            scalar: bool | int | float = value
            return scalar
    elif kind is AttrKind.STRING:
        if isinstance(value, str) and len(value) <= limits.max_name_length:
            return value
    elif kind is AttrKind.INT_LIST:
        if isinstance(value, tuple | list) and all(_is_int(v) for v in value):
            if len(value) > limits.max_list_length:
                raise SpecError(f"{where}: more than {limits.max_list_length} values")
            return tuple(value)
    elif kind is AttrKind.SLICES:
        if isinstance(value, tuple | list) and all(_is_slice(v) for v in value):
            if len(value) > limits.max_rank:
                raise SpecError(f"{where}: more than {limits.max_rank} slices")
            return tuple((v[0], v[1], v[2]) for v in value)
        raise SpecError(
            f"{where}: expected a list of [start, stop, step] (each an integer or null, step not 0), got {value!r}"
        )
    elif kind is AttrKind.ENUM and isinstance(value, str):
        if value.upper() in spec_.choices:
            return value.upper()
        raise SpecError(f"{where}: {value!r} is not one of {', '.join(spec_.choices)}")
    elif kind is AttrKind.SUBGRAPH:
        if isinstance(value, Subgraph):
            return _normalize_subgraph(value, where, limits)
        raise SpecError(
            f"{where}: a callback's ops are given as a score modifier (plancache.graphspec.subgraph), not {type(value).__name__}"
        )
    raise SpecError(f"{where}: expected {kind.value}, got {value!r}")


def _normalize_subgraph(subgraph: Subgraph, where: str, limits: Limits) -> Subgraph:
    """A score modifier's ops: pointwise ops of the catalog, their ports and
    attributes as the catalog says, references to the score, an earlier op
    or a graph tensor (normalize checks those uids against the graph)."""
    if len(subgraph.ops) > limits.max_nodes:
        raise SpecError(f"{where}: {len(subgraph.ops)} ops, over the limit of {limits.max_nodes}")
    ops = []
    for i, op in enumerate(subgraph.ops):
        at = f"{where} op {i} ({op.op})"
        schema = CATALOG.get(op.op)
        if schema is None or schema.family != "pointwise":
            raise SpecError(f"{at}: a score modifier adds pointwise ops of the catalog only")
        ports = dict(op.inputs)
        if set(ports) != set(schema.inputs):
            raise SpecError(f"{at}: ports {sorted(ports)}, {op.op} takes {list(schema.inputs)}")
        for port, ref in ports.items():
            if ref[0] == "result" and not 0 <= ref[1] < i:
                raise SpecError(f"{at}: input {port!r} refers to op {ref[1]}, not an earlier one")
        attributes: dict[str, Any] = _normalize_attributes(
            schema, {k: v for k, v in op.attributes if v is not None}, at, limits
        )  # type: ignore[misc]
        ops.append(
            replace(
                op,
                inputs=tuple((p, ports[p]) for p in schema.inputs),
                attributes=tuple(sorted(attributes.items())),
                compute_data_type=dtypes.normalize(op.compute_data_type, at) if op.compute_data_type else None,
                data_type=dtypes.normalize(op.data_type, at) if op.data_type else None,
            )
        )
    if subgraph.result[0] == "result" and not 0 <= subgraph.result[1] < len(ops):
        raise SpecError(f"{where}: its result refers to op {subgraph.result[1]}, which it does not have")
    return Subgraph(tuple(ops), subgraph.result)


def _is_slice(value: Any) -> bool:
    return (
        isinstance(value, tuple | list)
        and len(value) == 3
        and all(v is None or _is_int(v) for v in value)
        and value[2] != 0
    )


def _check_dims(t: Tensor, limits: Limits, where: str | None = None) -> None:
    where = where or t.label()
    if len(t.dim) > limits.max_rank:
        raise SpecError(f"{where}: rank {len(t.dim)} over the limit of {limits.max_rank}")
    if any(d < 1 for d in t.dim):
        raise SpecError(f"{where}: dims must be >= 1, got {list(t.dim)}")
    if math.prod(t.dim) > limits.max_elements_per_tensor:
        raise SpecError(f"{where}: {math.prod(t.dim):,} elements, over the limit of {limits.max_elements_per_tensor:,}")


def _check_graph_arguments(spec: GraphSpec) -> None:
    for name in ("sm_count", "sm_version"):
        value = getattr(spec, name)
        if value is not None and (not _is_int(value) or value < 1):
            raise SpecError(f"graph: {name} must be a positive integer, got {value!r}")
    for name in (
        "is_dynamic_shape_enabled",
        "is_override_shape_enabled",
        "kernel_cache",
        "is_cuda_graph_replay_expected",
    ):
        if not isinstance(getattr(spec, name), bool):
            raise SpecError(f"graph: {name} must be true or false")
    retention = spec.cuda_graph_retention
    if retention is not None:
        choices = ("PER_GRAPH", "NONE")
        if not isinstance(retention, str) or retention.upper() not in choices:
            raise SpecError(f"graph: cuda_graph_retention {retention!r} is not one of {', '.join(choices)}")
        spec.cuda_graph_retention = retention.upper()


def _normalize_frontend_fields(t: Tensor, where: str) -> None:
    """The frontend tensor's attributes past the classic ones: valid, and at their defaults unless set."""
    reordering = t.reordering_type
    if reordering is not None:
        members = recorded().enums.get("tensor_reordering", ())
        if not isinstance(reordering, str) or reordering not in members:
            raise SpecError(f"{where}: reordering_type {reordering!r} is not one of {', '.join(members)}")
        t.reordering_type = None if reordering == "NONE" else reordering
    for name in ("ragged_offset_multiplier", "alignment_value"):
        value = getattr(t, name)
        if not _is_int(value) or value < 1:
            raise SpecError(f"{where}: {name} must be a positive integer, got {value!r}")
    if t.ragged_offset_multiplier != 1 and t.ragged_offset is None:
        raise SpecError(f"{where}: ragged_offset_multiplier is for a ragged tensor")
    if t.constant is None:
        if t.scalar_type is not None:
            raise SpecError(f"{where}: scalar_type is for a scalar held in the graph (constant)")
        return
    if isinstance(t.constant, bool) or not (
        _is_int(t.constant) or (isinstance(t.constant, float) and math.isfinite(t.constant))
    ):
        raise SpecError(f"{where}: constant must be a finite number, got {t.constant!r}")
    members = recorded().enums.get("scalar_type", ())
    if t.scalar_type not in members:
        raise SpecError(f"{where}: a constant needs scalar_type, one of {', '.join(members)}")
    if not t.is_pass_by_value or t.is_virtual or t.is_output or t.scalar_value is not None:
        raise SpecError(f"{where}: a constant is a pass-by-value graph input without scalar_value")


def _a_sibling_is_kept(node: Node, uid: int, consumed: set[int]) -> bool:
    """Whether another result of `node` is an output or consumed. A program may
    leave a side result unused (sdpa's Stats: `o, _ = graph.sdpa(...)`) and the
    frontend builds that graph; the dangling result stays part of the graph it
    declared. A node none of whose results is kept is a mistake, refused."""
    return any(o.uid != uid and (o.is_output or o.uid in consumed) for o in node.outputs.values())


def _normalize_tensor(spec: GraphSpec, t: Tensor, producer: dict[int, int], consumed: set[int], limits: Limits) -> None:
    assert t.uid is not None
    where = t.label()
    _normalize_frontend_fields(t, where)
    produced = t.uid in producer
    if produced:
        if t.is_output and t.is_virtual:
            raise SpecError(f"{where}: cannot be both virtual and an output")
        t.is_virtual = not t.is_output
        if (
            t.is_virtual
            and t.uid not in consumed
            and not _a_sibling_is_kept(spec.nodes[producer[t.uid]], t.uid, consumed)
        ):
            raise SpecError(f"{where}: an intermediate no node consumes; mark it as an output (is_output) to keep it")
        if t.is_pass_by_value:
            raise SpecError(f"{where}: a node's result cannot be pass-by-value")
        default_type = spec.intermediate_data_type if t.is_virtual else spec.io_data_type
    else:
        if t.is_virtual or t.is_output:
            raise SpecError(f"{where}: marked {'virtual' if t.is_virtual else 'output'} but no node produces it")
        if t.uid not in consumed:
            raise SpecError(f"{where}: declared but no node uses it")
        default_type = "float" if t.is_pass_by_value else spec.io_data_type
    if t.data_type is None and t.constant is None:  # a constant's type is the one cuDNN gives its value
        if default_type is None:
            raise SpecError(f"{where}: no data_type, and the graph has no io_data_type to default to")
        t.data_type = default_type
    if not t.dim:
        if not produced:
            raise SpecError(f"{where}: no dims")
        # A result whose dims cuDNN infers (see _result_dims); the program may still have set its strides.
        if t.stride and t.inferred_dim and len(t.stride) != len(t.inferred_dim):
            raise SpecError(f"{where}: strides {list(t.stride)} for a result of rank {len(t.inferred_dim)}")
        if any(not _is_int(s) or s < 0 for s in t.stride):
            raise SpecError(f"{where}: strides must be >= 0, got {list(t.stride)}")
        return
    _check_dims(t, limits)
    if not t.stride and not produced:
        t.stride = layouts.row_major(t.dim)
    if t.stride and len(t.stride) != len(t.dim):
        raise SpecError(f"{where}: stride {list(t.stride)} has {len(t.stride)} entries for {len(t.dim)} dims")
    # The frontend takes zero strides (a broadcast view, as torch's expand() makes).
    if any(not _is_int(s) or s < 0 for s in t.stride):
        raise SpecError(f"{where}: strides must be >= 0, got {list(t.stride)}")
    if t.is_pass_by_value and math.prod(t.dim) != 1:
        raise SpecError(f"{where}: a pass-by-value tensor must hold one element, got dims {list(t.dim)}")
    if t.scalar_value is not None and not t.is_pass_by_value:
        raise SpecError(f"{where}: scalar_value is only for pass-by-value tensors")
    if t.scalar_value is not None and not math.isfinite(t.scalar_value):
        raise SpecError(f"{where}: scalar_value must be finite")

"""A node brought to normal form: its op, ports and attributes checked, its results' dims, data types and
strides inferred the way the cuDNN frontend infers them."""

from __future__ import annotations

from plancache.errors import SpecError
from plancache.graphspec import layouts
from plancache.graphspec.graph import GraphSpec, Node, Tensor
from plancache.graphspec.ops import CATALOG, Dims, OpSchema, ShapeError
from plancache.graphspec.subgraph import Subgraph
from plancache.graphspec.suggest import did_you_mean, unknown_op
from plancache.graphspec.validation.attributes import normalize_attributes
from plancache.graphspec.validation.limits import Limits


def normalize_node(
    spec: GraphSpec, node: Node, index: int, producer: dict[int, int], consumed: set[int], limits: Limits
) -> None:
    where = node.label(index)
    schema = CATALOG.get(node.op)
    if schema is None:
        raise SpecError(f"{where}: {unknown_op(node.op, CATALOG)}")
    if len(node.name) > limits.max_name_length:
        raise SpecError(f"{where}: name longer than {limits.max_name_length} characters")
    _check_ports(schema, node, where)
    node.attributes = normalize_attributes(schema, node.attributes, where, limits)
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
                f"{where}: input {port!r} uses {t.label()}, whose dims cuDNN infers: "
                f"set them (plancache checks {node.op}'s shapes)"
            )
        consumed.add(t.uid)
    if schema.complete is not None:
        schema.complete(input_dims, node.attributes)
    expected = schema.outputs_for(node.attributes, frozenset(node.inputs))
    for port in node.outputs:
        if port not in expected and port not in schema.optional_outputs:
            extra = f"; on request: {', '.join(schema.optional_outputs)}" if schema.optional_outputs else ""
            raise SpecError(
                f"{where}: {node.op} does not produce {port!r} with these inputs and attributes "
                f"(it produces {', '.join(expected)}{extra})"
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


def _check_ports(schema: OpSchema, node: Node, where: str) -> None:
    allowed = set(schema.inputs) | set(schema.optional_inputs)
    lists: dict[str, list[int]] = {}
    for port in node.inputs:
        listed = schema.list_port(port)
        if listed is not None:
            lists.setdefault(listed, []).append(int(port[len(listed) + 1 :]))
        elif port not in allowed:
            listing = ", ".join((*schema.inputs, *schema.optional_inputs, *(f"{p}_0.." for p in schema.list_inputs)))
            hint = did_you_mean(port, (*allowed, *schema.list_inputs))
            raise SpecError(f"{where}: {node.op} has no input port {port!r}{hint} (ports: {listing})")
    for name, indices in lists.items():
        if sorted(indices) != list(range(len(indices))):
            raise SpecError(
                f"{where}: list input {name!r} must be given as {name}_0 .. {name}_{len(indices) - 1}, "
                f"got {sorted(indices)}"
            )
    for port in schema.inputs:
        if port not in node.inputs:
            raise SpecError(f"{where}: missing required input {port!r}")
    both = [p for p in schema.tensor_attributes if p in node.inputs and p in node.attributes]
    if both:
        raise SpecError(f"{where}: {both[0]!r} is given both as a tensor and as a value; the frontend takes one")


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
                f"{where}: output {port!r} ({t.label()}) needs its dims "
                "(the frontend sends them to cuDNN, which cannot infer them)"
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
                f"{where}: ragged output {port!r} ({t.label()}) needs its strides "
                "(the packed layout cuDNN writes through the offsets)"
            )
        if not t.stride:
            t.stride = inferred
        elif not t.is_output and tuple(t.stride) != inferred:
            raise SpecError(
                f"{where}: intermediate {t.label()} has strides {list(t.stride)}, "
                f"but cuDNN lays it out as {list(inferred)}: "
                "leave an intermediate's strides out, or make it an output"
            )

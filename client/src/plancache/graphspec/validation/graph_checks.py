"""The checks of a graph as a whole: its sizes, arguments and uids, every port on a tensor of the graph,
integers where lengths go, ragged tensors and their offsets."""

from __future__ import annotations

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec.graph import GraphSpec, Tensor
from plancache.graphspec.ops import CATALOG
from plancache.graphspec.validation.limits import MAX_UID, Limits, check_dims, is_exact_int


def check_graph(spec: GraphSpec, limits: Limits) -> None:
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
            check_dims(t, limits, users.get(id(t)))
    known = {id(t) for t in spec.tensors}
    for t in spec.tensors:
        if t.ragged_offset is not None and id(t.ragged_offset) not in known:
            raise SpecError(f"{t.label()}: its ragged offsets tensor is not part of this graph")
    for i, node in enumerate(spec.nodes):
        for port, t in [*node.inputs.items(), *node.outputs.items()]:
            if id(t) not in known:
                raise SpecError(f"{node.label(i)}: port {port!r} uses a tensor that is not part of this graph")


def _check_graph_arguments(spec: GraphSpec) -> None:
    for name in ("sm_count", "sm_version"):
        value = getattr(spec, name)
        if value is not None and (not is_exact_int(value) or value < 1):
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


def check_integer_ports(spec: GraphSpec) -> None:
    """Ports that carry lengths (sdpa's seq_len_q ...) need integer tensors."""
    for index, node in enumerate(spec.nodes):
        schema = CATALOG[node.op]
        for port in (*schema.integer_bounds, *schema.index_bounds, *schema.integer_inputs):
            t = node.inputs.get(port)
            if t is not None and t.data_type not in dtypes.INTEGER_TYPES:
                raise SpecError(
                    f"{node.label(index)}: input {port!r} must have an integer data type, {t.label()} is {t.data_type}"
                )


def check_ragged(spec: GraphSpec, producer: dict[int, int]) -> None:
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
                f"{where}: its ragged offsets {offsets.label()} must be a GPU tensor the caller binds, "
                "not a node's result, a scalar or ragged itself"
            )
        expected = (t.dim[0] + 1, *([1] * (len(t.dim) - 1)))
        if tuple(offsets.dim) != expected:
            raise SpecError(
                f"{where}: its ragged offsets {offsets.label()} must have dims {list(expected)} "
                f"(one start per batch, and the end), got {list(offsets.dim)}"
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
                    f"{node.label(index)}: {port!r} ({ports[port].label()}) is ragged, "
                    f"but {node.op} takes ragged tensors on {allowed}"
                )
        if packed and not node.attributes.get("use_padding_mask"):
            raise SpecError(
                f"{node.label(index)}: ragged {', '.join(map(repr, packed))} need use_padding_mask "
                "with seq_len_q and seq_len_kv (each sequence's length)"
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
                    f"{node.label(index)}: {attr} = {total} must be in [1, {t.dim[0] * t.dim[2]}] "
                    f"(batch × longest sequence of {port!r})"
                )

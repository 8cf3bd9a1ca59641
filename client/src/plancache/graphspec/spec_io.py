"""The two wire forms of a GraphSpec: hand-written JSON and the proto message.

Both refer to tensors by uid; parsing resolves uids into Tensor objects and
refuses dangling or duplicate ones, naming the node or tensor at fault.
Unknown JSON keys are errors too: a typo must not silently change a graph.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec.graph import GraphSpec, Node, Tensor
from plancache.graphspec.ops import AttrValue
from plancache.graphspec.subgraph import Subgraph, SubgraphOp
from plancache.graphspec.subgraph import from_plain as subgraph_from_plain
from plancache.v1 import plancache_pb2 as pb

# The frontend graph's constructor arguments a spec may set (GraphSpec's fields of the same names).
GRAPH_ARGUMENTS = (
    "sm_count",
    "sm_version",
    "is_dynamic_shape_enabled",
    "is_override_shape_enabled",
    "kernel_cache",
    "cuda_graph_retention",
    "is_cuda_graph_replay_expected",
)
_GRAPH_KEYS = {
    "name",
    "io_data_type",
    "intermediate_data_type",
    "compute_data_type",
    "tensors",
    "nodes",
    *GRAPH_ARGUMENTS,
}
_TENSOR_KEYS = {
    "uid",
    "name",
    "dim",
    "stride",
    "data_type",
    "is_virtual",
    "is_pass_by_value",
    "is_output",
    "scalar_value",
    "ragged_offset_uid",
    "reordering_type",
    "ragged_offset_multiplier",
    "alignment_value",
    "constant",
    "scalar_type",
}
_NODE_KEYS = {"op", "name", "inputs", "outputs", "attributes", "compute_data_type"}


# ---------------------------------------------------------------------------
# dict / JSON
# ---------------------------------------------------------------------------


def to_dict(spec: GraphSpec) -> dict[str, Any]:
    spec.assign_uids()
    graph: dict[str, Any] = {"name": spec.name} if spec.name else {}
    for key in ("io_data_type", "intermediate_data_type", "compute_data_type"):
        if getattr(spec, key) is not None:
            graph[key] = getattr(spec, key)
    for key in GRAPH_ARGUMENTS:
        if getattr(spec, key) not in (None, False):
            graph[key] = getattr(spec, key)
    graph["tensors"] = [_tensor_to_dict(t) for t in spec.tensors]
    graph["nodes"] = [_node_to_dict(n) for n in spec.nodes]
    return graph


def _tensor_to_dict(t: Tensor) -> dict[str, Any]:
    out: dict[str, Any] = {"uid": t.uid}
    if t.name:
        out["name"] = t.name
    if t.dim:
        out["dim"] = list(t.dim)
    if t.stride:
        out["stride"] = list(t.stride)
    if t.data_type:
        out["data_type"] = t.data_type
    for flag in ("is_virtual", "is_pass_by_value", "is_output"):
        if getattr(t, flag):
            out[flag] = True
    if t.scalar_value is not None:
        out["scalar_value"] = t.scalar_value
    if t.ragged_offset is not None:
        out["ragged_offset_uid"] = t.ragged_offset.uid
    if t.reordering_type is not None:
        out["reordering_type"] = t.reordering_type
    for key in ("ragged_offset_multiplier", "alignment_value"):
        if getattr(t, key) != 1:
            out[key] = getattr(t, key)
    if t.constant is not None:
        out["constant"], out["scalar_type"] = t.constant, t.scalar_type
    return out


def _node_to_dict(n: Node) -> dict[str, Any]:
    out: dict[str, Any] = {"op": n.op}
    if n.name:
        out["name"] = n.name
    out["inputs"] = {port: t.uid for port, t in n.inputs.items()}
    out["outputs"] = {port: t.uid for port, t in n.outputs.items()}
    if n.attributes:
        out["attributes"] = {k: _plain(v) for k, v in n.attributes.items()}
    if n.compute_data_type:
        out["compute_data_type"] = n.compute_data_type
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Subgraph):
        return value.to_plain()
    return [_plain(v) for v in value] if isinstance(value, tuple | list) else value


def to_json(spec: GraphSpec, indent: int | None = 2) -> str:
    return json.dumps(to_dict(spec), indent=indent)


def from_json(text: str | bytes) -> GraphSpec:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SpecError(f"spec is not valid JSON: {e}") from e
    return from_dict(data)


def from_dict(data: Any) -> GraphSpec:
    where = "graph"
    _expect(isinstance(data, dict), f"{where}: expected a JSON object, got {type(data).__name__}")
    _no_unknown(data, _GRAPH_KEYS, where)
    spec = GraphSpec(
        name=_str(data.get("name", ""), "graph name"),
        io_data_type=_dtype(data.get("io_data_type"), "graph io_data_type"),
        intermediate_data_type=_dtype(data.get("intermediate_data_type", "float"), "graph intermediate_data_type"),
        compute_data_type=_dtype(data.get("compute_data_type", "float"), "graph compute_data_type"),
    )
    for key in GRAPH_ARGUMENTS:
        if key in data:
            setattr(spec, key, data[key])  # validation checks the values
    tensors = data.get("tensors", [])
    _expect(isinstance(tensors, list), "graph: 'tensors' must be a list")
    ragged: dict[int, int] = {}
    for i, raw in enumerate(tensors):
        spec.tensors.append(_tensor_from_dict(raw, f"tensor {i}"))
        if isinstance(raw, dict) and raw.get("ragged_offset_uid") is not None:
            ragged[i] = _int(raw["ragged_offset_uid"], f"tensor {i} ragged_offset_uid")
    by_uid = _index_uids(spec.tensors)
    _resolve_ragged(spec, ragged, by_uid)
    nodes = data.get("nodes", [])
    _expect(isinstance(nodes, list), "graph: 'nodes' must be a list")
    for i, raw in enumerate(nodes):
        spec.nodes.append(_node_from_dict(raw, i, by_uid))
    return spec


def _tensor_from_dict(raw: Any, where: str) -> Tensor:
    _expect(isinstance(raw, dict), f"{where}: expected an object")
    _no_unknown(raw, _TENSOR_KEYS, where)
    name = _str(raw.get("name", ""), f"{where} name")
    where = f"{where} ({name})" if name else where
    _expect("uid" in raw, f"{where}: missing 'uid' (clients bind tensors by uid)")
    scalar = raw.get("scalar_value")
    _expect(scalar is None or (_is_number(scalar)), f"{where}: scalar_value must be a number")
    constant = raw.get("constant")
    _expect(constant is None or _is_number(constant), f"{where}: constant must be a number")
    return Tensor(
        uid=_int(raw["uid"], f"{where} uid"),
        name=name,
        dim=_ints(raw.get("dim", []), f"{where} dim"),
        stride=_ints(raw.get("stride", []), f"{where} stride"),
        data_type=_dtype(raw.get("data_type"), f"{where} data_type"),
        is_virtual=_bool(raw.get("is_virtual", False), f"{where} is_virtual"),
        is_pass_by_value=_bool(raw.get("is_pass_by_value", False), f"{where} is_pass_by_value"),
        is_output=_bool(raw.get("is_output", False), f"{where} is_output"),
        scalar_value=None if scalar is None else float(scalar),
        reordering_type=None
        if raw.get("reordering_type") is None
        else _str(raw["reordering_type"], f"{where} reordering_type"),
        ragged_offset_multiplier=_int(raw.get("ragged_offset_multiplier", 1), f"{where} ragged_offset_multiplier"),
        alignment_value=_int(raw.get("alignment_value", 1), f"{where} alignment_value"),
        constant=constant,
        scalar_type=None if raw.get("scalar_type") is None else _str(raw["scalar_type"], f"{where} scalar_type"),
    )


def _node_from_dict(raw: Any, index: int, by_uid: Mapping[int, Tensor]) -> Node:
    where = f"node {index}"
    _expect(isinstance(raw, dict), f"{where}: expected an object")
    _no_unknown(raw, _NODE_KEYS, where)
    name = _str(raw.get("name", ""), f"{where} name")
    where = f"{where} ({name or raw.get('op')})"
    _expect(isinstance(raw.get("op"), str), f"{where}: missing 'op'")
    attributes = raw.get("attributes", {})
    _expect(isinstance(attributes, dict), f"{where}: 'attributes' must be an object")
    return Node(
        op=raw["op"],
        name=name,
        inputs=_ports(raw.get("inputs", {}), by_uid, f"{where} input"),
        outputs=_ports(raw.get("outputs", {}), by_uid, f"{where} output"),
        attributes={str(k): _attr_from_json(v, f"{where} attribute {k!r}") for k, v in attributes.items()},
        compute_data_type=_dtype(raw.get("compute_data_type"), f"{where} compute_data_type"),
    )


def _ports(raw: Any, by_uid: Mapping[int, Tensor], where: str) -> dict[str, Tensor]:
    _expect(isinstance(raw, dict), f"{where}s must be an object of port -> uid")
    ports: dict[str, Tensor] = {}
    for port, raw_uid in raw.items():
        uid = _int(raw_uid, f"{where} {port!r}")
        _expect(uid in by_uid, f"{where} {port!r} refers to uid {uid}, which no tensor declares")
        ports[str(port)] = by_uid[uid]
    return ports


def _attr_from_json(value: Any, where: str) -> AttrValue:
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        _expect(math.isfinite(value), f"{where}: must be finite")
        return value
    if isinstance(value, dict):  # a callback's ops (score_mod)
        return subgraph_from_plain(value, where)
    if (
        isinstance(value, list) and value and all(isinstance(v, list) for v in value)
    ):  # slices: [[start, stop, step], ...]
        return tuple(_slice(v, where) for v in value)
    if isinstance(value, list):
        return _ints(value, where)
    raise SpecError(
        f"{where}: unsupported value {value!r} (number, bool, string, list of ints or list of [start, stop, step])"
    )


def _slice(value: list[Any], where: str) -> tuple[int | None, int | None, int | None]:
    _expect(
        len(value) == 3 and all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value),
        f"{where}: a slice is [start, stop, step], each an integer or null, got {value!r}",
    )
    return (value[0], value[1], value[2])


# ---------------------------------------------------------------------------
# proto
# ---------------------------------------------------------------------------


def to_proto(spec: GraphSpec) -> pb.GraphSpec:
    spec.assign_uids()
    msg = pb.GraphSpec(
        name=spec.name,
        io_data_type=dtypes.to_proto(spec.io_data_type),
        intermediate_data_type=dtypes.to_proto(spec.intermediate_data_type),
        compute_data_type=dtypes.to_proto(spec.compute_data_type),
        sm_count=spec.sm_count or 0,
        sm_version=spec.sm_version or 0,
        is_dynamic_shape_enabled=spec.is_dynamic_shape_enabled,
        is_override_shape_enabled=spec.is_override_shape_enabled,
        kernel_cache=spec.kernel_cache,
        cuda_graph_retention=spec.cuda_graph_retention or "",
        is_cuda_graph_replay_expected=spec.is_cuda_graph_replay_expected,
    )
    for t in spec.tensors:
        tensor = pb.TensorSpec(
            uid=t.uid,
            name=t.name,
            dim=t.dim,
            stride=t.stride,
            data_type=dtypes.to_proto(t.data_type),
            is_virtual=t.is_virtual,
            is_pass_by_value=t.is_pass_by_value,
            is_output=t.is_output,
            scalar_value=t.scalar_value,
            ragged_offset_uid=t.ragged_offset.uid if t.ragged_offset is not None else None,
            reordering_type=t.reordering_type or "",
            ragged_offset_multiplier=t.ragged_offset_multiplier if t.ragged_offset_multiplier != 1 else 0,
            alignment_value=t.alignment_value if t.alignment_value != 1 else 0,
        )
        if isinstance(t.constant, int):
            tensor.constant.CopyFrom(pb.ScalarConstant(int_value=t.constant, scalar_type=t.scalar_type or ""))
        elif t.constant is not None:
            tensor.constant.CopyFrom(pb.ScalarConstant(float_value=t.constant, scalar_type=t.scalar_type or ""))
        msg.tensors.append(tensor)
    for n in spec.nodes:
        node = msg.nodes.add(op=n.op, name=n.name, compute_data_type=dtypes.to_proto(n.compute_data_type))
        for port, t in n.inputs.items():
            assert t.uid is not None
            node.inputs[port] = t.uid
        for port, t in n.outputs.items():
            assert t.uid is not None
            node.outputs[port] = t.uid
        for key, value in n.attributes.items():
            node.attributes[key].CopyFrom(attr_to_proto(value))
    return msg


def attr_to_proto(value: AttrValue) -> pb.AttributeValue:
    if isinstance(value, bool):
        return pb.AttributeValue(bool_value=value)
    if isinstance(value, int):
        return pb.AttributeValue(int_value=value)
    if isinstance(value, float):
        return pb.AttributeValue(float_value=value)
    if isinstance(value, str):
        return pb.AttributeValue(string_value=value)
    if isinstance(value, Subgraph):
        return pb.AttributeValue(subgraph=_subgraph_to_proto(value))
    if value and all(isinstance(v, tuple) for v in value):
        return pb.AttributeValue(
            slice_list=pb.SliceList(
                slices=[pb.Slice(start=v[0], stop=v[1], step=v[2]) for v in value if isinstance(v, tuple)]
            )
        )
    return pb.AttributeValue(int_list=pb.IntList(values=[int(v) for v in value if isinstance(v, int)]))


def refuse_unknown_fields(msg: Message, where: str) -> None:
    """SpecError naming the first field this version does not know, anywhere in `msg`.

    A newer client's field inside a spec, target or options would otherwise
    be dropped silently: the plan would be built (and keyed) without it."""
    unknown = [f.field_number for f in UnknownFieldSet(msg)]  # type: ignore[attr-defined]
    if unknown:
        raise SpecError(
            f"{where}: unknown field number(s) {', '.join(map(str, unknown))} in {msg.DESCRIPTOR.name} (sent by a newer client? this server cannot honor them)"
        )
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for k, v in value.items():
                    refuse_unknown_fields(v, f"{where}.{field.name}[{k!r}]")
        elif field.is_repeated:
            for i, item in enumerate(value):
                refuse_unknown_fields(item, f"{where}.{field.name}[{i}]")
        else:
            refuse_unknown_fields(value, f"{where}.{field.name}")


def from_proto(msg: pb.GraphSpec) -> GraphSpec:
    spec = GraphSpec(
        name=msg.name,
        io_data_type=dtypes.from_proto(msg.io_data_type, "graph io_data_type"),
        intermediate_data_type=dtypes.from_proto(msg.intermediate_data_type, "graph intermediate_data_type"),
        compute_data_type=dtypes.from_proto(msg.compute_data_type, "graph compute_data_type"),
        sm_count=msg.sm_count or None,
        sm_version=msg.sm_version or None,
        is_dynamic_shape_enabled=msg.is_dynamic_shape_enabled,
        is_override_shape_enabled=msg.is_override_shape_enabled,
        kernel_cache=msg.kernel_cache,
        cuda_graph_retention=msg.cuda_graph_retention or None,
        is_cuda_graph_replay_expected=msg.is_cuda_graph_replay_expected,
    )
    ragged: dict[int, int] = {}
    for i, t in enumerate(msg.tensors):
        where = f"tensor {i} ({t.name})" if t.name else f"tensor {i}"
        if t.HasField("ragged_offset_uid"):
            ragged[i] = t.ragged_offset_uid
        kind = t.constant.WhichOneof("value") if t.HasField("constant") else None
        _expect(t.HasField("uid"), f"{where}: missing uid (clients bind tensors by uid)")
        spec.tensors.append(
            Tensor(
                uid=t.uid,
                name=t.name,
                dim=tuple(t.dim),
                stride=tuple(t.stride),
                data_type=dtypes.from_proto(t.data_type, f"{where} data_type"),
                is_virtual=t.is_virtual,
                is_pass_by_value=t.is_pass_by_value,
                is_output=t.is_output,
                scalar_value=t.scalar_value if t.HasField("scalar_value") else None,
                reordering_type=t.reordering_type or None,
                ragged_offset_multiplier=t.ragged_offset_multiplier or 1,
                alignment_value=t.alignment_value or 1,
                constant=getattr(t.constant, kind) if kind else None,
                scalar_type=(t.constant.scalar_type or None) if kind else None,
            )
        )
    by_uid = _index_uids(spec.tensors)
    _resolve_ragged(spec, ragged, by_uid)
    for i, n in enumerate(msg.nodes):
        where = f"node {i} ({n.name or n.op})"
        spec.nodes.append(
            Node(
                op=n.op,
                name=n.name,
                inputs=_ports(dict(n.inputs), by_uid, f"{where} input"),
                outputs=_ports(dict(n.outputs), by_uid, f"{where} output"),
                attributes={k: _attr_from_proto(v, f"{where} attribute {k!r}") for k, v in n.attributes.items()},
                compute_data_type=dtypes.from_proto(n.compute_data_type, f"{where} compute_data_type"),
            )
        )
    return spec


def _attr_from_proto(value: pb.AttributeValue, where: str) -> AttrValue:
    kind = value.WhichOneof("value")
    if kind is None:
        raise SpecError(f"{where}: no value set")
    if kind == "int_list":
        return tuple(value.int_list.values)
    if kind == "subgraph":
        return _subgraph_from_proto(value.subgraph, where)
    if kind == "slice_list":
        return tuple(
            (
                s.start if s.HasField("start") else None,
                s.stop if s.HasField("stop") else None,
                s.step if s.HasField("step") else None,
            )
            for s in value.slice_list.slices
        )
    if kind == "float_value":
        _expect(math.isfinite(value.float_value), f"{where}: must be finite")
    result: AttrValue = getattr(value, kind)
    return result


def _ref_to_proto(ref: tuple[str, int]) -> pb.SubgraphRef:
    if ref[0] == "score":
        return pb.SubgraphRef(score=True)
    return pb.SubgraphRef(result=ref[1]) if ref[0] == "result" else pb.SubgraphRef(uid=ref[1])


def _ref_from_proto(ref: pb.SubgraphRef, where: str) -> tuple[str, int]:
    kind = ref.WhichOneof("ref")
    _expect(kind is not None, f"{where}: an empty reference")
    return ("score", 0) if kind == "score" else (str(kind), int(getattr(ref, str(kind))))


def _subgraph_to_proto(subgraph: Subgraph) -> pb.Subgraph:
    msg = pb.Subgraph(result=_ref_to_proto(subgraph.result))
    for op in subgraph.ops:
        item = msg.ops.add(
            op=op.op,
            compute_data_type=dtypes.to_proto(op.compute_data_type),
            data_type=dtypes.to_proto(op.data_type),
            name=op.name,
        )
        for port, ref in op.inputs:
            item.inputs[port].CopyFrom(_ref_to_proto(ref))
        for key, value in op.attributes:
            item.attributes[key].CopyFrom(attr_to_proto(value))  # type: ignore[arg-type]
    return msg


def _subgraph_from_proto(msg: pb.Subgraph, where: str) -> Subgraph:
    ops = tuple(
        SubgraphOp(
            op=op.op,
            inputs=tuple((p, _ref_from_proto(r, f"{where} op {i} input {p!r}")) for p, r in op.inputs.items()),
            attributes=tuple(
                (k, _attr_from_proto(v, f"{where} op {i} attribute {k!r}"))  # type: ignore[misc]
                for k, v in op.attributes.items()
            ),
            compute_data_type=dtypes.from_proto(op.compute_data_type, where),
            data_type=dtypes.from_proto(op.data_type, where),
            name=op.name,
        )
        for i, op in enumerate(msg.ops)
    )
    return Subgraph(ops, _ref_from_proto(msg.result, f"{where} result"))


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _resolve_ragged(spec: GraphSpec, ragged: Mapping[int, int], by_uid: Mapping[int, Tensor]) -> None:
    """Point each ragged tensor (by index) at its offsets tensor (by uid)."""
    for index, uid in ragged.items():
        t = spec.tensors[index]
        _expect(uid in by_uid, f"{t.label()}: ragged_offset_uid {uid} names no tensor of this graph")
        t.ragged_offset = by_uid[uid]


def _index_uids(tensors: list[Tensor]) -> dict[int, Tensor]:
    by_uid: dict[int, Tensor] = {}
    for t in tensors:
        assert t.uid is not None
        if t.uid in by_uid:
            raise SpecError(f"{t.label()}: duplicate uid {t.uid} (also {by_uid[t.uid].label()})")
        by_uid[t.uid] = t
    return by_uid


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


def _no_unknown(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    _expect(
        not unknown,
        f"{where}: unknown field(s) {', '.join(map(repr, unknown))} (allowed: {', '.join(sorted(allowed))})",
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: Any, where: str) -> int:
    _expect(isinstance(value, int) and not isinstance(value, bool), f"{where}: expected an integer, got {value!r}")
    result: int = value
    return result


def _ints(value: Any, where: str) -> tuple[int, ...]:
    _expect(isinstance(value, list), f"{where}: expected a list of integers, got {value!r}")
    return tuple(_int(v, where) for v in value)


def _bool(value: Any, where: str) -> bool:
    _expect(isinstance(value, bool), f"{where}: expected true or false, got {value!r}")
    result: bool = value
    return result


def _str(value: Any, where: str) -> str:
    _expect(isinstance(value, str), f"{where}: expected a string, got {value!r}")
    result: str = value
    return result


def _dtype(value: Any, where: str) -> str | None:
    return None if value is None else dtypes.normalize(value, where)

"""A GraphSpec's proto message (plancache.v1.GraphSpec), both ways, and the refusal of fields this version
does not know."""

from __future__ import annotations

import math

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec.graph import GraphSpec, Node, Tensor
from plancache.graphspec.ops import AttrValue
from plancache.graphspec.spec_refs import expect, index_uids, port_tensors, resolve_ragged
from plancache.graphspec.subgraph import Subgraph, SubgraphOp
from plancache.v1 import plancache_pb2 as pb


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
        tensor = msg.tensors.add(  # made in place: a TensorSpec made apart was copied in (a miss's path, issue 41)
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
            f"{where}: unknown field number(s) {', '.join(map(str, unknown))} in {msg.DESCRIPTOR.name} "
            "(sent by a newer client? this server cannot honor them)"
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
        expect(t.HasField("uid"), f"{where}: missing uid (clients bind tensors by uid)")
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
    by_uid = index_uids(spec.tensors)
    resolve_ragged(spec, ragged, by_uid)
    for i, n in enumerate(msg.nodes):
        where = f"node {i} ({n.name or n.op})"
        spec.nodes.append(
            Node(
                op=n.op,
                name=n.name,
                inputs=port_tensors(dict(n.inputs), by_uid, f"{where} input"),
                outputs=port_tensors(dict(n.outputs), by_uid, f"{where} output"),
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
        expect(math.isfinite(value.float_value), f"{where}: must be finite")
    result: AttrValue = getattr(value, kind)
    return result


def _ref_to_proto(ref: tuple[str, int]) -> pb.SubgraphRef:
    if ref[0] == "score":
        return pb.SubgraphRef(score=True)
    return pb.SubgraphRef(result=ref[1]) if ref[0] == "result" else pb.SubgraphRef(uid=ref[1])


def _ref_from_proto(ref: pb.SubgraphRef, where: str) -> tuple[str, int]:
    kind = ref.WhichOneof("ref")
    expect(kind is not None, f"{where}: an empty reference")
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

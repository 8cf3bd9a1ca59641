"""A GraphSpec's hand-written JSON form, and the plain dict behind it.

Unknown keys are errors: a typo must not silently change a graph.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec.graph import GraphSpec, Node, Tensor
from plancache.graphspec.ops import AttrValue
from plancache.graphspec.spec_refs import as_int, expect, index_uids, port_tensors, resolve_ragged
from plancache.graphspec.subgraph import Subgraph
from plancache.graphspec.subgraph import from_plain as subgraph_from_plain
from plancache.graphspec.suggest import did_you_mean

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
    expect(isinstance(data, dict), f"{where}: expected a JSON object, got {type(data).__name__}")
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
    expect(isinstance(tensors, list), "graph: 'tensors' must be a list")
    ragged: dict[int, int] = {}
    for i, raw in enumerate(tensors):
        spec.tensors.append(_tensor_from_dict(raw, f"tensor {i}"))
        if isinstance(raw, dict) and raw.get("ragged_offset_uid") is not None:
            ragged[i] = as_int(raw["ragged_offset_uid"], f"tensor {i} ragged_offset_uid")
    by_uid = index_uids(spec.tensors)
    resolve_ragged(spec, ragged, by_uid)
    nodes = data.get("nodes", [])
    expect(isinstance(nodes, list), "graph: 'nodes' must be a list")
    for i, raw in enumerate(nodes):
        spec.nodes.append(_node_from_dict(raw, i, by_uid))
    return spec


def _tensor_from_dict(raw: Any, where: str) -> Tensor:
    expect(isinstance(raw, dict), f"{where}: expected an object")
    _no_unknown(raw, _TENSOR_KEYS, where)
    name = _str(raw.get("name", ""), f"{where} name")
    where = f"{where} ({name})" if name else where
    expect("uid" in raw, f"{where}: missing 'uid' (clients bind tensors by uid)")
    scalar = raw.get("scalar_value")
    expect(scalar is None or (_is_number(scalar)), f"{where}: scalar_value must be a number")
    constant = raw.get("constant")
    expect(constant is None or _is_number(constant), f"{where}: constant must be a number")
    return Tensor(
        uid=as_int(raw["uid"], f"{where} uid"),
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
        ragged_offset_multiplier=as_int(raw.get("ragged_offset_multiplier", 1), f"{where} ragged_offset_multiplier"),
        alignment_value=as_int(raw.get("alignment_value", 1), f"{where} alignment_value"),
        constant=constant,
        scalar_type=None if raw.get("scalar_type") is None else _str(raw["scalar_type"], f"{where} scalar_type"),
    )


def _node_from_dict(raw: Any, index: int, by_uid: Mapping[int, Tensor]) -> Node:
    where = f"node {index}"
    expect(isinstance(raw, dict), f"{where}: expected an object")
    _no_unknown(raw, _NODE_KEYS, where)
    name = _str(raw.get("name", ""), f"{where} name")
    where = f"{where} ({name or raw.get('op')})"
    expect(isinstance(raw.get("op"), str), f"{where}: missing 'op'")
    attributes = raw.get("attributes", {})
    expect(isinstance(attributes, dict), f"{where}: 'attributes' must be an object")
    return Node(
        op=raw["op"],
        name=name,
        inputs=port_tensors(raw.get("inputs", {}), by_uid, f"{where} input"),
        outputs=port_tensors(raw.get("outputs", {}), by_uid, f"{where} output"),
        attributes={str(k): _attr_from_json(v, f"{where} attribute {k!r}") for k, v in attributes.items()},
        compute_data_type=_dtype(raw.get("compute_data_type"), f"{where} compute_data_type"),
    )


def _attr_from_json(value: Any, where: str) -> AttrValue:
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        expect(math.isfinite(value), f"{where}: must be finite")
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
    expect(
        len(value) == 3 and all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value),
        f"{where}: a slice is [start, stop, step], each an integer or null, got {value!r}",
    )
    return (value[0], value[1], value[2])


def _no_unknown(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise SpecError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}{did_you_mean(unknown[0], allowed)}"
            f" (allowed: {', '.join(sorted(allowed))})"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _ints(value: Any, where: str) -> tuple[int, ...]:
    expect(isinstance(value, list), f"{where}: expected a list of integers, got {value!r}")
    return tuple(as_int(v, where) for v in value)


def _bool(value: Any, where: str) -> bool:
    expect(isinstance(value, bool), f"{where}: expected true or false, got {value!r}")
    result: bool = value
    return result


def _str(value: Any, where: str) -> str:
    expect(isinstance(value, str), f"{where}: expected a string, got {value!r}")
    result: str = value
    return result


def _dtype(value: Any, where: str) -> str | None:
    return None if value is None else dtypes.normalize(value, where)

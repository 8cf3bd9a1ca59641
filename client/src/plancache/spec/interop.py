"""From an existing cuDNN frontend graph to a GraphSpec, so code that builds
`cudnn.pygraph`s compiles through plancache with one line:

    spec = GraphSpec.from_pygraph(g)      # g: a cudnn.pygraph, built or not
    plan = client.compile(spec)

Reads the frontend's (1.32) graph IR: nodes with their type, ports, params
and compute type; tensors with uid, dims, strides, data type and flags.
Anything the catalog does not know is refused by validation, naming it.
"""

from __future__ import annotations

import enum
from typing import Any

from plancache.errors import SpecError
from plancache.spec.graph import GraphSpec, Node, Tensor
from plancache.spec.ops import CATALOG

# Frontend node types -> catalog ops (pointwise nodes carry their op in params["mode"]).
_NODE_OPS = {
    "MATMUL": "matmul", "CONV_FPROP": "conv_fprop", "CONV_DGRAD": "conv_dgrad", "CONV_WGRAD": "conv_wgrad", "SDPA": "sdpa", "SDPA_FP8": "sdpa_fp8",
    "SDPA_BWD": "sdpa_backward", "LAYERNORM": "layernorm", "RMSNORM": "rmsnorm", "BATCHNORM_INFERENCE": "batchnorm_inference",
    "REDUCTION": "reduction",
}  # fmt: skip


def _dtype(value: Any) -> str | None:
    name = getattr(value, "name", None)
    return None if name in (None, "NOT_SET") else str(name).lower()


def _attribute(value: Any) -> Any:
    if isinstance(value, enum.Enum) or (hasattr(value, "name") and not isinstance(value, bool | int | float | str)):
        return str(value.name)
    if isinstance(value, list | tuple):
        return tuple(value)
    return value


def _dropout_ports(params: dict[str, Any], inputs: dict[str, Any], where: str) -> None:
    """The IR keeps dropout=(p, seed, offset) flattened (params _dropout_n and
    dropout_0, inputs dropout_1 and dropout_2): the catalog's names for them."""
    count = params.pop("_dropout_n", None)
    if count is None:
        return
    if count != 3 or "dropout_0" not in params or "dropout_1" not in inputs or "dropout_2" not in inputs:
        raise SpecError(f"{where}: only Philox dropout (probability, seed, offset) has a plancache form, not a dropout mask")
    params["dropout_probability"] = float(params.pop("dropout_0"))
    inputs["dropout_seed"] = inputs.pop("dropout_1")
    inputs["dropout_offset"] = inputs.pop("dropout_2")


def from_pygraph(graph: Any) -> GraphSpec:
    context = getattr(graph, "_context", None)
    spec = GraphSpec(
        io_data_type=_dtype(getattr(context, "io_data_type", None)),
        intermediate_data_type=_dtype(getattr(context, "intermediate_data_type", None)) or "float",
        compute_data_type=_dtype(getattr(context, "compute_data_type", None)) or "float",
    )
    made: dict[int, Tensor] = {}

    def tensor(t: Any, produced: bool = False) -> Tensor:
        # A node's result keeps only strides its caller set: the frontend's
        # own (a provisional row-major before validate(), its layout after)
        # are inferred again by normalize, the way the frontend infers them.
        if id(t) not in made:
            made[id(t)] = Tensor(
                uid=int(t.uid) if t.uid is not None else None, name=str(t.name or ""), dim=tuple(t.dim or ()),
                stride=tuple(t.stride or ()) if t.stride_assigned or not produced else (), data_type=_dtype(t.data_type),
                is_virtual=bool(t.is_virtual), is_pass_by_value=bool(t.is_pass_by_value),
            )  # fmt: skip
            spec.tensors.append(made[id(t)])
            offsets = getattr(t, "ragged_offset", None)
            if offsets is not None:
                if getattr(t, "ragged_offset_multiplier", 1) not in (None, 1):
                    raise SpecError(f"tensor {t.name}: a ragged offset multiplier other than 1 has no plancache form yet")
                made[id(t)].ragged_offset = tensor(offsets)
        return made[id(t)]

    for index, node in enumerate(graph.nodes):
        kind = node.node_type.name
        params = dict(node.params)
        if kind == "POINTWISE":
            op = str(params.pop("mode"))
        elif kind in _NODE_OPS:
            op = _NODE_OPS[kind]
        else:
            raise SpecError(f"node {index} ({node.name}): frontend node type {kind} has no plancache op yet")
        schema = CATALOG.get(op)
        if schema is None:
            raise SpecError(f"node {index} ({node.name}): op {op!r} is not in plancache's catalog")
        inputs = dict(node.inputs)
        if kind == "POINTWISE":  # the IR names pointwise ports IN_0, IN_1: the method's keywords, in order
            inputs = {schema.inputs[int(port.removeprefix("IN_"))]: t for port, t in inputs.items()}
        _dropout_ports(params, inputs, f"node {index} ({node.name})")
        attributes = {k: _attribute(v) for k, v in params.items() if v is not None}
        outputs = {port: tensor(t, produced=True) for port, t in node.outputs.items()}
        for t in outputs.values():
            t.is_output = not t.is_virtual
        spec.nodes.append(
            Node(op=op, name=str(node.name), inputs={p: tensor(t) for p, t in inputs.items()}, outputs=outputs,
                 attributes=attributes, compute_data_type=_dtype(node.compute_data_type))
        )  # fmt: skip
    return spec

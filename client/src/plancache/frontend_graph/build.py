"""A normalized spec as the cuDNN frontend's graph, built through the
frontend's own API the way a program builds it: `cudnn.pygraph(...)` with
the spec's constructor arguments, `g.tensor(...)` / `g.tensor_scalar(...)`
for its inputs, one builder call per node with the node's ports and
attributes as keywords, and on each result the setters a program calls
(`set_uid`, `set_data_type`, `set_output`, `set_dim`, `set_stride`, ...).

Which dims and strides a result is given follows what the frontend sends to
cuDNN (see plancache.graphspec.interop): a frontend op's results get those the
spec carries (the program set them, or the frontend always sends them); a
classic op's outputs get the normal form's, which plancache's layout rules
derive as cuDNN would (checked on the GPU, tests/gpu/test_gpu_layouts.py);
its intermediates are left to the frontend.
"""

from __future__ import annotations

from typing import Any

from plancache import dtypes
from plancache.errors import CompileFailed
from plancache.graphspec.frontend_ops import DROPOUT_MASK, DROPOUT_PHILOX, recorded
from plancache.graphspec.graph import GraphSpec, Node, Tensor
from plancache.graphspec.ops import CATALOG, AttrKind, OpSchema
from plancache.graphspec.subgraph import Subgraph, replay


def cudnn_type(cudnn: Any, name: str) -> Any:
    return getattr(cudnn.data_type, dtypes.cudnn_name(name))


def _enum(cudnn: Any, enum_type: str, member: str) -> Any:
    return getattr(getattr(cudnn._compiled_module, enum_type), member)


def build_pygraph(
    spec: GraphSpec, cudnn: Any, *, handle: Any = None, kernel_cache: Any = None, classic_result_strides: bool = True
) -> Any:
    """The unbuilt pygraph of a normalized spec. CompileFailed names the node
    whose builder the frontend refused (with the frontend's reason).
    `classic_result_strides=False` leaves a classic op's results' strides to
    the frontend (tests/gpu check plancache's layout rules against it)."""
    g = cudnn.pygraph(**_graph_arguments(spec, cudnn, handle, kernel_cache))
    made: dict[int, Any] = {}
    produced = {
        t.uid for n in spec.nodes for port, t in n.outputs.items() if port not in CATALOG[n.op].optional_outputs
    }
    for t in spec.tensors:
        if t.uid not in produced:
            made[_uid(t)] = _input(g, cudnn, t)
    for t in spec.tensors:
        if t.uid not in produced:
            _set_ragged(made[_uid(t)], t, made)
    for index, node in enumerate(spec.nodes):
        _node(g, cudnn, node, index, made, classic_result_strides)
    return g


def _uid(t: Tensor) -> int:
    assert t.uid is not None
    return t.uid


def _graph_arguments(spec: GraphSpec, cudnn: Any, handle: Any, kernel_cache: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"name": spec.name or "plancache"}
    if spec.io_data_type:
        kwargs["io_data_type"] = cudnn_type(cudnn, spec.io_data_type)
    kwargs["intermediate_data_type"] = cudnn_type(cudnn, spec.intermediate_data_type or "float")
    kwargs["compute_data_type"] = cudnn_type(cudnn, spec.compute_data_type or "float")
    if handle is not None:
        kwargs["handle"] = handle
    for name in ("sm_count", "sm_version"):
        if getattr(spec, name) is not None:
            kwargs[name] = getattr(spec, name)
    if spec.is_dynamic_shape_enabled:
        kwargs["is_dynamic_shape_enabled"] = True
    if spec.is_override_shape_enabled:
        kwargs["is_override_shape_enabled"] = True
    if spec.kernel_cache:  # the program gave its graph one: so does the worker, a fresh one of its own
        kwargs["kernel_cache"] = kernel_cache if kernel_cache is not None else cudnn.create_kernel_cache()
    if spec.cuda_graph_retention is not None:
        kwargs["cuda_graph_retention"] = getattr(cudnn.cuda_graph_retention, spec.cuda_graph_retention)
    if spec.is_cuda_graph_replay_expected:
        kwargs["is_cuda_graph_replay_expected"] = True
    return kwargs


def _input(g: Any, cudnn: Any, t: Tensor) -> Any:
    """A graph input (or a tensor the caller hands a node as an output, as dBias=)."""
    name = t.name or f"t{t.uid}"
    if t.constant is not None:
        made = g.tensor_scalar(t.constant, getattr(cudnn.scalar_type, str(t.scalar_type)), name=name).set_uid(_uid(t))
        if t.data_type is not None:
            made.set_data_type(cudnn_type(cudnn, t.data_type))
        return made
    assert t.data_type is not None
    return g.tensor(
        name=name,
        dim=list(t.dim),
        stride=list(t.stride),
        data_type=cudnn_type(cudnn, t.data_type),
        is_pass_by_value=t.is_pass_by_value,
        uid=_uid(t),
        reordering_type=getattr(cudnn.tensor_reordering, t.reordering_type) if t.reordering_type else None,
        alignment_value=t.alignment_value,
    )


def _set_ragged(made: Any, t: Tensor, tensors: dict[int, Any]) -> None:
    if t.ragged_offset is not None:
        made.set_ragged_offset(tensors[_uid(t.ragged_offset)])
        if t.ragged_offset_multiplier != 1:
            made.set_ragged_offset_multiplier(t.ragged_offset_multiplier)


def _attribute(cudnn: Any, schema: OpSchema, key: str, value: Any, made: dict[int, Any]) -> Any:
    attr = schema.attributes.get(key)
    if attr is not None and attr.kind is AttrKind.ENUM and attr.enum_type:
        return _enum(cudnn, attr.enum_type, str(value))
    if attr is not None and attr.kind is AttrKind.SLICES:
        return [slice(*item) for item in value]
    if isinstance(value, Subgraph):  # a callback that adds the recorded ops, as the program's did
        return replay(
            value,
            made,
            lambda op, name, v: _attribute(cudnn, CATALOG[op], name, v, made),
            lambda name: cudnn_type(cudnn, name),
        )
    return list(value) if isinstance(value, tuple) else value


def _arguments(
    g: Any, cudnn: Any, node: Node, schema: OpSchema, made: dict[int, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The builder's positional and keyword arguments for `node`."""
    inputs = {port: made[_uid(t)] for port, t in node.inputs.items()}
    kwargs: dict[str, Any] = {}
    args: list[Any] = []
    if schema.node_type == "POINTWISE":  # tensors positionally, as the IR numbers its ports IN_0, IN_1 ...
        args = [inputs.pop(port) for port in schema.inputs]
    for listed in schema.list_inputs:
        members = sorted((int(p[len(listed) + 1 :]), p) for p in inputs if schema.list_port(p) == listed)
        if members:
            kwargs[listed] = [inputs.pop(p) for _, p in members]
    if DROPOUT_PHILOX[0] in inputs:
        kwargs["dropout"] = (
            node.attributes["dropout_probability"],
            inputs.pop(DROPOUT_PHILOX[0]),
            inputs.pop(DROPOUT_PHILOX[1]),
        )
    elif DROPOUT_MASK[0] in inputs:
        kwargs["dropout"] = (inputs.pop(DROPOUT_MASK[0]), inputs.pop(DROPOUT_MASK[1]))
    kwargs.update(inputs)
    for key, value in node.attributes.items():
        if key != "dropout_probability":
            kwargs[key] = _attribute(cudnn, schema, key, value, made)
    for port, t in node.outputs.items():
        if (
            port in schema.optional_outputs
        ):  # a tensor the caller made and hands over (dBias=, score_max=): made with the inputs
            kwargs[port] = made[_uid(t)]
    if schema.takes_compute_type and node.compute_data_type:
        kwargs["compute_data_type"] = cudnn_type(cudnn, node.compute_data_type)
    return args, kwargs


def _node(g: Any, cudnn: Any, node: Node, index: int, made: dict[int, Any], classic_result_strides: bool) -> None:
    schema = CATALOG[node.op]
    where = f"node {index} ({node.name or node.op})"
    args, kwargs = _arguments(g, cudnn, node, schema, made)
    try:
        result = getattr(g, node.op)(*args, name=node.name or f"{node.op}_{index}", **kwargs)
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        raise CompileFailed(f"{where}: the cuDNN frontend refused it: {e}") from e
    returned = result if isinstance(result, list | tuple) else [result]
    by_port = dict(zip(recorded().ops[node.op].outputs, returned, strict=False))
    produced = {port for port, out in by_port.items() if out is not None}
    wanted = {port for port in node.outputs if port not in schema.optional_outputs}
    if produced != wanted:
        raise CompileFailed(
            f"{where}: the frontend makes outputs {sorted(produced)} of this node, "
            f"the spec maps {sorted(wanted)} (a result the frontend makes must be in the spec, and only those)"
        )
    for port in sorted(wanted):
        _result(cudnn, schema, node.outputs[port], by_port[port], made, classic_result_strides)


def _result(
    cudnn: Any, schema: OpSchema, t: Tensor, out: Any, made: dict[int, Any], classic_result_strides: bool
) -> None:
    made[_uid(t)] = out
    out.set_uid(_uid(t))
    if t.name and t.name != out.name:  # a label, as the program named it (names reach cuDNN's graph, not the key)
        out.set_name(t.name)
    if t.data_type is not None:
        out.set_data_type(cudnn_type(cudnn, t.data_type))
    if t.is_output:
        out.set_output(True)
    # Dims and strides: see the module docstring.
    if t.dim and (schema.derived or schema.pushes_output_dims or t.is_output):
        out.set_dim(list(t.dim))
    classic_output = t.is_output and classic_result_strides
    if t.stride and (schema.derived or schema.pushes_output_strides or classic_output or t.ragged_offset is not None):
        out.set_stride(list(t.stride))
    if t.ragged_offset is not None:
        out.set_ragged_offset(made[_uid(t.ragged_offset)])
        if t.ragged_offset_multiplier != 1:
            out.set_ragged_offset_multiplier(t.ragged_offset_multiplier)
    if t.reordering_type is not None:
        out.set_reordering_type(getattr(cudnn.tensor_reordering, t.reordering_type))
    if t.alignment_value != 1:
        out.set_alignment_value(t.alignment_value)

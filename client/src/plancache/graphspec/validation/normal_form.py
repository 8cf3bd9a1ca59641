"""normalize(): a spec's checks and defaults in their order, and the bytes its tensors need on the GPU."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec import layouts
from plancache.graphspec.graph import GraphSpec, Node, Tensor
from plancache.graphspec.validation.graph_checks import check_graph, check_integer_ports, check_ragged
from plancache.graphspec.validation.limits import DEFAULT_LIMITS, Limits, storage_elements
from plancache.graphspec.validation.nodes import normalize_node
from plancache.graphspec.validation.tensors import normalize_tensor


def normalize(spec: GraphSpec, limits: Limits = DEFAULT_LIMITS, *, owned: bool = False) -> GraphSpec:
    """`spec` checked and in normal form: a copy, or `spec` itself when the caller `owned` it (made it for this
    call, as plancache.cudnn's capture reads a program's graph: the copy was ~10 % of normalizing it)."""
    out = spec if owned else copy_spec(spec)
    out.assign_uids()
    check_graph(out, limits)
    producer: dict[int, int] = {}
    consumed: set[int] = set()
    for index, node in enumerate(out.nodes):
        normalize_node(out, node, index, producer, consumed, limits)
    consumed.update(
        t.ragged_offset.uid for t in out.tensors if t.ragged_offset is not None and t.ragged_offset.uid is not None
    )
    total_bytes = 0
    for tensor in out.tensors:
        normalize_tensor(out, tensor, producer, consumed, limits)
        if not tensor.is_virtual and tensor.shape:
            stride = tensor.stride or layouts.row_major(tensor.shape)
            total_bytes += storage_elements(tensor.shape, stride) * dtypes.itemsize(tensor.data_type or "float")
    if total_bytes > limits.max_total_bytes:
        raise SpecError(f"graph: its tensors need {total_bytes:,} bytes, over the limit of {limits.max_total_bytes:,}")
    check_integer_ports(out)
    check_ragged(out, producer)
    return out


_IMMUTABLE = (int, float, bool, str, type(None))
_Copied = TypeVar("_Copied", GraphSpec, Node, Tensor)


def copy_spec(spec: GraphSpec) -> GraphSpec:
    """A copy normalize may change without touching `spec`: new tensors (each
    shared reference, a ragged offset or a node's port, kept shared), nodes,
    lists and dicts; values are immutable (tuples, numbers, strings) and are
    shared. An attribute of another kind (a Subgraph) is deep-copied. As
    copy.deepcopy(spec) does, in a quarter of the time (a graph's key is made
    on every call that keys it: a miss's fixed cost, issue 41)."""
    tensors: dict[int, Tensor] = {}

    def tensor(t: Tensor) -> Tensor:
        found = tensors.get(id(t))
        if found is None:
            found = tensors[id(t)] = _shallow(t)
            if t.ragged_offset is not None:
                found.ragged_offset = tensor(t.ragged_offset)
        return found

    out = _shallow(spec)
    out.tensors = [tensor(t) for t in spec.tensors]
    out.nodes = [_node(n, tensor) for n in spec.nodes]
    return out


def _node(node: Node, tensor: Callable[[Tensor], Tensor]) -> Node:
    out = _shallow(node)  # every field; those that hold tensors or may change are made anew
    out.inputs = {port: tensor(t) for port, t in node.inputs.items()}
    out.outputs = {port: tensor(t) for port, t in node.outputs.items()}
    out.attributes = {k: v if _frozen(v) else copy.deepcopy(v) for k, v in node.attributes.items()}
    return out


def _shallow(value: _Copied) -> _Copied:
    """copy.copy(value) for the graph's dataclasses (their fields in __dict__, no __copy__): a third of its
    time, which goes through __reduce_ex__ (a key copies every tensor and node of its graph)."""
    out = object.__new__(type(value))
    out.__dict__.update(value.__dict__)
    return out


def _frozen(value: object) -> bool:
    if isinstance(value, _IMMUTABLE):
        return True
    return isinstance(value, tuple) and all(isinstance(v, _IMMUTABLE) for v in value)

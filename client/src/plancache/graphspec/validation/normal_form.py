"""normalize(): a spec's checks and defaults in their order, and the bytes its tensors need on the GPU."""

from __future__ import annotations

import copy

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec import layouts
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.validation.graph_checks import check_graph, check_integer_ports, check_ragged
from plancache.graphspec.validation.limits import DEFAULT_LIMITS, Limits, storage_elements
from plancache.graphspec.validation.nodes import normalize_node
from plancache.graphspec.validation.tensors import normalize_tensor


def normalize(spec: GraphSpec, limits: Limits = DEFAULT_LIMITS) -> GraphSpec:
    out = copy.deepcopy(spec)
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

"""A tensor brought to normal form: its role (input, intermediate, output), data type, dims and strides, and
the frontend tensor's attributes past the classic ones."""

from __future__ import annotations

import math

from plancache.errors import SpecError
from plancache.graphspec import layouts
from plancache.graphspec.frontend_ops import recorded
from plancache.graphspec.graph import GraphSpec, Node, Tensor
from plancache.graphspec.validation.limits import Limits, check_dims, is_exact_int


def normalize_tensor(spec: GraphSpec, t: Tensor, producer: dict[int, int], consumed: set[int], limits: Limits) -> None:
    assert t.uid is not None
    # The tensor's label is made only for an error (made on success too: ~15 % of normalizing a tensor, issue 41).
    _normalize_frontend_fields(t)
    produced = t.uid in producer
    if produced:
        if t.is_output and t.is_virtual:
            raise SpecError(f"{t.label()}: cannot be both virtual and an output")
        t.is_virtual = not t.is_output
        if (
            t.is_virtual
            and t.uid not in consumed
            and not _a_sibling_is_kept(spec.nodes[producer[t.uid]], t.uid, consumed)
        ):
            raise SpecError(
                f"{t.label()}: an intermediate no node consumes; mark it as an output (is_output) to keep it"
            )
        if t.is_pass_by_value:
            raise SpecError(f"{t.label()}: a node's result cannot be pass-by-value")
        default_type = spec.intermediate_data_type if t.is_virtual else spec.io_data_type
    else:
        if t.is_virtual or t.is_output:
            raise SpecError(f"{t.label()}: marked {'virtual' if t.is_virtual else 'output'} but no node produces it")
        if t.uid not in consumed:
            raise SpecError(f"{t.label()}: declared but no node uses it")
        default_type = "float" if t.is_pass_by_value else spec.io_data_type
    if t.data_type is None and t.constant is None:  # a constant's type is the one cuDNN gives its value
        if default_type is None:
            raise SpecError(f"{t.label()}: no data_type, and the graph has no io_data_type to default to")
        t.data_type = default_type
    if not t.dim:
        if not produced:
            raise SpecError(f"{t.label()}: no dims")
        # A result whose dims cuDNN infers (see nodes._result_dims); the program may still have set its strides.
        if t.stride and t.inferred_dim and len(t.stride) != len(t.inferred_dim):
            raise SpecError(f"{t.label()}: strides {list(t.stride)} for a result of rank {len(t.inferred_dim)}")
        if any(not is_exact_int(s) or s < 0 for s in t.stride):
            raise SpecError(f"{t.label()}: strides must be >= 0, got {list(t.stride)}")
        return
    check_dims(t, limits)
    if not t.stride and not produced:
        t.stride = layouts.row_major(t.dim)
    if t.stride and len(t.stride) != len(t.dim):
        raise SpecError(f"{t.label()}: stride {list(t.stride)} has {len(t.stride)} entries for {len(t.dim)} dims")
    # The frontend takes zero strides (a broadcast view, as torch's expand() makes).
    if any(not is_exact_int(s) or s < 0 for s in t.stride):
        raise SpecError(f"{t.label()}: strides must be >= 0, got {list(t.stride)}")
    if t.is_pass_by_value and math.prod(t.dim) != 1:
        raise SpecError(f"{t.label()}: a pass-by-value tensor must hold one element, got dims {list(t.dim)}")
    if t.scalar_value is not None and not t.is_pass_by_value:
        raise SpecError(f"{t.label()}: scalar_value is only for pass-by-value tensors")
    if t.scalar_value is not None and not math.isfinite(t.scalar_value):
        raise SpecError(f"{t.label()}: scalar_value must be finite")


def _a_sibling_is_kept(node: Node, uid: int, consumed: set[int]) -> bool:
    """Whether another result of `node` is an output or consumed. A program may
    leave a side result unused (sdpa's Stats: `o, _ = graph.sdpa(...)`) and the
    frontend builds that graph; the dangling result stays part of the graph it
    declared. A node none of whose results is kept is a mistake, refused."""
    return any(o.uid != uid and (o.is_output or o.uid in consumed) for o in node.outputs.values())


def _normalize_frontend_fields(t: Tensor) -> None:
    """The frontend tensor's attributes past the classic ones: valid, and at their defaults unless set."""
    reordering = t.reordering_type
    if reordering is not None:
        members = recorded().enums.get("tensor_reordering", ())
        if not isinstance(reordering, str) or reordering not in members:
            raise SpecError(f"{t.label()}: reordering_type {reordering!r} is not one of {', '.join(members)}")
        t.reordering_type = None if reordering == "NONE" else reordering
    for name in ("ragged_offset_multiplier", "alignment_value"):
        value = getattr(t, name)
        if not is_exact_int(value) or value < 1:
            raise SpecError(f"{t.label()}: {name} must be a positive integer, got {value!r}")
    if t.ragged_offset_multiplier != 1 and t.ragged_offset is None:
        raise SpecError(f"{t.label()}: ragged_offset_multiplier is for a ragged tensor")
    if t.constant is None:
        if t.scalar_type is not None:
            raise SpecError(f"{t.label()}: scalar_type is for a scalar held in the graph (constant)")
        return
    if isinstance(t.constant, bool) or not (
        is_exact_int(t.constant) or (isinstance(t.constant, float) and math.isfinite(t.constant))
    ):
        raise SpecError(f"{t.label()}: constant must be a finite number, got {t.constant!r}")
    members = recorded().enums.get("scalar_type", ())
    if t.scalar_type not in members:
        raise SpecError(f"{t.label()}: a constant needs scalar_type, one of {', '.join(members)}")
    if not t.is_pass_by_value or t.is_virtual or t.is_output or t.scalar_value is not None:
        raise SpecError(f"{t.label()}: a constant is a pass-by-value graph input without scalar_value")

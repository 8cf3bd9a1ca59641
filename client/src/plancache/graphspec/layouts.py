"""The strides of a node's results, inferred as the cuDNN frontend infers them.

A spec may leave out the strides of what its nodes produce; the frontend
then chooses a layout per op, and a node building the same graph locally
gets that layout. Normalizing to the same strides makes a spec, the same
graph built with the frontend's API and captured with `from_pygraph`, and a
spec that writes the strides out all one graph, one key, one plan.

The rules (cuDNN frontend 1.32: its Python graph lowers to the C++ graph,
whose per-node `infer_properties_node` picks the layout unless the caller
set one; the SDPA family gets the Python graph's row-major strides), checked
against the frontend on the GPU for every op family (tests/gpu):

- matmul, sdpa, sdpa_backward: row-major (packed, last dim fastest);
- conv_fprop, conv_dgrad, conv_wgrad, reduction: channels-last (NHWC: dim 1
  fastest, then the last dims, dim 0 slowest), whatever the inputs' layout;
- norms (layernorm, rmsnorm, batchnorm_inference): Y takes X's strides;
  their statistics keep X's dim order, packed;
- pointwise: the strides of the first input (in port order) whose dims
  equal the result's; otherwise the first input's dim order, packed (the
  frontend does this for intermediates only and fails for a graph output;
  here an output gets it too, since the strides are then written out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Dims = tuple[int, ...]

ROW_MAJOR_FAMILIES = frozenset({"matmul", "sdpa", "sdpa_backward"})
CHANNELS_LAST_FAMILIES = frozenset({"conv", "reduction"})


def packed(dim: Sequence[int], order: Sequence[int]) -> Dims:
    """Dense strides for `dim` where order[i] ranks axis i from fastest (0)
    to slowest; ties go to the lower axis (the frontend's generate_stride)."""
    strides = [0] * len(dim)
    step = 1
    for _, axis in sorted((rank, axis) for axis, rank in enumerate(order)):
        strides[axis] = step
        step *= dim[axis]
    return tuple(strides)


def row_major(dim: Sequence[int]) -> Dims:
    return packed(dim, list(reversed(range(len(dim)))))


def channels_last(dim: Sequence[int]) -> Dims:
    rank = len(dim)
    if rank < 3:
        return row_major(dim)
    order = [0] * rank
    order[1] = 0
    for rank_of, axis in enumerate(range(rank - 1, 1, -1), start=1):
        order[axis] = rank_of
    order[0] = rank - 1
    return packed(dim, order)


def order_of(stride: Sequence[int], rank: int) -> list[int]:
    """The dim order a stride follows (fastest first; a stable sort, as the
    frontend's insertion sort of short vectors), padded to `rank`."""
    by_speed = sorted(range(len(stride)), key=lambda axis: stride[axis])
    order = [0] * len(stride)
    for rank_of, axis in enumerate(by_speed):
        order[axis] = rank_of
    return order + list(range(len(stride), rank))


def result_strides(
    family: str, port: str, dim: Dims, inputs: Mapping[str, tuple[Dims, Dims]], input_order: Sequence[str]
) -> Dims:
    """Strides of result `port` (dims `dim`) of a node of `family`, given
    its inputs' (dims, strides) by port and its ports' order."""
    if family in ROW_MAJOR_FAMILIES:
        return row_major(dim)
    if family in CHANNELS_LAST_FAMILIES:
        return channels_last(dim)
    if family == "norm":
        x_dim, x_stride = inputs["input"]
        if port == "Y" and x_dim == dim:
            return x_stride
        return packed(dim, order_of(x_stride, len(dim))[: len(dim)])
    if family == "pointwise":
        present = [p for p in input_order if p in inputs]
        for p in present:
            if inputs[p][0] == dim:
                return inputs[p][1]
        first_stride = inputs[present[0]][1]
        return packed(dim, order_of(first_stride, len(dim))[: len(dim)])
    return row_major(dim)

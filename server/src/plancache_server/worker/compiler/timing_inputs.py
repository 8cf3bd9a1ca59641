"""What the autotuner may put in the integer tensors it times candidates on.

Random values are right for data, wrong for tensors that steer memory
accesses: a length past its axis, a page index past the pool or a ragged
offset past the buffer makes a candidate read or write out of bounds (and a
backward's workspace is sized by its token totals). These rules keep every
candidate inside the buffers the autotuner allocates; torch-free, so they
are tested on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plancache import dtypes
from plancache.graphspec.attention import PAGED_PORTS
from plancache.graphspec.graph import GraphSpec, Node
from plancache.graphspec.ops import CATALOG


@dataclass
class TimingInputs:
    """Per tensor uid: `lengths` values in [1, bound]; `indices` values in
    [0, bound); `ragged_steps` offsets i × step for batch i (elements)."""

    lengths: dict[int, int] = field(default_factory=dict)
    indices: dict[int, int] = field(default_factory=dict)
    ragged_steps: dict[int, int] = field(default_factory=dict)
    # Why no candidate may run on random inputs ("" when they may): an
    # integer input these rules do not know (MoE token offsets, cumulative
    # sequence lengths ...) can steer memory accesses out of bounds, so the
    # heuristic plan is served untimed rather than a GPU fault risked.
    untimeable: str = ""


def timing_inputs(spec: GraphSpec) -> TimingInputs:
    found = TimingInputs()
    for index, node in enumerate(spec.nodes):
        schema = CATALOG[node.op]
        if not found.untimeable:
            found.untimeable = _unknown_integer_input(node, index)
        for table, bounds in ((schema.integer_bounds, found.lengths), (schema.index_bounds, found.indices)):
            for port, (source, axis) in table.items():
                if port in node.inputs:
                    uid = node.inputs[port].uid or 0
                    bounds[uid] = min(bounds.get(uid, node.inputs[source].dim[axis]), node.inputs[source].dim[axis])
        _ragged(node, found)
        _paged(node, found)
    return found


def _unknown_integer_input(node: Node, index: int) -> str:
    """A reason when one of the node's integer inputs has no rule here (pointwise
    ops and matmuls read integers as data: any value is in bounds)."""
    schema = CATALOG[node.op]
    if schema.family in ("pointwise", "matmul"):
        return ""
    known = {*schema.integer_bounds, *schema.index_bounds, *schema.integer_inputs}
    for port, t in node.inputs.items():
        if port not in known and t.data_type in dtypes.INTEGER_TYPES and not t.is_pass_by_value:
            return (
                f"node {index} ({node.name or node.op}): integer input {port!r} may steer memory accesses, "
                "and plancache has no rule for its values"
            )
    return ""


def _paged(node: Node, found: TimingInputs) -> None:
    """A paged cache's kv lengths go up to the longest sequence it declares,
    not to one page (k's axis 2 is the page size there)."""
    longest = node.attributes.get("paged_attention_max_seq_len_kv")
    if isinstance(longest, int) and "seq_len_kv" in node.inputs:
        found.lengths[node.inputs["seq_len_kv"].uid or 0] = longest


def _ragged(node: Node, found: TimingInputs) -> None:
    """Packed sequences at a fixed spacing of `tokens` positions, lengths at
    most that: b × tokens stays within the padded buffers and within the
    token totals (max_total_seq_len_q/_kv) the node declares."""
    packed = {port: t for port, t in [*node.inputs.items(), *node.outputs.items()] if t.ragged_offset is not None}
    if not packed or "q" not in node.inputs or "k" not in node.inputs:
        return
    q, k = node.inputs["q"], node.inputs["k"]
    batch = q.dim[0]
    tokens = min(q.dim[2], k.dim[2])
    for attr in ("max_total_seq_len_q", "max_total_seq_len_kv"):
        total = node.attributes.get(attr)
        if isinstance(total, int):
            tokens = min(tokens, max(1, total // batch))
    for port, t in packed.items():
        assert t.ragged_offset is not None
        offsets = t.ragged_offset.uid or 0
        # A packed page table: each sequence's pages at its row of the padded table. Else
        # elements per position (h × d in THD) × positions per sequence.
        step = t.stride[0] if port in PAGED_PORTS else t.stride[0] // t.dim[2] * tokens
        found.ragged_steps[offsets] = min(found.ragged_steps.get(offsets, step), step)
    for port in ("seq_len_q", "seq_len_kv"):
        if port in node.inputs:
            uid = node.inputs[port].uid or 0
            found.lengths[uid] = min(found.lengths.get(uid, tokens), tokens)

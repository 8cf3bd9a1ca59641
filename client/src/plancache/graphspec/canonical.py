"""The canonical form of a spec, and its hash.

Two specs that describe the same graph must hash the same, whatever order
their JSON fields, map entries or tensor list came in and whatever their
tensors and nodes are called; anything that can change the plan (dims,
strides, data types, attributes, uids, ops, node order) must change the hash.

So the canonical form is built from the *normalized* spec (every default
explicit), leaves names out, lists tensors by uid, keeps nodes in order
(they execute in order), and is serialized with RFC 8785 (JCS,
plancache.graphspec.jcs), so that any language reproduces the bytes; the rules are
written down in docs/canonical-form.md with test vectors for every example.
Virtual tensors are never bound by a client, so their uids do not reach the
plan: they are renumbered in order of first appearance (v0, v1, ...).
The version tag lets a future canonical form coexist with stored plans.
"""

from __future__ import annotations

import hashlib
from typing import Any

from plancache.errors import SpecError
from plancache.graphspec.graph import GraphSpec, Tensor
from plancache.graphspec.jcs import canonicalize
from plancache.graphspec.subgraph import Subgraph
from plancache.graphspec.validation import DEFAULT_LIMITS, Limits, normalize

# v2: JCS bytes (v1 was Python json.dumps: 1e-05 where JCS writes 0.00001).
CANONICAL_VERSION = "plancache.spec.v2"


def canonical_dict(normalized: GraphSpec) -> dict[str, Any]:
    """The canonical structure of an already normalized spec."""
    virtual: dict[int, str] = {}
    for node in normalized.nodes:
        for t in [*node.inputs.values(), *node.outputs.values()]:
            if t.is_virtual and t.uid is not None and t.uid not in virtual:
                virtual[t.uid] = f"v{len(virtual)}"

    def ref(uid: int | None) -> int | str | None:
        return virtual.get(uid, uid) if uid is not None else None

    tensors = sorted((t for t in normalized.tensors if t.uid not in virtual), key=lambda t: t.uid or 0)
    tensors += sorted((t for t in normalized.tensors if t.uid in virtual), key=lambda t: int(virtual[t.uid or 0][1:]))
    return {
        "version": CANONICAL_VERSION,
        "io_data_type": normalized.io_data_type,
        "intermediate_data_type": normalized.intermediate_data_type,
        "compute_data_type": normalized.compute_data_type,
        **graph_arguments(normalized),
        "tensors": [
            {
                "uid": ref(t.uid),
                "dim": list(t.dim),
                "stride": list(t.stride),
                "data_type": t.data_type,
                "is_virtual": t.is_virtual,
                "is_pass_by_value": t.is_pass_by_value,
                "is_output": t.is_output,
                "scalar_value": t.scalar_value,
                # Only ragged tensors carry the key, so every other spec's hash stays as it was.
                **({"ragged_offset_uid": ref(t.ragged_offset.uid)} if t.ragged_offset is not None else {}),
                **tensor_extras(t),
            }
            for t in tensors
        ],
        "nodes": [
            {
                "op": n.op,
                "inputs": {port: ref(t.uid) for port, t in n.inputs.items()},
                "outputs": {port: ref(t.uid) for port, t in n.outputs.items()},
                "attributes": {k: _plain(v) for k, v in n.attributes.items()},
                "compute_data_type": n.compute_data_type,
            }
            for n in normalized.nodes
        ],
    }


def graph_arguments(spec: GraphSpec) -> dict[str, Any]:
    """The frontend graph's constructor arguments a spec sets (none: nothing, so older keys hold)."""
    found: dict[str, Any] = {}
    for name in ("sm_count", "sm_version", "cuda_graph_retention"):
        if getattr(spec, name) is not None:
            found[name] = getattr(spec, name)
    for name in (
        "is_dynamic_shape_enabled",
        "is_override_shape_enabled",
        "kernel_cache",
        "is_cuda_graph_replay_expected",
    ):
        if getattr(spec, name):
            found[name] = True
    return found


def tensor_extras(t: Tensor) -> dict[str, Any]:
    """A tensor's frontend attributes past the classic ones, each only when not at its default."""
    found: dict[str, Any] = {}
    if t.reordering_type is not None:
        found["reordering_type"] = t.reordering_type
    if t.ragged_offset_multiplier != 1:
        found["ragged_offset_multiplier"] = t.ragged_offset_multiplier
    if t.alignment_value != 1:
        found["alignment_value"] = t.alignment_value
    if t.constant is not None:
        # JSON writes 2 and 2.0 alike; the frontend lowers an int and a float differently.
        found["constant"] = {
            "value": t.constant,
            "type": "int" if isinstance(t.constant, int) else "float",
            "scalar_type": t.scalar_type,
        }
    return found


def _plain(value: Any) -> Any:
    """Tuples (int lists, slices) as JSON arrays; a score modifier as its ops (names left out)."""
    if isinstance(value, Subgraph):
        return value.to_plain(names=False)
    return [_plain(v) for v in value] if isinstance(value, tuple | list) else value


def canonical_bytes(normalized: GraphSpec) -> bytes:
    """The hashed bytes: the canonical structure in RFC 8785 form."""
    try:
        return canonicalize(canonical_dict(normalized))
    except ValueError as e:  # e.g. an attribute integer past 2**53: JSON cannot carry it exactly
        raise SpecError(f"graph: {e}") from None


def hash_normalized(normalized: GraphSpec) -> str:
    return hashlib.sha256(canonical_bytes(normalized)).hexdigest()


def spec_hash(spec: GraphSpec, limits: Limits = DEFAULT_LIMITS) -> str:
    """Validate, normalize and hash: the spec part of a plan key."""
    return hash_normalized(normalize(spec, limits))

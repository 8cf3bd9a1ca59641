"""The op catalog as data for clients in other languages: what
scripts/frontend-catalog.py publishes as proto/plancache/v1/catalog.json,
beside the .proto it completes (docs/canonical-form.md says how a client
normalizes a spec with it).

Per op: its frontend node type and statistics family; its input ports
(required, optional, lists written "<port>_<i>"); its attributes (kind, the
enum and its members, required, the default the normal form writes); its
outputs, those the caller hands over as tensors, and which exist for which
inputs and attributes; the dims rule of each output and what the normal
form writes of a result's dims and strides ("classic": plancache's own
rules, ported by a client or delegated to the server; "frontend": as the
frontend lowers them, see canonical-form.md).
"""

from __future__ import annotations

from typing import Any

from plancache import dtypes
from plancache.graphspec.canonical import CANONICAL_VERSION
from plancache.graphspec.frontend_ops import recorded
from plancache.graphspec.ops import CATALOG, AttrSchema, OpSchema

CATALOG_VERSION = "plancache.catalog.v1"


def _attribute(attr: AttrSchema) -> dict[str, Any]:
    found: dict[str, Any] = {"kind": attr.kind.name.lower(), "required": attr.required}
    if attr.choices:
        found["choices"] = list(attr.choices)
    if attr.enum_type:
        found["enum"] = attr.enum_type
    if attr.default is not None:
        found["default"] = attr.default
    return found


def _op(schema: OpSchema) -> dict[str, Any]:
    return {
        "node_type": schema.node_type,
        "family": schema.family,
        "rules": "frontend" if schema.derived else "classic",
        "inputs": list(schema.inputs),
        "optional_inputs": list(schema.optional_inputs),
        "list_inputs": list(schema.list_inputs),
        "attributes": {name: _attribute(a) for name, a in sorted(schema.attributes.items())},
        "outputs": list(schema.all_outputs),
        "given_outputs": list(schema.optional_outputs),
        "output_presence": dict(schema.output_presence),
        "output_dims": dict(schema.output_rules),
        "pushes_output_dims": schema.pushes_output_dims,
        "pushes_output_strides": schema.pushes_output_strides,
        "takes_compute_type": schema.takes_compute_type,
        "lowering": schema.lowering,
        # Callbacks (score_mod): attributes of kind "subgraph", the ops the callback adds, recorded.
        "callbacks": list(schema.callables),
    }


def export() -> dict[str, Any]:
    frontend = recorded()
    return {
        "version": CATALOG_VERSION,
        "canonical_version": CANONICAL_VERSION,
        "frontend_version": frontend.frontend_version,
        "data_types": list(dtypes.DATA_TYPE_NAMES),
        "enums": {name: list(members) for name, members in frontend.enums.items()},
        "node_types_without_builder": list(frontend.without_builder),
        "ops": {name: _op(schema) for name, schema in CATALOG.items()},
    }

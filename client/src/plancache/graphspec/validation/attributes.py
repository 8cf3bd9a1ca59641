"""A node's attributes coerced to their kinds, defaults made explicit, and a score modifier's ops checked
against the catalog."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec.ops import CATALOG, AttrKind, AttrSchema, AttrValue, OpSchema
from plancache.graphspec.subgraph import Subgraph
from plancache.graphspec.suggest import did_you_mean
from plancache.graphspec.validation.limits import Limits, is_exact_int


def normalize_attributes(
    schema: OpSchema, raw: dict[str, AttrValue], where: str, limits: Limits
) -> dict[str, AttrValue]:
    attrs: dict[str, AttrValue] = {}
    given = dict(raw)
    if schema.prepare is not None:
        schema.prepare(given)
    for key, value in given.items():
        spec_ = schema.attributes.get(key)
        if spec_ is None:
            if key in schema.callables:
                raise SpecError(f"{where}: {key!r} takes Python code (a callback), which a spec cannot carry")
            allowed = ", ".join(sorted(schema.attributes)) or "none"
            hint = did_you_mean(key, (*schema.attributes, *schema.inputs, *schema.optional_inputs))
            raise SpecError(f"{where}: {schema.name} has no attribute {key!r}{hint} (attributes: {allowed})")
        attrs[key] = _coerce(value, spec_, f"{where}: attribute {key!r}", limits)
    for key, spec_ in schema.attributes.items():
        if key not in attrs:
            if spec_.required:
                raise SpecError(
                    f"{where}: missing required attribute {key!r}"
                    + (f" (one of {', '.join(spec_.choices)})" if spec_.choices else "")
                )
            if spec_.default is not None:
                attrs[key] = spec_.default
    return attrs


def _coerce(value: Any, spec_: AttrSchema, where: str, limits: Limits) -> AttrValue:
    kind = spec_.kind
    if kind is AttrKind.BOOL:
        if isinstance(value, bool):
            return value
    elif kind is AttrKind.INT:
        if is_exact_int(value):
            return int(value)
    elif kind is AttrKind.FLOAT:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif kind is AttrKind.SCALAR:
        # Passed on as given (the frontend types these `object`): an int stays an int.
        if isinstance(value, bool) or is_exact_int(value) or (isinstance(value, float) and math.isfinite(value)):
            scalar: bool | int | float = value
            return scalar
    elif kind is AttrKind.STRING:
        if isinstance(value, str) and len(value) <= limits.max_name_length:
            return value
    elif kind is AttrKind.INT_LIST:
        if isinstance(value, tuple | list) and all(is_exact_int(v) for v in value):
            if len(value) > limits.max_list_length:
                raise SpecError(f"{where}: more than {limits.max_list_length} values")
            return tuple(value)
    elif kind is AttrKind.SLICES:
        if isinstance(value, tuple | list) and all(_is_slice(v) for v in value):
            if len(value) > limits.max_rank:
                raise SpecError(f"{where}: more than {limits.max_rank} slices")
            return tuple((v[0], v[1], v[2]) for v in value)
        raise SpecError(
            f"{where}: expected a list of [start, stop, step] (each an integer or null, step not 0), got {value!r}"
        )
    elif kind is AttrKind.ENUM and isinstance(value, str):
        if value.upper() in spec_.choices:
            return value.upper()
        raise SpecError(f"{where}: {value!r} is not one of {', '.join(spec_.choices)}")
    elif kind is AttrKind.SUBGRAPH:
        if isinstance(value, Subgraph):
            return _normalize_subgraph(value, where, limits)
        raise SpecError(
            f"{where}: a callback's ops are given as a score modifier (plancache.graphspec.subgraph), "
            f"not {type(value).__name__}"
        )
    raise SpecError(f"{where}: expected {kind.value}, got {value!r}")


def _normalize_subgraph(subgraph: Subgraph, where: str, limits: Limits) -> Subgraph:
    """A score modifier's ops: pointwise ops of the catalog, their ports and
    attributes as the catalog says, references to the score, an earlier op
    or a graph tensor (normalize checks those uids against the graph)."""
    if len(subgraph.ops) > limits.max_nodes:
        raise SpecError(f"{where}: {len(subgraph.ops)} ops, over the limit of {limits.max_nodes}")
    ops = []
    for i, op in enumerate(subgraph.ops):
        at = f"{where} op {i} ({op.op})"
        schema = CATALOG.get(op.op)
        if schema is None or schema.family != "pointwise":
            pointwise = [name for name, s in CATALOG.items() if s.family == "pointwise"]
            hint = did_you_mean(op.op, pointwise) if schema is None else ""
            raise SpecError(f"{at}: a score modifier adds pointwise ops of the catalog only{hint}")
        ports = dict(op.inputs)
        if set(ports) != set(schema.inputs):
            raise SpecError(f"{at}: ports {sorted(ports)}, {op.op} takes {list(schema.inputs)}")
        for port, ref in ports.items():
            if ref[0] == "result" and not 0 <= ref[1] < i:
                raise SpecError(f"{at}: input {port!r} refers to op {ref[1]}, not an earlier one")
        attributes: dict[str, Any] = normalize_attributes(
            schema, {k: v for k, v in op.attributes if v is not None}, at, limits
        )  # type: ignore[misc]
        ops.append(
            replace(
                op,
                inputs=tuple((p, ports[p]) for p in schema.inputs),
                attributes=tuple(sorted(attributes.items())),
                compute_data_type=dtypes.normalize(op.compute_data_type, at) if op.compute_data_type else None,
                data_type=dtypes.normalize(op.data_type, at) if op.data_type else None,
            )
        )
    if subgraph.result[0] == "result" and not 0 <= subgraph.result[1] < len(ops):
        raise SpecError(f"{where}: its result refers to op {subgraph.result[1]}, which it does not have")
    return Subgraph(tuple(ops), subgraph.result)


def _is_slice(value: Any) -> bool:
    return (
        isinstance(value, tuple | list)
        and len(value) == 3
        and all(v is None or is_exact_int(v) for v in value)
        and value[2] != 0
    )

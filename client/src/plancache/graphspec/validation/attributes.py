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

# Every numeric attribute has a range (issue 44): what cuDNN can take, or what makes a graph at all.
# An attribute not named here has its kind's: an integer cuDNN takes as int32 (int64 for sizes that can
# pass it: the sequence lengths); a float within float32, which cuDNN computes attributes in (-1e308 as a
# matmul's padding value passed the wire checks and became -inf). Bounds are inclusive.
INT32 = (-(2**31), 2**31 - 1)
FLOAT32_MAX = 3.4028234663852886e38
SIZE = (1, 2**31 - 1)
ATTRIBUTE_RANGES: dict[str, tuple[float, float]] = {
    # convolutions (per spatial dim)
    "padding": (0, 2**20),  # conv: int lists; matmul's padding is a float value (the float range)
    "pre_padding": (0, 2**20),
    "post_padding": (0, 2**20),
    "stride": (1, 2**20),
    "dilation": (1, 2**20),
    # attention
    "dropout_probability": (0.0, 1.0),
    "max_total_seq_len_q": (0, 2**53),
    "max_total_seq_len_kv": (0, 2**53),
    "paged_attention_max_seq_len_kv": (0, 2**53),
    "sliding_window": (0, 2**31 - 1),
    "sliding_window_length": (0, 2**31 - 1),
    # shapes and indices
    "permutation": (0, 7),  # a tensor's axes (rank 8 at most)
    "axis": (-8, 7),
    "block_size": SIZE,
    "top_k": SIZE,
    "rope_dim": (0, 2**31 - 1),  # 0: the whole head dim (the frontend's default)
    "in_place_index": (0, 2**31 - 1),
}


def attribute_range(key: str, kind: AttrKind, value: object) -> tuple[float, float]:
    """The inclusive range of attribute `key` (of `kind`; for a scalar, of `value`'s type)."""
    found = ATTRIBUTE_RANGES.get(key)
    if found is not None and not (key == "padding" and kind is AttrKind.FLOAT):
        return found
    if kind is AttrKind.FLOAT or (kind is AttrKind.SCALAR and isinstance(value, float)):
        return (-FLOAT32_MAX, FLOAT32_MAX)
    return INT32


def _check_range(key: str, kind: AttrKind, value: AttrValue, where: str) -> None:
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        low, high = attribute_range(key, kind, v)
        if not low <= v <= high:
            raise SpecError(f"{where}: {v!r} is outside its range [{_shown(low)}, {_shown(high)}]")


def _shown(bound: float) -> str:
    if isinstance(bound, float) and abs(bound) >= 1e6:
        return f"{bound:.7g}"
    return f"{bound:,}" if isinstance(bound, int) and abs(bound) >= 10_000 else str(bound)


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
        _check_range(key, spec_.kind, attrs[key], f"{where}: attribute {key!r}")
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
        if isinstance(value, int) and not isinstance(value, bool):
            raise SpecError(f"{where}: {value!r} is outside [-2**53, 2**53], the integers a spec holds")
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
        if isinstance(value, tuple | list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise SpecError(f"{where}: {list(value)!r} has a value outside [-2**53, 2**53], the integers a spec holds")
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

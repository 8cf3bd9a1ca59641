"""The frontend's per-output rules, as data: which outputs a node has and
what dims they take (scripts/frontend_api.py reads them from the frontend's
code into frontend_ops.json; this module evaluates them).

Presence (does the node produce this output?):
    {"input": "p"}                  port p is given
    {"param_truthy": "p"}           attribute p is given and true / non-zero
    {"param_not_false": "p"}        attribute p is not given, or not false
    {"param_not": ["p", "NAME"]}    attribute p (an enum) is not NAME
    {"param_is": ["p", "NAME"]}     attribute p (an enum) is NAME
    {"stats": true}                 the SDPA rule: generate_stats, else not is_inference
    {"all": [rule, ...]}

Dims (what the frontend's IR infers for an output):
    {"like": "p"}                           port p's dims
    {"stats_like": "p", "keep": [axes]}     p's dims, 1 on every other axis
    {"norm_stats": a}                       the input's dims, 1 from axis a on wherever scale is not 1
                                            (1 past the batch axis without a scale)
    {"sdpa_o": true} / {"sdpa_stats": true} q's dims with v's head dim / with 1
    {"fixed": [dims]}
    {"permute": "p", "by": "attr"}          p's dims permuted by the attribute
    {"slice": true}                         each slice's extent over the input's dims
    {"block_scale": true}                   the input's dims, the block axis divided by block_size
    {"conv_fprop": true}                    the convolution's output
    {"concatenate": "axis"}                 the list inputs' dims, summed along the attribute's axis
                                            (plancache's own: the frontend leaves it to cuDNN)
    {"declared": name}                      none plancache reads: the spec gives the dims
A rule returns None when its ports are missing or have no dims yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Dims = tuple[int, ...]
Rule = Mapping[str, Any]


def present(rule: Rule, attributes: Mapping[str, Any], ports: set[str]) -> bool:
    if "all" in rule:
        return all(present(r, attributes, ports) for r in rule["all"])
    if "input" in rule:
        return str(rule["input"]) in ports
    if "param_truthy" in rule:
        return bool(attributes.get(rule["param_truthy"]))
    if "param_not_false" in rule:
        return attributes.get(rule["param_not_false"], True) is not False
    if "param_not" in rule:
        name, value = rule["param_not"]
        return bool(str(attributes.get(name, "")).upper() != value)
    if "param_is" in rule:
        name, value = rule["param_is"]
        return bool(str(attributes.get(name, "")).upper() == value)
    if "stats" in rule:
        if attributes.get("generate_stats") is not None:
            return bool(attributes["generate_stats"])
        return not attributes.get("is_inference", True)
    raise ValueError(f"unknown output presence rule {dict(rule)}")


def dims(
    rule: Rule, inputs: Mapping[str, Dims], attributes: Mapping[str, Any], outputs: Mapping[str, Dims]
) -> Dims | None:
    """The dims `rule` gives an output, or None when it cannot say."""
    if "like" in rule:
        return inputs.get(rule["like"]) or None
    if "stats_like" in rule:
        source = inputs.get(rule["stats_like"])
        keep = set(rule["keep"])
        return tuple(d if i in keep else 1 for i, d in enumerate(source)) if source else None
    if "norm_stats" in rule:
        other = rule.get("or_like_output")
        if other is not None and outputs.get(other):
            return outputs[other]
        return _norm_stats(inputs.get("input"), inputs.get("scale"), int(rule["norm_stats"]))
    if "sdpa_o" in rule:
        q, v = inputs.get("q"), inputs.get("v")
        return (*q[:-1], v[-1]) if q and v else None
    if "sdpa_stats" in rule:
        q = inputs.get("q")
        return (*q[:-1], 1) if q else None
    if "fixed" in rule:
        return tuple(int(d) for d in rule["fixed"])
    if "permute" in rule:
        source, order = inputs.get(rule["permute"]), attributes.get(rule["by"])
        if not source or not isinstance(order, tuple) or sorted(order) != list(range(len(source))):
            return None
        return tuple(source[i] for i in order)
    if "slice" in rule:
        return _sliced(inputs.get("input"), attributes.get("slices"))
    if "concatenate" in rule:
        return _concatenated(
            [d for port, d in sorted(inputs.items(), key=lambda item: _list_index(item[0])) if _list_index(port) >= 0],
            attributes.get(rule["concatenate"]),
        )
    if "block_scale" in rule:
        return _block_scaled(inputs.get("input"), attributes.get("block_size"), attributes.get("axis"))
    return None  # conv_fprop is the classic catalog's own rule; "declared": the spec gives them


def _norm_stats(x: Dims | None, scale: Dims | None, first_axis: int) -> Dims | None:
    if not x:
        return None
    if not scale:
        return tuple(d if i == 0 else 1 for i, d in enumerate(x))
    if len(scale) != len(x):
        return None
    return tuple(1 if i >= first_axis and scale[i] != 1 else d for i, d in enumerate(x))


def _sliced(x: Dims | None, slices: Any) -> Dims | None:
    if not x or not isinstance(slices, tuple) or not slices:
        return None
    out = list(x)
    for axis, (item, extent) in enumerate(zip(slices, x, strict=False)):
        start, stop, step = item
        out[axis] = len(range(*slice(start, stop, step).indices(extent)))
    return tuple(out)


def _block_scaled(x: Dims | None, block_size: Any, axis: Any) -> Dims | None:
    if not x or not isinstance(block_size, int) or block_size < 1:
        return None
    out = list(x)
    where = len(out) - 1 if axis in (None, -1) else axis
    if not isinstance(where, int) or not 0 <= where < len(out):
        return None
    out[where] = (out[where] + block_size - 1) // block_size
    return tuple(out)


def _list_index(port: str) -> int:
    head, _, index = port.rpartition("_")
    return int(index) if head and index.isdigit() else -1


def _concatenated(parts: list[Dims], axis: Any) -> Dims | None:
    if not parts or not isinstance(axis, int) or any(len(p) != len(parts[0]) for p in parts):
        return None
    rank = len(parts[0])
    where = axis + rank if axis < 0 else axis
    if not 0 <= where < rank or any(p[i] != parts[0][i] for p in parts for i in range(rank) if i != where):
        return None
    return tuple(sum(p[where] for p in parts) if i == where else parts[0][i] for i in range(rank))


def slices_valid(value: Sequence[Any]) -> bool:
    return all(isinstance(item, tuple) and len(item) == 3 for item in value)

"""RFC 8785, the JSON Canonicalization Scheme: the bytes plancache hashes.

Any language with a JCS implementation produces the same bytes for the same
JSON value, which Python's `json.dumps` does not: it writes 1e-05 where
JavaScript (and JCS) writes 0.00001, and 1.0 where they write 1. The
encoder is the `rfc8785` package (issue 40: as fast as the hand-written one
it replaced, bytes identical on every spec; docs/design.md "Libraries"),
with one domain widened: integers must be exact as IEEE doubles,
|n| <= 2**53, as ECMAScript writes them, where `rfc8785` stops at I-JSON's
"safe" 2**53 - 1. A spec may carry a uid of 2**53 (validation admits it and
keys of such specs exist), so that one magnitude is written as the double
it is (9007199254740992); past it, values are refused.
"""

from __future__ import annotations

import json
import math
from typing import Any

import rfc8785

MAX_EXACT_INTEGER = 2**53


def canonicalize(value: Any) -> bytes:
    """The JCS bytes of a JSON value made of dict, list, tuple, str, int, float, bool, None.
    ValueError for what JSON cannot carry exactly (NaN, infinities, |integers| > 2**53, non-string names)."""
    numbers: list[str] = []
    try:
        ready = _standard_form(value, numbers)
    except _NotStandard:
        try:
            return rfc8785.dumps(value)
        except rfc8785.IntegerDomainError:  # rare: only a value holding ±2**53 gets here
            return rfc8785.dumps(_edge_integers_as_doubles(value))
    # ASCII names (sorted alike in UTF-16 and in code points) and numbers Python writes as JCS does: JCS is
    # the standard library's sorted, compact JSON, written in C at about four times rfc8785's speed (a
    # graph's key is made on every call that keys it: issue 41; tests/unit/test_jcs_oracle.py checks the two
    # are the same bytes). A number Python writes otherwise (1e-05 for JCS's 0.00001) stood in it as a
    # placeholder string, "\u0000<n>\u0000", put back here as JCS writes it: a value with NUL in any string
    # takes rfc8785's path, so no string of the value's own can read as a placeholder.
    text = json.dumps(ready, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for index, written in enumerate(numbers):
        text = text.replace(f'"\\u0000{index}\\u0000"', written, 1)
    return text.encode()


class _NotStandard(Exception):
    """The value has what only rfc8785 writes as JCS: it takes that path."""


# Non-integral doubles in [1e-4, 1e16): Python's repr and ECMAScript's Number.prototype.toString both write
# the shortest round-tripping digits in positional notation there (Python switches to exponents below 1e-4
# and from 1e16, ECMAScript below 1e-6 and from 1e21).
_POSITIONAL_ALIKE = (1e-4, 1e16)


def _standard_form(value: Any, numbers: list[str]) -> Any:
    """`value` as the standard library's JSON writes JCS's bytes: integral doubles as integers (JCS writes
    1.0 as 1), other doubles Python writes otherwise as placeholders (their JCS text in `numbers`).
    _NotStandard for anything else: non-ASCII names, |integers| >= 2**53, NUL in a string, other types."""
    kind = type(value)
    if kind is str:
        if "\x00" in value:
            raise _NotStandard
        return value
    if kind is bool or value is None:
        return value
    if kind is int:
        if -MAX_EXACT_INTEGER < value < MAX_EXACT_INTEGER:
            return value
        raise _NotStandard
    if kind is float:
        if not math.isfinite(value):
            raise _NotStandard  # rfc8785 refuses it, with its reason
        if value.is_integer():
            if -MAX_EXACT_INTEGER < value < MAX_EXACT_INTEGER:
                return int(value)  # -0.0 included: JCS writes 0
        elif _POSITIONAL_ALIKE[0] <= abs(value) < _POSITIONAL_ALIKE[1]:
            return value
        numbers.append(rfc8785.dumps(value).decode())
        return f"\x00{len(numbers) - 1}\x00"
    if kind is dict:
        ready = {}
        for name, item in value.items():
            if type(name) is not str or not name.isascii() or "\x00" in name:
                raise _NotStandard
            ready[name] = _standard_form(item, numbers)
        return ready
    if kind is list or kind is tuple:
        # Dims and strides are most of a spec's values: a list of plain integers is taken in one pass.
        if all(type(item) is int and -MAX_EXACT_INTEGER < item < MAX_EXACT_INTEGER for item in value):
            return value
        return [_standard_form(item, numbers) for item in value]
    raise _NotStandard


def number(x: float) -> str:
    """ECMAScript's Number.prototype.toString for a finite double."""
    return canonicalize(float(x)).decode()


def _edge_integers_as_doubles(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_EXACT_INTEGER:
            raise ValueError(f"integer {value} is not exact as an IEEE double (JCS)")
        return float(value) if abs(value) == MAX_EXACT_INTEGER else value
    if isinstance(value, dict):
        return {name: _edge_integers_as_doubles(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_edge_integers_as_doubles(item) for item in value]
    return value

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
from typing import Any

import rfc8785

MAX_EXACT_INTEGER = 2**53


def canonicalize(value: Any) -> bytes:
    """The JCS bytes of a JSON value made of dict, list, tuple, str, int, float, bool, None.
    ValueError for what JSON cannot carry exactly (NaN, infinities, |integers| > 2**53, non-string names)."""
    if _plain(value):
        # No number JCS writes differently from Python and ASCII names (sorted alike in UTF-16 and
        # in code points): JCS is the standard library's sorted, compact JSON, written in C at about
        # four times rfc8785's speed (a graph's key is made on every call that keys it: issue 41;
        # tests/unit/test_jcs_oracle.py checks the two are the same bytes).
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:  # rare: only a value holding ±2**53 gets here
        return rfc8785.dumps(_edge_integers_as_doubles(value))


def _plain(value: Any) -> bool:
    """Whether `value` holds no float, no integer JCS writes as a double (|n| >= 2**53), only str
    names that are ASCII, and only the JSON types."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-MAX_EXACT_INTEGER < value < MAX_EXACT_INTEGER)
    if kind is dict:
        return all(type(k) is str and k.isascii() and _plain(v) for k, v in value.items())
    if kind is list or kind is tuple:
        return all(_plain(v) for v in value)
    return False  # a float, or anything else: rfc8785 writes it (or refuses it)


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

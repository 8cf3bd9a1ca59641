"""RFC 8785, the JSON Canonicalization Scheme: the bytes plancache hashes.

Any language with a JCS implementation (or the ~50 lines below) produces the
same bytes for the same JSON value, which Python's `json.dumps` does not:
it writes 1e-05 where JavaScript (and JCS) writes 0.00001, and 1.0 where
they write 1. The rules:

- objects: members sorted by their names' UTF-16 code units, no whitespace;
- strings: `"` and `\\` escaped, \\b \\f \\n \\r \\t, other control characters as
  \\u00xx (lower-case hex), everything else as UTF-8;
- numbers: ECMAScript's Number-to-String (shortest round-trip digits;
  integers up to 1e21 without exponent; exponent form below 1e-6 and from
  1e21, like 1e-7 and 1e+21); -0 is 0; NaN and infinities are refused;
- integers must be exact as IEEE doubles (|n| <= 2**53).
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

MAX_EXACT_INTEGER = 2**53

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def canonicalize(value: Any) -> bytes:
    """The JCS bytes of a JSON value made of dict, list, tuple, str, int, float, bool, None."""
    out: list[str] = []
    _write(value, out)
    return "".join(out).encode("utf-8")


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, int):
        if abs(value) > MAX_EXACT_INTEGER:
            raise ValueError(f"integer {value} is not exact as an IEEE double (JCS)")
        out.append(str(value))
    elif isinstance(value, float):
        out.append(number(value))
    elif isinstance(value, dict):
        out.append("{")
        for name in value:
            if not isinstance(name, str):
                raise ValueError(f"object member name {name!r} is not a string")
        for i, name in enumerate(sorted(value, key=_utf16_units)):
            if i:
                out.append(",")
            out.append(_string(name))
            out.append(":")
            _write(value[name], out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise ValueError(f"{type(value).__name__} is not a JSON value")


def _utf16_units(name: str) -> bytes:
    return name.encode("utf-16-be")


def _string(s: str) -> str:
    chars = []
    for ch in s:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            chars.append(escaped)
        elif ord(ch) < 0x20:
            chars.append(f"\\u{ord(ch):04x}")
        else:
            chars.append(ch)
    return '"' + "".join(chars) + '"'


def number(x: float) -> str:
    """ECMAScript's Number.prototype.toString for a finite double."""
    if not math.isfinite(x):
        raise ValueError(f"{x} is not a JSON number (JCS)")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    # repr gives the shortest digits that round-trip, as ECMAScript requires;
    # value = 0.DIGITS × 10^n.
    exact = Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, exact.digits))
    n = len(digits) + int(exact.exponent)
    k = len(digits)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        text = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e > 0 else "-") + str(abs(e))
    return sign + text

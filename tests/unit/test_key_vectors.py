"""The published key vectors are what this code computes (regenerate with
`python scripts/key-vectors.py`), and the JCS bytes follow RFC 8785."""

from __future__ import annotations

import importlib.util
import json

import pytest

from plancache.graphspec.jcs import canonicalize, number
from tests.support.processes import REPO

SCRIPT = REPO / "scripts" / "key-vectors.py"


def _script() -> object:
    spec = importlib.util.spec_from_file_location("key_vectors", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_published_vectors_are_current() -> None:
    module = _script()
    published = (REPO / "proto" / "plancache" / "v1" / "key-vectors.json").read_text()
    assert module.render() == published, (
        "proto/plancache/v1/key-vectors.json is stale: run python scripts/key-vectors.py"
    )  # type: ignore[attr-defined]
    cases = json.loads(published)["cases"]
    assert sorted(c["name"] for c in cases) == sorted(p.stem for p in (REPO / "examples").glob("*.json"))
    assert any("0.00001" in c["canonical_bytes"] for c in cases), (
        "a vector exercises the float form Python's json would write as 1e-05"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1e-05, "0.00001"),
        (1.0, "1"),
        (-0.0, "0"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (123.456, "123.456"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (333333333.33333329, "333333333.3333333"),
        (-1.5e-6, "-0.0000015"),
        (9007199254740992.0, "9007199254740992"),
    ],
)
def test_numbers_are_written_as_ecmascript_writes_them(value: float, expected: str) -> None:
    assert number(value) == expected


def test_objects_sort_by_utf16_code_units_and_strings_escape_minimally() -> None:
    # U+1F600 is a surrogate pair (D83D DE00): before U+FB33 in UTF-16, after it in code points.
    assert canonicalize({"\ufb33": 1, "\U0001f600": 2, "b": [None, True, 'x\u0001\n"é'], "a": 0.5}) == (
        '{"a":0.5,"b":[null,true,"x\\u0001\\n\\"é"],"\U0001f600":2,"\ufb33":1}'.encode()
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2**53 + 1, {1: "x"}, object()])
def test_values_json_cannot_carry_exactly_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        canonicalize({"v": bad})

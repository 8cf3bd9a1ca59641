"""plancache.graphspec.jcs is the `rfc8785` package (issue 40) with one domain widened; the bytes it
writes are the ones plancache always hashed: every published key vector (written by the hand-written
encoder it replaced), the standard library's JSON wherever the two forms agree (no floats, names sorted
alike), and the keys of specs that carry a uid of 2**53, which `rfc8785` alone refuses.
"""

from __future__ import annotations

import json

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plancache import GraphSpec
from plancache.graphspec.canonical import canonical_bytes, spec_hash
from plancache.graphspec.jcs import MAX_EXACT_INTEGER, canonicalize
from plancache.graphspec.validation import normalize
from tests.support.processes import REPO

# Names below the surrogates sort alike by UTF-16 code units (JCS) and by code points (json.dumps).
names = st.text(alphabet=st.characters(max_codepoint=0xD7FF), max_size=8)
integers = st.integers(min_value=-MAX_EXACT_INTEGER, max_value=MAX_EXACT_INTEGER)
without_floats = st.recursive(
    st.none() | st.booleans() | integers | st.text(),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(names, children, max_size=6),
    max_leaves=30,
)
json_values = st.recursive(
    st.none() | st.booleans() | integers | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(), children, max_size=6),
    max_leaves=30,
)


def test_every_published_key_vector_is_byte_identical() -> None:
    cases = json.loads((REPO / "proto" / "plancache" / "v1" / "key-vectors.json").read_text())["cases"]
    assert len(cases) >= 20
    for case in cases:
        assert canonicalize(case["canonical"]) == case["canonical_bytes"].encode("utf-8"), case["name"]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(without_floats)
def test_without_floats_the_bytes_are_the_standard_librarys_sorted_compact_json(value: object) -> None:
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert canonicalize(value) == expected


def _ascii_named(leaves: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """Lists and objects of `leaves` whose names are ASCII (sorted alike by UTF-16 and by code points)."""
    return st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=6)
            | st.dictionaries(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=8), children, max_size=6)
        ),
        max_leaves=30,
    )


safe_integers = st.integers(min_value=-MAX_EXACT_INTEGER + 1, max_value=MAX_EXACT_INTEGER - 1)
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)))
# What canonicalize writes with the standard library (its fast path): ASCII names, |integers| < 2**53.
plain_values = _ascii_named(st.none() | st.booleans() | safe_integers | texts)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(plain_values)
def test_the_fast_path_writes_rfc8785s_bytes(value: object) -> None:
    assert canonicalize(value) == rfc8785.dumps(value)


# With doubles (specs carry them: a matmul's padding 0.0, a norm's epsilon 1e-5): written by the standard library
# where Python writes them as JCS does, the others put in as JCS writes them; NUL in strings (the placeholders'
# character) and every double's edge (integral ones, 2**53, exponents on either side of both notations).
doubles = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1e-4, 9.999e-5, 1e-7, 1e-6, 1e16, 1e21, 1e22, 2.0**53, -(2.0**53), 2.0**60, 0.1, 1e-05, 5e-324]
)
values_with_doubles = _ascii_named(
    st.none()
    | st.booleans()
    | safe_integers
    | doubles
    | texts
    | st.sampled_from(["\x00", "\x000\x00", '"\\u00000\\u0000"'])
)


@settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
@given(values_with_doubles)
def test_values_with_doubles_are_written_as_rfc8785_writes_them(value: object) -> None:
    assert canonicalize(value) == rfc8785.dumps(value)


def test_a_string_shaped_like_a_placeholder_is_never_read_as_a_number() -> None:
    """The fast path stands a double Python writes otherwise in as "\\u0000<n>\\u0000": a value whose own
    string is that text (NUL included) takes rfc8785's path, so the two values keep distinct bytes."""
    number = {"eps": 1e-05}
    lookalike = {"eps": "\x000\x00"}
    assert canonicalize(number) == b'{"eps":0.00001}'
    assert canonicalize(lookalike) == rfc8785.dumps(lookalike) != canonicalize(number)
    both = [1e-05, "\x000\x00"]
    assert canonicalize(both) == rfc8785.dumps(both)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(json_values)
def test_the_bytes_read_back_as_the_value_and_are_a_fixed_point(value: object) -> None:
    written = canonicalize(value)
    read = json.loads(written, parse_int=float)  # JSON numbers are doubles: 3.6e16 is written in digits
    assert read == value
    assert canonicalize(read) == written


@pytest.mark.parametrize("value", [MAX_EXACT_INTEGER, -MAX_EXACT_INTEGER, [1, {"uid": MAX_EXACT_INTEGER}]])
def test_magnitude_2_53_is_written_as_ecmascript_writes_it_where_rfc8785_refuses(value: object) -> None:
    assert b"9007199254740992" in canonicalize(value)
    with pytest.raises(rfc8785.IntegerDomainError):
        rfc8785.dumps(value)


def test_integers_past_2_53_and_non_finite_numbers_are_refused() -> None:
    for value in (MAX_EXACT_INTEGER + 1, -MAX_EXACT_INTEGER - 1, [1, {"x": 2**60}], float("nan"), float("inf")):
        with pytest.raises(ValueError):
            canonicalize(value)


def test_a_spec_with_a_uid_of_2_53_keeps_its_hash() -> None:
    g = GraphSpec(io_data_type="half")
    a = g.tensor([8, 16, 32], name="A", uid=MAX_EXACT_INTEGER)
    b = g.tensor([8, 32, 16], name="B", uid=2)
    g.matmul(a, b).set_output(True).set_uid(3).set_name("C")
    assert b'"uid":9007199254740992' in canonical_bytes(normalize(g))
    # As the hand-written encoder hashed it before issue 40.
    assert spec_hash(g) == "f956acfaab07a752cd7b4a4334ba3e44149ef9759198e89b4262cfb237d5c9e3"

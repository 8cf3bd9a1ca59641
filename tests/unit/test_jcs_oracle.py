"""Our RFC 8785 encoder (plancache.graphspec.jcs) against `rfc8785`, the pure-Python
implementation sigstore relies on, as an oracle: byte for byte on every
published key vector and on arbitrary JSON values.

Why ours stays (issue 25): the two differ on exactly one domain, integers of
magnitude 2**53. Spec validation admits a tensor uid of 2**53 (exact as a
double, and what JavaScript's JSON.stringify writes), and `rfc8785` refuses
it as outside the "safe integer" range: switching would make such a spec
unhashable, a changed key. Our encoder is also no slower (about 80 us for a
matmul spec on the 2-core CI machine, rfc8785 about 75 us) and the client
keeps one dependency less on the GPU machines.
"""

from __future__ import annotations

import json

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plancache import GraphSpec
from plancache.graphspec.canonical import canonical_bytes
from plancache.graphspec.jcs import MAX_EXACT_INTEGER, canonicalize
from tests.support.processes import REPO

SAFE_INTEGER = MAX_EXACT_INTEGER - 1  # rfc8785's domain: |n| < 2**53

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE_INTEGER, max_value=SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(), children, max_size=6),
    max_leaves=30,
)


def test_every_published_key_vector_is_byte_identical_under_rfc8785() -> None:
    cases = json.loads((REPO / "proto" / "plancache" / "v1" / "key-vectors.json").read_text())["cases"]
    assert len(cases) >= 20
    for case in cases:
        ours = canonicalize(case["canonical"])
        assert ours == case["canonical_bytes"].encode("utf-8"), case["name"]
        assert ours == rfc8785.dumps(case["canonical"]), case["name"]


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(json_values)
def test_any_json_value_encodes_as_rfc8785_encodes_it(value: object) -> None:
    assert canonicalize(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("value", [MAX_EXACT_INTEGER, -MAX_EXACT_INTEGER, [1, {"uid": MAX_EXACT_INTEGER}]])
def test_magnitude_2_53_is_the_one_domain_where_they_differ(value: object) -> None:
    # Ours writes it as ECMAScript does (exact as a double); rfc8785 refuses it.
    assert b"9007199254740992" in canonicalize(value)
    with pytest.raises(rfc8785.IntegerDomainError):
        rfc8785.dumps(value)


def test_both_refuse_integers_past_2_53_and_non_finite_numbers() -> None:
    for value in (MAX_EXACT_INTEGER + 1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            canonicalize(value)
        with pytest.raises(ValueError):
            rfc8785.dumps(value)


def test_a_valid_spec_can_carry_a_uid_of_2_53_which_rfc8785_would_refuse() -> None:
    g = GraphSpec(io_data_type="half")
    a = g.tensor([8, 16, 32], name="A", uid=MAX_EXACT_INTEGER)
    b = g.tensor([8, 32, 16], name="B", uid=2)
    g.matmul(a, b).set_output(True).set_uid(3).set_name("C")
    assert b'"uid":9007199254740992' in canonical_bytes(g)  # validated and hashed today
    with pytest.raises(rfc8785.IntegerDomainError):
        rfc8785.dumps(json.loads(canonical_bytes(g)))

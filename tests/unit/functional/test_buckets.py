"""Bucketing as a policy (plancache.functional.set_buckets): which size a
call runs at, what is never padded, and the waste counted. (The padding
itself is torch's: its results against unpadded calls are GPU tests,
tests/gpu/test_gpu_families.py.)"""

from __future__ import annotations

import pytest

import plancache.functional as pf
from plancache import InvalidRequest
from plancache.frontdoors.buckets import BUCKETS


@pytest.fixture(autouse=True)
def no_policy_after() -> object:
    yield None
    pf.set_buckets(None)


def test_a_size_runs_at_the_next_bucket_and_the_waste_is_counted() -> None:
    pf.set_buckets([8, 1, 4, 2, 16])
    assert [BUCKETS.target("linear", n) for n in (1, 3, 4, 5, 16, 17)] == [
        None,
        4,
        None,
        8,
        None,
        None,
    ]  # a bucket's own size and past the largest: as is
    stats = pf.bucket_stats()
    assert (stats.calls, stats.padded_calls, stats.asked, stats.computed) == (
        6,
        2,
        1 + 3 + 4 + 5 + 16,
        1 + 4 + 4 + 8 + 16,
    )
    assert stats.waste == pytest.approx(1 - 29 / 33)


def test_only_the_functions_padding_cannot_change_are_padded() -> None:
    pf.set_buckets([64, 128], functions=["scaled_dot_product_attention"])
    assert BUCKETS.target("linear", 100) is None and BUCKETS.target("scaled_dot_product_attention", 100) == 128
    with pytest.raises(InvalidRequest, match="matmul cannot be padded"):
        pf.set_buckets([64], functions=["matmul"])
    with pytest.raises(InvalidRequest, match="sizes must be positive integers"):
        pf.set_buckets([0, 8])
    pf.set_buckets(None)
    assert BUCKETS.target("linear", 3) is None and pf.bucket_stats().calls == 0

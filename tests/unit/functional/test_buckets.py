"""Bucketing as a policy (plancache.functional.set_buckets): which size a
call runs at, what is never padded, and the waste counted. (The padding
itself is torch's: its results against unpadded calls are GPU tests,
tests/gpu/test_gpu_families.py.)"""

from __future__ import annotations

from typing import Any

import pytest

import plancache.functional as pf
from plancache import InvalidRequest
from plancache.frontdoors import buckets
from plancache.frontdoors.buckets import BUCKETS, auto_bucket, auto_buckets
from plancache.functional import _linear, _norms
from plancache.functional._table import TABLE, Fallback
from tests.support.frontdoor_standins import StandInClient


@pytest.fixture(autouse=True)
def no_policy_after() -> object:
    yield None
    pf.set_buckets(None)
    pf.set_auto_buckets(None)


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


# ---- rows bucketed once they vary (AUTO) ----------------------------------------------------------


@pytest.fixture
def cpu_geometries(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    """CPU tensors taken as if on the GPU, each geometry's first call kept in the table running torch's
    function: a stand-in for its served plans (which geometries the calls make is what is tested here), except
    in float32, which is torch's for good (as it is on the GPU)."""
    monkeypatch.setattr(buckets, "on_gpu", lambda x: True)

    def first_call(bound: Any, key: Any, request: Any, fallback: Any, *args: Any, **kwargs: Any) -> Any:
        served = bound.tensors[0].dtype != torch.float32  # a passing reason stands in for a served plan
        entry = Fallback(bound.function, key, fallback, "a CPU test's stand-in", transient=served)
        TABLE.put(key, entry)
        return entry(bound.tensors)

    for module in (_linear, _norms):
        monkeypatch.setattr(module, "first_call", first_call)


def test_auto_buckets_are_a_multiple_of_an_eighth_of_the_size_at_most() -> None:
    assert [auto_bucket(n) for n in (1, 15, 16, 17, 199, 255, 256, 257, 511, 513, 1000, 1025, 3000)] == [
        16,
        16,
        16,
        32,
        208,
        256,
        256,
        288,
        512,
        576,
        1024,
        1152,
        3072,
    ]
    sizes = auto_buckets()
    assert list(sizes) == sorted(set(sizes)) and all(auto_bucket(b) == b for b in sizes)
    assert all(auto_bucket(n) - n <= n / 8 for n in range(128, 5000))  # padding: ~12 % of the work at most


@pytest.mark.usefixtures("cpu_geometries")
def test_a_layers_rows_are_padded_once_it_met_three_row_counts() -> None:
    """The program's first two row counts run as they are; from the third distinct one, a new row count
    runs at its auto bucket (zero rows padded, the caller's rows returned: torch's values and gradients);
    a row count met before keeps its geometry; another layer (another weight shape) counts its own rows;
    set_auto_buckets(False) stops it. On CPU tensors, as if on the GPU (the plans' numerics are GPU-tested)."""
    torch = pytest.importorskip("torch")
    pf.set_auto_buckets(True)
    weight, bias = torch.randn(32, 64, dtype=torch.float64), torch.randn(32, dtype=torch.float64)

    def rows_run(function: str) -> list[int]:
        return sorted(int(g.key[1][0]) for g in pf.geometries() if g.function == function)

    for rows in (5, 9, 13, 40, 9):
        x = torch.randn(rows, 64, dtype=torch.float64, requires_grad=True)
        y = pf.linear(x, weight, bias)
        assert y.shape == (rows, 32)
        torch.testing.assert_close(y, torch.nn.functional.linear(x, weight, bias))
        (grad,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(grad, weight.sum(0).expand(rows, 64))
    assert rows_run("linear") == [5, 9, 16, 48]  # 13 -> 16, 40 -> 48; 9 again: its own geometry
    stats = pf.bucket_stats()
    assert (stats.padded_calls, stats.asked, stats.computed, stats.auto_layers) == (2, 13 + 40, 16 + 48, 1)

    x3 = torch.randn(2, 7, 64, dtype=torch.float64)  # rows of a 3-D input: 14 -> 16
    torch.testing.assert_close(pf.linear(x3, weight, bias), torch.nn.functional.linear(x3, weight, bias))
    other = torch.randn(16, 64, dtype=torch.float64)  # another layer: its first row count, as it is
    pf.linear(torch.randn(13, 64, dtype=torch.float64), other)
    norm_weight = torch.randn(64, dtype=torch.float64)
    for rows in (3, 6, 21):
        x = torch.randn(rows, 64, dtype=torch.float64)
        torch.testing.assert_close(
            pf.rms_norm(x, [64], norm_weight, 1e-5), torch.nn.functional.rms_norm(x, [64], norm_weight, 1e-5)
        )
        torch.testing.assert_close(pf.layer_norm(x, [64]), torch.nn.functional.layer_norm(x, [64]))
    assert rows_run("rms_norm") == [3, 6, 32] and rows_run("layer_norm") == [3, 6, 32]
    assert rows_run("linear") == [5, 9, 13, 16, 48]  # x3 (14 rows) ran at 16; the other layer: 13 as it is

    torch_runs = torch.randn(24, 64)  # float32: torch's function runs it, so padding would only add work
    for rows in (3, 5, 7, 9):
        pf.linear(torch.randn(rows, 64), torch_runs)
    assert [int(g.key[1][0]) for g in pf.geometries() if g.key[5] == (24, 64)] == [3, 5, 7, 9]

    pf.set_auto_buckets(False)
    pf.linear(torch.randn(70, 64, dtype=torch.float64), weight, bias)
    assert 70 in rows_run("linear") and pf.bucket_stats().auto_layers == 0


@pytest.mark.usefixtures("cpu_geometries")
def test_a_set_buckets_policy_covers_its_functions_instead() -> None:
    torch = pytest.importorskip("torch")
    pf.set_auto_buckets(True)
    pf.set_buckets([64, 128], functions=["linear"])
    weight = torch.randn(8, 16)
    for rows in (3, 5, 7, 9):
        pf.linear(torch.randn(rows, 16), weight)
    assert {int(g.key[1][0]) for g in pf.geometries() if g.function == "linear"} == {64}
    assert pf.bucket_stats().auto_layers == 0


@pytest.mark.usefixtures("cpu_geometries")
def test_a_padded_row_counts_next_calls_take_the_decided_bucket_until_a_policy_or_setting_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A padded row count has no table entry of its own, so each of its calls passes the miss path: from its
    second call the decided bucket is taken without the layer's bookkeeping (its rows not counted again), with
    the same result; set_buckets, set_auto_buckets and a layer torch runs for good forget the decisions."""
    torch = pytest.importorskip("torch")
    pf.set_auto_buckets(True)
    weight = torch.randn(8, 16, dtype=torch.float64)
    for rows in (3, 5, 7):
        pf.linear(torch.randn(rows, 16, dtype=torch.float64), weight)
    counted: list[int] = []
    original = buckets.AUTO.pad_rows
    monkeypatch.setattr(buckets.AUTO, "pad_rows", lambda *a, **k: counted.append(1) or original(*a, **k))
    x = torch.randn(13, 16, dtype=torch.float64)
    torch.testing.assert_close(pf.linear(x, weight), torch.nn.functional.linear(x, weight))
    keyed: list[int] = []
    inner = _linear._linear
    monkeypatch.setattr(_linear, "_linear", lambda *a, **k: keyed.append(1) or inner(*a, **k))
    for _ in range(2):
        torch.testing.assert_close(pf.linear(x, weight), torch.nn.functional.linear(x, weight))
    assert counted == [1], "the layer's bookkeeping ran at the first padded call only"
    assert keyed == [1, 1], "each later call keyed once: the bucket's entry ran on the padded input directly"
    assert pf.bucket_stats().padded_calls == 1 + 3  # 7 (the third row count) and every call of 13, to 16
    assert {int(g.key[1][0]) for g in pf.geometries() if g.function == "linear"} == {3, 5, 16}

    pf.set_buckets([13, 64], functions=["linear"])  # a policy from now on: 13 is its own bucket, never the auto 16
    pf.linear(x, weight)
    assert 13 in {int(g.key[1][0]) for g in pf.geometries() if g.function == "linear"}
    pf.set_buckets(None)
    pf.clear()
    pf.set_auto_buckets(True)
    for rows in (3, 5, 7, 13):
        pf.linear(torch.randn(rows, 16, dtype=torch.float64), weight)
    pf.set_auto_buckets(False)  # off: 13 runs as it is
    pf.linear(x, weight)
    assert 13 in {int(g.key[1][0]) for g in pf.geometries() if g.function == "linear"}


def test_the_auto_buckets_setting_refuses_what_is_not_a_boolean(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidRequest, match="True, False or None"):
        pf.set_auto_buckets("no")  # type: ignore[arg-type]
    monkeypatch.setenv("PLANCACHE_AUTO_BUCKETS", "sometimes")
    pf.set_auto_buckets(None)  # read when first asked, not here
    with pytest.raises(InvalidRequest, match="PLANCACHE_AUTO_BUCKETS='sometimes' is not a boolean"):
        _ = buckets.AUTO.enabled
    monkeypatch.setenv("PLANCACHE_AUTO_BUCKETS", "0")
    pf.set_auto_buckets(None)
    assert buckets.AUTO.enabled is False

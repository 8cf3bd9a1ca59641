"""plancache.functional asks for the family of shapes that vary: once a
function met three graphs that differ only in dims, their family (sizes
1..H, H the next power of two of the largest seen) is asked for once, and
grows by one doubling at a time as the program passes its range, each of
its graphs exactly the one the function builds at that size; graphs
that differ otherwise never make a family; a service that refuses costs the
program nothing but the builds ahead."""

from __future__ import annotations

from typing import Any

import pytest

import plancache.functional as pf
from plancache import InvalidRequest, Unavailable
from plancache.frontdoors import buckets
from plancache.frontdoors import families as _families
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.validation import normalize
from plancache.keys.query import PlanQuery
from tests.support.frontdoor_standins import StandInClient, StandInTensor

T = StandInTensor


@pytest.fixture(autouse=True)
def at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The family is asked for on the calling thread (the product uses a background thread)."""
    monkeypatch.setattr(_families.WATCH, "starter", lambda work: work())


def linear_at(batch: int, activation: str | None = "gelu") -> Any:
    return pf.linear(T((batch, 64)), T((32, 64)), T((32,)), activation=activation)


def asked_spec(client: StandInClient, batch: int) -> Any:
    return next(spec for spec, _, _ in client.asked if spec.tensors[0].dim[1] == batch)


def test_three_sizes_of_one_graph_ask_for_its_family_once(client: StandInClient) -> None:
    for batch in (8, 17):
        linear_at(batch)
    assert client.families == []
    linear_at(33)
    ((family, _, _),) = client.families
    (varying,) = family.varying
    assert varying.sizes == tuple(range(1, 65))  # 33 -> 64
    for batch in (1, 50, 64):  # each graph of the family is the one linear builds at that batch
        linear_at(batch)
        assert hash_normalized(normalize(family.instance({varying.symbol: batch}))) == hash_normalized(
            normalize(asked_spec(client, batch))
        )
    assert len(client.families) == 1  # asked once
    # Once the family is asked, each new size's first call asks the service first (never an expected miss).
    # (Sizes 1, 50 and 64; not 8, 17, 33, met before it was asked.)
    assert client.asked_first == [PlanQuery.of(*asked).key for asked in client.asked[-3:]]
    assert len(client.asked) == 6
    (ask,) = pf.families()
    assert ask.status == "asked" and ask.graphs == 64 and ask.sizes == {varying.symbol: (1, 64)}


def test_a_family_grows_a_doubling_at_a_time_as_the_program_passes_its_range(client: StandInClient) -> None:
    """Built ahead is what the program met: 1..64 for sizes up to 33; a size past 64 asks for 65..128 (and not
    again within it); a size far past the range (more than FAMILY_GRAPHS new members) asks for nothing."""
    for batch in (8, 17, 33):
        linear_at(batch)
    linear_at(100)
    assert len(client.families) == 2
    family = client.families[1][0]
    (varying,) = family.varying
    assert varying.sizes == tuple(range(65, 129))
    assert hash_normalized(normalize(family.instance({varying.symbol: 100}))) == hash_normalized(
        normalize(asked_spec(client, 100))
    )
    # the service builds those nearest the sizes met first
    assert client.families_seen[1] == {varying.symbol: [8, 17, 33, 100]}
    for batch in (90, 128, 60):
        linear_at(batch)
    assert len(client.families) == 2
    linear_at(300)  # 129..512: 384 members
    assert [f.varying[0].sizes[0] for f, _, _ in client.families] == [1, 65, 129]
    assert client.families[2][0].varying[0].sizes[-1] == 512
    linear_at(100_000)  # 513..131072: past FAMILY_GRAPHS
    assert len(client.families) == 3
    assert [a.sizes for a in pf.families()] == [{varying.symbol: r} for r in ((1, 64), (65, 128), (129, 512))]


def test_a_bucketed_family_is_the_buckets_up_to_one_past_the_largest_size_met(client: StandInClient) -> None:
    """With buckets, a family is their sizes (a padded call runs at one), only up to the bucket after the one
    the largest size met runs at, and it grows a bucket past each new largest size (run 34: every bucket up to
    256 was built for a sweep whose sizes ended at 199, and 224-256 were never fetched)."""
    pf.set_buckets(range(16, 257, 16), functions=["linear"])
    try:
        for batch in (16, 48, 96):  # the sizes padded calls run at
            linear_at(batch)
        ((family, _, _),) = client.families
        (varying,) = family.varying
        assert varying.sizes == (16, 32, 48, 64, 80, 96, 112)
        linear_at(112)
        linear_at(64)
        assert len(client.families) == 1  # within its reach: nothing more asked
        linear_at(160)
        assert client.families[1][0].varying[0].sizes == (128, 144, 160, 176)
        linear_at(256)
        assert client.families[2][0].varying[0].sizes == (192, 208, 224, 240, 256)
        linear_at(300)  # past the last bucket (run as it is): no bucket left to ask for
        assert len(client.families) == 3
    finally:
        pf.set_buckets(None)


def test_a_function_padded_to_auto_buckets_asks_for_the_buckets(
    client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows that vary are padded to auto buckets (plancache.frontdoors.buckets.AUTO; the padding is tested in
    test_buckets.py): once linear's calls are padded, its family is the auto buckets up to the one after the
    largest met, as with a set_buckets policy; a function whose calls are not padded keeps sizes 1..H."""
    monkeypatch.setattr(buckets.AUTO, "_padding", {"linear"})  # what a padded torch call records
    for batch in (16, 48, 96):
        linear_at(batch)
    ((family, _, _),) = client.families
    assert family.varying[0].sizes == (16, 32, 48, 64, 80, 96, 112)
    linear_at(200)
    assert client.families[1][0].varying[0].sizes == (128, 144, 160, 176, 192, 208, 224)
    pf.set_auto_buckets(False)  # off: no longer the buckets
    assert _families._bucket_sizes("linear") == ()


def test_graphs_that_differ_beyond_dims_make_no_family(client: StandInClient) -> None:
    linear_at(8, "gelu")
    linear_at(17, "relu")
    linear_at(33, None)
    pf.linear(T((40, 64)), T((32, 64)))  # no bias
    assert client.families == []


def test_a_refusing_service_costs_only_the_builds_ahead(
    client: StandInClient, caplog: pytest.LogCaptureFixture
) -> None:
    client.family_error = Unavailable("server down")
    for batch in (8, 17, 33, 40):
        assert linear_at(batch) is not None  # every call served as before
    (ask,) = pf.families()
    assert ask.status == "refused" and "server down" in ask.reason and client.families == []
    assert sum("no family was asked for" in r.getMessage() for r in caplog.records) == 1


def test_the_threshold_is_the_programs_to_set(client: StandInClient) -> None:
    pf.set_family_threshold(0)
    for batch in (8, 17, 33, 65):
        linear_at(batch)
    assert client.families == []
    pf.set_family_threshold(2)
    linear_at(3)
    linear_at(4)
    assert len(client.families) == 1
    with pytest.raises(InvalidRequest, match="graphs must be >= 0"):
        pf.set_family_threshold(-1)
    pf.set_family_threshold(_families.DEFAULT_THRESHOLD)


def test_a_graph_alone_among_those_that_could_share_its_signature_is_not_signed(
    client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signature (canonical JSON and a hash of the graph) is made only once a second graph of the same
    function, call site, parameters, tensor count and ops comes: a fixed-shape program's graphs each stay
    alone and none pays it; the group's first graph is then counted before the second, so a family still
    forms at the third size; with a threshold of 1 each graph is signed at once."""
    signed: list[Any] = []
    real = _families._signature
    monkeypatch.setattr(_families, "_signature", lambda spec, evidence: signed.append(spec) or real(spec, evidence))
    linear_at(8)
    linear_at(8, activation=None)  # another graph (no GELU node): another group
    assert signed == [] and client.families == []
    linear_at(17)  # the second of linear_at(8)'s group: both signed now, in order
    assert [spec.tensors[0].dim[1] for spec in signed] == [8, 17]
    linear_at(33)
    assert len(client.families) == 1
    _families.WATCH.clear()
    pf.set_family_threshold(1)
    try:
        signed.clear()
        linear_at(5)
        assert len(signed) == 1
    finally:
        pf.set_family_threshold(_families.DEFAULT_THRESHOLD)


# ---- evidence, not resemblance (issue 43) ---------------------------------------------------------------


def layer(x: Any, weight: Any) -> Any:
    """A model's one linear helper: every layer's call comes from this line."""
    return pf.linear(x, weight)


# The held-out GPT block's six linear layers, four weight shapes: q, k, v, o, up, down (hidden 768, GQA 256).
GPT_WEIGHTS = [(768, 768), (256, 768), (256, 768), (768, 768), (2304, 768), (768, 2304)]


def test_a_fixed_shape_training_step_asks_for_no_family(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Distinct layers resemble one layer at many sizes (linear.backward's dims 768, 256, 2304): with each
    layer's weight shape in its evidence, a fixed-shape step (batch 2, sequence 320) meets one size of each."""
    from tests.unit.functional.modes import set_modes
    from tests.unit.functional.recording import RecordingFunction

    set_modes(monkeypatch, grad_on=True)
    monkeypatch.setattr(pf._autograd, "_function", lambda: RecordingFunction)  # type: ignore[attr-defined]
    for _ in range(3):  # three steps
        x = T((2, 320, 768), requires_grad=True)
        for out_features, in_features in GPT_WEIGHTS:
            w = T((out_features, in_features), requires_grad=True)
            layer(x if in_features == 768 else T((2, 320, in_features), requires_grad=True), w)
    assert {spec.name for spec, _, _ in client.asked} >= {
        "plancache.functional.linear",
        "plancache.functional.linear.backward",
    }
    assert client.families == [] and pf.families() == []


def test_a_sweep_at_one_call_site_asks_for_its_family_with_the_sizes_it_met(client: StandInClient) -> None:
    w = T((32, 64))
    for rows in (17, 150, 88):
        layer(T((rows, 64)), w)
    ((family, _, _),) = client.families
    (varying,) = family.varying
    assert client.families_seen == [{varying.symbol: [17, 88, 150]}]
    assert all(uid not in family.fixed or uid == 2 for uid in family.fixed) and 2 in family.fixed  # the weight
    (ask,) = pf.families()
    assert ask.site.endswith(f"test_families.py:{layer.__code__.co_firstlineno + 2}")


def test_a_training_sweeps_forward_and_backward_graphs_ask_first_once_their_families_are_asked(
    client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With autograd, a sweep asks for the forward's family and the backward graphs' (linear.backward): from
    then on each new size's forward and backward first calls ask the service first (members it may have)."""
    from tests.unit.functional.modes import set_modes
    from tests.unit.functional.recording import RecordingFunction

    set_modes(monkeypatch, grad_on=True)
    monkeypatch.setattr(pf._autograd, "_function", lambda: RecordingFunction)  # type: ignore[attr-defined]
    w = T((32, 64), requires_grad=True)
    for rows in (17, 150, 88):
        layer(T((rows, 64), requires_grad=True), w)
    assert len(client.families) >= 2  # the forward's and the backward graphs'
    asked_before = len(client.asked)
    layer(T((40, 64), requires_grad=True), w)
    new = client.asked[asked_before:]
    assert {spec.name for spec, _, _ in new} >= {"plancache.functional.linear", "plancache.functional.linear.backward"}
    assert client.asked_first == [PlanQuery.of(*asked).key for asked in new]


def test_one_weight_shape_at_two_call_sites_is_two_signatures(client: StandInClient) -> None:
    w = T((32, 64))
    for rows in (8, 17):
        layer(T((rows, 64)), w)
    pf.linear(T((33, 64)), w)  # a third size, but another line of the program
    assert client.families == []


def test_layers_of_different_weights_at_one_call_site_make_no_family(client: StandInClient) -> None:
    for out_features in (16, 32, 48, 64):  # four layers, one row count each: the same line, different weights
        layer(T((8, 64)), T((out_features, 64)))
    assert client.families == [] and pf.families() == []  # not even asked (and refused)

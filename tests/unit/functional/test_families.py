"""plancache.functional asks for the family of shapes that vary: once a
function met three graphs that differ only in dims, their family (sizes
1..H, H the next power of two of twice the largest seen) is asked for once,
each of its graphs exactly the one the function builds at that size; graphs
that differ otherwise never make a family; a service that refuses costs the
program nothing but the builds ahead."""

from __future__ import annotations

from typing import Any

import pytest

import plancache.functional as pf
from plancache import InvalidRequest, Unavailable
from plancache.frontdoors import families as _families
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.validation import normalize
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
    assert varying.sizes == tuple(range(1, 129))  # 2 x 33 = 66 -> 128
    for batch in (1, 50, 128):  # each graph of the family is the one linear builds at that batch
        linear_at(batch)
        assert hash_normalized(normalize(family.instance({varying.symbol: batch}))) == hash_normalized(
            normalize(asked_spec(client, batch))
        )
    linear_at(300)
    assert len(client.families) == 1  # asked once
    (ask,) = pf.families()
    assert ask.status == "asked" and ask.graphs == 128 and ask.sizes == {varying.symbol: (1, 128)}


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

"""plancache.torch's first calls take stored plans only (plancache.functional._first_call.STORED_ONLY), on this
machine without a GPU: with a client that hedges, a geometry whose plans are not stored is torch's at once (its
reason said, asked again after RETRY_AFTER_S), every graph of the call asked for, so that the service builds
them all for the next call; a client that does not hedge waits for the service's plans as it chose; a traced
call's question (torch_faster_reason) says why torch runs it. What it saves on the GPU (a compiled first process
with nothing stored) is bench/torch_models_startup.py's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import plancache.functional as pf
from plancache.functional import _autograd, _first_call, _table
from tests.support.frontdoor_standins import StandInClient, StandInTensor
from tests.unit.functional.modes import set_modes
from tests.unit.functional.recording import RecordingFunction

T = StandInTensor


@contextmanager
def stored_only() -> Iterator[None]:
    """As plancache.torch's eager route makes its call (plancache.torch._mode.dispatch)."""
    before, _first_call.STORED_ONLY.on = _first_call.STORED_ONLY.on, True
    try:
        yield
    finally:
        _first_call.STORED_ONLY.on = before


def _entry() -> Any:
    ((_, entry),) = _table.TABLE.entries()
    return entry


def test_a_geometry_not_stored_is_torchs_at_once_and_its_plan_taken_once_stored(
    client: StandInClient, torch_runs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client.hedge, client.starts_empty = True, True
    x, w = T((4, 64)), T((32, 64))
    with stored_only():
        assert pf.linear(x, w) == "torch linear"
        assert pf.linear(x, w) == "torch linear"  # within the retry delay: not asked again
    assert len(client.asked_stored_only) == 1
    entry = _entry()
    assert isinstance(entry, _table.Fallback) and entry.expires is not None  # asked again later
    stats = pf.stats()["linear"]
    assert (stats.torch, stats.cudnn, stats.torch_geometries) == (2, 0, 1)
    assert stats.reasons == {_first_call.NOT_STORED: 1}
    monkeypatch.setattr(_table, "RETRY_AFTER_S", -1.0)
    _table.TABLE.clear()
    with stored_only():
        assert pf.linear(x, w) != "torch linear"  # the service built it meanwhile: its plan runs the call
    assert client.asked_stored_only == [client.asked_stored_only[0]] * 2
    assert pf.stats()["linear"].cudnn == 1


def test_plancache_functionals_own_calls_and_a_client_that_does_not_hedge_wait_for_the_plans(
    client: StandInClient, torch_runs: list[Any]
) -> None:
    client.starts_empty = True
    with stored_only():  # the client does not hedge: it chose the service's plans
        assert pf.linear(T((4, 64)), T((32, 64))) != "torch linear"
    client.hedge = True
    assert pf.linear(T((8, 64)), T((32, 64))) != "torch linear"  # not plancache.torch's call: as before
    assert not client.asked_stored_only and not torch_runs


def test_a_trained_call_not_stored_asks_for_every_graph_of_it(
    client: StandInClient, torch_runs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward not stored: its backward's graphs are asked for all the same, so that the next process finds
    the whole call stored, not the forward alone (one process more a graph)."""
    set_modes(monkeypatch, grad_on=True)
    monkeypatch.setattr(_autograd, "_function", lambda: RecordingFunction)
    client.hedge, client.starts_empty = True, True
    x, w, b = T((4, 16, 64), requires_grad=True), T((32, 64), requires_grad=True), T((32,), requires_grad=True)
    with stored_only():
        assert pf.linear(x, w, b, activation="gelu") == "torch linear"
    assert len(client.asked_stored_only) == 5 == len(set(client.asked_stored_only))  # the forward, 4 backward
    assert client.stored == set(client.asked_stored_only)
    # A forward stored whose backward is not (another process's inference): torch's, each backward graph asked.
    client.stored = {client.asked_stored_only[0]}
    client.asked_stored_only.clear()
    _table.TABLE.clear()
    with stored_only():
        assert pf.linear(x, w, b, activation="gelu") == "torch linear"
    assert len(client.asked_stored_only) == 5
    _table.TABLE.clear()
    with stored_only():
        assert pf.linear(x, w, b, activation="gelu") != "torch linear"  # all five stored now
    # One backward graph not stored: torch's call, unless it is the optional one (the bias gradient's sum), which
    # torch computes while the rest of the call is served.
    every = set(client.stored)
    served_without = []
    for missing in sorted(every - {client.asked_stored_only[0]}):
        client.stored = every - {missing}
        _table.TABLE.clear()
        with stored_only():
            if pf.linear(x, w, b, activation="gelu") != "torch linear":
                served_without.append(missing)
    assert len(served_without) == 1
    assert pf.stats()["linear.backward"].reasons == {f"bgrad: {_first_call.NOT_STORED}": 1}


def test_a_traced_calls_question_says_its_plans_are_not_stored(client: StandInClient, torch_runs: list[Any]) -> None:
    """plancache.torch's trace-time question: a geometry not stored is torch's in the traced program (the
    reason), and the next trace of it, once stored, has its plan's answer (None: no race here, it is off)."""
    client.hedge, client.starts_empty = True, True
    x, w = T((4, 64)), T((32, 64))
    assert _first_call.torch_faster_reason(lambda: pf.linear(x, w)) == _first_call.NOT_STORED
    assert not _first_call.STORED_ONLY.on  # put back
    _table.TABLE.clear()
    assert _first_call.torch_faster_reason(lambda: pf.linear(x, w)) is None
    assert pf.stats()["linear"].cudnn == 1

"""What plancache.functional hands plancache.torch's native kernels: a launch record per served call made while
LAUNCH_LOG collects (the contract csrc/kernels.cpp reads: tests/unit/plancache_torch/test_native.py), and a
call of the table's change hook whenever an entry leaves or is replaced (the kernels forget what they kept)."""

from __future__ import annotations

from typing import Any

import plancache.functional as pf
from plancache.functional import _table
from plancache.functional._table import LAUNCH_LOG, TABLE, Fallback
from tests.support.fake_gpu import FakeRawGraph, FakeRuntime
from tests.support.frontdoor_standins import StandInClient, StandInTensor

T = StandInTensor


def _collect(call: Any) -> tuple[Any, list[tuple[Any, ...]]]:
    LAUNCH_LOG.launches = launches = []
    try:
        return call(), launches
    finally:
        LAUNCH_LOG.launches = None


def test_a_served_call_logs_its_raw_launch_with_its_buffers(client: StandInClient, runtime: FakeRuntime) -> None:
    runtime.raw = True
    w, b = T((32, 64)), T((32,))
    x = T((4, 16, 64))
    pf.linear(x, w, b)  # the first call: the frontend's public execute, no raw form yet
    _, first = _collect(lambda: pf.linear(x, w, b))
    y, launches = _collect(lambda: pf.linear(x, w, b))
    (graph,) = runtime.graphs
    assert isinstance(graph, FakeRawGraph)
    (record,) = launches
    run, positions, workspace, function, buffers, inputs, outputs, versions, device = record
    assert run == graph._lowered_graph._execute_with_raw_ptrs and function == "linear"
    assert buffers[:4] == (x, w, b, y) and (inputs, outputs) == (3, 1)
    assert sorted(positions) == list(range(len(buffers))) and len(versions) == len(buffers)
    assert device == 0 and workspace >= 0
    assert first[0][0] is not None  # the second call already had the raw form


def test_nothing_is_logged_unless_collecting(client: StandInClient, runtime: FakeRuntime) -> None:
    runtime.raw = True
    x, w = T((4, 64)), T((32, 64))
    for _ in range(3):
        pf.linear(x, w)
    assert LAUNCH_LOG.launches is None


def test_a_launch_without_a_raw_form_is_logged_as_such(client: StandInClient, runtime: FakeRuntime) -> None:
    runtime.raw = False
    x, w = T((4, 64)), T((32, 64))
    pf.linear(x, w)
    _, launches = _collect(lambda: pf.linear(x, w))
    assert [record[0] for record in launches] == [None]


def test_the_table_says_when_an_entry_leaves_or_is_replaced() -> None:
    changes: list[int] = []
    TABLE.on_change = lambda: changes.append(1)
    try:
        entry = Fallback("linear", "k1", lambda *a: None, "test", transient=False)
        TABLE.put("k1", entry)
        assert changes == []  # a new entry changes nothing kept
        other = Fallback("linear", "k1", lambda *a: None, "test", transient=False)
        TABLE.put("k1", other)
        assert len(changes) == 1  # replaced
        TABLE.replace("k1", other, entry)
        TABLE.discard("k1", entry)
        assert len(changes) == 3
        size = TABLE.max_entries
        TABLE.resize(1)
        TABLE.put("a", Fallback("linear", "a", lambda *a: None, "test", transient=False))
        TABLE.put("b", Fallback("linear", "b", lambda *a: None, "test", transient=False))  # evicts "a"
        assert len(changes) == 4
        TABLE.resize(size)
        TABLE.clear()
        assert len(changes) == 5
    finally:
        TABLE.on_change = None
        TABLE.clear()


def test_launches_replayed_natively_count_as_the_functions_served_calls() -> None:
    pf.clear()
    _table.NATIVE_DRAINS.append(lambda: {"layer_norm": 5})
    try:
        assert pf.stats()["layer_norm"].cudnn == 5
    finally:
        _table.NATIVE_DRAINS.clear()
        pf.clear()

"""plancache.run.raw_execute through plancache.functional, on the stand-in
runtime: a plan the backend runs takes its buffers' addresses only after its
first call (ordered, through the frontend's public execute), in the variant
pack's order; anything the raw form cannot vouch for keeps the public
execute. That the backend computes right from raw pointers is GPU-tested
(tests/gpu/test_gpu_functional.py, tests/gpu/test_gpu_torch.py run with it on)."""

from __future__ import annotations

import pytest

import plancache.functional as pf
from plancache.functional import _requests, _table
from plancache.run.raw_execute import RAW_EXECUTE_ENV, RawExecute
from tests.support.fake_gpu import FakeHandle, FakeRawGraph, FakeRuntime
from tests.support.frontdoor_standins import StandInClient, StandInTensor

T = StandInTensor
OUT = _requests.OUTPUT_UID


def _pointers(pack: dict[int, object]) -> dict[int, int]:
    return {uid: tensor.data_ptr() for uid, tensor in pack.items()}  # type: ignore[attr-defined]


def test_after_the_first_call_a_plan_runs_from_its_buffers_addresses(
    client: StandInClient, runtime: FakeRuntime
) -> None:
    runtime.raw = True
    w, b = T((32, 64)), T((32,))
    xs = [T((4, 16, 64)) for _ in range(3)]
    ys = [pf.linear(x, w, b, activation="relu") for x in xs]
    (graph,) = runtime.graphs
    assert isinstance(graph, FakeRawGraph)
    assert graph.ordered_calls == 1 and len(graph.calls) == 1  # the first call: the public execute
    raw = graph._lowered_graph.raw_calls
    assert len(raw) == 2
    for (pointers, workspace, handle, index), x, y in zip(raw, xs[1:], ys[1:], strict=True):
        assert pointers == {1: x.data_ptr(), 2: w.data_ptr(), 3: b.data_ptr(), OUT: y.data_ptr()}
        assert list(pointers) == sorted(pointers)  # the variant pack's order, ascending uid
        assert workspace == runtime.allocations[0].data_ptr() and index == -1
        assert handle == graph.loaded_with.backend_handle  # this thread's handle
    assert pf.stats()["linear"] == pf.FunctionStats(cudnn=3, torch=0, geometries=1)


def test_raw_pointers_follow_a_norms_constants(client: StandInClient, runtime: FakeRuntime) -> None:
    runtime.raw = True
    x, w = T((8, 64)), T((64,))
    pf.rms_norm(x, (64,), w, eps=1e-5)
    y = pf.rms_norm(x, (64,), w, eps=1e-5)
    (graph,) = runtime.graphs
    ((pointers, _, _, _),) = graph._lowered_graph.raw_calls
    (first, _, _) = graph.calls[0]
    assert pointers == {**_pointers(first), OUT: y.data_ptr()}  # the same constants, the new output


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"bound_by_graph": ()}, id="an ordinary plan"),
        pytest.param({"selected_engine": "sdpa_fwd_python"}, id="a python engine runs it"),
        pytest.param({"_plans": ["planning of its own"]}, id="a graph still planning"),
        pytest.param({"lowered": None}, id="no lowered graph"),
    ],
)
def test_raw_execute_is_taken_only_where_the_frontend_vouches_for_it(change: dict[str, object]) -> None:
    graph = FakeRawGraph(b"blob", FakeHandle(7))
    graph.execute((1, 2, 3), None, tensor_uids=(3, 1, 2))
    if "lowered" in change:
        graph._lowered_graph = change.pop("lowered")  # type: ignore[assignment]
    for name, value in change.items():
        setattr(graph, name, value)
    raw = RawExecute.of(graph, (3, 1, 2), FakeHandle(7))
    assert (raw is not None) == (change == {"bound_by_graph": ()})


def test_a_slot_the_caller_does_not_fill_keeps_the_public_execute() -> None:
    graph = FakeRawGraph(b"blob", FakeHandle(7))
    graph.execute((1, 2, 3), None, tensor_uids=(1, 2, 3))
    assert RawExecute.of(graph, (1, 2), FakeHandle(7)) is None  # uid 3 in the pack, not in the caller's
    assert RawExecute.of(graph, (1, 2, 3), object()) is None  # a handle without a backend int
    assert RawExecute.of(graph, (1, 2, 3), FakeHandle(7)) is not None


def test_the_setting_turns_it_off(client: StandInClient, runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RAW_EXECUTE_ENV, "0")
    runtime.raw = True
    w = T((32, 64))
    for _ in range(3):
        pf.linear(T((4, 64)), w)
    (graph,) = runtime.graphs
    assert graph.ordered_calls == 3 and graph._lowered_graph.raw_calls == []


def test_a_frontend_whose_raw_call_takes_other_arguments_keeps_the_public_execute(
    client: StandInClient, runtime: FakeRuntime
) -> None:
    runtime.raw = True
    w = T((32, 64))
    pf.linear(T((4, 64)), w)
    (graph,) = runtime.graphs

    def other_signature(address: int, count: int) -> None:  # as a changed private API would be
        raise TypeError("_execute_with_raw_ptrs(): incompatible function arguments")

    ((_, served),) = _table.TABLE.entries()
    (launcher,) = served._launchers.values()  # type: ignore[union-attr]
    launcher._raw._run = other_signature  # the bound call the launcher found, as another frontend's
    ys = [pf.linear(T((4, 64)), w) for _ in range(2)]
    assert graph.ordered_calls == 3 and [pack[OUT] for pack, _, _ in graph.calls[1:]] == ys
    assert launcher._raw is None and pf.stats()["linear"].cudnn == 3

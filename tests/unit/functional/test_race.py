"""A served geometry's plan raced against torch's function at its first call (plancache.functional._race), on
this machine without a GPU: stand-in tensors and plans, a clock the test moves (each run of the plan or of
torch's function costs what the test says). What is checked: the faster keeps the geometry (torch's only past
the margin), what the race runs (rounds alternating, the device synchronized around each, forward and
backward with autograd), what is counted and said, and what is never raced (the setting off, an operator's
call, batch norm, attention with dropout, a geometry torch runs anyway). The GPU's verdicts are
tests/gpu/test_gpu_race.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import plancache.functional as pf
from plancache import InvalidRequest
from plancache.functional import _attention, _autograd, _first_call, _linear, _race, _table, _tensor_ops
from plancache.functional._op_call import INFERENCE
from tests.support.frontdoor_standins import StandInClient, StandInOps, StandInTensor
from tests.unit.functional.modes import set_modes
from tests.unit.functional.recording import RecordingFunction, backward

T = StandInTensor


class Costs:
    """The test's clock: each run of the plan or of torch's function moves it by that arm's cost (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.plan = 100e-6
        self.torch = 100e-6
        self.runs: list[str] = []  # "plan" or "torch", in order, during races

    def clock(self) -> float:
        return self.now

    def costed(self, arm: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            self.now += getattr(self, arm)
            self.runs.append(arm)
            return fn(*args)

        return run


@pytest.fixture
def costs(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[Costs]:
    """The race on (conftest.py turns it off), torch's functions stand-ins that return a marker, both arms costed."""
    costs = Costs()
    monkeypatch.setattr(_tensor_ops, "available", lambda: True)
    monkeypatch.setattr(_race, "clock", costs.clock)
    monkeypatch.setattr(_linear, "torch_linear", lambda *args, **kwargs: "torch linear")
    monkeypatch.setattr(_attention, "torch_scaled_dot_product_attention", lambda *args, **kwargs: "torch attention")
    real_race = _first_call.race

    def costed_race(plan: Any, torch: Any, tensors: Any, device: int, needs_grad: bool, result: Any) -> Any:
        return real_race(costs.costed("plan", plan), costs.costed("torch", torch), tensors, device, needs_grad, result)

    monkeypatch.setattr(_first_call, "race", costed_race)
    pf.set_race_torch(True)
    yield costs


def standin_ops() -> StandInOps:
    ops = _tensor_ops.ops()
    assert isinstance(ops, StandInOps)
    return ops


def test_where_torch_is_faster_torch_runs_the_geometry_from_its_first_call_on(costs: Costs) -> None:
    costs.plan, costs.torch = 50e-6, 30e-6
    x, w = T((64, 256)), T((256, 256))
    first = pf.linear(x, w)
    assert first != "torch linear"  # the first call's result is the plan's, computed before the race
    assert pf.linear(T((64, 256)), w) == "torch linear"
    entry = _table.TABLE.get(next(key for key, _ in _table.TABLE.entries()))
    assert isinstance(entry, _table.TorchFaster)
    stats = pf.stats()["linear"]
    assert (stats.raced, stats.geometries, stats.torch_geometries) == (1, 1, 1)
    assert stats.reasons == {_race.TORCH_FASTER: 1} and stats.cudnn == 1 and stats.torch == 1
    (geometry,) = pf.geometries()
    assert geometry.plan is None
    assert geometry.reason == f"{_race.TORCH_FASTER}: torch 30.0 µs a call, the plan 50.0 µs"


@pytest.mark.parametrize(("plan_us", "torch_us"), [(30.0, 50.0), (100.0, 97.5)])
def test_where_the_plan_is_faster_or_within_the_margin_the_plan_runs_it(
    costs: Costs, plan_us: float, torch_us: float
) -> None:
    costs.plan, costs.torch = plan_us * 1e-6, torch_us * 1e-6
    w = T((256, 256))
    pf.linear(T((64, 256)), w)
    assert pf.linear(T((64, 256)), w) != "torch linear"
    stats = pf.stats()["linear"]
    assert (stats.raced, stats.torch_geometries, stats.cudnn, stats.torch) == (1, 0, 2, 0)
    (geometry,) = pf.geometries()
    assert geometry.plan is not None and geometry.reason is None


def test_the_race_alternates_rounds_between_synchronizations_and_fills_each_round(costs: Costs) -> None:
    costs.plan, costs.torch = 200e-6, 100e-6  # ROUND_S / the slower run's time: runs a round
    pf.linear(T((64, 256)), T((256, 256)))
    runs = int(_race.ROUND_S / 200e-6)
    once = ["plan", "torch"] * 2  # untimed, then timed once each
    rounds = [["plan"] * runs + ["torch"] * runs, ["torch"] * runs + ["plan"] * runs] * 2
    assert costs.runs == once + [arm for r in rounds[: _race.ROUNDS] for arm in r]
    log = standin_ops().race_log
    assert log[0] == ("grad mode", False)
    assert sum(1 for step in log if step[0] == "sync") == 2 * (4 + 2 * _race.ROUNDS)  # before and after each timing


def test_a_small_call_runs_up_to_max_runs_a_round(costs: Costs) -> None:
    costs.plan = costs.torch = 1e-9
    pf.linear(T((64, 256)), T((256, 256)))
    assert len(costs.runs) == 4 + 2 * _race.ROUNDS * _race.MAX_RUNS


def test_with_autograd_each_run_is_the_forward_and_its_backward(costs: Costs, monkeypatch: pytest.MonkeyPatch) -> None:
    set_modes(monkeypatch, grad_on=True)
    monkeypatch.setattr(_autograd, "_function", lambda: RecordingFunction)
    RecordingFunction.calls = []
    ops = standin_ops()
    backwards: list[Any] = []
    ops.on_gradients = lambda result, grad: backwards.append(
        backward(grad) if not isinstance(result, str) else "torch's backward"
    )
    costs.plan, costs.torch = 100e-6, 50e-6
    x, w = T((64, 256), requires_grad=True), T((256, 256), requires_grad=True)
    pf.linear(x, w)
    assert ops.race_log[:2] == [("leaves", (x, w)), ("grad mode", True)]
    grads = [step for step in ops.race_log if step[0] == "grad"]
    assert len(grads) == len(costs.runs)  # every run of either arm took its backward
    served = [b for b in backwards if b != "torch's backward"]
    assert served and all(tuple(g.shape for g in b) == ((64, 256), (256, 256)) for b in served)
    assert pf.linear(T((64, 256), requires_grad=True), w) == "torch linear"
    assert pf.stats()["linear"].torch_geometries == 1


def test_the_setting_off_races_nothing(costs: Costs, monkeypatch: pytest.MonkeyPatch) -> None:
    pf.set_race_torch(False)
    pf.linear(T((64, 256)), T((256, 256)))
    assert not costs.runs and pf.stats()["linear"].raced == 0
    pf.set_race_torch(None)  # the environment's word
    monkeypatch.setenv(_race.RACE_ENV, "0")
    pf.linear(T((32, 256)), T((256, 256)))
    assert not costs.runs
    monkeypatch.setenv(_race.RACE_ENV, "maybe")
    pf.set_race_torch(None)
    with pytest.raises(InvalidRequest, match=_race.RACE_ENV):
        pf.linear(T((16, 256)), T((256, 256)))


def test_on_by_default() -> None:
    setting = _race.RaceSetting()
    assert setting.enabled is True


@pytest.mark.parametrize("enabled", ["yes", 1, 0.0])
def test_the_setting_takes_a_boolean_or_none(enabled: Any) -> None:
    with pytest.raises(InvalidRequest, match="set_race_torch: enabled must be True, False or None"):
        pf.set_race_torch(enabled)


def test_an_operators_call_is_not_raced(costs: Costs) -> None:
    """A torch operator is called below autograd (and its compiled program's calls were raced at its trace)."""
    out = _linear._linear(T((64, 256)), T((256, 256)), None, op=INFERENCE)
    assert out != "torch linear" and not costs.runs and pf.stats()["linear"].raced == 0


def test_attention_with_dropout_is_not_raced_and_without_it_is(costs: Costs) -> None:
    q = T((2, 8, 128, 64))
    pf.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    assert not costs.runs
    pf.scaled_dot_product_attention(q, q, q)
    assert costs.runs and pf.stats()["scaled_dot_product_attention"].raced == 1


def test_batch_norm_is_not_raced(costs: Costs, monkeypatch: pytest.MonkeyPatch) -> None:
    """It writes its running statistics: a race would update them again."""
    set_modes(monkeypatch, grad_on=True)
    monkeypatch.setattr(_autograd, "_function", lambda: RecordingFunction)
    mean, var = T((64,), dtype="float32"), T((64,), dtype="float32")
    pf.batch_norm(T((8, 64, 16, 16), requires_grad=True), mean, var, training=True)
    assert pf.stats()["batch_norm"].cudnn == 1
    assert not costs.runs and pf.stats()["batch_norm"].raced == 0


def test_a_geometry_torch_runs_anyway_is_not_raced(costs: Costs) -> None:
    assert pf.linear(T((64, 256), dtype="float32"), T((256, 256), dtype="float32")) == "torch linear"
    assert not costs.runs and pf.stats()["linear"].raced == 0


def test_a_race_that_fails_keeps_the_plan_and_says_so_once(
    costs: Costs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(device: int) -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(standin_ops(), "synchronize", broken)
    w = T((256, 256))
    pf.linear(T((64, 256)), w)
    pf.linear(T((32, 256)), w)
    assert pf.linear(T((64, 256)), w) != "torch linear"
    stats = pf.stats()["linear"]
    assert (stats.raced, stats.torch_geometries, stats.geometries) == (0, 0, 2)
    (record,) = [r for r in caplog.records if "race" in r.getMessage()]
    assert "the race against torch's function failed (RuntimeError: CUDA error" in record.getMessage()


def test_clear_forgets_the_setting(costs: Costs) -> None:
    pf.set_race_torch(False)
    pf.clear()
    assert _race.RACE.enabled is True

"""A served geometry's plan raced against torch's function (plancache.functional._race), on this machine
without a GPU: stand-in tensors and plans, clocks the test moves (each run of the plan or of torch's function
costs what the test says; the time since a geometry's first call, which the race waits for). What is checked:
no race at a geometry's first call nor before RACE_AFTER_S, the faster keeps the geometry from the race on
(torch's only past the margin), what the race runs (rounds alternating, the device synchronized around each,
forward and backward with autograd), what is counted and said, a traced call's race at once, and what is
never raced (the setting off, an operator's call, batch norm, attention with dropout, a geometry torch runs
anyway, a call under CUDA graph capture). The GPU's verdicts are tests/gpu/test_gpu_race.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import plancache.functional as pf
from plancache import InvalidRequest
from plancache.functional import _attention, _autograd, _first_call, _linear, _modes, _race, _table, _tensor_ops
from plancache.functional._op_call import INFERENCE
from tests.support.frontdoor_standins import StandInClient, StandInOps, StandInTensor
from tests.unit.functional.modes import set_modes
from tests.unit.functional.recording import RecordingFunction, backward

T = StandInTensor


class Costs:
    """The test's clock: each run of the plan or of torch's function moves it by that arm's host cost (seconds),
    and queues that arm's device cost (`plan_device`, `torch_device`: none unless a test sets them) on a stand-in
    device, which runs what the host issued in order; a synchronization waits for it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.wall = 0.0  # _race.monotonic: when a geometry's race is due
        self.plan = 100e-6
        self.torch = 100e-6
        self.plan_device = 0.0
        self.torch_device = 0.0
        self.lookup = 0.0  # a served layer's way to its entry (_race.LOOKUP), where a test sets one
        self.lookup_device = 0.0
        self.device_done = 0.0  # when the device has run everything issued
        self.device_spent = 0.0  # the device's time, all runs
        self.holds = False  # whether device_seconds can hold the device (as a GPU's can: a test sets it)
        self.runs: list[str] = []  # "plan" or "torch", in order, during races

    def clock(self) -> float:
        return self.now

    def synchronize(self) -> None:
        self.now = max(self.now, self.device_done)

    def device_seconds(self, run: Callable[[], None], runs: int) -> float | None:
        """The device's time a run, as the device held behind a sleep measures it (None: it cannot be held)."""
        if not self.holds:
            return None
        before = self.device_spent
        for _ in range(runs):
            run()
        self.synchronize()
        return (self.device_spent - before) / runs

    def later(self) -> None:
        """Past RACE_AFTER_S: every geometry's race is due at its next call."""
        self.wall += _race.RACE_AFTER_S

    def costed(self, arm: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            self.now += getattr(self, arm)
            self.device_done = max(self.device_done, self.now) + getattr(self, f"{arm}_device")
            self.device_spent += getattr(self, f"{arm}_device")
            self.runs.append(arm)
            return fn(*args)

        return run


@pytest.fixture
def costs(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[Costs]:
    """The race on (conftest.py turns it off), torch's functions stand-ins that return a marker, both arms costed."""
    costs = Costs()
    monkeypatch.setattr(_tensor_ops, "available", lambda: True)
    monkeypatch.setattr(_race, "clock", costs.clock)
    monkeypatch.setattr(_race, "monotonic", lambda: costs.wall)
    monkeypatch.setattr(_linear, "torch_linear", lambda *args, **kwargs: "torch linear")
    monkeypatch.setattr(_attention, "torch_scaled_dot_product_attention", lambda *args, **kwargs: "torch attention")
    real_race = _first_call.race

    def costed_race(plan: Any, torch: Any, tensors: Any, device: int, needs_grad: bool, result: Any) -> Any:
        return real_race(costs.costed("plan", plan), costs.costed("torch", torch), tensors, device, needs_grad, result)

    monkeypatch.setattr(_first_call, "race", costed_race)
    ops = standin_ops()
    recorded_synchronize = ops.synchronize

    def synchronize(device: int) -> None:
        costs.synchronize()
        recorded_synchronize(device)

    monkeypatch.setattr(ops, "synchronize", synchronize)
    monkeypatch.setattr(ops, "device_seconds", lambda run, runs, device, hold_s: costs.device_seconds(run, runs))
    pf.set_race_torch(True)
    yield costs


def _entry() -> Any:
    """The table's one entry."""
    ((_, entry),) = _table.TABLE.entries()
    return entry


def _raced_call(costs: Costs, *tensors: Any, function: Callable[..., Any] = pf.linear) -> Any:
    """A geometry's first call, then its call past RACE_AFTER_S (the one a race is due at)."""
    function(*tensors)
    costs.later()
    return function(*tensors)


def standin_ops() -> StandInOps:
    ops = _tensor_ops.ops()
    assert isinstance(ops, StandInOps)
    return ops


def test_where_torch_is_faster_torch_runs_the_geometry_from_its_first_call_on(costs: Costs) -> None:
    costs.plan, costs.torch = 50e-6, 30e-6
    x, w = T((64, 256)), T((256, 256))
    assert pf.linear(x, w) != "torch linear" and pf.linear(x, w) != "torch linear"
    assert not costs.runs and pf.stats()["linear"].raced == 0  # the program's start-up runs the plan, unraced
    assert isinstance(_entry(), _table.Racing) and pf.geometries()[0].plan is not None
    costs.later()
    assert pf.linear(x, w) != "torch linear"  # the call that raced: its result the plan's, computed before
    assert costs.runs
    assert pf.linear(T((64, 256)), w) == "torch linear"
    assert isinstance(_entry(), _table.TorchFaster)
    stats = pf.stats()["linear"]
    assert (stats.raced, stats.geometries, stats.torch_geometries) == (1, 1, 1)
    assert stats.reasons == {_race.TORCH_FASTER: 1} and stats.cudnn == 3 and stats.torch == 1
    (geometry,) = pf.geometries()
    assert geometry.plan is None
    times = "torch 30.0 µs a call, the plan 50.0 µs (the host's 30.0 and 50.0 µs)"
    assert geometry.reason == f"{_race.TORCH_FASTER}: {times}"
    assert geometry.race == times


@pytest.mark.parametrize(("plan_us", "torch_us"), [(30.0, 50.0), (95.0, 100.0)])
def test_where_the_plan_is_faster_past_the_margin_the_plan_runs_it(
    costs: Costs, plan_us: float, torch_us: float
) -> None:
    costs.plan, costs.torch = plan_us * 1e-6, torch_us * 1e-6
    w = T((256, 256))
    pf.linear(T((64, 256)), w)
    costs.later()
    assert pf.linear(T((64, 256)), w) != "torch linear"
    assert pf.linear(T((64, 256)), w) != "torch linear"
    assert type(_entry()) is _table.Served  # the plan's own entry, the race done
    stats = pf.stats()["linear"]
    assert (stats.raced, stats.torch_geometries, stats.cudnn, stats.torch) == (1, 0, 3, 0)
    (geometry,) = pf.geometries()
    assert geometry.plan is not None and geometry.reason is None
    host = f"the host's {torch_us:.1f} and {plan_us:.1f} µs"
    assert geometry.race == f"torch {torch_us:.1f} µs a call, the plan {plan_us:.1f} µs ({host})"  # why the plan runs
    pf.clear()
    assert _race.KEPT.get(geometry.key) is None


@pytest.mark.parametrize(("plan_us", "torch_us"), [(100.0, 97.5), (98.0, 100.0), (100.0, 100.0)])
def test_within_the_margin_either_way_torchs_function_keeps_the_geometry(
    costs: Costs, plan_us: float, torch_us: float
) -> None:
    """The two the same to the race's precision: torch's function, what the program runs without plancache, keeps
    the geometry (a plan that ties a call in the race can lose in the step: GPU run 54's GPT-2 linear, 1.6 % faster
    in its race, 10 % slower on the device, the eager step 1.15x torch's)."""
    costs.plan, costs.torch = plan_us * 1e-6, torch_us * 1e-6
    _raced_call(costs, T((64, 256)), T((256, 256)))
    assert isinstance(_entry(), _table.TorchFaster)
    (geometry,) = pf.geometries()
    assert geometry.plan is None and geometry.reason is not None and geometry.reason.startswith(_race.TORCH_FASTER)


@pytest.mark.parametrize(("lookup_us", "torch_runs_it"), [(0.0, False), (10.0, True)])
def test_a_served_layers_lookup_counts_against_the_plan(
    costs: Costs, monkeypatch: pytest.MonkeyPatch, lookup_us: float, torch_runs_it: bool
) -> None:
    """The plan 95 µs a call, torch 100: the plan keeps the geometry, unless each of its runs also pays the served
    layer's way to it (LOOKUP, as plancache.torch sets it: 10 µs here), made before each plan run and never
    before torch's."""
    costs.plan, costs.torch = 95e-6, 100e-6
    costs.lookup = lookup_us * 1e-6
    x, w = T((64, 256)), T((256, 256))
    pf.linear(x, w)
    costs.later()
    monkeypatch.setattr(_race.LOOKUP, "call", costs.costed("lookup", lambda: None) if lookup_us else None)
    pf.linear(x, w)
    assert isinstance(_entry(), _table.TorchFaster) == torch_runs_it
    if lookup_us:
        plan_runs = [i for i, arm in enumerate(costs.runs) if arm == "plan"]
        assert all(costs.runs[i - 1] == "lookup" for i in plan_runs)
        assert costs.runs.count("lookup") == len(plan_runs)
        (geometry,) = pf.geometries()
        times = "torch 100.0 µs a call, the plan 105.0 µs (the host's 100.0 and 105.0 µs)"
        assert geometry.reason == f"{_race.TORCH_FASTER}: {times}"


@pytest.mark.parametrize("holds", [True, False], ids=["device-timed", "rounds-only"])
@pytest.mark.parametrize(
    ("plan_host_us", "plan_device_us", "torch_host_us", "torch_device_us", "torch_runs_it"),
    [
        (15.0, 18.0, 8.0, 18.0, True),  # as fast on the device, twice torch's host time: torch's (a host-bound step)
        (15.0, 80.0, 8.0, 100.0, False),  # 20 µs saved on the device, 7 more on the host: the plan's
        (15.0, 98.0, 8.0, 100.0, True),  # 2 µs saved on the device, 7 more on the host: torch's
        (8.0, 18.0, 8.0, 18.0, True),  # the same: torch's (what the program runs without plancache)
        # The host the longer for both and the same: the rounds equal; the plan 4 µs slower on the device
        # (GPU run 53's ResNet-50 inference): torch's.
        (17.5, 16.0, 17.5, 12.0, True),
        # A round bound by the host, the plan's 5 % shorter; on the device alone 20 % longer: torch's where the
        # device can be timed alone (run 54's GPT-2 linear kept a plan so), the plan's where it cannot.
        (15.0, 12.0, 16.0, 10.0, "holds"),
    ],
)
def test_the_host_time_a_plan_adds_counts_against_what_it_saves_on_the_device(
    costs: Costs,
    holds: bool,
    plan_host_us: float,
    plan_device_us: float,
    torch_host_us: float,
    torch_device_us: float,
    torch_runs_it: bool | str,
) -> None:
    """Each arm's runs issued by the host and run by the device in its own time (the stand-in device): a round's
    time is the longer of the two, which hides the shorter; the plan's extra host time counts against what it
    saves a call; where the device can be held (a GPU's), each arm's device time alone is measured, and the
    verdict says both arms' host times (and device times)."""
    costs.holds = holds
    costs.plan, costs.plan_device = plan_host_us * 1e-6, plan_device_us * 1e-6
    costs.torch, costs.torch_device = torch_host_us * 1e-6, torch_device_us * 1e-6
    _raced_call(costs, T((64, 256)), T((256, 256)))
    assert isinstance(_entry(), _table.TorchFaster) == (holds if torch_runs_it == "holds" else torch_runs_it)
    (geometry,) = pf.geometries()
    assert geometry.race is not None
    hosts = f"(the host's {torch_host_us:.1f} and {plan_host_us:.1f} µs"
    devices = f", the device's {torch_device_us:.1f} and {plan_device_us:.1f} µs)"
    assert geometry.race.endswith(hosts + (devices if holds else ")")), geometry.race


def test_the_verdicts_kept_for_plans_are_bounded_oldest_out(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = _race.KeptVerdicts()
    monkeypatch.setattr(kept, "MAX_KEPT", 3)
    for i in range(5):
        kept.note(("linear", i), _race.Verdict(1e-6, 2e-6))
    kept.note(("linear", 2), _race.Verdict(3e-6, 4e-6))  # raced again: the newest
    assert [kept.get(("linear", i)) is not None for i in range(5)] == [False, False, True, True, True]
    assert kept.get(("linear", 2)) == _race.Verdict(3e-6, 4e-6)


def test_the_race_alternates_rounds_between_synchronizations_and_fills_each_round(costs: Costs) -> None:
    costs.plan, costs.torch = 200e-6, 100e-6  # ROUND_S / the slower run's time: runs a round
    _raced_call(costs, T((64, 256)), T((256, 256)))
    runs = int(_race.ROUND_S / 200e-6)
    once = ["plan", "torch"] * 2  # untimed, then timed once each
    rounds = [["plan"] * runs + ["torch"] * runs, ["torch"] * runs + ["plan"] * runs] * 2
    assert costs.runs == once + [arm for r in rounds[: _race.ROUNDS] for arm in r]
    log = standin_ops().race_log
    assert log[0] == ("grad mode", False)
    assert sum(1 for step in log if step[0] == "sync") == 2 * (4 + 2 * _race.ROUNDS)  # before and after each timing


def test_a_small_call_runs_up_to_max_runs_a_round(costs: Costs) -> None:
    costs.plan = costs.torch = 1e-9
    _raced_call(costs, T((64, 256)), T((256, 256)))
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
    w = T((256, 256), requires_grad=True)
    pf.linear(T((64, 256), requires_grad=True), w)
    costs.later()
    x = T((64, 256), requires_grad=True)
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
    _raced_call(costs, T((64, 256)), T((256, 256)))
    assert not costs.runs and pf.stats()["linear"].raced == 0 and type(_entry()) is _table.Served
    pf.set_race_torch(None)  # the environment's word
    monkeypatch.setenv(_race.RACE_ENV, "0")
    _raced_call(costs, T((32, 256)), T((256, 256)))
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
    w = T((256, 256))
    out = _linear._linear(T((64, 256)), w, None, op=INFERENCE)
    assert out != "torch linear" and type(_entry()) is _table.Served
    _table.TABLE.clear()
    pf.linear(T((64, 256)), w)  # eager: its race to come
    costs.later()
    _linear._linear(T((64, 256)), w, None, op=INFERENCE)  # the operator's call runs the plan, unraced
    assert not costs.runs and pf.stats()["linear"].raced == 0 and isinstance(_entry(), _table.Racing)


def test_attention_with_dropout_is_not_raced_and_without_it_is(costs: Costs) -> None:
    q = T((2, 8, 128, 64))
    for _ in range(2):
        pf.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
        costs.later()
    assert not costs.runs
    _raced_call(costs, q, q, q, function=pf.scaled_dot_product_attention)
    assert costs.runs and pf.stats()["scaled_dot_product_attention"].raced == 1


def test_batch_norm_is_not_raced(costs: Costs, monkeypatch: pytest.MonkeyPatch) -> None:
    """It writes its running statistics: a race would update them again."""
    set_modes(monkeypatch, grad_on=True)
    monkeypatch.setattr(_autograd, "_function", lambda: RecordingFunction)
    mean, var = T((64,), dtype="float32"), T((64,), dtype="float32")
    for _ in range(2):
        pf.batch_norm(T((8, 64, 16, 16), requires_grad=True), mean, var, training=True)
        costs.later()
    assert pf.stats()["batch_norm"].cudnn == 2
    assert not costs.runs and pf.stats()["batch_norm"].raced == 0


def test_a_geometry_torch_runs_anyway_is_not_raced(costs: Costs) -> None:
    x, w = T((64, 256), dtype="float32"), T((256, 256), dtype="float32")
    assert _raced_call(costs, x, w) == "torch linear"
    assert not costs.runs and pf.stats()["linear"].raced == 0


def test_a_race_that_fails_keeps_the_plan_and_says_so_once(
    costs: Costs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(device: int) -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(standin_ops(), "synchronize", broken)
    w = T((256, 256))
    _raced_call(costs, T((64, 256)), w)
    _raced_call(costs, T((32, 256)), w)
    assert pf.linear(T((64, 256)), w) != "torch linear"
    stats = pf.stats()["linear"]
    assert (stats.raced, stats.torch_geometries, stats.geometries) == (0, 0, 2)
    (record,) = [r for r in caplog.records if "race" in r.getMessage()]
    assert "the race against torch's function failed (RuntimeError: CUDA error" in record.getMessage()


def test_clear_forgets_the_setting(costs: Costs) -> None:
    pf.set_race_torch(False)
    pf.clear()
    assert _race.RACE.enabled is True


def test_a_due_race_waits_for_a_call_outside_a_cuda_graph_capture(costs: Costs) -> None:
    """No synchronizing while a stream captures: the plan runs (its launch captured), the race at the next call."""
    w = T((256, 256))
    pf.linear(T((64, 256)), w)
    costs.later()
    standin_ops().capturing_graph = True
    pf.linear(T((64, 256)), w)
    assert not costs.runs and isinstance(_entry(), _table.Racing)
    standin_ops().capturing_graph = False
    pf.linear(T((64, 256)), w)
    assert costs.runs and pf.stats()["linear"].raced == 1


def test_a_traced_calls_race_runs_at_once_and_says_why_torch_runs_it(costs: Costs) -> None:
    """plancache.torch's trace-time question: the geometry raced at its first call, torch's reason returned."""
    costs.plan, costs.torch = 50e-6, 30e-6
    w = T((256, 256))
    reason = _first_call.torch_faster_reason(lambda: pf.linear(T((64, 256)), w))
    assert reason == f"{_race.TORCH_FASTER}: torch 30.0 µs a call, the plan 50.0 µs (the host's 30.0 and 50.0 µs)"
    assert isinstance(_entry(), _table.TorchFaster) and not _race.RACE_NOW.on
    costs.plan, costs.torch = 30e-6, 50e-6
    assert _first_call.torch_faster_reason(lambda: pf.linear(T((32, 256)), w)) is None
    assert pf.stats()["linear"].raced == 2
    # A geometry whose race is to come (an eager call made it) is raced when a trace asks.
    pf.linear(T((16, 256)), w)
    costs.plan, costs.torch = 50e-6, 30e-6
    assert _first_call.torch_faster_reason(lambda: pf.linear(T((16, 256)), w)) is not None
    assert pf.stats()["linear"].raced == 3


def test_a_geometry_whose_race_is_to_come_is_in_the_manifest_and_geometries(costs: Costs) -> None:
    pf.linear(T((64, 256)), T((256, 256)))
    assert isinstance(_entry(), _table.Racing)
    (geometry,) = pf.geometries()
    assert geometry.plan is not None and geometry.reason is None and geometry.race is None
    assert [e.name for e in pf.manifest().entries] == ["linear"]


def test_a_traced_calls_race_runs_the_functions_eager_path(costs: Costs, monkeypatch: pytest.MonkeyPatch) -> None:
    """plancache.torch races a traced call while torch.compile's session says "compiling" throughout: within
    eager_calls() the functions take their eager path (their plan raced), outside it torch's function."""
    set_modes(monkeypatch, compiling=True)
    costs.plan, costs.torch = 50e-6, 100e-6  # the plan's race won (a tie is torch's)
    w = T((256, 256))
    assert pf.linear(T((64, 256)), w) == "torch linear"  # traced: torch's function, nothing asked
    with _modes.eager_calls():
        reason = _first_call.torch_faster_reason(lambda: pf.linear(T((64, 256)), w))
    assert reason is None and pf.stats()["linear"].raced == 1
    assert pf.linear(T((64, 256)), w) == "torch linear"  # compiling again after it

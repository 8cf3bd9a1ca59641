"""plancache.torch's native kernels (native/kernels.cpp), built here with the machine's C++ compiler and
registered for the CPU key on operators of this test, whose implementations launch a STAND-IN plan: a Python
`run` with the frontend's raw-pointer signature that computes on the buffers' addresses (ctypes). What is
tested is the kernel's contract: a call is kept only where replaying its launches is the call, a kept call
replays with the new call's addresses without Python, and anything else keeps running Python.
On the GPU the same kernels run the frontend's plans (tests/gpu/test_gpu_torch.py)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from plancache.functional._table import LAUNCH_LOG  # noqa: E402
from plancache.torch import native as _native  # noqa: E402

from .native_build import BUILD_DIR, NEEDS_A_BUILD  # noqa: E402

pytestmark = NEEDS_A_BUILD


class StandInRun:
    """A stand-in plan's raw execute: `compute(floats...)` over `count` buffers of `numel` float32 each, the
    last `outputs` of them written."""

    def __init__(self, numel: int, compute: Callable[..., list[float]]) -> None:
        self.numel, self.compute, self.calls = numel, compute, 0

    def __call__(self, address: int, count: int, workspace: int, handle: int, index: int) -> None:
        self.calls += 1
        pointers = (ctypes.c_void_p * count).from_address(address)
        arrays = [(ctypes.c_float * self.numel).from_address(p) for p in pointers]
        result = self.compute(*[list(a) for a in arrays[:-1]])
        arrays[-1][:] = result


def _record(run: Any, buffers: tuple[Any, ...], inputs: int, outputs: int, positions: Any = None) -> None:
    """What plancache.functional._table.Served.logged appends for a launch."""
    if LAUNCH_LOG.launches is not None:
        LAUNCH_LOG.launches.append(
            (
                run,
                tuple(range(len(buffers))) if positions is None else positions,
                0,
                "stand_in",
                buffers,
                inputs,
                outputs,
                [-1 if b.is_inference() else b._version for b in buffers],
                -1,  # a CPU tensor's device index
            )
        )


def _launch(run: StandInRun, buffers: tuple[Any, ...], inputs: int, outputs: int) -> None:
    array = (ctypes.c_void_p * len(buffers))(*[b.data_ptr() for b in buffers])
    run(ctypes.addressof(array), len(buffers), 0, 0, -1)
    _record(run, buffers, inputs, outputs)


LIBRARY = torch.library.Library("plancache", "FRAGMENT")
CALLS: dict[str, int] = {}
LEARNING: list[bool] = []
BEHAVIOUR: dict[str, str] = {"scale": "plain"}
RUNS: dict[tuple[Any, ...], StandInRun] = {}


def _run_for(key: tuple[Any, ...], numel: int, compute: Callable[..., list[float]]) -> StandInRun:
    if key not in RUNS:
        RUNS[key] = StandInRun(numel, compute)
    return RUNS[key]


def scale_impl(x: Any, s: float) -> Any:
    """Served-like: one launch writing s * x into a fresh output (BEHAVIOUR says what else it does)."""
    CALLS["scale"] = CALLS.get("scale", 0) + 1
    LEARNING.append(LAUNCH_LOG.launches is not None)
    behaviour = BEHAVIOUR["scale"]
    if behaviour == "torch":
        return x * s
    source = x.clone() if behaviour == "temporary input" else x
    out = torch.empty_like(x)
    run = _run_for(("scale", tuple(x.shape), s), x.numel(), lambda a: [s * v for v in a])
    _launch(run, (source, out), 1, 1)
    if behaviour == "written after":
        out.add_(1)
    if behaviour == "copy returned":
        return out.clone()
    return out


def chain_impl(x: Any, y: Any) -> tuple[Any, Any]:
    """Two launches, the first's output read by the second; returns (second's output, None)."""
    CALLS["chain"] = CALLS.get("chain", 0) + 1
    mid, out = torch.empty_like(x), torch.empty_like(x)
    _launch(
        _run_for(("add", x.numel()), x.numel(), lambda a, b: [u + v for u, v in zip(a, b, strict=True)]),
        (x, y, mid),
        2,
        1,
    )
    _launch(_run_for(("double", x.numel()), x.numel(), lambda a: [2 * v for v in a]), (mid, out), 1, 1)
    return out, None


LIBRARY.define("_native_test_scale(Tensor x, float s) -> Tensor")
LIBRARY.define("_native_test_chain(Tensor x, Tensor y) -> (Tensor, Tensor?)")


@pytest.fixture(scope="module")
def native() -> Any:
    os.environ.setdefault(_native.NATIVE_DIR_ENV, BUILD_DIR)
    # A lock file a killed build left where torch's own build would wait on it forever: this build does not.
    shared = _native.build_directory(_native.module_name())
    shared.mkdir(parents=True, exist_ok=True)
    (shared / "lock").touch()
    module = _native.build()
    assert _native._built(_native.module_name()) is not None  # in place for the next process
    # Its own build folder is gone (another test worker's may be building beside it: pytest -n).
    assert [p.name for p in shared.iterdir() if p.name.startswith(f"build-{os.getpid()}-")] == []
    module.set_learn_call(_native.learn_call)
    module.install("_native_test_scale", scale_impl, "CPU")
    module.install("_native_test_chain", chain_impl, "CPU")
    module.load_cudnn("")  # absent on a CPU machine: the CPU key runs without a handle
    return module


@pytest.fixture(autouse=True)
def fresh(native: Any) -> Any:
    native.clear()
    native.drain_calls()
    CALLS.clear()
    LEARNING.clear()
    BEHAVIOUR["scale"] = "plain"
    yield native
    native.clear()


def scale(x: Any, s: float) -> Any:
    return torch.ops.plancache._native_test_scale(x, s)


def test_a_kept_call_replays_the_implementations_launch_with_the_new_calls_addresses(native: Any) -> None:
    first = scale(torch.arange(6.0).reshape(2, 3), 2.0)
    assert CALLS["scale"] == 1 and LEARNING == [True]
    assert native.counts()["kept"] == 1
    x = torch.tensor([[1.0, -2.0, 3.5], [0.25, 7.0, -1.0]])
    y = scale(x, 2.0)
    assert CALLS["scale"] == 1  # no Python: replayed
    assert torch.equal(y, 2.0 * x) and y.data_ptr() != first.data_ptr()
    assert y.shape == x.shape and y.stride() == x.stride() and y.dtype == x.dtype
    assert torch.equal(first, 2.0 * torch.arange(6.0).reshape(2, 3))  # the earlier result untouched
    assert native.drain_calls() == {"stand_in": 1}


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(lambda: scale(torch.ones(2, 3), 3.0), id="another scalar"),
        pytest.param(lambda: scale(torch.ones(3, 2), 2.0), id="another shape"),
        pytest.param(lambda: scale(torch.ones(3, 2).t(), 2.0), id="other strides"),
        pytest.param(lambda: scale(torch.ones(2, 3, dtype=torch.float64), 2.0), id="another dtype"),
    ],
)
def test_a_call_differing_in_any_argument_runs_python(native: Any, other: Callable[[], Any]) -> None:
    scale(torch.ones(2, 3), 2.0)
    CALLS.clear()
    BEHAVIOUR["scale"] = "torch"  # what Python does for that geometry, seen in the result
    out = other()
    assert CALLS["scale"] == 1
    assert native.drain_calls() == {}
    assert out.dtype in (torch.float32, torch.float64)


@pytest.mark.parametrize("behaviour", ["temporary input", "written after", "copy returned", "torch"])
def test_a_call_its_launches_do_not_reproduce_is_never_kept(native: Any, behaviour: str) -> None:
    BEHAVIOUR["scale"] = behaviour
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    results = [scale(x, 2.0) for _ in range(5)]
    assert CALLS["scale"] == 5  # Python ran every call
    assert native.counts()["kept"] == 0
    expected = 2.0 * x + (1 if behaviour == "written after" else 0)
    assert all(torch.equal(r, expected) for r in results)
    # after MAX_TRIES refusals the key is no longer learned (its Python runs without collecting launches)
    assert LEARNING == [True, True, True, False, False]


def test_launches_chained_through_an_intermediate_replay_in_order(native: Any) -> None:
    x, y = torch.ones(4), torch.full((4,), 2.0)
    torch.ops.plancache._native_test_chain(x, y)
    a, b = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([10.0, 20.0, 30.0, 40.0])
    out, none = torch.ops.plancache._native_test_chain(a, b)
    assert CALLS["chain"] == 1
    assert none is None and torch.equal(out, 2 * (a + b))
    assert native.drain_calls() == {"stand_in": 2}


def test_one_tensor_given_twice_is_not_kept(native: Any) -> None:
    x = torch.ones(4)
    torch.ops.plancache._native_test_chain(x, x)
    assert native.counts()["kept"] == 0
    a, b = torch.ones(4), torch.full((4,), 5.0)
    out, _ = torch.ops.plancache._native_test_chain(a, b)
    assert CALLS["chain"] == 2 and torch.equal(out, 2 * (a + b))


def test_clear_forgets_every_kept_call(native: Any) -> None:
    scale(torch.ones(2, 3), 2.0)
    native.clear()
    scale(torch.ones(2, 3), 2.0)
    assert CALLS["scale"] == 2 and native.counts()["kept"] == 1


def test_a_kept_call_that_fails_runs_python_and_is_not_replayed_again(native: Any) -> None:
    x = torch.ones(2, 3)
    scale(x, 2.0)
    run = RUNS[("scale", (2, 3), 2.0)]
    real = run.compute
    run.compute = lambda a: (_ for _ in ()).throw(RuntimeError("the stand-in plan fails"))
    try:
        with pytest.raises(RuntimeError, match="the stand-in plan fails"):
            scale(x, 2.0)  # the replay fails, then Python's own launch fails the same way: the caller sees it
    finally:
        run.compute = real
    assert native.counts()["kept"] == 0
    y = scale(torch.full((2, 3), 3.0), 2.0)
    assert torch.equal(y, torch.full((2, 3), 6.0)) and CALLS["scale"] == 3


def test_a_call_under_inference_mode_runs_and_is_never_kept(native: Any) -> None:
    """An inference tensor keeps no version counter: a write after the launch could not be seen, so such a call
    runs Python every time (and runs: reading the counter would raise)."""
    with torch.inference_mode():
        x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        results = [scale(x, 2.0) for _ in range(4)]
    assert CALLS["scale"] == 4 and native.counts()["kept"] == 0
    assert all(torch.equal(r, 2.0 * x) for r in results)


def test_the_setting_decides_whether_the_kernels_are_had(native: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset: off (the default until a GPU run verifies them under CUDA graphs); auto: the built extension is
    loaded, and where it cannot serve (this machine: cuDNN not loaded) the state says why and the program goes on,
    Python serving; 1: they fail loudly with the reason; a value that is not a setting is refused."""
    monkeypatch.delenv(_native.NATIVE_ENV, raising=False)
    off = _native.Native()
    off.start(())
    assert off.state.startswith("disabled") and off.drain() == {} and off.info()["state"] == off.state
    monkeypatch.setenv(_native.NATIVE_ENV, "auto")
    automatic = _native.Native()
    automatic.start(())  # built by the fixture: loaded at once, no background build
    assert automatic.state == "failed: cuDNN's library is not loaded in this process"
    assert automatic.drain() == {} and automatic.info()["state"] == automatic.state
    wanted = _native.Native()
    monkeypatch.setenv(_native.NATIVE_ENV, "1")
    with pytest.raises(RuntimeError, match="cuDNN's library is not loaded"):
        wanted.start(())
    monkeypatch.setenv(_native.NATIVE_ENV, "yes")
    with pytest.raises(ValueError, match="auto, 0 or 1"):
        _native.Native().start(())

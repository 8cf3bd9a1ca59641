"""The stand-in service and runtime plancache.functional's CPU tests share:
a fake GPU runtime, stand-in tensor operations, a stand-in client configured
as the functions' service, on a machine without torch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import plancache.functional as pf
from plancache.functional import _attention, _first_call, _linear, _tensor_ops
from plancache.run import execution
from tests.support.fake_gpu import FakeRuntime
from tests.support.frontdoor_standins import TARGET, StandInClient, StandInOps, StandInTensor
from tests.unit.functional.modes import set_modes


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    fake = FakeRuntime()
    execution.use_runtime(fake)
    _tensor_ops.use_tensor_ops(StandInOps())
    yield fake
    execution.use_runtime(None)
    _tensor_ops.use_tensor_ops(None)


@pytest.fixture
def client(runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInClient]:
    """A served process, as on a machine without torch (whatever this one has)."""
    monkeypatch.setattr(_tensor_ops, "available", lambda: False)
    set_modes(monkeypatch, grad_on=False, compiling=False)
    monkeypatch.setattr(
        _tensor_ops, "dropout_seed", lambda device: StandInTensor((1, 1, 1, 1), dtype="int64", device=str(device))
    )
    _first_call._once.forget()
    standin = StandInClient()
    pf.configure(standin, target=TARGET)
    # The race of a served geometry against torch's function runs torch's function again: off here, where tests
    # count torch's calls; on in test_race.py, which tests it.
    pf.set_race_torch(False)
    yield standin
    pf.clear()


@pytest.fixture
def torch_runs(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """torch's functions, recorded: the fallback path without torch."""
    calls: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(_tensor_ops, "available", lambda: True)
    for module, name in ((_linear, "linear"), (_linear, "matmul"), (_attention, "scaled_dot_product_attention")):
        monkeypatch.setattr(
            module, f"torch_{name}", lambda *args, _name=name, **kwargs: calls.append((_name, args)) or f"torch {_name}"
        )
    return calls

"""The stand-in service and runtime plancache.functional's CPU tests share:
a fake GPU runtime, stand-in tensor operations, a stand-in client configured
as the functions' service, on a machine without torch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import plancache.functional as pf
from plancache.functional import _ops, _torch
from plancache.run import execution
from tests.support.fake_gpu import FakeRuntime
from tests.support.frontdoor_standins import TARGET, StandInClient, StandInOps, StandInTensor


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    fake = FakeRuntime()
    execution.use_runtime(fake)
    _torch.use_tensor_ops(StandInOps())
    yield fake
    execution.use_runtime(None)
    _torch.use_tensor_ops(None)


@pytest.fixture
def client(runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInClient]:
    """A served process, as on a machine without torch (whatever this one has)."""
    monkeypatch.setattr(_torch, "available", lambda: False)
    monkeypatch.setattr(_ops, "_grad_on", lambda: False)
    monkeypatch.setattr(_ops, "_compiling", lambda: False)
    monkeypatch.setattr(
        _torch, "dropout_seed", lambda device: StandInTensor((1, 1, 1, 1), dtype="int64", device=str(device))
    )
    _ops._once.forget()
    standin = StandInClient()
    pf.configure(standin, target=TARGET)
    yield standin
    pf.clear()


@pytest.fixture
def torch_runs(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """torch's functions, recorded: the fallback path without torch."""
    calls: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(_torch, "available", lambda: True)
    for name in ("linear", "matmul", "scaled_dot_product_attention"):
        monkeypatch.setattr(
            _torch, name, lambda *args, _name=name, **kwargs: calls.append((_name, args)) or f"torch {_name}"
        )
    return calls

"""Grad mode and torch.compile as a CPU test sets them: in every operator
module at once (each holds its own `_grad_on` and `_compiling`:
plancache.functional._modes)."""

from __future__ import annotations

import pytest

from plancache.functional import _modes


def set_modes(monkeypatch: pytest.MonkeyPatch, *, grad_on: bool | None = None, compiling: bool | None = None) -> None:
    for namespace in _modes.NAMESPACES:
        if grad_on is not None:
            monkeypatch.setitem(namespace, "_grad_on", lambda: grad_on)
        if compiling is not None:
            monkeypatch.setitem(namespace, "_compiling", lambda: compiling)

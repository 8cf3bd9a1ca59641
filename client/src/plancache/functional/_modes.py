"""Grad mode and torch.compile, as every operator's hot path asks them: torch's own checks once torch is needed.

Each operator module holds `_grad_on` and `_compiling` as globals of its
own (`_grad_on, _compiling = _modes.install(globals())`): a global is the
cheapest name a call can read. Until torch is first needed they are the
checks below, whose first call puts torch's own (torch.is_grad_enabled,
torch.compiler.is_compiling; `bool` where torch is not installed) in every
operator module that still holds them, so plancache stays importable
without torch and a hit pays one C call for each check. A test sets them
in every operator module at once (`NAMESPACES`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from plancache.functional import _tensor_ops

Check = Callable[[], bool]
NAMESPACES: list[dict[str, Any]] = []  # every operator module's globals


def _bind() -> tuple[Check, Check]:
    grad_on: Check
    compiling: Check
    if _tensor_ops.available():
        import torch

        grad_on, compiling = torch.is_grad_enabled, torch.compiler.is_compiling
    else:
        grad_on = compiling = bool
    for namespace in NAMESPACES:  # a check a test has set stays
        if namespace.get("_grad_on") is _first_grad_check:
            namespace["_grad_on"] = grad_on
        if namespace.get("_compiling") is _first_compiling_check:
            namespace["_compiling"] = compiling
    return grad_on, compiling


def _first_grad_check() -> bool:
    return _bind()[0]()


def _first_compiling_check() -> bool:
    return _bind()[1]()


def install(namespace: dict[str, Any]) -> tuple[Check, Check]:
    """An operator module's `_grad_on` and `_compiling`, until torch's replace them."""
    NAMESPACES.append(namespace)
    return _first_grad_check, _first_compiling_check


@contextlib.contextmanager
def eager_calls() -> Iterator[None]:
    """Every operator module's `_compiling` says False meanwhile: plancache.torch races a traced call by running
    the function on real tensors while torch.compile traces (whose session torch.compiler.is_compiling() reports
    throughout), and the call must take its eager path, not hand itself to torch as a traced call does."""
    saved = [(namespace, namespace.get("_compiling")) for namespace in NAMESPACES]
    for namespace, _ in saved:
        namespace["_compiling"] = _not_compiling
    try:
        yield
    finally:
        for namespace, check in saved:
            namespace["_compiling"] = check


def _not_compiling() -> bool:
    return False

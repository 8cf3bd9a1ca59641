"""Waiting on a condition instead of sleeping a fixed time: a test goes on as
soon as what it needs is true, and a wait that runs out says what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, what: str, poll_s: float = 0.05) -> T:
    """Polls `condition` until it returns something truthy, and returns that;
    fails with `what` when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s: {what}")
        time.sleep(poll_s)

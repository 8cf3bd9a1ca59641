"""One log line per kind of fault per interval (plancache.log_limits)."""

from __future__ import annotations

import logging

import pytest

from plancache.log_limits import LogLimiter


def test_one_line_per_kind_per_interval_and_the_held_back_count_in_the_next(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limiter = LogLimiter(logging.getLogger("limited"), interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="limited"):
        written = [limiter.warning("disk", "cannot write %s", i) for i in range(60)]
        limiter.error("redis", "store down")  # another kind is not held back by the first
        now[0] = 59.9
        limiter.warning("disk", "cannot write %s", "late")
        now[0] = 60.0
        limiter.warning("disk", "cannot write %s", "again")
        limiter.warning("disk", "cannot write %s", "held")
    assert written == [True] + [False] * 59
    assert [r.getMessage() for r in caplog.records] == [
        "cannot write 0",
        "store down",
        "cannot write again (60 more like this in the last 60 s not logged)",
    ]
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.ERROR, logging.WARNING]

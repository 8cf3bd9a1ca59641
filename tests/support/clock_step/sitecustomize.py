"""A host whose clock steps, played in one process: with this folder on
PYTHONPATH and PLANCACHE_TEST_CLOCK_FILE naming a file that holds a number of
seconds, the process's wall clock (time.time) is off by that many seconds,
read again at each call, so a test steps it mid-run by writing the file.
Monotonic clocks are left alone, as a real clock step leaves them."""

from __future__ import annotations

import os
import time

_FILE = os.environ.get("PLANCACHE_TEST_CLOCK_FILE")

if _FILE:
    _real_time = time.time

    def _stepped_time() -> float:
        try:
            with open(_FILE) as f:  # type: ignore[arg-type]
                offset = float(f.read() or 0)
        except (OSError, ValueError):
            offset = 0.0
        return _real_time() + offset

    time.time = _stepped_time

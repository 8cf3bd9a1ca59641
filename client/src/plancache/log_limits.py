"""One log line per kind of fault per minute, not one per call.

A fault that every call meets (a read-only disk cache, Redis refusing
writes, a lost GPU) would otherwise write a line per plan: 60 plans, 60
lines, and the one line an operator needs scrolls away. A `LogLimiter`
writes the first line of a kind, counts the ones that follow within its
interval, and says how many it held back in the next line of that kind.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# An operator reads one line per kind of fault per minute.
DEFAULT_INTERVAL_S = 60.0


@dataclass
class _Kind:
    last: float
    held_back: int = 0


class LogLimiter:
    """Thread-safe; `kind` names the fault (a short fixed text: never a plan
    key or anything else that would make each call a kind of its own)."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._clock = clock
        self._kinds: dict[str, _Kind] = {}
        self._lock = threading.Lock()

    def log(self, level: int, kind: str, message: str, *args: object) -> bool:
        """Writes the line unless one of this kind was written within the
        interval; True when it was written."""
        now = self._clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen.last < self._interval_s:
                seen.held_back += 1
                return False
            held_back = seen.held_back if seen is not None else 0
            self._kinds[kind] = _Kind(now)
        if held_back:
            message += f" ({held_back} more like this in the last {self._interval_s:.0f} s not logged)"
        self._log.log(level, message, *args)
        return True

    def warning(self, kind: str, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, kind, message, *args)

    def error(self, kind: str, message: str, *args: object) -> bool:
        return self.log(logging.ERROR, kind, message, *args)

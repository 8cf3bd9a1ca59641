"""CPU work on large messages, off the event loop.

Parsing a multi-megabyte spec, normalizing and hashing it, or checking the
sha256 of a large blob takes milliseconds to seconds of CPU. Done on the
event loop it would stall every other caller, hits included, for that
long; in a small thread pool the loop keeps running (it shares the GIL with
the pool, and gets it back at least every switch interval, 5 ms). Small
messages, the common case, stay on the loop: a thread hop costs more than
the work.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# Bytes of input above which work leaves the event loop (about 1 ms of parsing).
LARGE_BYTES = 256 * 1024


class CpuOffload:
    def __init__(self, threads: int, large_bytes: int = LARGE_BYTES) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="plancache-cpu")
        self.large_bytes = large_bytes

    async def run(self, size: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn(*args) on the loop for small inputs, in the pool for large ones."""
        if size < self.large_bytes:
            return fn(*args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

"""CPU work on large messages, off the event loop, one task per caller at a time.

Parsing a multi-megabyte spec, walking a large request's wire shape,
normalizing and hashing it, or checking the sha256 of a large blob takes
milliseconds to seconds of CPU. Done on the event loop it would stall every
other caller, hits included, for that long (a flooder's 21 large Prefetch
requests, walked on the loop: ~0.8 s in which no one else was answered); in
a small thread pool the loop keeps running (it shares the GIL with the
pool, and gets it back at least every switch interval, 5 ms). Small
messages, the common case, stay on the loop: a thread hop costs more than
the work.

The pool is shared by callers in turn: a caller (the call's
plancache_server.gateway.shares.CALLER) has at most one task in the pool at
once; its next ones wait here, in order, at most `waiting_per_caller` of
them holding at most `waiting_bytes_per_caller` bytes of input (then
RESOURCE_EXHAUSTED with the retry delay, the request's bytes let go: a
caller sending that many large requests at once is asked to come back). So a caller with a
hundred large requests under way holds one thread, and another caller's
large request goes beside it instead of behind all of them. Work done
outside a call (no caller) is not gated, nor is a stored plan's check
(`run_ungated`: sha256 and a signature, C code that lets go of the GIL),
which a caller's hits must never wait a turn for or be refused over.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import ParamSpec, TypeVar

from plancache.errors import ResourceExhausted
from plancache_server.gateway.shares import CALLER

P = ParamSpec("P")
R = TypeVar("R")

# Bytes of input above which work leaves the event loop (about 1 ms of parsing).
LARGE_BYTES = 256 * 1024
# A caller's large tasks waiting for its turn in the pool, at most (its Prefetch streams' share, by default),
# and the bytes of input they hold (four of the largest Prefetch requests): past either, refused at once, the
# request's bytes let go.
WAITING_PER_CALLER = 64
WAITING_BYTES_PER_CALLER = 64 * 2**20


class CpuOffload:
    def __init__(
        self,
        threads: int,
        large_bytes: int = LARGE_BYTES,
        *,
        waiting_per_caller: int = WAITING_PER_CALLER,
        waiting_bytes_per_caller: int = WAITING_BYTES_PER_CALLER,
        retry_delay_s: float = 1.0,
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="plancache-cpu")
        self.large_bytes = large_bytes
        self.waiting_per_caller = waiting_per_caller
        self.waiting_bytes_per_caller = waiting_bytes_per_caller
        self.retry_delay_s = retry_delay_s
        # Callers with a task in the pool -> their tasks waiting to go in, in order (each with its input's size).
        self._callers: dict[str, deque[tuple[asyncio.Future[None], int]]] = {}
        self._waiting_bytes: dict[str, int] = {}

    async def run(self, size: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn(*args) on the loop for small inputs, in the pool (in the caller's turn) for large ones."""
        if size < self.large_bytes:
            return fn(*args, **kwargs)
        return await self.run_off_loop(size, fn, *args, **kwargs)

    async def run_off_loop(self, size: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn(*args) in the pool, when the current caller has no other task there (`size`: the bytes of
        input it holds meanwhile)."""
        async with self.caller_turn(size):
            return await self.in_pool(fn, *args, **kwargs)

    @asynccontextmanager
    async def caller_turn(self, size: int) -> AsyncIterator[None]:
        """The current caller's one place in the pool, once its tasks before this one are done (`size`: the
        bytes of input this one holds while it waits; refused past the caller's bounds)."""
        caller = CALLER.get()
        await self._enter(caller, size)
        try:
            yield
        finally:
            self._leave(caller)

    async def in_pool(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn(*args) in the pool, now (inside the caller's turn)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def run_ungated(self, size: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn(*args) on the loop for small inputs, in the pool for large ones, outside the callers' turns: for
        a stored plan's checks (sha256 and signature: C code that lets go of the GIL), which a caller's hits
        must never wait a turn for, nor be refused for (a node reading many large plans at once)."""
        if size < self.large_bytes:
            return fn(*args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def waiting(self, caller: str) -> int:
        queue = self._callers.get(caller)
        return len(queue) if queue is not None else 0

    async def _enter(self, caller: str, size: int) -> None:
        if not caller:
            return
        queue = self._callers.get(caller)
        if queue is None:
            self._callers[caller] = deque()
            return
        held = self._waiting_bytes.get(caller, 0)
        if len(queue) >= self.waiting_per_caller or held + size > self.waiting_bytes_per_caller:
            raise ResourceExhausted(
                f"this caller already has {len(queue):,} large requests ({held:,} bytes) waiting for the "
                f"gateway's CPU threads (each caller's are taken one at a time, at most {self.waiting_per_caller:,} "
                f"or {self.waiting_bytes_per_caller:,} bytes waiting): call again later",
                retry_after=self.retry_delay_s,
            )
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (turn, size)
        queue.append(entry)
        self._waiting_bytes[caller] = held + size
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._leave(caller)  # handed the turn as it was cancelled: pass it on
            else:
                queue.remove(entry)
                self._unwait(caller, size)
            raise

    def _unwait(self, caller: str, size: int) -> None:
        left = self._waiting_bytes.get(caller, 0) - size
        if left > 0:
            self._waiting_bytes[caller] = left
        else:
            self._waiting_bytes.pop(caller, None)

    def _leave(self, caller: str) -> None:
        if not caller:
            return
        queue = self._callers.get(caller)
        if queue is None:
            return
        while queue:
            turn, size = queue.popleft()
            self._unwait(caller, size)
            if not turn.done():
                turn.set_result(None)
                return
        del self._callers[caller]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

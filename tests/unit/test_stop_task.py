"""Stopping a gateway's background tasks ends them even when a cancel is
swallowed (redis-py's read timeouts can turn one into "no message"), and
never waits without a bound."""

from __future__ import annotations

import asyncio
import time

from plancache_server.store.redis_conn import stop_task


def test_a_task_that_swallows_a_cancel_is_cancelled_again_and_ends() -> None:
    swallowed = []

    async def loop_that_swallows_the_first_cancel() -> None:
        while True:
            try:
                await asyncio.sleep(1.0)  # a read with its own timeout
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # answered as "no message": the loop runs on

    async def scenario() -> float:
        task = asyncio.get_running_loop().create_task(loop_that_swallows_the_first_cancel())
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await stop_task(task)
        assert task.done() and task.cancelled()
        return time.monotonic() - started

    took = asyncio.run(scenario())
    assert swallowed == [True] and took < 1.0


def test_a_task_that_never_ends_is_left_behind_after_the_bound() -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    async def scenario() -> tuple[float, bool]:
        task = asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await stop_task(task, timeout=0.5)
        took, done = time.monotonic() - started, task.done()
        released.set()  # let asyncio.run end it
        task.cancel()
        await asyncio.wait([task])
        return took, done

    took, done = asyncio.run(scenario())
    assert not done and 0.5 <= took < 1.5


def test_none_and_finished_tasks_return_at_once() -> None:
    async def scenario() -> None:
        await stop_task(None)
        task = asyncio.get_running_loop().create_task(asyncio.sleep(0))
        await task
        await stop_task(task)

    asyncio.run(scenario())

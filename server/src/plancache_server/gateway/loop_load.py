"""How busy the gateway's event loop is: the share of the time its thread is runnable.

Every PROBE_S a coroutine on the loop reads how long the loop's thread was
on the CPU or waiting for one (Linux's /proc/self/task/<tid>/schedstat:
everything the loop ran, calls' steps and gRPC's and Redis' callbacks, and
the time it was ready to run on a host whose cores were taken) against the
wall clock; the ratio is smoothed (an exponential average over ~100 ms).
Without schedstat, the thread's CPU time alone (time.thread_time), which
reads a loop starved of CPU as idle: the CI machine's loaded test run read
~0.4 for a loop that never waited for work. Above `busy_share` the loop
counts as busy, and a caller's turns are then paced to its share of the
loop (plancache_server.gateway.shares.FairTurns). A timer's lateness was
tried first and does not show it: a loop taken up by many short steps goes
around in well under a millisecond (bench/flood.py: a timer 2 ms late at
most while fifty nodes and a flooder kept the loop's thread ~85 % on the
CPU). Measured rather than counted, work no one else waits for (a caller
alone on a quiet gateway) is not paced.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

from plancache_server.store.redis_conn import stop_task

PROBE_S = 0.02
SMOOTHING = 0.2  # the weight of each probe in the average (about the last 100 ms count)


class LoopLoad:
    def __init__(self, busy_share: float, probe_s: float = PROBE_S) -> None:
        """`busy_share` 0: never busy (turns are not paced)."""
        self.busy_share = busy_share
        self.probe_s = probe_s
        self.share = 0.0  # the smoothed share of the time the loop's thread was on the CPU
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self.busy_share > 0 and self.share > self.busy_share

    def start(self) -> LoopLoad:
        if self.busy_share > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._probe(), name="plancache-loop-load")
        return self

    async def _probe(self) -> None:
        runnable = runnable_seconds()  # read on the loop's thread: its own
        wall, busy = time.monotonic(), runnable()
        while True:
            await asyncio.sleep(self.probe_s)
            now_wall, now_busy = time.monotonic(), runnable()
            if now_wall > wall:
                self.share += SMOOTHING * (min(1.0, (now_busy - busy) / (now_wall - wall)) - self.share)
            wall, busy = now_wall, now_busy

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None


def runnable_seconds() -> Callable[[], float]:
    """A reader of the calling thread's seconds on a CPU or waiting for one (schedstat), else on a CPU."""
    schedstat = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")

    def from_schedstat() -> float:
        on_cpu, waiting = schedstat.read_text().split()[:2]
        return (int(on_cpu) + int(waiting)) / 1e9

    try:
        from_schedstat()
    except (OSError, ValueError):
        return time.thread_time
    return from_schedstat

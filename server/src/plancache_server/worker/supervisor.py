"""Worker processes: one per GPU, restarted when they die."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

from plancache.log_limits import LogLimiter
from plancache_server.worker.compiler.faults import EXIT_GPU_LOST

log = logging.getLogger(__name__)
_faults = LogLimiter(log)

MAX_RESTARTS = 5
# A worker whose GPU is lost is restarted until the GPU answers, at least this often (seconds).
GPU_RETRY_CAP_S = 60
# A worker that ran this long before it exited starts its count of restarts
# again: a GPU lost once a week is restarted every time, a crash loop is not.
STABLE_S = 60.0
# Exit status of a worker that cannot work on this host (missing GPU stack):
# it is not restarted.
EXIT_MISCONFIGURED = 3


class WorkerProcesses:
    def __init__(self, devices: list[int], redis_url: str, flags: list[str]) -> None:
        """`flags`: settings.worker_flags() of the starting program. The Redis
        URL (it may hold a password) goes by environment, not on the command
        line, which any local user can read (ps, /proc/*/cmdline)."""
        self._devices = devices
        self._base = [sys.executable, "-m", "plancache_server.worker_main", *flags]
        self._env = {**os.environ, "PLANCACHE_REDIS_URL": redis_url}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._restarts: dict[int, int] = {}
        self._started: dict[int, float] = {}
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    def start(self) -> None:
        for device in self._devices:
            self._spawn(device)
        self._monitor = threading.Thread(target=self._watch, name="worker-monitor", daemon=True)
        self._monitor.start()

    def _spawn(self, device: int) -> None:
        self._procs[device] = subprocess.Popen(
            [*self._base, "--device", str(device)], stdin=subprocess.DEVNULL, env=self._env
        )
        self._started[device] = time.monotonic()
        log.info("started compile worker for GPU %d (pid %d)", device, self._procs[device].pid)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            for device, proc in list(self._procs.items()):
                code = proc.poll()
                if code is None or self._stop.is_set():
                    continue
                restarts = self._restarts.get(device, 0) if time.monotonic() - self._started[device] < STABLE_S else 0
                if code == EXIT_MISCONFIGURED:
                    log.error("worker for GPU %d cannot run on this host (see its log); not restarting it", device)
                    del self._procs[device]
                    continue
                self._restarts[device] = restarts + 1
                if code == EXIT_GPU_LOST:
                    # Its GPU was lost, or does not answer yet: tried again for as long as it takes
                    # (a reset, a node back), once a minute at the slowest; said once a minute.
                    _faults.warning(
                        "gpu lost",
                        "worker for GPU %d: its GPU is lost or does not answer (see the line before); trying again "
                        "in %d s, and on until it answers",
                        device,
                        min(2**restarts, GPU_RETRY_CAP_S),
                    )
                    delay = min(2**restarts, GPU_RETRY_CAP_S)
                elif restarts >= MAX_RESTARTS:
                    log.error("worker for GPU %d exited with %d; gave up after %d restarts", device, code, restarts)
                    del self._procs[device]
                    continue
                else:
                    log.warning(
                        "worker for GPU %d exited with %d; restarting (%d/%d)", device, code, restarts + 1, MAX_RESTARTS
                    )
                    delay = min(2**restarts, 30)
                if self._stop.wait(delay):
                    return
                self._spawn(device)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout_s
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()

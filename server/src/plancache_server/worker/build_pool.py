"""Build processes: a worker's pool of processes that build plans side by side.

The cuDNN frontend cannot build in threads (its extension holds the GIL and
refuses multithreaded builds), but one process can build a candidate with
`build_plan_at_index(i)` and hand it over serialized. So each GPU worker
starts a few build processes (plancache_server.worker.build_process), each with its
own CUDA context and compiler, and sends them pieces of builds
(plancache_server.worker.build_tasks): a job's heuristic plan, or one
candidate of an autotuning. Timing stays in the worker itself, on its GPU,
one plan at a time.

The protocol is frames on the child's stdin and stdout
(plancache_server.worker.frames); the child's stderr is the worker's log. A
child that dies is noticed when its stdout ends: its task comes back as
`lost` (the worker retries it) and a new child is started in its place. A
child past the build budget is killed, and its task fails with that reason.
Children end when the worker closes their stdin, and with the worker
process itself (PR_SET_PDEATHSIG).

`ThreadBuildPool` runs a thread-safe compiler (the tests' stand-in) on
threads in the worker's own process, with the same interface.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from plancache.log_limits import LogLimiter
from plancache_server.worker.build_tasks import BuildTask, TaskResult, decode_result, encode_task, run_task
from plancache_server.worker.compiler.base import Compiler
from plancache_server.worker.compiler.faults import EXIT_GPU_LOST
from plancache_server.worker.frames import read_frame, write_frame

log = logging.getLogger(__name__)
# Processes dying over and over (a lost GPU, the OOM killer): one line a minute.
_faults = LogLimiter(log)

# The CPU priority (nice) of the build processes past the first.
CANDIDATE_NICE = 10
# A child that fails to start is started again after this long, doubling to the cap.
RESTART_DELAY_S, RESTART_DELAY_CAP_S = 0.5, 30.0
CLOSE_GRACE_S = 5.0


class BuildPool(Protocol):
    @property
    def size(self) -> int: ...

    def free(self, urgent: bool = True) -> int:
        """Tasks that can be submitted now: `urgent` ones (a caller's
        heuristic plan) on any idle process, others on the idle processes
        past the first, which is kept for urgent ones."""
        ...

    def in_flight(self) -> int: ...

    def submit(self, task: BuildTask, urgent: bool = True) -> None:
        """Start `task` on an idle process it may use (only while free(urgent) > 0):
        an urgent one on the first process when it is idle."""
        ...

    def results(self, timeout: float) -> list[TaskResult]:
        """Tasks finished since the last call, waiting up to `timeout` for the first."""
        ...

    def close(self) -> None: ...


# ---- processes ---------------------------------------------------------------------------


def death(code: int) -> str:
    """How a build process ended, as an operator reads it."""
    if code == -signal.SIGKILL:
        return (
            "was killed by SIGKILL (the kernel's out-of-memory killer does this "
            "when the host runs out of memory: see dmesg)"
        )
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code == EXIT_GPU_LOST:
        return "ended: its GPU was lost"
    return f"exited with status {code}"


@dataclass(eq=False)
class _Child:
    slot: int
    proc: subprocess.Popen[bytes]
    ready: bool = False
    task: BuildTask | None = None
    started: float = 0.0  # when its task started
    over_budget: bool = False

    @property
    def name(self) -> str:
        return f"build process {self.slot} (pid {self.proc.pid})"


@dataclass
class _Slot:
    failures: int = 0  # starts that ended before the child was ready, in a row
    restart_at: float = 0.0


class ProcessBuildPool:
    """`size` build processes, each loading `compiler` (load_compiler's name) for `device`."""

    def __init__(
        self,
        size: int,
        compiler: str,
        device: int,
        autotune_strategy: str = "screened",
        *,
        budget_s: float | None = None,
        log_level: str = "INFO",
        env: dict[str, str] | None = None,
    ) -> None:
        self._size = max(1, size)
        self._command = [
            sys.executable,
            "-m",
            "plancache_server.worker.build_process",
            "--compiler",
            compiler,
            "--device",
            str(device),
            "--autotune-strategy",
            autotune_strategy,
            "--log-level",
            log_level,
        ]
        self._env = env
        self._budget_s = budget_s
        self._events: queue.Queue[tuple[_Child, tuple[dict[str, Any], bytes] | None]] = queue.Queue()
        self._children: dict[int, _Child] = {}
        self._slots = [_Slot() for _ in range(self._size)]
        self._closed = False

    @property
    def size(self) -> int:
        return self._size

    def start(self) -> ProcessBuildPool:
        for slot in range(self._size):
            self._spawn(slot)
        return self

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self._children.values()]

    def free(self, urgent: bool = True) -> int:
        return len(self._idle(urgent))

    def in_flight(self) -> int:
        return sum(1 for c in self._children.values() if c.task is not None)

    def _idle(self, urgent: bool) -> list[_Child]:
        """Idle children a task may use, in the order it takes them: an
        urgent task the first process first (it builds what a node would, in
        the order a node would, so its warm state is a node's), another one
        the last first, never the first (when there are others)."""
        idle = sorted((c for c in self._children.values() if c.ready and c.task is None), key=lambda c: c.slot)
        if urgent:
            return idle
        return [c for c in reversed(idle) if c.slot != 0 or self._size == 1]

    def submit(self, task: BuildTask, urgent: bool = True) -> None:
        child = self._idle(urgent)[0]
        child.task, child.started = task, time.monotonic()
        try:
            assert child.proc.stdin is not None
            write_frame(child.proc.stdin, *encode_task(task))
        except OSError as e:  # it died meanwhile: its stdout ends too, and the task comes back as lost
            log.warning("%s: could not send task %d: %s", child.name, task.task_id, e)

    def results(self, timeout: float) -> list[TaskResult]:
        self._restart_due()
        self._enforce_budget()
        finished: list[TaskResult] = []
        try:
            event = self._events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return finished
        while True:
            result = self._on_event(*event)
            if result is not None:
                finished.append(result)
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return finished

    def close(self) -> None:
        """Ask every child to end (its stdin closes); kill those still there after a grace."""
        self._closed = True
        for child in self._children.values():
            try:
                if child.proc.stdin is not None:
                    child.proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + CLOSE_GRACE_S
        for child in self._children.values():
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait(timeout=5)
        self._children.clear()

    # ---- inside --------------------------------------------------------------------------

    def _spawn(self, slot: int) -> None:
        # Past the first, build processes run at a lower CPU priority: on a
        # busy host the first one's heuristic plans (and the nodes) go first.
        nice = ["--nice", str(CANDIDATE_NICE)] if slot and self._size > 1 else []
        proc = subprocess.Popen(
            [*self._command, *nice],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env=self._env,
            bufsize=0,
        )
        child = _Child(slot, proc)
        self._children[slot] = child
        threading.Thread(target=self._read, args=(child,), name=f"build-process-{slot}-reader", daemon=True).start()

    def _read(self, child: _Child) -> None:
        assert child.proc.stdout is not None
        try:
            while True:
                frame = read_frame(child.proc.stdout)
                self._events.put((child, frame))
                if frame is None:
                    return
        except (OSError, ValueError) as e:
            log.error("%s: unreadable answer (%s); ending it", child.name, e)
            child.proc.kill()
            self._events.put((child, None))

    def _on_event(self, child: _Child, frame: tuple[dict[str, Any], bytes] | None) -> TaskResult | None:
        if self._children.get(child.slot) is not child:
            return None  # a child already replaced
        if frame is None:
            return self._died(child)
        header, payload = frame
        if header.get("ready"):
            child.ready = True
            self._slots[child.slot].failures = 0
            log.info("%s ready", child.name)
            return None
        task = child.task
        if task is None or header.get("task") != task.task_id:
            log.error("%s answered task %s, not the one it was given; ending it", child.name, header.get("task"))
            child.proc.kill()
            return None
        child.task = None
        return decode_result(task, header, payload, child.name)

    def _died(self, child: _Child) -> TaskResult | None:
        code = child.proc.wait()
        del self._children[child.slot]
        slot = self._slots[child.slot]
        if self._closed:
            return None
        if child.ready:
            slot.failures, slot.restart_at = 0, 0.0
        else:
            slot.failures += 1
            slot.restart_at = time.monotonic() + min(RESTART_DELAY_S * 2 ** (slot.failures - 1), RESTART_DELAY_CAP_S)
        _faults.warning(
            "ended", "%s %s%s; starting another", child.name, death(code), "" if child.ready else " before it was ready"
        )
        self._restart_due()
        task = child.task
        if task is None:
            return None
        if child.over_budget:
            return TaskResult(
                task,
                error=f"the build ran past its time budget of {self._budget_s:g} s (--build-budget)",
                rejected=True,
                worker=child.name,
            )
        return TaskResult(task, error=f"{child.name} {death(code)} building it", lost=True, worker=child.name)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for index, slot in enumerate(self._slots):
            if index not in self._children and not self._closed and now >= slot.restart_at:
                self._spawn(index)

    def _enforce_budget(self) -> None:
        if self._budget_s is None:
            return
        now = time.monotonic()
        for child in self._children.values():
            if child.task is not None and not child.over_budget and now - child.started > self._budget_s:
                log.error(
                    "%s: task %d ran past the build budget (%g s); ending the process",
                    child.name,
                    child.task.task_id,
                    self._budget_s,
                )
                child.over_budget = True
                child.proc.kill()


# ---- threads (a thread-safe compiler, in this process) -----------------------------------


@dataclass
class ThreadBuildPool:
    """`size` threads running a thread-safe compiler's pieces (the tests'
    stand-in sleeps in them); the cuDNN compiler needs ProcessBuildPool."""

    compiler: Compiler
    pool_size: int = 4
    _tasks: queue.Queue[BuildTask | None] = field(default_factory=queue.Queue)
    _done: queue.Queue[TaskResult] = field(default_factory=queue.Queue)
    _running: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)
    on_task: Callable[[BuildTask], None] = lambda task: None  # tests watch what runs

    def __post_init__(self) -> None:
        if not getattr(self.compiler, "thread_safe", False):
            raise ValueError(f"{type(self.compiler).__name__} cannot build on threads: use ProcessBuildPool")
        for n in range(self.pool_size):
            thread = threading.Thread(target=self._serve, name=f"build-thread-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def size(self) -> int:
        return self.pool_size

    def free(self, urgent: bool = True) -> int:
        with self._lock:
            kept = 0 if urgent or self.pool_size == 1 else 1
            return max(0, self.pool_size - kept - self._running)

    def in_flight(self) -> int:
        with self._lock:
            return self._running

    def submit(self, task: BuildTask, urgent: bool = True) -> None:
        with self._lock:
            self._running += 1
        self._tasks.put(task)

    def results(self, timeout: float) -> list[TaskResult]:
        finished = []
        try:
            finished.append(self._done.get(timeout=max(0.0, timeout)))
            while True:
                finished.append(self._done.get_nowait())
        except queue.Empty:
            pass
        with self._lock:
            self._running -= len(finished)
        return finished

    def close(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join(timeout=CLOSE_GRACE_S)

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            self.on_task(task)
            self._done.put(run_task(self.compiler, task))


def default_pool_size(gpus: int, cores: int | None = None) -> int:
    """Build processes per GPU worker: the host's cores shared among its
    GPUs' workers, one core left to each worker itself, at most 8 (on an
    H200, 8 processes built a large matmul's candidates 3.9-5.2x faster than
    one; each holds a CUDA context)."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, min(8, cores // max(1, gpus) - 1))

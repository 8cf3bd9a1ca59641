"""The kept threads a hedged miss's Compile waits on (plancache.transport.hedge.WaitingCalls): each call runs at
once on a thread that is kept for the next (no thread started per miss, the ~0.4 ms gRPC's future() cost), nothing
ever queues behind a busy thread, and a process may exit while one waits."""

from __future__ import annotations

import threading
import time

from plancache.transport.hedge import WaitingCalls


def run_and_wait(pool: WaitingCalls, work: threading.Event | None = None) -> str:
    ran: list[str] = []
    done = threading.Event()

    def job() -> None:
        ran.append(threading.current_thread().name)
        if work is not None:
            work.wait(10)
        done.set()

    assert pool.submit(job)
    assert done.wait(10)
    return ran[0]


class WaitingCall:
    """A call that waits until `release` is set (a Compile waiting for the service's build); each start is counted
    on `started`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)

    def __call__(self) -> None:
        self.started.release()
        self.release.wait(10)


def test_calls_one_after_another_run_on_one_kept_daemon_thread() -> None:
    pool = WaitingCalls(4)
    names = set()
    for _ in range(20):
        names.add(run_and_wait(pool))
        deadline = time.monotonic() + 10
        while pool._idle < 1:  # the thread counts itself idle again just after its work
            assert time.monotonic() < deadline
            time.sleep(0.001)
    assert names == {"plancache-race-wait"}
    threads = [t for t in threading.enumerate() if t.name == "plancache-race-wait"]
    assert threads and all(t.daemon for t in threads)
    assert pool._threads == 2  # for twenty calls: the thread of the first, and the spare it started


def test_the_next_miss_finds_a_spare_thread_while_the_last_ones_call_still_waits() -> None:
    """A program compiling one graph at a time whose previous miss's call still waits: its next miss hands the
    call over to a spare, started by a kept thread, never by the caller (GPU run 41: 0.3-0.8 ms each)."""
    pool = WaitingCalls(8)
    starters: list[str] = []
    start_thread = pool._start_thread

    def recorded_start() -> None:
        starters.append(threading.current_thread().name)
        start_thread()

    pool._start_thread = recorded_start  # type: ignore[method-assign]
    waiting_call = WaitingCall()
    try:
        for _ in range(5):
            assert pool.submit(waiting_call)
            assert waiting_call.started.acquire(timeout=10)
            deadline = time.monotonic() + 10
            while pool._idle < 1:  # the spare is counted in before the caller's next miss (tens of ms later)
                assert time.monotonic() < deadline
                time.sleep(0.001)
    finally:
        waiting_call.release.set()
    caller = threading.current_thread().name
    assert starters.count(caller) == 1, "after the first miss, the caller never started a thread itself"
    assert pool._threads == 6  # five calls waiting at once, and one spare


def test_calls_in_flight_at_once_each_get_a_thread_and_none_queues_behind_a_busy_one() -> None:
    pool = WaitingCalls(3)
    waiting_call = WaitingCall()
    try:
        for _ in range(3):
            assert pool.submit(waiting_call)
        for _ in range(3):  # all three running at once, not one after another
            assert waiting_call.started.acquire(timeout=10)
        assert not pool.submit(waiting_call), "a fourth would wait behind a busy thread: refused, the caller goes on"
    finally:
        waiting_call.release.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not pool.submit(lambda: None):
        time.sleep(0.01)  # once one is idle again, it takes work
    assert pool._threads == 3


def test_a_failing_call_does_not_lose_its_thread() -> None:
    pool = WaitingCalls(1)

    def broken() -> None:
        raise RuntimeError("a bug in a race")

    assert pool.submit(broken)
    deadline = time.monotonic() + 10
    while not pool.submit(lambda: None):  # the one thread comes back
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_forked_child_makes_its_own_kept_threads() -> None:
    """A forked child has none of its parent's threads: its races must not hand work to a pool whose threads
    exist only in the parent (the work would never run and each miss would wait out its deadline)."""
    import os
    import warnings

    from plancache.transport import hedge

    parent = hedge.waiting_calls.get()
    run_and_wait(parent)
    with warnings.catch_warnings():  # Python 3.12+ warns of fork() in a process with threads: that is the case here
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its pool is its own and runs work
        try:
            child = hedge.waiting_calls.get()
            ok = child is not parent and run_and_wait(child) == "plancache-race-wait"
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert hedge.waiting_calls.get() is parent

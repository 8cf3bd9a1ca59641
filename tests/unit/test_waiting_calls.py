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
    assert pool._threads == 1  # one thread started for twenty calls


def test_calls_in_flight_at_once_each_get_a_thread_and_none_queues_behind_a_busy_one() -> None:
    pool = WaitingCalls(3)
    release = threading.Event()
    started = threading.Semaphore(0)

    def waiting_call() -> None:
        started.release()
        release.wait(10)

    try:
        for _ in range(3):
            assert pool.submit(waiting_call)
        for _ in range(3):  # all three running at once, not one after another
            assert started.acquire(timeout=10)
        assert not pool.submit(waiting_call), "a fourth would wait behind a busy thread: refused, the caller goes on"
    finally:
        release.set()
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

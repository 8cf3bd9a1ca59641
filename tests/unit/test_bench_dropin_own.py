"""bench/dropin_own.py's stand-in build holds the interpreter as the cuDNN frontend's build does (its bindings never
release it): another thread makes next to no progress while it runs, where a Python loop lets one in every 5 ms."""

from __future__ import annotations

import threading
import time

from bench.dropin_own import _held_for


def test_the_stand_in_build_lets_no_other_thread_run_and_lasts_about_as_asked() -> None:
    counted = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            counted[0] += 1

    hold = _held_for(200.0)
    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    try:
        before = counted[0]
        time.sleep(0.1)  # the counter alone: its pace
        pace = (counted[0] - before) / 0.1
        before, begun = counted[0], time.perf_counter()
        hold()
        took, during = time.perf_counter() - begun, counted[0] - before
    finally:
        stop.set()
        counter.join()
    assert 0.1 < took < 1.0
    # A Python loop hands the interpreter over every 5 ms (about half the time to the counter); held, the counter
    # runs only at the call's two edges (a switch interval each, ~10 ms of the 200).
    assert during < 0.2 * pace * took, f"the counter ran {during} times in {took:.3f} s (its pace {pace:.0f}/s)"

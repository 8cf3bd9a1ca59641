"""Fair shares on a gateway (plancache_server.gateway.shares): what one caller may hold, who a caller
is, and turns granted round robin over callers, whatever the number of steps each one has waiting."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from plancache.errors import ResourceExhausted
from plancache_server.gateway.shares import FairTurns, ShareLimits, Shares, caller_id


def test_a_caller_past_its_share_is_refused_with_a_retry_delay_and_no_other_caller_is() -> None:
    shares = Shares(ShareLimits(builds=2, retry_delay_s=0.5))
    shares.take("flood", "builds")
    shares.take("flood", "builds")
    with pytest.raises(ResourceExhausted, match="its share: 2, --caller-builds") as refused:
        shares.take("flood", "builds")
    assert refused.value.retry_after == 0.5
    shares.take("honest", "builds")  # another caller's share is its own
    shares.give_back("flood", "builds")
    shares.take("flood", "builds")  # room again once one ended
    assert shares.holding("flood").builds == 2 and shares.refused_total == 1


def test_a_caller_holding_nothing_is_forgotten() -> None:
    shares = Shares()
    with shares.holding_for("a", "streams"):
        assert shares.callers() == 1
    assert shares.callers() == 0


def test_a_call_outside_any_caller_is_not_charged() -> None:
    shares = Shares(ShareLimits(waiters=0))
    shares.take("", "waiters")  # e.g. the gateway's own work: never refused


@pytest.mark.parametrize(
    ("token", "peer", "open_service", "expected"),
    [
        ("abc", "ipv4:10.0.0.7:51234", False, "abc@10.0.0.7"),  # a fleet's token: one caller per host
        ("abc", "ipv6:[::1]:51234", False, "abc@[::1]"),
        ("", "ipv4:10.0.0.7:51234", True, "peer:ipv4:10.0.0.7:51234"),  # open: per connection
        ("abc", "unix:/run/plancache.sock", False, "abc@unix:/run/plancache.sock"),
    ],
)
def test_who_a_caller_is(token: str, peer: str, open_service: bool, expected: str) -> None:
    assert caller_id(token, peer, open_service) == expected


def test_turns_go_round_robin_over_callers_not_in_order_of_arrival() -> None:
    async def scenario() -> list[str]:
        turns = FairTurns(1)
        order: list[str] = []
        gate = asyncio.Event()

        async def step(caller: str) -> None:
            async with turns.turn(caller):
                order.append(caller)
                if caller == "first":
                    await gate.wait()

        first = asyncio.create_task(step("first"))
        await asyncio.sleep(0)
        # A flood of ten steps queues before one honest step.
        tasks = [asyncio.create_task(step("flood")) for _ in range(10)] + [asyncio.create_task(step("honest"))]
        await asyncio.sleep(0)
        assert turns.waiting() == 11
        gate.set()
        await asyncio.gather(first, *tasks)
        return order

    order = asyncio.run(scenario())
    assert order[:3] == ["first", "flood", "honest"]  # the honest step waited one flood step, not ten
    assert order.count("flood") == 10


def test_at_most_the_slots_run_at_once_and_a_cancelled_wait_passes_its_turn_on() -> None:
    async def scenario() -> tuple[int, list[str]]:
        turns = FairTurns(2)
        running = peak = 0
        done: list[str] = []
        release = asyncio.Event()

        async def step(caller: str) -> None:
            nonlocal running, peak
            async with turns.turn(caller):
                running += 1
                peak = max(peak, running)
                await release.wait()
                running -= 1
                done.append(caller)

        tasks = {name: asyncio.create_task(step(name)) for name in ("a", "b", "c", "d")}
        await asyncio.sleep(0.01)
        tasks["c"].cancel()  # waiting: it gives up its place
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        return peak, done

    peak, done = asyncio.run(scenario())
    assert peak == 2 and sorted(done) == ["a", "b", "d"]


def test_a_callers_builds_past_its_queue_slots_wait_in_order_and_others_are_not_held() -> None:
    """--caller-queued: at most so many of one caller's builds in the shared (first in, first out) build
    queue; its next ones wait for one of its own to leave it, in the order they came; another caller's build
    takes a slot of its own at once."""
    from plancache_server.gateway.shares import QueueSlots

    async def run() -> None:
        slots = QueueSlots(2)
        await slots.acquire("flood", 5, 0.5)
        await slots.acquire("flood", 5, 0.5)
        order: list[int] = []

        async def later(i: int) -> None:
            await slots.acquire("flood", 5, 0.5)
            order.append(i)

        waiting = [asyncio.create_task(later(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        assert slots.waiting("flood") == 3 and slots.held("flood") == 2 and not order
        slots.release("flood")
        await asyncio.sleep(0.01)
        assert order == [0] and slots.held("flood") == 2  # the slot passed to the next, in order
        waiting[1].cancel()  # a build whose callers left gives up its place
        await asyncio.sleep(0.01)
        slots.release("flood")
        await asyncio.sleep(0.01)
        assert order == [0, 2] and slots.waiting() == 0
        await asyncio.wait_for(slots.acquire("honest", 5, 0.5), 0.1)  # its own slot, at once
        for _ in range(3):
            slots.release("flood")
        slots.release("honest")
        assert slots.held("flood") == 0 and slots.held("honest") == 0
        slots.release("flood")  # more releases than slots: nothing goes negative
        assert slots.held("flood") == 0

    asyncio.run(run())


def test_the_queue_slots_are_divided_among_the_callers_that_hold_them() -> None:
    """A caller alone may hold all of --caller-queued; when others have builds queued, each caller's share
    is the slots divided among them (at least one), and a build past its caller's share goes in only when
    no other caller's build is in the queue: an honest miss queues behind none of the flooder's that came
    after it. When the others leave, the flooder's waiting builds take the slots again."""
    from plancache_server.gateway.shares import QueueSlots

    async def run() -> None:
        now = [0.0]
        slots = QueueSlots(4, recent_s=10, clock=lambda: now[0])
        for _ in range(4):
            await asyncio.wait_for(slots.acquire("flood", 5, 0.5), 0.1)  # alone: all four
        granted: list[int] = []

        async def later(i: int) -> None:
            await slots.acquire("flood", 5, 0.5)
            granted.append(i)

        waiting = [asyncio.create_task(later(i)) for i in range(4)]
        for caller in ("honest-1", "honest-2", "honest-3"):
            await asyncio.wait_for(slots.acquire(caller, 5, 0.5), 0.1)  # each its own slot, at once
        assert slots.share("flood") == 1 and slots.share("honest-4") == 1  # 4 slots, 4 callers (5 with a new one)
        for _ in range(4):  # the worker takes the flooder's four builds
            slots.release("flood")
        await asyncio.sleep(0.01)
        assert slots.held("flood") == 0 and granted == []  # the honest builds are in the queue: its next waits
        await asyncio.wait_for(slots.acquire("honest-4", 5, 0.5), 0.1)  # a new honest miss goes in at once
        for caller in ("honest-1", "honest-2", "honest-3", "honest-4"):  # the worker takes the honest builds
            slots.release(caller)
        await asyncio.sleep(0.01)
        assert granted == [0] and slots.held("flood") == 1  # the queue free of others': its share, one
        now[0] += 11  # the others gone for longer: the worker takes the flooder's build, its share widens
        slots.release("flood")
        await asyncio.sleep(0.01)
        assert granted == [0, 1, 2, 3] and slots.held("flood") == 3 and slots.waiting() == 0
        assert all(w.done() for w in waiting)

    asyncio.run(run())


def test_callers_over_their_share_take_turns_when_the_queue_is_free_of_others() -> None:
    """Two callers with builds waiting past their share (one slot each): each goes in only when the other's
    build has been taken, in turn, never the caller whose build was just taken refilling its slot first."""
    from plancache_server.gateway.shares import QueueSlots

    async def run() -> list[str]:
        slots = QueueSlots(1)
        queued: list[str] = []  # the build queue, first in first out

        async def build(caller: str) -> None:
            await slots.acquire(caller, 5, 0.5)
            queued.append(caller)

        tasks = [asyncio.create_task(build(c)) for c in ("a", "a", "a", "b", "b", "b")]
        await asyncio.sleep(0.01)
        assert queued == ["a", "b"]  # each caller's first build goes in at once, within its share
        taken: list[str] = []
        while len(taken) < 6:
            assert len(queued) == (2 if not taken else 1), queued  # then one past its share at a time
            caller = queued.pop(0)  # the worker takes it
            taken.append(caller)
            slots.release(caller)
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        return taken

    assert asyncio.run(run()) == ["a", "b", "a", "b", "a", "b"]


def test_callers_that_missed_lately_keep_a_flooder_to_its_one_slot() -> None:
    """Fifty honest nodes each miss a graph now and then, their builds in the queue for moments; a flooder
    that holds slots all the time must not take all of them between two honest misses (it did: it was
    mostly alone in the queue, took the 8, and the next honest miss queued behind them)."""
    from plancache_server.gateway.shares import QueueSlots

    async def run() -> None:
        now = [0.0]
        slots = QueueSlots(8, recent_s=10, clock=lambda: now[0])
        for n in range(50):  # each honest miss in and out of the queue within the window
            await slots.acquire(f"honest-{n}", 1, 0.5)
            slots.release(f"honest-{n}")
            now[0] += 0.04
        await slots.acquire("flood", 1, 0.5)
        assert slots.share("flood") == 1 and not slots.try_acquire("flood")  # one slot, while they are recent
        now[0] += 10.5  # nobody else for longer than the window: the queue is the flooder's
        slots.release("flood")
        assert slots.share("flood") == 8 and all(slots.try_acquire("flood") for _ in range(8))

    asyncio.run(run())


def test_a_build_that_waits_past_its_bound_for_a_slot_is_refused_with_the_reason() -> None:
    from plancache_server.gateway.shares import QueueSlots

    async def run() -> None:
        slots = QueueSlots(1)
        await slots.acquire("flood", 5, 0.5)
        started = asyncio.get_running_loop().time()
        with pytest.raises(ResourceExhausted, match="--caller-queued") as refused:
            await slots.acquire("flood", 0.05, 0.25)
        assert refused.value.retry_after == 0.25
        assert asyncio.get_running_loop().time() - started < 1
        assert slots.waiting() == 0 and slots.held("flood") == 1
        await slots.acquire("", 0.01, 0.25)  # no caller (the gateway's own work): never held

    asyncio.run(run())


def test_a_caller_whose_build_never_got_a_queue_turn_is_told_so_not_that_it_builds() -> None:
    """A flight waiting for its caller's slot in the build queue opens at once (its callers wait within their
    own deadlines, holding no turn of the gateway's work); at the deadline they are told why nothing builds."""
    from types import SimpleNamespace

    from plancache.errors import CompileTimeout
    from plancache_server.gateway.flight import Flight, Waiter

    async def run() -> None:
        crew: Any = SimpleNamespace(retry_delay_s=0.75)
        flight = Flight("k" * 64, crew, lambda f: None)
        waiter = Waiter(flight, lambda w: None)
        flight.waiting_for_turn = True
        told = waiter.timeout()
        assert isinstance(told, ResourceExhausted) and "--caller-queued" in told.message
        assert told.retry_after == 0.75
        flight.waiting_for_turn = False
        assert isinstance(waiter.timeout(), CompileTimeout)

    asyncio.run(run())


class _Busy:
    """A LoopLoad stand-in: busy or not, as the test says."""

    def __init__(self, busy: bool) -> None:
        self.busy = busy


def _paced_turns(busy: bool) -> tuple[FairTurns, list[float]]:
    now = [100.0]
    return FairTurns(1, _Busy(busy), clock=lambda: now[0]), now  # type: ignore[arg-type]


async def _step(turns: FairTurns, now: list[float], caller: str, spent: float, paced: bool = True) -> None:
    async with turns.turn(caller, paced):
        now[0] += spent  # the step's time on the loop


def test_on_a_busy_loop_a_callers_steps_are_paced_to_its_share_of_the_callers_seen() -> None:
    """Three callers called lately: a step of 10 ms books the caller's next one 20 ms later (its third of the
    loop); the other callers' steps are not held by it."""
    turns, now = _paced_turns(busy=True)
    for caller in ("flood", "honest-1", "honest-2"):
        turns.seen(caller)

    async def scenario() -> None:
        await _step(turns, now, "flood", 0.010)
        assert turns.paced_s == 0
        await _step(turns, now, "honest-1", 0.001)  # another caller: not held by the flooder's booking
        assert turns.paced_s == 0
        await _step(turns, now, "flood", 0.010)
        assert turns.paced_s == pytest.approx(0.019)  # 20 ms after its step ended, 1 ms of it gone meanwhile

    asyncio.run(scenario())


def test_a_callers_concurrent_steps_each_wait_for_the_booking_of_the_one_before() -> None:
    """A flooder's steps come from many calls at once: one at a time, each after the booking the one before
    made (without it, every waiting step read the same booking and all ran at once when it came)."""
    turns, now = _paced_turns(busy=True)
    turns.seen("flood"), turns.seen("honest")

    async def scenario() -> None:
        await asyncio.gather(*(_step(turns, now, "flood", 0.010) for _ in range(4)))

    asyncio.run(scenario())
    assert turns.paced_s == pytest.approx(0.030)  # two callers: the 2nd, 3rd and 4th waited 10 ms each


def test_steps_waiting_count_toward_the_horizon(monkeypatch: pytest.MonkeyPatch) -> None:
    from plancache_server.gateway import shares

    monkeypatch.setattr(shares, "PACE_HORIZON_S", 0.5)
    turns, now = _paced_turns(busy=True)
    for n in range(11):
        turns.seen(f"caller-{n}")

    async def scenario() -> list[Any]:
        await _step(turns, now, "caller-0", 0.02)  # books 0.2 s ahead; its steps cost 0.02 s
        return await asyncio.gather(*(_step(turns, now, "caller-0", 0.02) for _ in range(10)), return_exceptions=True)

    outcomes = asyncio.run(scenario())
    # 0.2 s booked, then 0.2 s more for each step already waiting: the third waiting one would start 0.6 s ahead
    assert [isinstance(o, ResourceExhausted) for o in outcomes] == [False] * 3 + [True] * 7


def test_a_long_call_keeps_its_caller_among_those_sharing_the_loop() -> None:
    """A Prefetch stream is one call: its steps keep its caller counted (it called once, seconds ago)."""
    turns, now = _paced_turns(busy=True)
    turns.seen("flood"), turns.seen("honest")

    async def scenario() -> None:
        for _ in range(3):
            now[0] += 2.0  # each step long after the call began
            turns.seen("honest")
            await _step(turns, now, "flood", 0.010)

    asyncio.run(scenario())
    assert turns.paced_s == 0  # 2 s between its steps: each booking long past
    assert turns.active() == 2


def test_an_idle_loop_or_a_caller_alone_is_not_paced() -> None:
    idle, now = _paced_turns(busy=False)
    idle.seen("flood"), idle.seen("honest")
    alone, alone_now = _paced_turns(busy=True)
    alone.seen("flood")

    async def scenario() -> None:
        for _ in range(3):
            await _step(idle, now, "flood", 0.010)
            await _step(alone, alone_now, "flood", 0.010)

    asyncio.run(scenario())
    assert idle.paced_s == 0 and alone.paced_s == 0


def test_with_nothing_to_share_a_caller_uses_every_slot_at_once() -> None:
    """Pacing runs a caller's steps one at a time only while it has others to share a busy loop with."""
    turns = FairTurns(2, _Busy(False))  # type: ignore[arg-type]
    turns.seen("flood"), turns.seen("honest")
    inside: list[int] = []

    async def scenario() -> None:
        both = asyncio.Event()

        async def step() -> None:
            async with turns.turn("flood"):
                inside.append(1)
                if len(inside) == 2:
                    both.set()
                await asyncio.wait_for(both.wait(), 1)

        await asyncio.gather(step(), step())

    asyncio.run(scenario())
    assert len(inside) == 2


def test_finishing_what_was_built_is_not_paced_and_a_quiet_caller_starts_afresh() -> None:
    turns, now = _paced_turns(busy=True)
    turns.seen("flood"), turns.seen("honest")

    async def scenario() -> None:
        await _step(turns, now, "flood", 0.010)
        await _step(turns, now, "flood", 0.001, paced=False)  # a built plan handed to its stream
        assert turns.paced_s == 0
        now[0] += 2.0  # a second and more without a call: no longer counted, its booking forgotten
        turns.seen("flood")
        await _step(turns, now, "flood", 0.010)
        assert turns.paced_s == 0 and turns.active() == 1

    asyncio.run(scenario())


def test_steps_booked_past_the_horizon_are_refused_with_the_wait() -> None:
    """A flooder's thousands of steps are told, not held: past PACE_HORIZON_S booked, RESOURCE_EXHAUSTED."""
    turns, now = _paced_turns(busy=True)
    for n in range(11):
        turns.seen(f"caller-{n}")

    async def scenario() -> None:
        await _step(turns, now, "caller-0", 1.0)  # books its next step 10 s ahead (1/11 of the loop)
        with pytest.raises(ResourceExhausted, match=r"paced to 1/11 of a busy loop, --busy-loop-share") as refused:
            await _step(turns, now, "caller-0", 0.001)
        assert refused.value.retry_after == pytest.approx(10.0 - 5.0)
        await _step(turns, now, "caller-1", 0.001)  # the others are served

    asyncio.run(scenario())


def test_the_loops_load_is_the_share_of_the_time_its_thread_is_runnable() -> None:
    """Busy while the loop's thread always has work (on a CPU or waiting for one: a loaded host's CI run read
    a starved loop as idle by its CPU time alone), not while it waits for work."""
    import time

    from plancache_server.gateway.loop_load import LoopLoad

    async def scenario() -> tuple[bool, bool, bool]:
        load = LoopLoad(busy_share=0.5).start()
        await asyncio.sleep(0.3)
        idle = load.busy
        ends = time.monotonic() + 0.5
        while time.monotonic() < ends:  # short steps, the loop's thread never waiting for work
            busy_until = time.monotonic() + 0.002
            while time.monotonic() < busy_until:
                pass
            await asyncio.sleep(0)
        busy = load.busy
        await asyncio.sleep(0.8)
        after = load.busy
        await load.stop()
        return idle, busy, after

    assert asyncio.run(scenario()) == (False, True, False)
    assert not LoopLoad(busy_share=0).busy  # 0: never busy, never paced


def test_the_runnable_time_is_read_from_schedstat_where_linux_has_it() -> None:
    import time

    from plancache_server.gateway.loop_load import runnable_seconds

    read = runnable_seconds()
    before, on_cpu_before, started = read(), time.thread_time(), time.monotonic()
    while time.monotonic() - started < 0.1:
        pass
    runnable, on_cpu = read() - before, time.thread_time() - on_cpu_before
    # At least the time the kernel saw it on a CPU: a virtual machine's stolen time is in neither clock (CI's
    # 2-core machine once had 33 ms of the 100 stolen), and schedstat's running total may lag one tick (10 ms at
    # HZ=100) behind the thread clock, which is brought up to date when read.
    assert on_cpu > 0.02
    assert runnable >= on_cpu - 0.012
    assert read is not time.thread_time or not Path("/proc/self/schedstat").exists()

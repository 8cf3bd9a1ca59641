"""Large requests on a gateway (issue 44, item 1): their shape walked before they are parsed
(plancache_server.gateway.wire), and the walk and the parse done in the CPU threads with each caller
holding one thread at a time (plancache_server.gateway.offload). Before, a flooder's 21 large Prefetch
requests were walked on the event loop: ~0.8 s in which no other caller was answered (py-spy, bench/flood.py)."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time

import pytest

from plancache.errors import InvalidRequest, ResourceExhausted, SpecError
from plancache.graphspec.validation import Limits
from plancache.keys.query import PlanQuery
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway import wire
from plancache_server.gateway.offload import CpuOffload
from plancache_server.gateway.shares import CALLER
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET

LIMITS = wire.WireLimits(Limits(), max_prefetch_refs=10_000, max_prefetch_bytes=16 * 2**20)


def prefetch(refs: int, tensors_per_spec: int = 0) -> bytes:
    specs = []
    for i in range(refs):
        query = PlanQuery.of(matmul_spec(m=64 + i, name=f"walk-{i}"), STANDIN_TARGET).to_proto()
        for extra in range(tensors_per_spec):
            query.spec.tensors.add(uid=1000 + extra, dim=[1], stride=[1], name=f"t{extra}")
        specs.append(pb.PlanRef(query=query))
    return pb.PrefetchRequest(refs=specs, compile_missing=True).SerializeToString()


def test_a_large_valid_request_passes_the_walk_and_a_small_one_is_not_walked() -> None:
    raw = prefetch(400)
    assert len(raw) > wire.SMALL_REQUEST_BYTES and wire.needs_walk("Prefetch", raw)
    wire.check("Prefetch", raw, LIMITS)
    assert not wire.needs_walk("Prefetch", prefetch(2))
    assert not wire.needs_walk("GetPlan", raw)  # no specs in it: bounded by size alone
    with pytest.raises(ResourceExhausted, match="a GetPlan request takes at most 65,536 bytes"):
        wire.check("GetPlan", raw, LIMITS)


def test_the_walk_refuses_too_many_tensors_naming_where() -> None:
    too_many = LIMITS.spec.max_tensors + 1
    raw = prefetch(200, tensors_per_spec=too_many)
    with pytest.raises(SpecError, match=r"request\.PlanRef\[0\]\.PlanQuery\[0\]\.GraphSpec\[0\]: more than "):
        wire.check("Prefetch", raw, LIMITS)


def test_the_walk_refuses_too_many_refs_and_too_many_entries() -> None:
    tight = wire.WireLimits(Limits(), max_prefetch_refs=100, max_prefetch_bytes=16 * 2**20)
    with pytest.raises(ResourceExhausted, match="at most 100 plan refs"):
        wire.check("Prefetch", prefetch(400), tight)
    keys = pb.PrefetchRequest(refs=[pb.PlanRef(key=f"k{i}") for i in range(wire.MAX_ENTRIES + 1)])
    many = wire.WireLimits(Limits(), max_prefetch_refs=10**9, max_prefetch_bytes=64 * 2**20)
    with pytest.raises(ResourceExhausted, match="more than 250,000 tensors, nodes and refs"):
        wire.check("Prefetch", keys.SerializeToString(), many)


def test_damaged_requests_are_refused_as_malformed_never_with_another_error() -> None:
    raw = bytearray(prefetch(600))
    rng = random.Random(44)
    refused = 0
    for _ in range(300):
        damaged = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        cut = bytes(damaged[: rng.randrange(wire.SMALL_REQUEST_BYTES + 1, len(damaged) + 1)])
        try:
            wire.check("Prefetch", cut, LIMITS)
        except (InvalidRequest, SpecError, ResourceExhausted):
            refused += 1
    assert refused > 0  # truncations and flipped headers are found; an IndexError would have escaped above
    with pytest.raises(InvalidRequest, match=r"runs past its end|is truncated|bad varint"):
        wire.check("Prefetch", bytes(raw[:-3]), LIMITS)


def test_each_caller_holds_one_cpu_thread_and_another_caller_goes_beside_it() -> None:
    async def scenario() -> tuple[int, float, list[str]]:
        offload = CpuOffload(threads=2, large_bytes=1)
        running = {"flood": 0, "honest": 0}
        peak = {"flood": 0}
        order: list[str] = []
        lock = threading.Lock()

        def work(caller: str, seconds: float) -> None:
            with lock:
                running[caller] += 1
                if caller == "flood":
                    peak["flood"] = max(peak["flood"], running["flood"])
            time.sleep(seconds)
            with lock:
                running[caller] -= 1
                order.append(caller)

        async def call(caller: str, seconds: float) -> float:
            CALLER.set(caller)  # as the guard sets it for each call (a task's own context)
            started = time.perf_counter()
            await offload.run_off_loop(1, work, caller, seconds)
            return time.perf_counter() - started

        floods = [asyncio.create_task(call("flood", 0.05)) for _ in range(10)]
        await asyncio.sleep(0.01)
        honest = await call("honest", 0.01)
        await asyncio.gather(*floods)
        offload.close()
        return peak["flood"], honest, order

    peak, honest_s, order = asyncio.run(scenario())
    assert peak == 1  # the flooder's ten never held both threads
    assert order.index("honest") < 3  # the honest call went beside the flood, not behind its ten
    assert honest_s < 0.25  # ten flood tasks in a row would be 0.5 s


def test_a_caller_with_too_many_large_requests_waiting_is_refused_with_a_retry_delay() -> None:
    async def scenario() -> tuple[ResourceExhausted, int]:
        offload = CpuOffload(threads=1, large_bytes=1, waiting_per_caller=3, retry_delay_s=0.5)
        release = threading.Event()
        CALLER.set("flood")
        held = [asyncio.create_task(offload.run_off_loop(1, release.wait, 5)) for _ in range(4)]
        await asyncio.sleep(0.05)  # one in the pool, three waiting
        with pytest.raises(ResourceExhausted, match="3 large requests") as refused:
            await offload.run_off_loop(1, time.sleep, 0)
        CALLER.set("honest")
        waiting_of_honest = offload.waiting("honest")
        release.set()
        await asyncio.gather(*held)
        offload.close()
        return refused.value, waiting_of_honest

    refused, honest_waiting = asyncio.run(scenario())
    assert refused.retry_after == 0.5 and honest_waiting == 0


def test_a_caller_whose_waiting_requests_hold_too_many_bytes_is_refused_and_others_are_not() -> None:
    async def scenario() -> tuple[ResourceExhausted, int]:
        offload = CpuOffload(threads=2, large_bytes=1, waiting_bytes_per_caller=100, retry_delay_s=0.5)
        release = threading.Event()
        CALLER.set("flood")
        running = asyncio.create_task(offload.run_off_loop(1000, release.wait, 5))  # in the pool: not counted
        await asyncio.sleep(0.02)
        waiting = [asyncio.create_task(offload.run_off_loop(40, time.sleep, 0)) for _ in range(2)]  # 80 bytes
        await asyncio.sleep(0.02)
        with pytest.raises(ResourceExhausted, match="80 bytes") as refused:
            await offload.run_off_loop(40, time.sleep, 0)
        CALLER.set("honest")
        honest = await asyncio.wait_for(offload.run_off_loop(90, len, b"abc"), 2)  # its own bound, its own turn
        release.set()
        await asyncio.gather(running, *waiting)
        offload.close()
        return refused.value, honest

    refused, honest = asyncio.run(scenario())
    assert refused.retry_after == 0.5 and honest == 3


def test_a_cancelled_wait_passes_the_callers_turn_on() -> None:
    async def scenario() -> bool:
        offload = CpuOffload(threads=1, large_bytes=1)
        CALLER.set("a")
        release = threading.Event()
        first = asyncio.create_task(offload.run_off_loop(1, release.wait, 5))
        await asyncio.sleep(0.02)
        second = asyncio.create_task(offload.run_off_loop(1, time.sleep, 0))
        third = asyncio.create_task(offload.run_off_loop(1, time.sleep, 0))
        await asyncio.sleep(0.02)
        second.cancel()
        release.set()
        await first
        await asyncio.wait_for(third, 2)  # not stuck behind the cancelled one
        offload.close()
        return offload.waiting("a") == 0

    assert asyncio.run(scenario())


def test_work_outside_any_call_is_not_gated() -> None:
    async def scenario() -> int:
        offload = CpuOffload(threads=2, large_bytes=1, waiting_per_caller=0)
        results = await asyncio.gather(*(offload.run_off_loop(1, pow, 2, i) for i in range(5)))
        offload.close()
        return sum(results)

    assert asyncio.run(scenario()) == 31


def test_a_plans_check_takes_no_turn_and_is_never_refused() -> None:
    """A node reading many large plans at once: each check goes to the pool beside the caller's gated work,
    never waiting for its turn, never refused (a hit is not refused for its own caller's load either)."""

    async def scenario() -> list[int]:
        offload = CpuOffload(threads=2, large_bytes=1, waiting_per_caller=1)
        CALLER.set("node")
        release = threading.Event()
        gated = asyncio.create_task(offload.run_off_loop(1, release.wait, 5))  # the caller's turn, held
        await asyncio.sleep(0.02)
        checks = await asyncio.wait_for(asyncio.gather(*(offload.run_ungated(10, len, b"x" * i) for i in range(5))), 2)
        release.set()
        await gated
        offload.close()
        return list(checks)

    assert asyncio.run(scenario()) == [0, 1, 2, 3, 4]


class _BusyLoop:
    """A LoopLoad stand-in that always says the event loop is busy."""

    busy = True


def _walked_by(caller: str, calls: int, parse_s: float) -> tuple[float, list[float], list[object]]:
    """`calls` large Prefetch requests of `caller` at once, through the guard's parse, on a busy loop shared
    with one other caller; each parse takes at least `parse_s` in its thread. Returns the seconds the caller's
    walks were paced, when each parse began, and each call's request (or the error it ended with)."""
    from plancache_server.gateway.guard import parse
    from plancache_server.gateway.shares import Shares

    raw = prefetch(400)

    async def scenario() -> tuple[float, list[float], list[object]]:
        shares = Shares(load=_BusyLoop())  # type: ignore[arg-type]
        offload = CpuOffload(threads=2)
        began: list[float] = []

        def slow_parser(data: bytes) -> pb.PrefetchRequest:
            began.append(time.monotonic())
            time.sleep(parse_s)  # in a CPU thread, as a walk holding the GIL would be
            return pb.PrefetchRequest.FromString(data)

        async def call() -> pb.PrefetchRequest:
            CALLER.set(caller)
            shares.seen(caller)
            return await parse("Prefetch", raw, slow_parser, offload, LIMITS, shares)

        shares.seen("honest")
        results = await asyncio.gather(*(call() for _ in range(calls)), return_exceptions=True)
        offload.close()
        return shares.turns.paced_s, began, list(results)

    return asyncio.run(scenario())


def test_a_large_requests_walk_is_a_step_of_its_caller_paced_on_a_busy_loop() -> None:
    """The walk and parse hold the GIL the loop needs: on a busy loop shared with another caller, each of a
    flooder's large requests waits out the booking its previous one made (its time x the others)."""
    paced_s, began, results = _walked_by("flood", calls=3, parse_s=0.05)
    assert all(isinstance(r, pb.PrefetchRequest) and len(r.refs) == 400 for r in results)
    assert paced_s >= 2 * 0.05 * 0.9  # the 2nd and 3rd each waited at least the walk before them
    gaps = [b - a for a, b in itertools.pairwise(began)]
    assert min(gaps) >= 2 * 0.05 * 0.9  # a walk (>= 50 ms), then the booking it made (>= 50 ms)


def test_a_callers_walks_booked_past_the_horizon_are_refused_with_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from plancache_server.gateway import shares

    monkeypatch.setattr(shares, "PACE_HORIZON_S", 0.02)
    _, began, results = _walked_by("flood", calls=4, parse_s=0.05)
    refused = [r for r in results if isinstance(r, ResourceExhausted)]
    assert refused and all("share of the gateway's time" in r.message for r in refused)
    assert all(r.retry_after is not None and r.retry_after > 0 for r in refused)
    assert len(began) == len(results) - len(refused)  # a refused request was never walked

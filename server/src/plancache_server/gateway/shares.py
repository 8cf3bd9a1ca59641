"""Fair shares: what one caller may hold on a gateway at once.

A caller is its bearer token and the host it calls from (a token shared by
a fleet is as many callers as the fleet has hosts; one host flooding with
it is one caller); on an open service (no tokens file) it is the
connection it calls on (host and port: a client's channel). Per caller the
gateway bounds:

- streams: Prefetch streams open at once;
- refs: plan refs of those streams not answered yet;
- waiters: callers' waits for builds (a Compile that waits, a Prefetch ref
  with compile_missing);
- builds: builds this caller queued that have not ended here.

Past a bound the call (or, in a Prefetch, the ref) is answered
RESOURCE_EXHAUSTED with a retry delay, at once, before anything is queued;
no other caller's share changes.

The build queue is one stream per target, first in first out, shared by
every caller: a caller's builds wait there behind all those queued before
them. So of its builds, at most its share of `queued` (`--caller-queued`,
8) wait in the queue at once, not yet taken by a worker (QueueSlots): the 8
divided among the callers that have builds there or had within the last
10 s (a caller alone: 8; with 50 honest callers missing now and then: 1),
at least 1. Its next ones wait here, each a coroutine, in order, for one
of its own to be taken (the worker announces it:
plancache_server.store.build_records.mark_running) and for the queue to
hold no other caller's build (waiting callers in turn), at most the compile
timeout (then RESOURCE_EXHAUSTED, the reason said). A flooding caller's 64
builds used to go before an honest caller's next miss; then 8 of them did,
and with a fixed 8 the flooder took every build the others did not, so the
queue stayed full and an honest miss waited ~1 s behind it on the 2-core
flood benchmark; then as many as the callers share; now a caller's builds
past its share go in when no one else's wait. A caller alone still has
every free build process (those taken do not count). A hit holds nothing: it is never refused
for another caller's load. What one share allows is a setting
(`--caller-*`); the gateway-wide bounds (--max-waiters, --max-queued-jobs)
still hold above them.

Holdings bound memory and Redis work; the event loop's time is shared by
*turns* (FairTurns): the CPU-heavy steps of a call (checking and hashing a
spec, a lookup that misses and the build it starts, a Prefetch ref, a
built plan handed to a stream, a large request's walk in a CPU thread,
which holds the GIL the loop needs) run at most `--work-slots` at once, granted
to the callers waiting for one in turn, round robin: a caller with a
thousand calls under way gets one turn when a caller with one gets one. A
stored plan served from the gateway's memory takes no turn: a flood never
stands between a node and a hit.

Turns alone divide the loop among the callers that want turns; hits take
none, so a flooder with turns to take had every one while fifty nodes
read stored plans, and took ~58 % of the loop from their hits
(bench/flood.py: their reads halved, 1,800 -> 760 a second, the gateway's
CPU the same). So while the loop is busy (plancache_server.gateway.
loop_load: `--busy-loop-share`), each turn's time is charged to its
caller: a turn of d seconds puts the caller's next turn d x (N - 1)
seconds later, N the callers that called in the last second (hits too),
so a caller's turns take at most its 1/N of the loop. Pacing waits within
the call's deadline; past PACE_HORIZON_S of them the step is refused
RESOURCE_EXHAUSTED with the time to wait (a flooder's thousands of refs
are told, not held). A plan asked for by key (a lookup: a hit when stored)
and finishing what was built (a plan handed to a stream) are not paced.
With the loop not busy, nothing is paced: a caller alone uses all of it.

The caller of a call is set by the guard (plancache_server.gateway.guard)
in a context variable, so that the services deep below it (Builds.join,
the Prefetch stream) charge the right share without passing it along.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from plancache.errors import ResourceExhausted
from plancache_server import telemetry
from plancache_server.gateway.loop_load import LoopLoad

# Seconds a caller whose builds left the build queue still counts among those sharing it (QueueSlots).
RECENT_CALLER_S = 10.0
# Seconds after its last call a caller still counts among those sharing the event loop (FairTurns' pacing).
ACTIVE_CALLER_S = 1.0
# How far ahead a caller's paced turns may be booked before a new step is refused (RESOURCE_EXHAUSTED).
PACE_HORIZON_S = 5.0
PACE_SMOOTHING = 0.2  # the weight of a step in its caller's smoothed step time
# Who the current call is (set per call by the guard; "" outside a call: not charged).
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("plancache_caller", default="")


@dataclass(frozen=True)
class ShareLimits:
    streams: int = 64
    refs: int = 50_000
    waiters: int = 1_000
    builds: int = 64
    retry_delay_s: float = 1.0
    work_slots: int = 1
    queued: int = 8


@dataclass
class Holding:
    """What one caller holds now."""

    streams: int = 0
    refs: int = 0
    waiters: int = 0
    builds: int = 0
    refused: int = 0  # calls and refs refused for this share, since the caller's holding began

    def empty(self) -> bool:
        return not (self.streams or self.refs or self.waiters or self.builds)


@dataclass
class Shares:
    limits: ShareLimits = field(default_factory=ShareLimits)
    load: LoopLoad | None = None  # how busy the loop is (None: turns are never paced)
    _held: dict[str, Holding] = field(default_factory=dict)
    refused_total: int = 0
    turns: FairTurns = field(init=False)
    queue_slots: QueueSlots = field(init=False)

    def __post_init__(self) -> None:
        self.turns = FairTurns(self.limits.work_slots, self.load, retry_delay_s=self.limits.retry_delay_s)
        self.queue_slots = QueueSlots(self.limits.queued)

    def turn(self, caller: str | None = None, paced: bool = True) -> AbstractAsyncContextManager[None]:
        """One CPU-heavy step of the current call (or of `caller`), in its turn; `paced`: new work, paced to
        the caller's share of a busy loop (False: finishing what was built)."""
        return self.turns.turn(CALLER.get() if caller is None else caller, paced)

    def seen(self, caller: str) -> None:
        """A call of `caller` began (the guard: every call, hits too): it shares the loop for a while."""
        self.turns.seen(caller)

    def holding(self, caller: str) -> Holding:
        return self._held.get(caller) or Holding()

    def callers(self) -> int:
        return len(self._held)

    def take(self, caller: str, what: str, amount: int = 1) -> None:
        """Charge `amount` of `what` (streams, refs, waiters, builds) to `caller`'s share, or refuse it
        (ResourceExhausted with the retry delay) when that would pass its bound. No caller: not charged."""
        if not caller or amount <= 0:
            return
        held = self._held.setdefault(caller, Holding())
        bound = getattr(self.limits, what)
        now = getattr(held, what)
        if now + amount > bound:
            held.refused += 1
            self.refused_total += 1
            telemetry.CALLER_REFUSALS.labels(what).inc()
            if held.empty():
                del self._held[caller]
            raise ResourceExhausted(
                f"this caller already holds {now:,} {_NAMES[what]} on this gateway (its share: {bound:,}, "
                f"--caller-{what}); {amount:,} more refused: call again later",
                retry_after=self.limits.retry_delay_s,
            )
        setattr(held, what, now + amount)

    def give_back(self, caller: str, what: str, amount: int = 1) -> None:
        if not caller or amount <= 0:
            return
        held = self._held.get(caller)
        if held is None:
            return
        setattr(held, what, max(0, getattr(held, what) - amount))
        if held.empty():
            del self._held[caller]

    @contextmanager
    def holding_for(self, caller: str, what: str, amount: int = 1) -> Iterator[None]:
        self.take(caller, what, amount)
        try:
            yield
        finally:
            self.give_back(caller, what, amount)


class RecentCallers:
    """Callers seen within the last `window_s` seconds, oldest first: who shares the loop (FairTurns) or the
    build queue (QueueSlots). Runs on the event loop's thread: no lock."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self.window_s = window_s
        self._clock = clock
        self._last: OrderedDict[str, float] = OrderedDict()  # caller -> when last seen, oldest first

    def see(self, caller: str) -> None:
        self._last[caller] = self._clock()
        self._last.move_to_end(caller)

    def __contains__(self, caller: object) -> bool:
        return caller in self._last

    def __len__(self) -> int:
        return len(self._last)

    def forget_gone(self, still_here: Callable[[str], bool] = lambda _caller: False) -> list[str]:
        """Forget the callers last seen more than window_s ago, except those `still_here` says are (seen
        again now); returns those forgotten."""
        now, gone = self._clock(), []
        while self._last:
            caller, last = next(iter(self._last.items()))
            if now - last <= self.window_s:
                break
            if still_here(caller):
                self.see(caller)
                continue
            del self._last[caller]
            gone.append(caller)
        return gone


@dataclass
class _Pace:
    """One caller's pacing: when its next step may start, what its steps cost, and its steps waiting."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one paced step of a caller at a time
    not_before: float = 0.0
    step_s: float = 0.0  # its steps' time, smoothed
    queued: int = 0  # its paced steps waiting for the lock

    def idle(self, now: float) -> bool:
        return not self.lock.locked() and not self.queued and self.not_before <= now


class FairTurns:
    """At most `slots` steps at once, granted to waiting callers in turn (round robin over callers, first
    come first served within one); while `load` says the loop is busy, a caller's steps paced to its share
    of the loop (module doc). Runs on the event loop's thread: no lock."""

    def __init__(
        self,
        slots: int,
        load: LoopLoad | None = None,
        clock: Callable[[], float] = time.monotonic,
        retry_delay_s: float = 1.0,
    ) -> None:
        self.slots = max(1, slots)
        self.load = load
        self._clock = clock
        self._retry_delay_s = retry_delay_s
        self._free = self.slots
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._active = RecentCallers(ACTIVE_CALLER_S, clock)  # callers whose latest call began within it
        self._paces: dict[str, _Pace] = {}  # callers with a booking or paced steps under way
        self.paced_s = 0.0  # seconds steps waited for their callers' share (a counter: /metrics)

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def seen(self, caller: str) -> None:
        if not caller:
            return
        self._active.see(caller)
        self._forget_inactive()

    def active(self) -> int:
        """Callers that called within the last ACTIVE_CALLER_S."""
        self._forget_inactive()
        return len(self._active)

    def _forget_inactive(self) -> None:
        for caller in self._active.forget_gone():
            pace = self._paces.get(caller)
            if pace is not None and not pace.lock.locked() and not pace.queued:
                del self._paces[caller]  # a caller gone quiet starts afresh

    @asynccontextmanager
    async def turn(self, caller: str, paced: bool = True) -> AsyncIterator[None]:
        if not paced or not caller or self.load is None:
            async with self._turn(caller):
                yield
            return
        self.seen(caller)  # a caller taking steps shares the loop (a long Prefetch stream calls once)
        pace = self._paces.get(caller)
        if pace is None:
            pace = self._paces[caller] = _Pace()
        if pace.idle(self._clock()) and not (self.load.busy and self.active() > 1):
            # Nothing booked, no one to share with: as many steps at once as slots (--work-slots).
            async with self._turn(caller) as spent:
                yield
            self._charge(caller, pace, spent[0])
            if self._paces.get(caller) is pace and pace.idle(self._clock()):
                del self._paces[caller]
            return
        self._refuse_past_horizon(pace)
        pace.queued += 1
        entered = False
        try:
            async with pace.lock:  # its steps one at a time: each sees the booking the one before it made
                pace.queued -= 1
                entered = True
                wait = pace.not_before - self._clock()
                if wait > 0:
                    self.paced_s += wait
                    await asyncio.sleep(wait)
                async with self._turn(caller) as spent:
                    yield
                self._charge(caller, pace, spent[0])
        finally:
            if not entered:  # cancelled (its call ended) while its caller's steps before it ran
                pace.queued -= 1
            if self._paces.get(caller) is pace and pace.idle(self._clock()):
                del self._paces[caller]

    @asynccontextmanager
    async def _turn(self, caller: str) -> AsyncIterator[list[float]]:
        """A slot, in the caller's turn; yields a list the step's time is put in once it ends."""
        await self._acquire(caller)
        spent = [0.0]
        started = self._clock()
        try:
            yield spent
        finally:
            self._release()
            spent[0] = self._clock() - started

    def _refuse_past_horizon(self, pace: _Pace) -> None:
        """Refuse a new step whose caller's booking, with its steps already waiting, reaches past the horizon."""
        if self.load is None or not self.load.busy:
            return
        others = self.active() - 1
        wait = pace.not_before - self._clock() + pace.queued * pace.step_s * max(0, others)
        if wait > PACE_HORIZON_S:
            telemetry.CALLER_REFUSALS.labels("loop").inc()
            raise ResourceExhausted(
                f"this caller's share of the gateway's time is taken for the next {wait:.1f} s (its steps are "
                f"paced to 1/{others + 1} of a busy loop, --busy-loop-share): call again later",
                retry_after=max(self._retry_delay_s, wait - PACE_HORIZON_S),
            )

    def _charge(self, caller: str, pace: _Pace, spent: float) -> None:
        """A step of `spent` seconds: while the loop is busy and others call, the caller's next step waits
        spent x (the others) (its 1/N of the loop)."""
        pace.step_s = spent if not pace.step_s else pace.step_s + PACE_SMOOTHING * (spent - pace.step_s)
        if self.load is None or not self.load.busy:
            return
        others = self.active() - 1
        if others <= 0:
            return
        now = self._clock()
        pace.not_before = max(now, pace.not_before) + spent * others

    async def _acquire(self, caller: str) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(caller, deque()).append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release()  # granted as it was cancelled: pass the turn on
            else:
                _drop_waiting(self._waiting, caller, granted)
            raise

    def _release(self) -> None:
        while self._waiting:
            caller, queue = self._waiting.popitem(last=False)  # the caller whose turn it is
            granted = queue.popleft()
            if queue:
                self._waiting[caller] = queue  # its next step waits for its next turn, after the others
            if not granted.done():
                granted.set_result(None)
                return
        self._free += 1


class QueueSlots:
    """Per caller, at most its share of `per_caller` builds in the shared build queue at once (module doc:
    `per_caller` divided among the callers with builds there now or within the last `recent_s` seconds, at
    least one); a caller's next build waits for one of its own to end, first come first served. No caller
    (""): not bounded. Runs on the event loop's thread: no lock.

    Why "within the last seconds": counted only while they held a slot, fifty honest nodes missing one graph
    every two seconds were each in the queue for a few milliseconds, so the flooder was mostly alone in it,
    took all the slots, and the next honest miss queued behind them (bench/flood.py: honest misses ~280 ms
    during the flood against ~70 idle). A caller is remembered for `recent_s` after its last build left.

    A build that had to wait for a slot (its caller had its share in the queue already) goes in only while
    no other caller's build is in the queue, waiting callers in turn: a caller's builds past its share use
    the worker when no one else needs it (a first build always goes in at once, within the share). With
    one slot the flooder still refilled it the moment its build was taken, ahead of honest misses arriving
    next, and kept the one build process ~100 % busy, so honest misses queued behind one another."""

    def __init__(
        self, per_caller: int, recent_s: float = RECENT_CALLER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_caller = max(1, per_caller)
        self.recent_s = recent_s
        self._clock = clock
        self._held: dict[str, int] = {}
        self._total = 0  # sum of _held
        # Callers with builds waiting for a slot (in the order their turns come), each its builds in order.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        # Every caller holding slots, and those that held one within recent_s.
        self._sharing = RecentCallers(recent_s, clock)

    def share(self, caller: str) -> int:
        """The slots `caller` may hold now: `per_caller` divided among the callers sharing the queue (holding
        slots, or lately), itself counted, at least one."""
        sharing = len(self._sharing) + (caller not in self._sharing)
        return max(1, self.per_caller // sharing)

    def _seen(self, caller: str) -> None:
        self._sharing.see(caller)

    def _forget_gone(self) -> bool:
        """Callers holding nothing, last seen more than recent_s ago, no longer share; True: some left."""
        return bool(self._sharing.forget_gone(still_here=lambda caller: caller in self._held))

    def held(self, caller: str) -> int:
        return self._held.get(caller, 0)

    def waiting(self, caller: str | None = None) -> int:
        if caller is not None:
            return len(self._waiting.get(caller, ()))
        return sum(len(q) for q in self._waiting.values())

    def try_acquire(self, caller: str) -> bool:
        """One of `caller`'s slots if one is free now and none of its builds waits for one."""
        if not caller:
            return True
        self._forget_gone()
        if self._held.get(caller, 0) < self.share(caller) and not self._waiting.get(caller):
            self._held[caller] = self._held.get(caller, 0) + 1
            self._total += 1
            self._seen(caller)
            return True
        return False

    async def acquire(self, caller: str, wait_s: float, retry_delay_s: float) -> None:
        """One of `caller`'s slots, waiting at most `wait_s` for it (then ResourceExhausted)."""
        if self.try_acquire(caller):
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(caller, deque()).append(granted)
        try:
            await asyncio.wait_for(asyncio.shield(granted), wait_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            if granted.done() and not granted.cancelled():
                self.release(caller)  # granted as it gave up: the slot goes to its next build
            else:
                granted.cancel()
                _drop_waiting(self._waiting, caller, granted)
            if isinstance(e, TimeoutError):
                raise ResourceExhausted(
                    f"this build waited {wait_s:g} s for a place in the build queue: its caller has "
                    f"{self.held(caller)} builds there (its share of --caller-queued {self.per_caller}, divided "
                    f"among the {len(self._sharing)} callers with builds there now or in the last "
                    f"{self.recent_s:g} s), and a build past a caller's share goes in only while no other "
                    "caller's build is there: call again later",
                    retry_after=retry_delay_s,
                ) from None
            raise

    def release(self, caller: str) -> None:
        """One of `caller`'s builds left the queue (taken by a worker, or given up). Builds waiting for a
        slot go in, callers in turn (this caller's after the others'), each as its share allows and only
        while no other caller's build is in the queue (class doc)."""
        if not caller or caller not in self._held:
            return
        self._seen(caller)
        self._forget_gone()
        self._held[caller] -= 1
        self._total -= 1
        if self._held[caller] <= 0:
            del self._held[caller]
        if caller in self._waiting:  # its next turn comes after the other waiting callers'
            self._waiting[caller] = self._waiting.pop(caller)
        self._grant_waiting()

    def _others_queued(self, caller: str) -> bool:
        return self._total - self._held.get(caller, 0) > 0

    def _pass_on(self, caller: str) -> bool:
        """A slot to `caller`'s next waiting build; False: none waits."""
        queue = self._waiting.get(caller)
        while queue:
            granted = queue.popleft()
            if not queue:
                del self._waiting[caller]
            if not granted.done():
                granted.set_result(None)
                return True
        return False

    def _grant_waiting(self) -> None:
        """Waiting builds into the queue: callers in order, each up to its share while no other caller's
        build is there."""
        for caller in list(self._waiting):
            while (
                self._held.get(caller, 0) < self.share(caller)
                and not self._others_queued(caller)
                and self._pass_on(caller)
            ):
                self._held[caller] = self._held.get(caller, 0) + 1
                self._total += 1
                self._seen(caller)


def _drop_waiting(
    waiting: MutableMapping[str, deque[asyncio.Future[None]]], caller: str, granted: asyncio.Future[None]
) -> None:
    """A wait given up: out of its caller's line (and the caller out of the map once its line is empty)."""
    queue = waiting.get(caller)
    if queue is None:
        return
    try:
        queue.remove(granted)
    except ValueError:
        pass
    if not queue:
        del waiting[caller]


_NAMES = {
    "streams": "Prefetch streams",
    "refs": "plan refs in Prefetch streams",
    "waiters": "waits for builds",
    "builds": "builds it queued that have not ended",
}


def caller_id(token_id: str, peer: str, open_service: bool) -> str:
    """Who a call is (module doc): "<token id>@<host>", or on an open service "peer:<host:port>"."""
    if open_service:
        return f"peer:{peer}"
    return f"{token_id}@{_host(peer)}"


def _host(peer: str) -> str:
    """The host of a gRPC peer ("ipv4:10.0.0.1:5000", "ipv6:[::1]:5000", "unix:/path")."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[: rest.find("]") + 1]
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer

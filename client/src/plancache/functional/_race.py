"""A geometry's plan against torch's own function, once: the faster runs the geometry from then on.

plancache promises that a node is never slower with it than without it. A
plan is the fastest cuDNN engine for its graph, but torch's own function
for the same call may still be faster (cuBLAS's matmuls, a call so small
that plancache's host time is most of it), and a user would then be better
off without plancache for that call. So a served geometry is raced: at its
first call RACE_AFTER_S or more after its first (the program's start-up
runs the plans and pays no race), with that call's result computed, both
are timed on the call's own tensors: each run back to back, the device
synchronized at each round's ends (what a program pays for a call: its
host time or its GPU time, whichever is longer), rounds alternating,
medians. With autograd each run is the forward and its backward (the
gradients taken apart: `.grad` is not touched), and of each round the
host's time (until its last run was issued); then each arm's time on the
device alone (its runs queued behind a sleeping kernel, timed by events:
a round where the host is the longer hides it). A served layer's call
(plancache.torch.serve) pays its key and the table's lookup before the
plan runs, and torch's function without them once the layer goes back to
its own forward: its plan's runs pay that lookup in the race too (LOOKUP).
Torch's function keeps the geometry unless the plan is faster by more than
MARGIN, both a call and with each arm's host and device times added (the
plan's extra host time no more than what it saves a call: Verdict.torch_wins;
on GPU run 52's H100, ResNet-50 inference's plans won their races by 0-2 µs
a call and the served step, bound by the host, was 1.09-1.17x torch's; on
run 54's, a GPT-2 linear whose plan ran 1.6 % faster a call in its race and
10 % slower on the device kept the plan, and the eager step was 1.15x): its
entry is a Fallback whose reason says so, with the
figures (`geometries()`); the service's plan is kept either way. A compiled
call is raced at once, as it is traced (plancache.torch: RACE_NOW).

A call whose function writes its arguments or draws random numbers (batch
norm's running statistics, attention's dropout) is not raced: running it
again would change the program. Nor is a call while a CUDA graph is being
captured (no synchronizing then: the race waits for a call outside it).
`PLANCACHE_RACE_TORCH=0` or `set_race_torch(False)` turns it off (every
geometry a plan serves runs its plan, as before).

What it costs, once a geometry: two runs of each, then ROUNDS rounds of
each of about ROUND_S and ROUNDS device timings of each, each behind a
sleep of twice its issue time (ten milliseconds or so), and the first call of torch's
own function (its own heuristics, which a program without plancache pays
in its first step). A failure of the race keeps the plan (logged once).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from plancache.env import env_bool
from plancache.errors import InvalidRequest
from plancache.functional import _tensor_ops

log = logging.getLogger("plancache.functional")

RACE_ENV = "PLANCACHE_RACE_TORCH"
ROUNDS = 3
ROUND_S = 0.0005  # each arm's round: enough runs of a small call to average its launches; one of a large call
MAX_RUNS = 64  # runs a round, at most (a round's two synchronizations are then a small share of it)
# The plan takes the geometry only where it is faster than torch's function by more than this share: within it
# the two are the same to the race's precision, and torch's function, what the program runs without plancache,
# keeps it (never slower than without plancache: a tie the race called for the plan could be a loss in the step).
MARGIN = 0.03
TORCH_FASTER = "torch's function is faster here (raced against the plan)"

# A geometry is raced at its first call this long after its first: a program's start-up (its first steps, a
# first node's builds) runs the plans and pays no race; the verdict comes from calls past it.
RACE_AFTER_S = 1.0

clock: Callable[[], float] = time.perf_counter  # a test's clock replaces it
monotonic: Callable[[], float] = time.monotonic  # when a race is due (a test's replaces it)


class _RaceNow(threading.local):
    """Set while plancache.torch races a traced call: the geometry is raced at once (not RACE_AFTER_S later)."""

    on = False


RACE_NOW = _RaceNow()


class _Lookup(threading.local):
    """Set by plancache.torch while a served layer's call runs a Racing entry: the call's own way to the entry
    (its key and the table's lookup), which the race's plan arm pays on every run. torch's arm does not: a layer
    whose calls torch runs goes back to its own forward (plancache.torch._serve). Unset (plancache.functional's
    own calls), both arms would pay the same lookup, and neither does in the race."""

    call: Callable[[], Any] | None = None
    # A served layer's own call and its class's forward, each on the call's input: what a race without
    # autograd times (the layer's whole served call against what the layer costs once it goes back).
    arms: tuple[Callable[[], Any], Callable[[], Any]] | None = None


LOOKUP = _Lookup()


@dataclass(frozen=True)
class Verdict:
    """Seconds a call, medians: the plan's and torch's (a round's runs, synchronized at its ends), and of those
    the host's (until the last run was issued); `torch_wins` unless the plan is faster past MARGIN."""

    plan_s: float
    torch_s: float
    plan_host_s: float = 0.0
    torch_host_s: float = 0.0
    # A run's time on the device alone (runs queued behind a held stream); None where it could not be had.
    plan_device_s: float | None = None
    torch_device_s: float | None = None

    @property
    def torch_wins(self) -> bool:
        """Torch's function keeps the geometry unless the plan is faster by more than MARGIN both a call and with
        each arm's host time added to its device time. A round of runs back to back hides whichever of a call's
        host and GPU time is the shorter, and a program's step may be bound by either: a plan as fast as torch's
        function a call at more host time (GPU run 53's ResNet-50 inference: its convolutions' plans, the served
        step 1.16x torch's) is slower in a step the host bounds; one a little faster a call in a host-bound race
        and slower on the device (run 54's GPT-2 linear) is slower in a step the device bounds. A plan that saves
        GPU time keeps the geometry where it saves more than the host time it adds."""
        keep = 1.0 - MARGIN
        plan_device, torch_device = self.plan_s, self.torch_s  # at most each run's device time
        if self.plan_device_s is not None and self.torch_device_s is not None:
            plan_device, torch_device = self.plan_device_s, self.torch_device_s
        plan_faster_a_call = self.plan_s < self.torch_s * keep
        plan_faster_with_host = plan_device + self.plan_host_s < (torch_device + self.torch_host_s) * keep
        return not (plan_faster_a_call and plan_faster_with_host)

    def describe(self, plan: str = "the plan") -> str:
        times = f"torch {self.torch_s * 1e6:.1f} µs a call, {plan} {self.plan_s * 1e6:.1f} µs"
        if self.plan_host_s or self.torch_host_s:
            times += f" (the host's {self.torch_host_s * 1e6:.1f} and {self.plan_host_s * 1e6:.1f} µs"
            if self.plan_device_s is not None and self.torch_device_s is not None:
                times += f", the device's {self.torch_device_s * 1e6:.1f} and {self.plan_device_s * 1e6:.1f} µs"
            times += ")"
        return times


class RaceSetting:
    def __init__(self) -> None:
        self._enabled: bool | None = None  # None: PLANCACHE_RACE_TORCH, read at the first race

    @property
    def enabled(self) -> bool:
        if self._enabled is None:
            self._enabled = env_bool(RACE_ENV, True)
        return self._enabled

    def set(self, enabled: bool | None) -> None:
        if enabled is not None and not isinstance(enabled, bool):
            raise InvalidRequest(f"set_race_torch: enabled must be True, False or None, got {enabled!r}"[:200])
        self._enabled = enabled


RACE = RaceSetting()


class KeptVerdicts:
    """The verdicts of the races each plan won, by geometry key (`geometries()` says both times for those too:
    a torch-won geometry's entry holds its own). Bounded: the oldest goes past MAX_KEPT (an entry evicted from
    the table and raced again under a new key leaves its verdict behind)."""

    MAX_KEPT = 4096

    def __init__(self) -> None:
        self._verdicts: dict[Hashable, Verdict] = {}
        self._lock = threading.Lock()

    def note(self, key: Hashable, verdict: Verdict) -> None:
        with self._lock:
            self._verdicts.pop(key, None)
            self._verdicts[key] = verdict
            while len(self._verdicts) > self.MAX_KEPT:
                del self._verdicts[next(iter(self._verdicts))]

    def get(self, key: Hashable) -> Verdict | None:
        return self._verdicts.get(key)

    def clear(self) -> None:
        with self._lock:
            self._verdicts.clear()


KEPT = KeptVerdicts()


def race(
    plan: Callable[[tuple[Any, ...]], Any],
    torch: Callable[..., Any],
    tensors: tuple[Any, ...],
    device: int,
    needs_grad: bool,
    result: Any,
) -> Verdict:
    """The plan's entry (`plan(tensors)`) against torch's function (`torch(*tensors)`) on `tensors`; with
    `needs_grad`, each run is the forward and the backward of its result (`result`: the first call's, whose
    shape the incoming gradient takes). Each run of the plan's arm first makes the lookup LOOKUP holds, if any
    (a served layer's way to its entry); without autograd, a served layer's arms (LOOKUP.arms) are raced instead:
    its whole served call against its class's forward."""
    ops = _tensor_ops.ops()
    lookup = LOOKUP.call or _no_lookup
    if needs_grad:
        leaves = ops.leaves(tensors)  # the same storage, no history: the program's graph is not touched
        grad_of_result = ops.random_like(result)

        def plan_run() -> None:
            lookup()
            ops.gradients(plan(leaves), leaves, grad_of_result)

        def torch_run() -> None:
            ops.gradients(torch(*leaves), leaves, grad_of_result)

    elif LOOKUP.arms is not None:
        plan_run, torch_run = LOOKUP.arms
    else:

        def plan_run() -> None:
            lookup()
            plan(tensors)

        def torch_run() -> None:
            torch(*tensors)

    with ops.on_device(device), ops.no_grad_unless(needs_grad):
        # Once each, untimed: torch's first call of a geometry makes its own choices (heuristics, a kernel's
        # load), the plan's backward graphs load at theirs. Then once each, timed: how many runs fill a round.
        for run in (plan_run, torch_run):
            _timed(ops, run, 1, device)
        once = [_timed(ops, run, 1, device) for run in (plan_run, torch_run)]
        runs = max(1, min(MAX_RUNS, int(ROUND_S / max(*once, 1e-9))))
        plan_times: list[tuple[float, float]] = []
        torch_times: list[tuple[float, float]] = []
        for round_ in range(ROUNDS):
            order = ((plan_run, plan_times), (torch_run, torch_times))
            for run, times in order if round_ % 2 == 0 else reversed(order):
                times.append(_timed_host(ops, run, runs, device))
        plan_host = statistics.median(h for _, h in plan_times)
        torch_host = statistics.median(h for _, h in torch_times)
        devices = _device_times(ops, (plan_run, torch_run), runs, device, max(plan_host, torch_host) * runs)
    return Verdict(
        statistics.median(t for t, _ in plan_times),
        statistics.median(t for t, _ in torch_times),
        plan_host,
        torch_host,
        *devices,
    )


def _device_times(
    ops: _tensor_ops.TensorOps,
    arms: tuple[Callable[[], None], Callable[[], None]],
    runs: int,
    device: int,
    issue_s: float,
) -> tuple[float | None, float | None]:
    """Each arm's median time a run on the device alone, ROUNDS measurements alternating; (None, None) where
    the device could not be held long enough for the host to issue a round (twice the issue time, then eight
    times: a run that waits on the device itself is never held)."""
    for hold in (2.0, 8.0):
        times: tuple[list[float], list[float]] = ([], [])
        for round_ in range(ROUNDS):
            for arm in (0, 1) if round_ % 2 == 0 else (1, 0):
                seconds = ops.device_seconds(arms[arm], runs, device, hold * issue_s + 50e-6)
                if seconds is None:
                    break
                times[arm].append(seconds)
            else:
                continue
            break
        else:
            return statistics.median(times[0]), statistics.median(times[1])
    return None, None


def _no_lookup() -> None:
    pass


def _timed(ops: _tensor_ops.TensorOps, run: Callable[[], None], runs: int, device: int) -> float:
    return _timed_host(ops, run, runs, device)[0]


def _timed_host(ops: _tensor_ops.TensorOps, run: Callable[[], None], runs: int, device: int) -> tuple[float, float]:
    """Seconds a run: until the device finished them, and until the host had issued them."""
    ops.synchronize(device)
    start = clock()
    for _ in range(runs):
        run()
    issued = clock()
    ops.synchronize(device)
    return (clock() - start) / runs, (issued - start) / runs

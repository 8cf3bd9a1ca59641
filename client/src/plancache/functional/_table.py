"""The per-process table of geometries and what runs each.

A function's first call of a geometry (shapes, strides, dtypes, device,
options: the key) gets its plan from plancache and leaves a `Served` entry;
a geometry cuDNN does not run leaves a `Fallback` (torch's function). Later
calls are a dict lookup and the entry's call. The table is a bounded LRU.

Why `Served` does not go through `plan.bind()`: a bound call checks each
new tensor's shape, strides, dtype and device, and takes only tensors of the
plan's own geometry, so a linear's 2-D weight would need a [1, k, n] view
made per call. Both cost more than the 20 % of the frontend's execute a
call may add; the geometry key has already proved every one of those
checks, and cuDNN reads addresses only. So a call packs the caller's tensors
by uid and runs the deserialized plan with the thread's handle, on the
current stream, with the shared workspace of that stream (plancache.run.execution,
as a bound plan does).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from plancache.functional import _race, _tensor_ops
from plancache.functional._race import TORCH_FASTER
from plancache.functional._requests import Request
from plancache.run.execution import handle_state, process
from plancache.run.local import LocalPlan
from plancache.run.plan import Plan
from plancache.run.raw_execute import RawExecute

log = logging.getLogger("plancache.functional")

DEFAULT_MAX_GEOMETRIES = 512
# A geometry left to torch because the service could not be reached is asked for again after this.
RETRY_AFTER_S = 60.0

_ident = threading.get_ident


class _LaunchLog(threading.local):
    """The launches of the call plancache.torch's native kernels are learning on this thread (a list of
    `Served.logged` records), None otherwise (plancache.torch.native: what a kept call replays)."""

    launches: list[tuple[Any, ...]] | None = None


LAUNCH_LOG = _LaunchLog()
# Launches run outside Python (plancache.torch.native's kept calls), by function since the last drain: each
# drain's counts are added to COUNTS when the counters are read.
NATIVE_DRAINS: list[Callable[[], dict[str, int]]] = []


def stream_workspace(device: int, stream: int, need: int) -> Any:
    """The workspace of `need` bytes or more that launches on `stream` use (plancache.run's pool: allocated
    outside CUDA graphs' private pools, never freed), for plancache.torch.native's kept calls: the same buffer as
    this module's launches on that stream."""
    return process().workspaces.slot(device, stream, need).buffer


def _version(tensor: Any) -> int:
    """A tensor's version counter; -1 where it keeps none (an inference tensor: torch.inference_mode), which the
    native kernels take as a reason not to keep the call (a write after the launch could not be seen)."""
    is_inference = getattr(tensor, "is_inference", None)  # plancache.functional runs without torch's types too
    if is_inference is None or is_inference():
        return -1
    return int(tensor._version)


def drain_native() -> None:
    for drain in NATIVE_DRAINS:
        for function, launches in drain().items():
            counts(function).cudnn += launches


@dataclass
class Counts:
    """One function's calls: run by a plancache plan, or by torch."""

    cudnn: int = 0
    torch: int = 0
    geometries: int = 0
    torch_geometries: int = 0
    raced: int = 0  # served geometries raced against torch's function (plancache.functional._race)
    reasons: dict[str, int] = field(default_factory=dict)  # why geometries went to torch


COUNTS: dict[str, Counts] = {}


def counts(function: str) -> Counts:
    found = COUNTS.get(function)
    if found is None:
        found = COUNTS.setdefault(function, Counts())
    return found


class Launcher:
    """One plan on one thread's handle for one device: `launcher(buffers)`,
    the buffers in the order of the entry's uids.

    The frontend's ordered execute (`tensor_uids=`: the uids fixed, the
    buffers a tuple) skips the mapping form's Python normalization; a plan
    whose ordered form fails at its first call runs the mapping form. Once
    the first call has run, a plan the backend runs takes its addresses only
    (plancache.run.raw_execute: the geometry key has proved the rest)."""

    __slots__ = (
        "_device",
        "_execute",
        "_graph",
        "_handle",
        "_mode",
        "_need",
        "_on_device",
        "_pool",
        "_raw",
        "_slot",
        "_state",
        "_stream",
        "_stream_of",
        "_uids",
        "_where",
    )

    def __init__(self, plan: Plan, device: int, uids: tuple[int, ...]) -> None:
        ops = _tensor_ops.ops()
        proc = process()
        with ops.on_device(device):
            self._state = handle_state(device)
            self._graph = plan.load(self._state.handle)
        self._execute = self._graph.execute
        self._raw: RawExecute | None = None
        self._handle, self._uids, self._mode = self._state.handle, uids, ""
        self._device, self._need, self._pool = device, plan.metadata.workspace_size, proc.workspaces
        self._stream_of = proc.runtime.stream_getter()
        self._stream = self._stream_of(device)
        self._slot = self._pool.slot(device, self._stream, self._need)
        self._where, self._on_device = ops.current_device(), ops.on_device

    def __call__(self, buffers: tuple[Any, ...]) -> None:
        if self._where() != self._device:  # torch runs a tensor's op on its device whatever is current; so must this
            with self._on_device(self._device):
                self(buffers)
            return
        stream = self._stream_of(self._device)
        if stream != self._stream:
            self._stream, self._slot = stream, self._pool.slot(self._device, stream, self._need)
        if self._state.stream != stream:
            self._state.use(stream)
        if self._raw is not None:
            try:
                self._raw(buffers, self._slot.buffer)
                return
            except TypeError as e:  # a frontend whose private call takes other arguments: refused before any launch
                log.debug("plancache.functional: the frontend's raw-pointer execute refused its call (%s)", e)
                self._raw = None
        if self._mode == "ordered":
            self._execute(buffers, self._slot.buffer, handle=self._handle, tensor_uids=self._uids)
        elif self._mode == "mapping":  # as many buffers as uids, by construction
            self._execute(dict(zip(self._uids, buffers)), self._slot.buffer, handle=self._handle)  # noqa: B905
        else:
            self._first(buffers)

    @property
    def raw(self) -> RawExecute | None:
        return self._raw

    @property
    def workspace_size(self) -> int:
        return int(self._need)

    def _first(self, buffers: tuple[Any, ...]) -> None:
        try:
            self._execute(buffers, self._slot.buffer, handle=self._handle, tensor_uids=self._uids)
            self._mode = "ordered"
            self._raw = RawExecute.of(self._graph, self._uids, self._handle)
        except Exception as e:  # an older frontend, or a plan its ordered form does not take
            log.debug(
                "plancache.functional: the frontend's ordered execute refused a plan (%s: %s); "
                "the mapping form runs it",
                type(e).__name__,
                e,
            )
            self._execute(dict(zip(self._uids, buffers)), self._slot.buffer, handle=self._handle)  # noqa: B905
            self._mode = "mapping"


class Served:
    """A geometry plancache serves: its plan, and how a call binds to it.
    A call returns the function's result (the first output); `outputs()`
    returns every output (a training forward's saved statistics)."""

    __slots__ = (
        "_alloc",
        "_allocs",
        "_constants",
        "_device",
        "_launchers",
        "_uids",
        "counts",
        "plan",
        "request",
        "used",
    )

    def __init__(self, request: Request, plan: Plan, device: int) -> None:
        ops = _tensor_ops.ops()
        self.request, self.plan, self._device, self.used = request, plan, device, 0
        self._allocs = tuple(ops.allocator(o.shape, o.stride, o.dtype, device) for o in request.outputs)
        self._alloc = self._allocs[0]
        self._constants = tuple(ops.constant(c, device) for c in request.constants)
        self._uids = (*request.inputs, *(o.uid for o in request.outputs), *(c.uid for c in request.constants))
        self._launchers: dict[int, Launcher] = {}
        self.counts = counts(request.function)

    @property
    def device(self) -> int:
        return self._device

    def _launcher(self) -> Launcher:
        launcher = self._launchers.get(_ident())
        if launcher is None:
            launcher = self._launchers[_ident()] = Launcher(self.plan, self._device, self._uids)
        return launcher

    def __call__(self, tensors: tuple[Any, ...]) -> Any:
        launcher = self._launchers.get(_ident()) or self._launcher()
        if len(self._allocs) != 1:
            return self.outputs(tensors, launcher)[0]
        out = self._alloc()
        buffers = (*tensors, out, *self._constants)
        launcher(buffers)
        self.counts.cudnn += 1
        if LAUNCH_LOG.launches is not None:
            self.logged(launcher, buffers, len(tensors), 1)
        return out

    def outputs(self, tensors: tuple[Any, ...], launcher: Launcher | None = None) -> tuple[Any, ...]:
        """Every output of the plan (a training forward's saved statistics after the result)."""
        outs = tuple([alloc() for alloc in self._allocs])  # a list comprehension: half a generator's cost
        launcher = launcher or self._launcher()
        buffers = (*tensors, *outs, *self._constants)
        launcher(buffers)
        self.counts.cudnn += 1
        if LAUNCH_LOG.launches is not None:
            self.logged(launcher, buffers, len(tensors), len(outs))
        return outs

    def logged(self, launcher: Launcher, buffers: tuple[Any, ...], inputs: int, outputs: int) -> None:
        """A launch of the call being learned: (run, positions, workspace bytes, function, buffers, how many
        inputs, how many outputs, each buffer's version now, device). No raw form (its first call, a frontend
        without it) or an entry whose behaviour changes with time (a hedged plan awaiting the service's):
        `run` None, and the call is not kept."""
        raw = launcher.raw if type(self) is Served else None
        versions = [_version(b) for b in buffers]
        assert LAUNCH_LOG.launches is not None
        LAUNCH_LOG.launches.append(
            (
                None if raw is None else raw.run,
                () if raw is None else raw.positions,
                launcher.workspace_size,
                self.request.function,
                buffers,
                inputs,
                outputs,
                versions,
                self._device,
            )
        )


class HedgedServed(Served):
    """A geometry whose plan this node built itself (a hedged miss it won):
    each call first looks whether the service's plan has taken over; once it
    has, a plain Served entry of that plan replaces this one in the table
    (so later calls do not look again)."""

    __slots__ = ("key",)

    def __init__(self, request: Request, plan: LocalPlan, device: int, key: Hashable) -> None:
        super().__init__(request, plan, device)
        self.key = key

    def __call__(self, tensors: tuple[Any, ...]) -> Any:
        plan = self.plan
        assert isinstance(plan, LocalPlan)
        if not plan.local:  # the service's plan, verified, is there: it runs from now on
            entry = Served(self.request, plan, self._device)
            TABLE.replace(self.key, self, entry)
            return entry(tensors)
        return super().__call__(tensors)


def served(request: Request, plan: Plan, device: int, key: Hashable) -> Served:
    """The entry that runs `plan` for a geometry (one that watches for the service's plan when this node built it)."""
    return HedgedServed(request, plan, device, key) if isinstance(plan, LocalPlan) else Served(request, plan, device)


class Fallback:
    """A geometry torch runs: `fn(*tensors)`, the call's options bound. One
    left to torch for a reason that may pass (the service unreachable)
    leaves the table when RETRY_AFTER_S has passed: the next call asks again."""

    __slots__ = ("_counts", "_fn", "expires", "function", "key", "reason", "used")

    def __init__(self, function: str, key: Hashable, fn: Callable[..., Any], reason: str, transient: bool) -> None:
        self.function, self.key, self._fn, self.reason, self._counts, self.used = (
            function,
            key,
            fn,
            reason,
            counts(function),
            0,
        )
        self.expires = time.monotonic() + RETRY_AFTER_S if transient else None

    def __call__(self, tensors: tuple[Any, ...]) -> Any:
        return self.run(self._fn, *tensors)

    def taken(self) -> None:
        """A call a torch operator runs itself (plancache.torch): counted and
        expiring as any call of this entry."""
        if self.expires is not None and time.monotonic() > self.expires:
            TABLE.discard(self.key, self)
        self._counts.torch += 1

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in place of the geometry's own call (a call whose torch
        arguments are not all in its tuple of tensors: batch_norm's running
        statistics), counted and expiring as any call of this entry."""
        if self.expires is not None and time.monotonic() > self.expires:
            TABLE.discard(self.key, self)
        result = fn(*args)
        self._counts.torch += 1
        return result


class TorchFaster(Fallback):
    """A geometry plancache serves whose plan torch's function beat in its race (plancache.functional._race):
    torch runs it; `verdict` says both times."""

    __slots__ = ("verdict",)

    def __init__(self, function: str, key: Hashable, fn: Callable[..., Any], verdict: Any) -> None:
        super().__init__(function, key, fn, TORCH_FASTER, transient=False)
        self.verdict = verdict


class Racing:
    """A served geometry whose race against torch's function (plancache.functional._race) is still to run: its
    calls run `inner` (the plan's entry) until RACE_AFTER_S has passed since it was made (or a traced call's
    race asks: RACE_NOW); the first call after (outside a CUDA graph's capture) runs it, races, and leaves the
    winner in the table in its place (`settle(inner, tensors, result)`: `inner` or torch's entry)."""

    __slots__ = ("due", "inner", "key", "settle", "used")

    def __init__(self, inner: Any, key: Hashable, settle: Callable[[Any, tuple[Any, ...], Any], Any]) -> None:
        self.inner, self.key, self.settle, self.used = inner, key, settle, 0
        self.due = _race.monotonic() + _race.RACE_AFTER_S

    def __call__(self, tensors: tuple[Any, ...]) -> Any:
        if (_race.monotonic() < self.due and not _race.RACE_NOW.on) or _tensor_ops.ops().capturing():
            return self.inner(tensors)
        self.due = float("inf")  # once: another thread's call meanwhile runs the plan
        result = self.inner(tensors)
        TABLE.replace(self.key, self, self.settle(self.inner, tensors, result))
        return result


class Entry(Protocol):
    """What runs a geometry: a Served plan, a Differentiable one, torch's Fallback."""

    used: int

    def __call__(self, tensors: tuple[Any, ...]) -> Any: ...


class GeometryTable:
    """geometry key -> entry, least recently used out first past `max_entries`.

    A hit stamps the entry with a tick (one hash of the key per call: an
    OrderedDict's move_to_end would hash it again); the rare put past the
    bound evicts the least recently stamped."""

    def __init__(self, max_entries: int = DEFAULT_MAX_GEOMETRIES) -> None:
        self.max_entries = max_entries
        # Called when an entry leaves or is replaced (plancache.torch's native kernels forget what they kept).
        self.on_change: Callable[[], None] | None = None
        self._entries: dict[Hashable, Entry] = {}
        self._ticks = itertools.count(1)
        self._lock = threading.Lock()
        self.evicted = 0
        # How many times the table was cleared (a new deployment, a test): what was derived from its entries
        # (plancache.torch's verdicts of traced calls) is stale once this changes.
        self.generation = 0

    def get(self, key: Hashable) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.used = next(self._ticks)
        return entry

    def put(self, key: Hashable, entry: Entry) -> None:
        with self._lock:
            entry.used = next(self._ticks)
            replaced = self._entries.get(key) is not None
            self._entries[key] = entry
            if self._evict(self.max_entries) or replaced:
                self._changed()

    def replace(self, key: Hashable, old: Entry, new: Entry) -> None:
        """`new` in place of `old` (unless `old` left meanwhile)."""
        with self._lock:
            if self._entries.get(key) is old:
                new.used = old.used
                self._entries[key] = new
                self._changed()

    def discard(self, key: Hashable, entry: Entry) -> None:
        with self._lock:
            if self._entries.get(key) is entry:
                del self._entries[key]
                self._changed()

    def resize(self, max_entries: int) -> None:
        with self._lock:
            self.max_entries = max_entries
            if self._evict(max_entries):
                self._changed()

    def _evict(self, bound: int) -> bool:
        excess = len(self._entries) - bound
        if excess > 0:
            for key, _ in sorted(self._entries.items(), key=lambda item: item[1].used)[:excess]:
                del self._entries[key]
            self.evicted += excess
        return excess > 0

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.generation += 1
            self._changed()

    def entries(self) -> list[tuple[Hashable, Entry]]:
        """Least recently used first."""
        with self._lock:
            return sorted(self._entries.items(), key=lambda item: item[1].used)

    def __len__(self) -> int:
        return len(self._entries)


TABLE = GeometryTable()

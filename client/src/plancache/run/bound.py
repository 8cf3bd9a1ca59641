"""Plans bound to tensors: the per-call fast path and CUDA-graph replay.

`plan.bind(tensors)` checks every tensor once and returns a `BoundPlan`;
calling it costs what the frontend's own execute costs plus a few attribute
reads: it follows the current torch stream (one raw stream query per call),
uses the shared workspace of that stream, and takes replacement tensors of
identical geometry with identity/tuple checks only.

`plan.capture(tensors)` records one execution into a CUDA graph and returns
a `CapturedPlan`; a call replays it (a few microseconds of host time,
whatever the plan). The graph reads and writes the captured tensors'
memory: write new inputs into `captured.tensors[name]` (for example with
`copy_`), read outputs from there, keep those tensors alive and never resize
them. A replay runs on the current stream; the capture owns a private
workspace, so do not replay the same capture on two streams at once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from plancache.errors import InvalidRequest

if TYPE_CHECKING:
    from plancache.run.execution import HandleState, Replayable, _Process
    from plancache.wire.bindings import TensorTable


class BoundPlan:
    """A plan with its tensors checked and packed; call it to execute.

    `bound()` runs on the bound tensors; `bound({"A": a2})` runs with `a2`
    in place of the bound "A" for this call only (same shape, strides, dtype
    and device, or InvalidRequest). Call it from the thread that bound it:
    cuDNN handles are per thread, so each thread binds its own."""

    __slots__ = (
        "_device",
        "_device_object",
        "_execute",
        "_handle",
        "_need",
        "_pack",
        "_process",
        "_slot",
        "_state",
        "_stream",
        "_stream_of",
        "_table",
        "_thread",
        "tensors",
    )

    def __init__(
        self,
        table: TensorTable,
        graph: Any,
        pack: dict[int, Any],
        tensors: dict[str | int, Any],
        state: HandleState,
        proc: _Process,
        need: int,
    ) -> None:
        self._table = table
        self._pack = pack
        self.tensors = tensors  # as given to bind: the caller's names
        self._state = state
        self._handle = state.handle
        self._device = state.device
        self._device_object = proc.runtime.device_object(state.device)
        self._process = proc
        self._need = need
        self._execute = graph.execute
        self._thread = threading.get_ident()
        self._stream_of = proc.runtime.stream_getter()
        self._stream = self._stream_of(self._device)
        self._slot = proc.workspaces.slot(self._device, self._stream, need)

    def __call__(self, tensors: Mapping[str | int, Any] | None = None) -> None:
        if threading.get_ident() != self._thread:
            raise InvalidRequest(
                f"plan {self._table.plan_key}: bound on another thread; "
                "bind it again on this one (cuDNN handles are per thread)"
            )
        pack = self._pack if tensors is None else self._replaced(tensors)
        stream = self._stream_of(self._device)
        if stream != self._stream:
            self._slot = self._process.workspaces.slot(self._device, stream, self._need)
            self._stream = stream
        state = self._state
        if state.stream != stream:
            state.use(stream)
        self._execute(pack, self._slot.buffer, handle=self._handle)

    def _replaced(self, tensors: Mapping[str | int, Any]) -> dict[int, Any]:
        pack = dict(self._pack)
        table, device = self._table, self._device_object
        for key, value in tensors.items():
            g = table.geometry(key)
            pack[g.uid] = table.quick_check(g, value, device)
        return pack


class CapturedPlan:
    """A plan recorded into a CUDA graph on fixed tensors; call it to replay."""

    __slots__ = ("_graph", "_pack", "_table", "_workspace", "tensors")

    def __init__(
        self, table: TensorTable, graph: Replayable, pack: dict[int, Any], tensors: dict[str | int, Any], workspace: Any
    ) -> None:
        self._table = table
        self._graph = graph
        self._pack = pack
        self._workspace = workspace  # the graph's kernels read this address: keep it alive
        self.tensors = tensors

    def __call__(self, tensors: Mapping[str | int, Any] | None = None) -> None:
        """Replay; `tensors`, if given, must be the captured tensors themselves
        (a check that the caller writes where the graph reads)."""
        if tensors is not None:
            self._check_same(tensors)
        self._graph.replay()

    def _check_same(self, tensors: Mapping[str | int, Any]) -> None:
        for key, value in tensors.items():
            g = self._table.geometry(key)
            captured = self._pack[g.uid]
            if value is captured:
                continue
            if g.pass_by_value:
                raise InvalidRequest(
                    f"plan {self._table.plan_key}: {g.label} is a scalar fixed at capture; capture again to change it"
                )
            self._table.quick_check(g, value, captured.device)  # another geometry, dtype or device: say which
            if value.data_ptr() != captured.data_ptr():
                raise InvalidRequest(
                    f"plan {self._table.plan_key}: {g.label} is not the captured tensor (the graph reads "
                    f"and writes fixed addresses): copy into captured.tensors[{key!r}] or capture again"
                )

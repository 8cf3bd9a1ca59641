"""A deserialized plan executed with its buffers' addresses only.

The frontend's `execute` (even its ordered form, `tensor_uids=`) runs a
Python wrapper on every call: the plan's engine looked up, its backend index
materialized, the binding schema fetched, each buffer read through the
exchange protocol (shape, strides, dtype, device). For a caller that has
already proved every buffer's geometry (plancache.functional's geometry key
holds each tensor's shape, strides, dtype and device), only the addresses
change from call to call, and cuDNN's backend reads nothing else.

The frontend's lowered graph takes exactly that: `_execute_with_raw_ptrs`,
an array of `void*` in the variant pack's order (ascending uid), the
workspace's address and the backend handle; its own execute uses it for the
mapping form. It is private API: `RawExecute.of` takes it only when every
piece it needs is there and the plan is one the backend runs (not a Python
engine, not a graph with planning state of its own), and answers None
otherwise; the caller then keeps the public ordered execute. A frontend
whose private API changed therefore costs the ordered execute's time, never
a wrong launch. `PLANCACHE_RAW_EXECUTE=0` turns it off.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

from plancache.env import env_bool

log = logging.getLogger("plancache.run")

RAW_EXECUTE_ENV = "PLANCACHE_RAW_EXECUTE"


def enabled() -> bool:
    return env_bool(RAW_EXECUTE_ENV, True)


class RawExecute:
    """`raw(buffers, workspace)`: one execution, `buffers` in the caller's uid
    order (the `uids` given to `of`), `workspace` a tensor or None."""

    __slots__ = ("_address", "_array", "_count", "_handle", "_pick", "_run", "positions")

    def __init__(self, run: Any, positions: Sequence[int], backend_handle: int) -> None:
        self._run = run
        self._count = len(positions)
        self._array = (ctypes.c_void_p * self._count)()
        self._address = ctypes.addressof(self._array)
        self._handle = backend_handle
        positions = tuple(positions)
        self.positions = positions  # the pack's order: a position in the caller's buffers for each slot
        # One C call picks every buffer the pack needs, in its order.
        self._pick = (lambda buffers: (buffers[positions[0]],)) if len(positions) == 1 else _itemgetter(positions)

    @classmethod
    def of(cls, graph: Any, uids: Sequence[int], handle: Any) -> RawExecute | None:
        """The raw form of `graph` run with `handle`, or None where it is not to be had."""
        if not enabled():
            return None
        try:
            lowered = getattr(graph, "_lowered_graph", None)
            run = getattr(lowered, "_execute_with_raw_ptrs", None)
            if run is None or getattr(graph, "_plans", None):  # no backend path, or a graph planning on its own
                return None
            if getattr(graph, "selected_engine", None) is not None:  # a Python engine runs this plan
                return None
            order = graph._variant_pack_uids()
            backend_handle = getattr(handle, "backend_handle", None)
            if not order or not isinstance(backend_handle, int):
                return None
            where = {uid: i for i, uid in enumerate(uids)}
            if any(uid not in where for uid in order):  # a slot the caller does not fill: the graph binds it
                return None
            return cls(run, [where[uid] for uid in order], backend_handle)
        except Exception as e:  # private API: anything unexpected keeps the public execute
            log.debug("plancache: the frontend's raw execute is not available (%s: %s)", type(e).__name__, e)
            return None

    @property
    def run(self) -> Any:
        """The frontend's call itself: run(addresses, count, workspace, handle, -1)."""
        return self._run

    def __call__(self, buffers: tuple[Any, ...], workspace: Any) -> None:
        self._array[:] = [b.data_ptr() for b in self._pick(buffers)]
        self._run(self._address, self._count, 0 if workspace is None else workspace.data_ptr(), self._handle, -1)


def _itemgetter(positions: tuple[int, ...]) -> Any:
    import operator

    return operator.itemgetter(*positions)

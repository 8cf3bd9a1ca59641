"""Plan: a serialized cuDNN execution plan with everything needed to run it.

`Plan.execute({"A": a, "B": b, "C": c})` binds tensors by name or uid and
checks each; `plan.bind(...)` checks once for calls at the frontend's own
cost, `plan.capture(...)` replays a CUDA graph (plancache.run.bound). The blob
is deserialized once per thread's handle; workspaces are shared per device
and stream (plancache.run.execution). The blob's sha256 is checked against the
metadata when the plan arrives.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from typing import Any

from plancache.errors import IntegrityError
from plancache.keys.target import Target
from plancache.run.bound import BoundPlan, CapturedPlan
from plancache.run.execution import _Process, handle_state, process
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.bindings import TensorTable

SOURCE_NAMES = {
    pb.COMPILE_SOURCE_HIT: "hit",
    pb.COMPILE_SOURCE_COMPILED: "compiled",
    pb.COMPILE_SOURCE_JOINED: "joined",
    pb.COMPILE_SOURCE_PROVISIONAL: "provisional",
}


class Plan:
    def __init__(
        self, blob: bytes, metadata: pb.PlanMetadata, source: str = "stored", signature: pb.PlanSignature | None = None
    ) -> None:
        digest = hashlib.sha256(blob).hexdigest()
        if digest != metadata.blob_sha256:
            raise IntegrityError(
                f"plan {metadata.key}: blob sha256 {digest} does not match its metadata ({metadata.blob_sha256})"
            )
        self.blob = blob
        self.metadata = metadata
        self.signature = signature if signature is not None and signature.signature else None
        # "hit", "compiled", "joined" (from Compile), "stored" (from GetPlan or a
        # file) or "cache" (from the client's disk cache, no network call).
        self.source = source
        self._graphs: dict[int, Any] = {}  # device -> deserialized graph
        self._lock = threading.Lock()
        self._tables: TensorTable | None = None

    @property
    def key(self) -> str:
        return self.metadata.key

    @property
    def provisional(self) -> bool:
        """cuDNN's heuristic plan, served while the autotuned one is built:
        it runs correctly; asking for the key again later gets the tuned one."""
        return bool(self.metadata.provisional)

    @property
    def target(self) -> Target:
        return Target.from_proto(self.metadata.target)

    def __repr__(self) -> str:
        return (
            f"Plan(key={self.key!r}, plan={self.metadata.plan_name!r}, {len(self.blob)} bytes, source={self.source!r})"
        )

    # ---- files --------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """A self-contained file form: the Plan proto (metadata, blob, signature)."""
        return pb.Plan(metadata=self.metadata, blob=self.blob, signature=self.signature).SerializeToString()

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "stored") -> Plan:
        return cls.from_proto(pb.Plan.FromString(data), source)

    @classmethod
    def from_proto(cls, msg: pb.Plan, source: str = "stored") -> Plan:
        return cls(msg.blob, msg.metadata, source, msg.signature if msg.HasField("signature") else None)

    # ---- execution (needs the [gpu] extra) ----------------------------------

    def load(self, handle: Any = None) -> Any:
        """The deserialized cuDNN graph on the current device (made once).

        Deserialized with `handle` (this thread's by default); every thread
        then executes it with its own handle, so a background thread can
        load what the node's thread runs (GPU-tested, docs/gpu-runs/)."""
        proc = process()
        device = proc.runtime.current_device()
        graph = self._graphs.get(device)
        if graph is None:
            with self._lock:
                graph = self._graphs.get(device)
                if graph is None:
                    graph = self._graphs[device] = proc.runtime.deserialize(
                        handle if handle is not None else handle_state(device).handle, self.blob
                    )
        return graph

    def execute(self, tensors: Mapping[str | int, Any], *, handle: Any = None) -> None:
        """Run the plan on the current CUDA stream; outputs are written in place.

        `tensors` maps names or uids to torch tensors, each checked (shape,
        strides, dtype, device); pass-by-value scalars may be Python numbers
        and default to the spec's scalar_value. For a plan run many times,
        `bind` checks once and calls cost what the frontend's execute costs.
        """
        proc = process()
        device = proc.runtime.current_device()
        pack = self._table(proc).full_pack(tensors, device)
        stream = proc.runtime.stream_getter()(device)
        if handle is None:
            state = handle_state(device)
            handle = state.handle
            state.use(stream)
        else:  # the caller's handle: its stream may have been set elsewhere
            proc.runtime.set_stream(handle, stream)
        workspace = proc.workspaces.slot(device, stream, self.metadata.workspace_size).buffer
        self.load(handle).execute(pack, workspace, handle=handle)

    def bind(self, tensors: Mapping[str | int, Any]) -> BoundPlan:
        """Check `tensors` once and return a callable that executes with them
        (see plancache.run.bound). Bind on the thread and device that will call it."""
        proc = process()
        state = handle_state()
        pack = self._table(proc).full_pack(tensors, state.device)
        return BoundPlan(
            self._table(proc), self.load(state.handle), pack, dict(tensors), state, proc, self.metadata.workspace_size
        )

    def capture(self, tensors: Mapping[str | int, Any]) -> CapturedPlan:
        """Record one execution on `tensors` into a CUDA graph and return a
        callable that replays it (see plancache.run.bound for when that is safe).
        Capturing runs the plan once eagerly first (a warm-up)."""
        proc = process()
        state = handle_state()
        table = self._table(proc)
        pack = table.full_pack(tensors, state.device)
        graph, handle = self.load(state.handle), state.handle
        workspace = proc.runtime.empty(max(1, self.metadata.workspace_size), state.device)
        replay = proc.runtime.capture(lambda: graph.execute(pack, workspace, handle=handle), state.device, state.use)
        return CapturedPlan(table, replay, pack, dict(tensors), workspace)

    def _table(self, proc: _Process) -> TensorTable:
        table = self._tables
        if table is None or table.runtime is not proc.runtime:
            table = self._tables = TensorTable(self.key, list(self.metadata.tensors), proc.runtime)
        return table

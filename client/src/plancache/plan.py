"""Plan: a serialized cuDNN execution plan with everything needed to run it.

`Plan.execute({"A": a, "B": b, "C": c})` binds tensors by name or uid,
deserializes the blob once, and allocates the workspace once and reuses it.
The blob's sha256 is checked against the metadata when the plan arrives.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from plancache import dtypes
from plancache.errors import IntegrityError, InvalidRequest
from plancache.target import Target
from plancache.v1 import plancache_pb2 as pb

SOURCE_NAMES = {
    pb.COMPILE_SOURCE_HIT: "hit",
    pb.COMPILE_SOURCE_COMPILED: "compiled",
    pb.COMPILE_SOURCE_JOINED: "joined",
    pb.COMPILE_SOURCE_PROVISIONAL: "provisional",
}


class Plan:
    def __init__(self, blob: bytes, metadata: pb.PlanMetadata, source: str = "stored", signature: pb.PlanSignature | None = None) -> None:
        digest = hashlib.sha256(blob).hexdigest()
        if digest != metadata.blob_sha256:
            raise IntegrityError(f"plan {metadata.key}: blob sha256 {digest} does not match its metadata ({metadata.blob_sha256})")
        self.blob = blob
        self.metadata = metadata
        self.signature = signature if signature is not None and signature.signature else None
        # "hit", "compiled", "joined" (from Compile), "stored" (from GetPlan or a
        # file) or "cache" (from the client's disk cache, no network call).
        self.source = source
        self._graph: Any = None
        self._workspace: Any = None
        self._device: int | None = None

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
        return f"Plan(key={self.key!r}, plan={self.metadata.plan_name!r}, {len(self.blob)} bytes, source={self.source!r})"

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
        """The deserialized cuDNN graph (cached): ready to execute."""
        if self._graph is None:
            import cudnn

            from plancache.gpu import cudnn_handle

            graph = cudnn.pygraph()
            graph.deserialize(handle if handle is not None else cudnn_handle(), self.blob)
            self._graph = graph
        return self._graph

    def execute(self, tensors: Mapping[str | int, Any], *, handle: Any = None) -> None:
        """Run the plan on the current CUDA stream; outputs are written in place.

        `tensors` maps names or uids to torch tensors; pass-by-value scalars
        may be Python numbers and default to the spec's scalar_value.
        """
        import torch

        from plancache.gpu import cudnn_handle, torch_dtype

        handle = handle if handle is not None else cudnn_handle()
        graph = self.load(handle)
        pack = self._bind(tensors, torch, torch_dtype)
        import cudnn

        cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
        device = torch.cuda.current_device()
        if self._workspace is None or self._device != device:
            self._workspace = torch.empty(max(1, self.metadata.workspace_size), device=device, dtype=torch.uint8)
            self._device = device
        graph.execute(pack, self._workspace, handle=handle)

    def _bind(self, tensors: Mapping[str | int, Any], torch: Any, torch_dtype: Any) -> dict[int, Any]:
        by_name = {b.name: b for b in self.metadata.tensors if b.name}
        by_uid = {b.uid: b for b in self.metadata.tensors}
        pack: dict[int, Any] = {}
        for key, value in tensors.items():
            binding = by_uid.get(key) if isinstance(key, int) else by_name.get(key)
            if binding is None:
                raise InvalidRequest(f"plan {self.key}: no tensor {key!r} (tensors: {', '.join(b.name or str(b.uid) for b in self.metadata.tensors)})")
            pack[binding.uid] = self._check(binding, value, torch, torch_dtype)
        for binding in self.metadata.tensors:
            if binding.uid in pack:
                continue
            if binding.is_pass_by_value and binding.HasField("scalar_value"):
                pack[binding.uid] = self._check(binding, binding.scalar_value, torch, torch_dtype)
            else:
                raise InvalidRequest(f"plan {self.key}: tensor {binding.name or binding.uid!r} (uid {binding.uid}) is not bound")
        return pack

    @staticmethod
    def _check(binding: pb.TensorBinding, value: Any, torch: Any, torch_dtype: Any) -> Any:
        name = dtypes.from_proto(binding.data_type, binding.name) or "float"
        if binding.is_pass_by_value and isinstance(value, int | float):
            return torch.full(tuple(binding.dim), value, dtype=torch_dtype(name))
        where = f"tensor {binding.name or binding.uid!r}"
        if tuple(value.shape) != tuple(binding.dim):
            raise InvalidRequest(f"{where}: shape {tuple(value.shape)} but the plan was built for {tuple(binding.dim)}")
        if not binding.is_pass_by_value and tuple(value.stride()) != tuple(binding.stride):
            raise InvalidRequest(f"{where}: strides {tuple(value.stride())} but the plan was built for {tuple(binding.stride)}")
        if value.dtype != torch_dtype(name):
            raise InvalidRequest(f"{where}: dtype {value.dtype} but the plan was built for {name}")
        return value

"""A plan's tensor table, built once, and the checks that bind tensors to it.

`Plan.execute` used to rebuild its name→uid tables and look every dtype up
on every call; a node runs a plan millions of times, so the table is built
once per plan and the checks come in two strengths:

- `full_pack`: every tensor the plan needs is present and has the plan's
  shape, strides, dtype and device, with messages naming what differs (used by
  `Plan.execute` and when binding);
- `quick_check`: one tensor replacing a bound one, compared with the bound
  geometry by identity and tuple equality (a bound call's new tensors).

Nothing here imports torch: the tensor operations come from a `Runtime`
(plancache.run.execution), so the logic is tested on machines without a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plancache import dtypes
from plancache.errors import InvalidRequest
from plancache.graphspec.graph import GraphSpec
from plancache.v1 import plancache_pb2 as pb

if TYPE_CHECKING:
    from plancache.run.execution import Runtime


@dataclass(frozen=True, slots=True)
class Geometry:
    """One tensor of a plan as it was built: what a bound tensor must match."""

    uid: int
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype_name: str
    pass_by_value: bool
    default: float | None  # a pass-by-value scalar's value from the spec
    # A ragged tensor is bound as its packed buffer: contiguous, any shape;
    # shape and stride here are the padded view cuDNN indexes through offsets.
    ragged: bool = False

    @property
    def label(self) -> str:
        return f"tensor {self.name or self.uid!r}"


class TensorTable:
    """A plan's tensors by name and uid, with the runtime's dtype objects resolved once."""

    def __init__(self, plan_key: str, bindings: list[pb.TensorBinding], runtime: Runtime) -> None:
        self.plan_key = plan_key
        self.runtime = runtime
        self.geometries = [
            Geometry(
                uid=b.uid,
                name=b.name,
                shape=tuple(b.dim),
                stride=tuple(b.stride),
                dtype_name=dtypes.from_proto(b.data_type, b.name) or "float",
                pass_by_value=b.is_pass_by_value,
                default=b.scalar_value if b.is_pass_by_value and b.HasField("scalar_value") else None,
                ragged=b.HasField("ragged_offset_uid"),
            )
            for b in bindings
        ]
        self._by_key: dict[str | int, Geometry] = {g.uid: g for g in self.geometries}
        self._by_key.update({g.name: g for g in self.geometries if g.name})
        self._dtype = {g.uid: runtime.dtype(g.dtype_name) for g in self.geometries}
        self._defaults: dict[int, Any] = {}  # uid -> the scalar tensor of a spec default, made once

    def geometry(self, key: str | int) -> Geometry:
        found = self._by_key.get(key)
        if found is None:
            names = ", ".join(g.name or str(g.uid) for g in self.geometries)
            raise InvalidRequest(f"plan {self.plan_key}: no tensor {key!r} (tensors: {names})")
        return found

    def full_pack(self, tensors: Mapping[str | int, Any], device: int) -> dict[int, Any]:
        """uid → tensor for every tensor the plan needs, each checked; pass-by-value
        scalars may be Python numbers or left out for the spec's default."""
        pack: dict[int, Any] = {}
        for key, value in tensors.items():
            g = self.geometry(key)
            pack[g.uid] = self._checked(g, value, device)
        for g in self.geometries:
            if g.uid in pack:
                continue
            if g.pass_by_value and g.default is not None:
                pack[g.uid] = self._default(g)
            else:
                raise InvalidRequest(f"plan {self.plan_key}: {g.label} (uid {g.uid}) is not bound")
        return pack

    def quick_check(self, g: Geometry, value: Any, device_object: Any) -> Any:
        """`value` ready for the pack, or InvalidRequest unless it has `g`'s
        geometry, dtype and device.

        Cheap on purpose (a bound call's per-call check: identity and tuple
        comparisons); anything else goes through the full check, which says
        what differs."""
        try:
            if (
                not g.pass_by_value
                and value.dtype is self._dtype[g.uid]
                and value.device == device_object
                and value.shape == g.shape
                and value.stride() == g.stride
            ):
                return value
        except (AttributeError, TypeError):
            pass
        return self._checked(g, value, device_object.index)

    def _default(self, g: Geometry) -> Any:
        scalar = self._defaults.get(g.uid)
        if scalar is None:
            assert g.default is not None
            scalar = self._defaults[g.uid] = self.runtime.scalar(g.shape, g.default, self._dtype[g.uid])
        return scalar

    def _checked(self, g: Geometry, value: Any, device: int) -> Any:
        if g.pass_by_value:
            if isinstance(value, int | float):
                return self.runtime.scalar(g.shape, value, self._dtype[g.uid])
        elif isinstance(value, int | float):
            raise InvalidRequest(f"{g.label}: a number was given, but the plan takes a GPU tensor here")
        if not hasattr(value, "shape") or not hasattr(value, "stride"):
            raise InvalidRequest(f"{g.label}: expected a tensor, got {type(value).__name__}")
        if g.ragged:
            # cuDNN reads and writes it through the offsets: only a dense buffer
            # of the right type holds tokens where they say (their values stay
            # on the GPU: checking them would cost a synchronization per call).
            if not value.is_contiguous():
                raise InvalidRequest(
                    f"{g.label}: a ragged tensor is bound as its packed buffer, which must be contiguous"
                )
            token = g.stride[2] if len(g.stride) > 2 else 1  # elements per token (h × d in THD)
            if value.numel() < token or value.numel() % token:
                raise InvalidRequest(
                    f"{g.label}: a packed buffer of {value.numel()} elements is not "
                    f"whole tokens of {token} (the plan's [b, h, s, d] strides {g.stride})"
                )
        elif tuple(value.shape) != g.shape:
            raise InvalidRequest(f"{g.label}: shape {tuple(value.shape)} but the plan was built for {g.shape}")
        if not g.pass_by_value and not g.ragged and tuple(value.stride()) != g.stride:
            raise InvalidRequest(f"{g.label}: strides {tuple(value.stride())} but the plan was built for {g.stride}")
        if value.dtype is not self._dtype[g.uid]:
            raise InvalidRequest(f"{g.label}: dtype {value.dtype} but the plan was built for {g.dtype_name}")
        where = value.device
        if g.pass_by_value:
            if where.type != "cpu":
                raise InvalidRequest(
                    f"{g.label}: a pass-by-value scalar must be a CPU tensor or a number, got one on {where}"
                )
        elif where.type != "cuda" or where.index != device:
            raise InvalidRequest(f"{g.label}: on {where} but the plan runs on cuda:{device}")
        return value


# uid -> (dims, strides) that cuDNN gave the results a spec leaves open, where the plan was built.
ResolvedGeometry = Mapping[int, tuple[list[int], list[int]]]


def tensor_bindings(spec: GraphSpec, geometry: ResolvedGeometry) -> list[pb.TensorBinding]:
    """The tensors a caller binds to a plan of the normalized `spec` (its
    plan metadata's): every non-virtual tensor but constants (the graph's
    own), by uid. A result whose dims or strides the spec leaves to cuDNN
    gets those cuDNN gave it where the plan was built (`geometry`). The
    worker's plans and a node's own (plancache.run.local) say the same
    (plancache.wire.metadata)."""
    bindings = []
    for t in sorted(spec.tensors, key=lambda t: t.uid or 0):
        if t.is_virtual or t.constant is not None:
            continue
        dim, stride = (
            (list(t.dim), list(t.stride)) if t.dim and t.stride else geometry.get(t.uid or 0, (t.dim, t.stride))
        )
        bindings.append(
            pb.TensorBinding(
                uid=t.uid,
                name=t.name,
                data_type=dtypes.to_proto(t.data_type),
                is_output=t.is_output,
                is_pass_by_value=t.is_pass_by_value,
                dim=dim,
                stride=stride,
                scalar_value=t.scalar_value,
                ragged_offset_uid=t.ragged_offset.uid if t.ragged_offset is not None else None,
            )
        )
    return bindings

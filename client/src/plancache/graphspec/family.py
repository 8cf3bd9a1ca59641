"""Graph families: one graph at many sizes of some of its dims.

    family = derive(spec_at_batch_8, spec_at_batch_17, sizes={"d0": range(1, 257)})
    family.instance({"d0": 42})      # the spec at batch 42, exactly as the program would declare it
    make_family_key(family.family_hash(), target, options)   # its key on the service (plancache.keys.plankey)
    family.values_of(spec)           # {"d0": 42} if `spec` is one of the family's graphs, else None

A family is an example spec (as the program's builder declared it: inputs
and explicit outputs with dims, inferred tensors without), its varying dims
(each a symbol naming the (tensor uid, axis) places it sits in) and the
sizes each symbol takes. An instance is the example with the symbols' sizes
put in those places and the strides of the tensors holding them derived for
the new dims, in the same order and packing: a dense tensor stays dense, a
tensor whose varying axis is its outermost keeps its strides. A tensor laid
out otherwise has no form at another size, and the family is refused naming it.

Why the family is never trusted to say what a graph is: a node keys every
call by its own graph's hash. An instance is only a graph the service
builds ahead; a node whose graph equals it byte for byte finds the plan
stored, any other graph misses as before. `derive` checks that the example
reproduces both graphs it was derived from (the stride rule included).

Families are served as exact plans of each size (GPU run 23: on cuDNN 9.19 a
kernel cache shared between sizes gave wrong results for SDPA and an
illegal memory access for paged attention; a static build of a new size in
a warm process costs 9-65 ms, a stored plan a fetch).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plancache.errors import SpecError
from plancache.graphspec import spec_io
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.jcs import canonicalize

# The most graphs one family may name: each is a build on a worker (9-65 ms
# heuristic on the H200 once warm, plus its autotuning).
MAX_FAMILY_SIZE = 1024
FAMILY_VERSION = 1

Place = tuple[int, int]  # (tensor uid, axis)


@dataclass(frozen=True)
class Varying:
    """A symbol: the places it sits in and the sizes it takes (sorted, unique, >= 1)."""

    symbol: str
    places: tuple[Place, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.places:
            raise SpecError(f"varying dim {self.symbol!r} sits nowhere")
        if not self.sizes or any(not isinstance(s, int) or s < 1 for s in self.sizes):
            raise SpecError(f"varying dim {self.symbol!r}: sizes must be positive integers")
        if tuple(sorted(set(self.sizes))) != self.sizes:
            object.__setattr__(self, "sizes", tuple(sorted(set(self.sizes))))


@dataclass(frozen=True)
class Family:
    example: dict[str, Any]  # spec_io.to_dict of the example graph (as declared, not normalized)
    varying: tuple[Varying, ...]
    # Tensors whose dims must not vary: the call's parameters (weights, biases, statistics). Not in the
    # family's hash: its graphs are the same; checked() refuses a varying dim placed in one.
    fixed: tuple[int, ...] = ()

    # ---- identity -----------------------------------------------------------------

    def family_hash(self) -> str:
        """The same for every example size: the varying places' dims and the
        strides derived from them are abstracted before hashing."""
        abstract = copy.deepcopy(self.example)
        derived = {uid for v in self.varying for uid, _ in v.places}
        for tensor in abstract["tensors"]:
            for v in self.varying:
                for uid, axis in v.places:
                    if tensor["uid"] == uid:
                        tensor["dim"][axis] = v.symbol
            if tensor["uid"] in derived and "stride" in tensor:
                tensor["stride"] = "derived"
        body = {
            "version": FAMILY_VERSION,
            "graph": abstract,
            "varying": [
                {"symbol": v.symbol, "places": [list(p) for p in v.places], "sizes": list(v.sizes)}
                for v in self.varying
            ],
        }
        return hashlib.sha256(canonicalize(body)).hexdigest()

    def size(self) -> int:
        return math.prod(len(v.sizes) for v in self.varying)

    # ---- instances ----------------------------------------------------------------

    def instance(self, values: Mapping[str, int]) -> GraphSpec:
        """The graph at `values` (one size per symbol); SpecError for a size outside the family."""
        return spec_io.from_dict(self.instance_dict(values))

    def instance_dict(self, values: Mapping[str, int], *, any_size: bool = False) -> dict[str, Any]:
        """The instance's JSON form; `any_size`: at sizes outside the family too (derive() checks
        the example's form with it)."""
        missing = {v.symbol for v in self.varying} - set(values)
        if missing:
            raise SpecError(f"a family instance needs a size for {', '.join(sorted(missing))}")
        for v in self.varying:
            if not any_size and values[v.symbol] not in v.sizes:
                raise SpecError(
                    f"size {values[v.symbol]} of {v.symbol!r} is not one of the family's ({_sizes_text(v.sizes)})"
                )
        graph = copy.deepcopy(self.example)
        by_uid = {t["uid"]: t for t in graph["tensors"]}
        changed: dict[int, dict[int, int]] = {}
        for v in self.varying:
            for uid, axis in v.places:
                changed.setdefault(uid, {})[axis] = values[v.symbol]
        for uid, axes in changed.items():
            tensor = by_uid[uid]
            old = list(tensor["dim"])
            new = list(old)
            for axis, size in axes.items():
                new[axis] = size
            tensor["dim"] = new
            if "stride" in tensor:
                tensor["stride"] = list(
                    derive_strides(old, tensor["stride"], new, set(axes), tensor.get("name") or f"uid {uid}")
                )
        return graph

    def instances(self) -> Iterator[tuple[dict[str, int], GraphSpec]]:
        """Every (values, graph) of the family, in size order."""
        symbols = [v.symbol for v in self.varying]
        for sizes in itertools.product(*(v.sizes for v in self.varying)):
            values = dict(zip(symbols, sizes, strict=True))
            yield values, self.instance(values)

    def values_of(self, spec: GraphSpec) -> dict[str, int] | None:
        """The sizes at which the family's graph is `spec` exactly, or None."""
        graph = spec_io.to_dict(spec)
        values: dict[str, int] = {}
        by_uid = {t["uid"]: t for t in graph.get("tensors", [])}
        for v in self.varying:
            uid, axis = v.places[0]
            dims = by_uid.get(uid, {}).get("dim") or []
            if axis >= len(dims):
                return None
            values[v.symbol] = dims[axis]
        try:
            return values if self.instance_dict(values) == graph else None
        except SpecError:
            return None

    # ---- wire and JSON forms ----------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FAMILY_VERSION,
            "example": self.example,
            "varying": [
                {"symbol": v.symbol, "places": [list(p) for p in v.places], "sizes": list(v.sizes)}
                for v in self.varying
            ],
            **({"fixed": list(self.fixed)} if self.fixed else {}),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Family:
        """A family from its JSON form, checked: the example parses, every
        place is an axis of a tensor with dims, at most MAX_FAMILY_SIZE graphs."""
        if not isinstance(data, dict) or data.get("version") != FAMILY_VERSION:
            raise SpecError(f'a family is an object with "version": {FAMILY_VERSION}')
        example = spec_io.to_dict(spec_io.from_dict(data.get("example")))  # parsed and written again: one form
        raw = data.get("varying")
        if not isinstance(raw, list) or not raw:
            raise SpecError("a family needs at least one varying dim")
        varying = []
        for item in raw:
            if not isinstance(item, dict) or set(item) != {"symbol", "places", "sizes"}:
                raise SpecError('a varying dim is {"symbol", "places", "sizes"}')
            try:
                places = tuple((int(uid), int(axis)) for uid, axis in item["places"])
                sizes = tuple(int(s) for s in item["sizes"])
            except (TypeError, ValueError) as e:
                raise SpecError(
                    f"varying dim {str(item['symbol'])[:64]!r}: places are [uid, axis] pairs, sizes integers ({e})"
                ) from None
            varying.append(Varying(str(item["symbol"])[:64], places, sizes))
        fixed = data.get("fixed", [])
        if not isinstance(fixed, list) or not all(isinstance(u, int) and not isinstance(u, bool) for u in fixed):
            raise SpecError('a family\'s "fixed" is a list of tensor uids')
        return checked(example, varying, fixed)

    def to_proto(self) -> Any:
        from plancache.v1 import plancache_pb2 as pb

        return pb.GraphFamily(
            example=spec_io.to_proto(spec_io.from_dict(self.example)),
            varying=[
                pb.VaryingDim(symbol=v.symbol, places=[pb.DimPlace(uid=u, axis=a) for u, a in v.places], sizes=v.sizes)
                for v in self.varying
            ],
            fixed_uids=self.fixed,
        )

    @classmethod
    def from_proto(cls, msg: Any) -> Family:
        example = spec_io.to_dict(spec_io.from_proto(msg.example))
        varying = [
            Varying(v.symbol[:64], tuple((p.uid, p.axis) for p in v.places), tuple(v.sizes)) for v in msg.varying
        ]
        if not varying:
            raise SpecError("a family needs at least one varying dim")
        return checked(example, varying, msg.fixed_uids)


def checked(example: dict[str, Any], varying: Sequence[Varying], fixed: Sequence[int] = ()) -> Family:
    """A Family whose places exist, none of them in a `fixed` tensor (a call's parameter), and whose
    size is bounded."""
    by_uid = {t["uid"]: t for t in example.get("tensors", [])}
    fixed = tuple(sorted({int(uid) for uid in fixed}))
    unknown = [uid for uid in fixed if uid not in by_uid]
    if unknown:
        raise SpecError(f"a family's fixed tensors {unknown[:8]} are not tensors of its example")
    symbols = [v.symbol for v in varying]
    if len(set(symbols)) != len(symbols):
        raise SpecError("a family's varying dims need distinct symbols")
    for v in varying:
        sizes_there = set()
        for uid, axis in v.places:
            tensor = by_uid.get(uid)
            dims = (tensor or {}).get("dim") or []
            if not 0 <= axis < len(dims):
                raise SpecError(f"varying dim {v.symbol!r}: tensor uid {uid} has no declared axis {axis}")
            sizes_there.add(dims[axis])
        if len(sizes_there) != 1:
            raise SpecError(
                f"varying dim {v.symbol!r} has different sizes in the example's places ({sorted(sizes_there)})"
            )
        for uid, axis in v.places:
            if uid in fixed:
                name = by_uid[uid].get("name") or f"uid {uid}"
                raise SpecError(
                    f"varying dim {v.symbol!r} sits in axis {axis} of {name!r} (uid {uid}), a parameter of the "
                    "call: its dims are fixed (different sizes there are different layers, not one layer at many "
                    "sizes); a family varies activations' dims (rows, batch, sequence, pages)"
                )
    axes_of: dict[int, set[int]] = {}
    for v in varying:
        for uid, axis in v.places:
            axes_of.setdefault(uid, set()).add(axis)
    for uid, axes in axes_of.items():  # each tensor holding a varying dim has a form at other sizes
        tensor = by_uid[uid]
        if "stride" in tensor:
            derive_strides(tensor["dim"], tensor["stride"], tensor["dim"], axes, tensor.get("name") or f"uid {uid}")
    family = Family(example, tuple(varying), fixed)
    if family.size() > MAX_FAMILY_SIZE:
        raise SpecError(
            f"a family names at most {MAX_FAMILY_SIZE:,} graphs, "
            f"this one {family.size():,}: give fewer sizes (or pad to buckets)"
        )
    return family


def derive_strides(
    old_dims: Sequence[int], old_strides: Sequence[int], new_dims: Sequence[int], varying_axes: set[int], name: str
) -> tuple[int, ...]:
    """The strides of a tensor at new dims: a dense tensor packed again in
    the same axis order; a tensor whose varying axes are all outermost
    (nothing is laid out around them) keeps its strides. SpecError otherwise."""
    order = sorted(
        range(len(old_dims)), key=lambda a: (-old_strides[a], a)
    )  # outermost first; ties: the earlier axis outer
    expected, dense = 1, True
    for axis in reversed(order):
        if old_dims[axis] != 1 and old_strides[axis] != expected:
            dense = False
            break
        if old_dims[axis] != 1:
            expected *= old_dims[axis]
    if dense:
        strides = [0] * len(new_dims)
        step = 1
        for axis in reversed(order):
            # A size-1 axis may carry any stride: one the packing gave is packed again, another kept.
            packed = old_dims[axis] != 1 or old_strides[axis] == _packed_at(old_dims, order, axis)
            strides[axis] = step if packed else old_strides[axis]
            step *= new_dims[axis]
        return tuple(strides)
    outer = set(order[: len(varying_axes)])
    if varying_axes <= outer:
        return tuple(old_strides)
    raise SpecError(
        f"tensor {name}: strides {tuple(old_strides)} for dims {tuple(old_dims)} are "
        "neither dense nor outermost on the varying axes: they have no form at another size"
    )


def _packed_at(dims: Sequence[int], order: Sequence[int], axis: int) -> int:
    """The stride a packed layout in `order` gives `axis` at `dims`."""
    step = 1
    for a in reversed(order):
        if a == axis:
            return step
        step *= dims[a]
    return step


def derive(
    first: GraphSpec,
    second: GraphSpec,
    sizes: Mapping[str, Sequence[int]] | None = None,
    *,
    size_range: tuple[int, int] | None = None,
    fixed: Sequence[int] = (),
) -> Family:
    """The family two graphs of one program are sizes of: the same graph but
    for some dims of declared tensors. Dims that differ are grouped into a
    symbol per pair of sizes (d0, d1, ... in the example's order); each
    symbol takes `sizes[symbol]`, or every size of `size_range` (inclusive).
    SpecError naming what differs otherwise (an attribute, a dtype, a
    stride that does not follow its dims, a dim of a `fixed` tensor)."""
    a, b = spec_io.to_dict(_copy(first)), spec_io.to_dict(_copy(second))
    if _without_dims(a) != _without_dims(b):
        raise SpecError(
            "the two graphs differ beyond tensor dims (ops, attributes, dtypes or layouts): they are not one family"
        )
    symbols: dict[tuple[int, int], str] = {}
    places: dict[str, list[Place]] = {}
    for ta, tb in zip(a["tensors"], b["tensors"], strict=True):
        da, db = ta.get("dim") or [], tb.get("dim") or []
        if len(da) != len(db):
            raise SpecError(f"tensor uid {ta['uid']} has {len(da)} dims in one graph and {len(db)} in the other")
        for axis, (x, y) in enumerate(zip(da, db, strict=True)):
            if x != y:
                symbol = symbols.setdefault((x, y), f"d{len(symbols)}")
                places.setdefault(symbol, []).append((ta["uid"], axis))
    if not places:
        raise SpecError("the two graphs are the same size: no dim varies")
    if sizes is None:
        if size_range is None:
            raise SpecError("a family needs its sizes: `sizes` per symbol or a `size_range`")
        low, high = size_range
        sizes = {s: range(low, high + 1) for s in places}
    unknown = set(sizes) - set(places)
    if unknown:
        raise SpecError(
            f"sizes given for {', '.join(sorted(unknown))}, "
            f"which the graphs do not vary ({', '.join(sorted(places))} vary)"
        )
    family = checked(a, [Varying(s, tuple(p), tuple(sizes.get(s, ()))) for s, p in places.items()], fixed)
    for graph, pick in ((a, 0), (b, 1)):
        values = {s: pair[pick] for pair, s in symbols.items()}
        if family.instance_dict(values, any_size=True) != graph:
            raise SpecError(
                "a tensor's strides do not follow its dims the way "
                "this family derives them: the graphs are not one family"
            )
    return family


def _copy(spec: GraphSpec) -> GraphSpec:
    return spec_io.from_dict(spec_io.to_dict(spec))


def without_sizes(spec: GraphSpec) -> tuple[dict[str, Any], list[Any]]:
    """`spec`'s JSON form with its tensors' dims taken out and each stride kept only as its axes' order
    (largest first: the layout, not the sizes), and the dims taken out, in tensor order. What the sizes of
    one graph have in common: the families' signatures (plancache.frontdoors.families) and the kernel caches
    norm sizes share (plancache.frontend_graph.kernel_caches)."""
    graph = spec_io.to_dict(spec)
    dims = []
    for tensor in graph.get("tensors", []):
        dims.append(tensor.pop("dim", None))
        stride = tensor.pop("stride", None)
        tensor["order"] = None if stride is None else sorted(range(len(stride)), key=lambda a: (-stride[a], a))
    return graph, dims


def _without_dims(graph: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(graph)
    for tensor in out["tensors"]:
        tensor.pop("dim", None)
        tensor.pop("stride", None)
    return out


def _sizes_text(sizes: Sequence[int]) -> str:
    if len(sizes) > 1 and list(sizes) == list(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}..{sizes[-1]}"
    shown = ", ".join(map(str, sizes[:8]))
    return shown + (f", ... ({len(sizes)} sizes)" if len(sizes) > 8 else "")

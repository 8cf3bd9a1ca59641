"""An operator's tensor arguments, named once: its slots, and how a geometry's first call binds them.

A slot is one tensor a call binds to its graph: its name (the argument's:
the messages say it, torch's fallback is given it by it), its uid, whether
the call may leave it out, whether the backward saves it, and whether
torch's function is given it (not a tensor the call makes itself: a dropout
seed, an inverse deviation, a running statistic bound again as the output
written in place). Every part of an operator reads its signature: the
spec's input uids (`uids`, in the slots' order) and the graph tensors of
those uids (`tensor`), the node type a geometry torch ran is counted under,
and at a geometry's first call the `Bound` slots: the tensors saved for
backward, the keywords of torch's fallback, the names the messages say,
each argument's geometry.

The one thing written by hand is the hot path's tensor tuple (what a hit
passes its entry): a hit is a key, a table lookup and the entry's call, so
its tuple is built in the slots' order without reading the signature. The
first call binds the same arguments by name and checks that tuple against
them: a tuple out of order fails the operator's first call (and its
tests), and never binds a tensor to another's uid.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plancache.functional._geometry import Geo, geo
from plancache.graphspec.graph import GraphSpec, Tensor


@dataclass(frozen=True)
class Slot:
    name: str
    uid: int
    optional: bool = False  # the call may leave it out (None): then it is not in the call's tuple
    saved: bool = False  # saved for the backward, when the geometry is trained
    to_torch: bool = True  # torch's fallback is given it (False: a tensor the call makes or binds again)


class Signature:
    """An operator's slots, in the order a call's tuple holds them (torch's before the call's own)."""

    __slots__ = ("_by_name", "function", "node_type", "slots")

    def __init__(self, function: str, node_type: str, *slots: Slot) -> None:
        # node_type: what a geometry torch ran before any spec was made is counted under
        self.function, self.node_type, self.slots = function, node_type, slots
        self._by_name = {s.name: s for s in slots}
        if len(self._by_name) != len(slots) or len({s.uid for s in slots}) != len(slots):
            raise ValueError(f"{function}: two slots of one name or uid")
        given_to_torch = [s.to_torch for s in slots]
        if given_to_torch != sorted(given_to_torch, reverse=True):
            raise ValueError(f"{function}: the slots torch is given come before the call's own")

    def uid(self, name: str) -> int:
        return self._by_name[name].uid

    def uids(self, **present: object) -> tuple[int, ...]:
        """The uids a spec binds, in the slots' order: those of the slots given a value other than None."""
        self._known(present)
        return tuple(s.uid for s in self.slots if present.get(s.name) is not None)

    def tensor(self, g: GraphSpec, name: str, dim: Any, stride: Any = None, data_type: str | None = None) -> Tensor:
        """Slot `name`'s tensor in graph `g` (its name and uid)."""
        return g.tensor(dim, stride, data_type, name=name, uid=self._by_name[name].uid)

    def bind(self, tensors: tuple[Any, ...], **arguments: Any) -> Bound:
        """A first call's slots: `arguments` names every slot's tensor (None:
        an optional slot the call leaves out); `tensors`, the tuple its hot
        path built, must be those tensors in the slots' order."""
        self._known(arguments)
        missing = [s.name for s in self.slots if not s.optional and s.name not in arguments]
        slots = tuple(s for s in self.slots if not s.optional or arguments.get(s.name) is not None)
        if (
            missing
            or len(slots) != len(tensors)
            or any(arguments[s.name] is not t for s, t in zip(slots, tensors, strict=True))
        ):
            raise RuntimeError(
                f"plancache.functional.{self.function}: the call's tuple of {len(tensors)} tensors is not its "
                f"slots ({', '.join(s.name for s in slots)}) in order{'; no ' + ', '.join(missing) if missing else ''}"
            )
        return Bound(self, slots, tensors)

    def _known(self, names: dict[str, object]) -> None:
        unknown = names.keys() - self._by_name.keys()
        if unknown:
            raise TypeError(f"{self.function} has no slot {', '.join(sorted(unknown))}")


class Bound:
    """A geometry's first call, by slot: the tensors present, in the call's order."""

    __slots__ = ("_geos", "signature", "slots", "tensors")

    def __init__(self, signature: Signature, slots: tuple[Slot, ...], tensors: tuple[Any, ...]) -> None:
        self.signature, self.slots, self.tensors = signature, slots, tensors
        self._geos: dict[str, Geo] = {}

    @property
    def function(self) -> str:
        return self.signature.function

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    @property
    def uids(self) -> tuple[int, ...]:
        """What the forward's spec binds (its Request's inputs)."""
        return tuple(s.uid for s in self.slots)

    @property
    def saved(self) -> tuple[int, ...]:
        """The positions in the call's tuple of the tensors a trained geometry saves."""
        return tuple(i for i, s in enumerate(self.slots) if s.saved)

    def index(self, name: str) -> int | None:
        """Slot `name`'s position in the call's tuple (None: left out)."""
        return next((i for i, s in enumerate(self.slots) if s.name == name), None)

    def tensor(self, name: str) -> Any:
        at = self.index(name)
        return None if at is None else self.tensors[at]

    def geo(self, name: str) -> Geo:
        """A slot's geometry, as the spec reads it (Unserved for what is not a tensor)."""
        found = self._geos.get(name)
        if found is None:
            at = self.index(name)
            if at is None:
                raise KeyError(f"{self.function}: the call has no {name}")
            found = self._geos[name] = geo(name, self.tensors[at])
        return found

    def geo_or_none(self, name: str) -> Geo | None:
        return None if self.index(name) is None else self.geo(name)

    def describe(self) -> str:
        """The tensors by name, with dims and dtype (what a log line says of a geometry)."""
        return ", ".join(
            f"{s.name} {tuple(getattr(t, 'shape', ()))} {getattr(t, 'dtype', type(t).__name__)}"
            for s, t in zip(self.slots, self.tensors, strict=True)
        )

    def where(self) -> str:
        return ", ".join(
            f"{s.name} on {getattr(t, 'device', '?')}" for s, t in zip(self.slots, self.tensors, strict=True)
        )

    def fallback(self, fn: Callable[..., Any], /, **options: Any) -> Callable[..., Any]:
        """torch's function for this geometry, called with each call's tuple:
        the tensors torch is given by slot name, `options` by keyword.
        Positional (a partial: nothing made per call) when `fn`'s first
        parameters are exactly those slots, by name and in order."""
        names = tuple(s.name for s in self.slots if s.to_torch)
        code = getattr(fn, "__code__", None)
        positional = code.co_varnames[: code.co_argcount][: len(names)] if code is not None else ()
        if len(names) == len(self.slots) and positional == names:
            return functools.partial(fn, **options) if options else fn
        return functools.partial(_by_name, fn, names, options)


def _by_name(fn: Callable[..., Any], names: tuple[str, ...], options: dict[str, Any], *tensors: Any) -> Any:
    # zip stops at the slots torch is given: they come first, the call's own after them.
    return fn(**options, **dict(zip(names, tensors)))  # noqa: B905

"""How both wire forms of a GraphSpec turn uids into tensors: each uid declared once, each reference to a
declared one, the node or tensor at fault named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plancache.errors import SpecError
from plancache.graphspec.graph import GraphSpec, Tensor


def index_uids(tensors: list[Tensor]) -> dict[int, Tensor]:
    by_uid: dict[int, Tensor] = {}
    for t in tensors:
        assert t.uid is not None
        if t.uid in by_uid:
            raise SpecError(f"{t.label()}: duplicate uid {t.uid} (also {by_uid[t.uid].label()})")
        by_uid[t.uid] = t
    return by_uid


def resolve_ragged(spec: GraphSpec, ragged: Mapping[int, int], by_uid: Mapping[int, Tensor]) -> None:
    """Point each ragged tensor (by index) at its offsets tensor (by uid)."""
    for index, uid in ragged.items():
        t = spec.tensors[index]
        expect(uid in by_uid, f"{t.label()}: ragged_offset_uid {uid} names no tensor of this graph")
        t.ragged_offset = by_uid[uid]


def port_tensors(raw: Any, by_uid: Mapping[int, Tensor], where: str) -> dict[str, Tensor]:
    """A node's port -> uid map as port -> tensor, every uid one the graph declares."""
    expect(isinstance(raw, dict), f"{where}s must be an object of port -> uid")
    ports: dict[str, Tensor] = {}
    for port, raw_uid in raw.items():
        uid = as_int(raw_uid, f"{where} {port!r}")
        expect(uid in by_uid, f"{where} {port!r} refers to uid {uid}, which no tensor declares")
        ports[str(port)] = by_uid[uid]
    return ports


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


def as_int(value: Any, where: str) -> int:
    expect(isinstance(value, int) and not isinstance(value, bool), f"{where}: expected an integer, got {value!r}")
    result: int = value
    return result

"""A request's shape, checked on the wire before it is parsed.

Parsing allocates per message: a 60 MiB spec of 7 million one-line tensors
parses in 0.6 s into 918 MB (measured), before any limit could count them.
So every request is first walked as protobuf wire data: its size against a
bound per method, and, where specs can appear, how many tensors, nodes and
refs it holds and how long each one is, stopping at the first excess. The
walk skips over field contents (it reads field headers only), so a hostile
request costs at most `MAX_ENTRIES` steps. What passes is parsed and then
validated in full (plancache.graphspec.validation); this only keeps parsing bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

from plancache.errors import InvalidRequest, ResourceExhausted, SpecError
from plancache.graphspec.validation import Limits

# Fields that hold submessages, per message: field number -> (message, largest
# entry in bytes). Everything else is skipped over.
GRAPH_SPEC, PLAN_QUERY, PLAN_REF, TARGET, OPTIONS = "GraphSpec", "PlanQuery", "PlanRef", "Target", "CompileOptions"
_SHAPES: dict[str, dict[int, tuple[str | None, int]]] = {
    "CompileRequest": {1: (GRAPH_SPEC, 0), 2: (TARGET, 1024), 3: (OPTIONS, 8192)},
    "ExplainRequest": {1: (PLAN_QUERY, 0)},
    "PrefetchRequest": {1: (PLAN_REF, 0)},
    "WarmRequest": {4: ("WarmManifest", 0)},
    "WarmManifest": {1: (PLAN_QUERY, 0)},
    "BuildFamilyRequest": {1: ("GraphFamily", 0), 2: (TARGET, 1024), 3: (OPTIONS, 8192)},
    "GraphFamily": {1: (GRAPH_SPEC, 0), 2: (None, 1 << 20)},
    PLAN_REF: {1: (None, 1024), 2: (PLAN_QUERY, 0)},
    PLAN_QUERY: {1: (GRAPH_SPEC, 0), 2: (TARGET, 1024), 3: (OPTIONS, 8192)},
    # A tensor: a name, up to max_rank dims and strides, flags. A node: an
    # op, ports, attributes. Bounded generously; the validator is exact.
    GRAPH_SPEC: {4: (None, 8192), 5: (None, 65536), 6: (None, 4096)},
}
# Specs in one Warm manifest (plancache_server.store.warming.MAX_TOP).
MAX_WARM_QUERIES = 10_000
# Counted entries (tensors, nodes, refs) in one request.
MAX_ENTRIES = 250_000
# Requests by method: the largest that may be parsed at all.
SMALL_REQUEST_BYTES = 64 * 1024
SPEC_REQUEST_BYTES = 4 * 2**20


@dataclass(frozen=True)
class WireLimits:
    spec: Limits
    max_prefetch_refs: int
    max_prefetch_bytes: int


def check(method: str, raw: bytes, limits: WireLimits) -> None:
    """Refuse a request whose size or shape is past the limits, before parsing."""
    check_size(method, raw, limits)
    if needs_walk(method, raw):
        walk(method, raw, limits)


def check_size(method: str, raw: bytes, limits: WireLimits) -> None:
    """The request's size against its method's bound (no walk: constant time)."""
    if method in ("Prefetch", "Warm"):
        bound = limits.max_prefetch_bytes
    elif method in ("Compile", "Explain", "BuildFamily"):
        bound = SPEC_REQUEST_BYTES
    else:
        bound = SMALL_REQUEST_BYTES
    if len(raw) > bound:
        raise ResourceExhausted(f"a {method} request takes at most {bound:,} bytes, this one has {len(raw):,}")


def needs_walk(method: str, raw: bytes) -> bool:
    """Whether the request's shape must be walked before it is parsed. A small request parses into little
    however it is shaped (64 KB of the tiniest messages: about 3 MB); the common case skips the walk. The
    walk costs ~40 ns a byte in Python (a 3,000-spec Prefetch: ~25 ms), so the guard runs it off the loop."""
    return method in _MESSAGES and len(raw) > SMALL_REQUEST_BYTES


def walk(method: str, raw: bytes, limits: WireLimits) -> None:
    """Walk the request's wire data, refusing at the first excess (see the module's docstring)."""
    _Walk(limits).message(raw, 0, len(raw), _MESSAGES[method], "request")


_MESSAGES = {
    "Compile": "CompileRequest",
    "Explain": "ExplainRequest",
    "Prefetch": "PrefetchRequest",
    "Warm": "WarmRequest",
    "BuildFamily": "BuildFamilyRequest",
}


class _Walk:
    """One request's walk. Its loop is the gateway's costliest Python per byte of a large request, so the
    common one-byte varints are read inline, messages with nothing to count inside are skipped over, and
    where an entry is (for the error message) is kept as a tuple, spelled out only when something is
    refused: 54 -> 25 ms for a 3,000-spec Prefetch."""

    def __init__(self, limits: WireLimits) -> None:
        self._limits = limits
        self._entries = 0

    def message(self, raw: bytes, start: int, end: int, name: str, where: _Where) -> None:
        shape = _SHAPES.get(name)
        counts: dict[int, int] = {}
        pos = start
        while pos < end:
            key = raw[pos]
            pos += 1
            if key & 0x80:
                key, pos = _varint(raw, pos - 1, end, where)
            field, wire_type = key >> 3, key & 7
            if wire_type == 2:
                if pos >= end:
                    raise InvalidRequest(f"malformed request: {_spelled(where)} is truncated")
                length = raw[pos]
                pos += 1
                if length & 0x80:
                    length, pos = _varint(raw, pos - 1, end, where)
                if pos + length > end:
                    raise InvalidRequest(f"malformed request: a field of {_spelled(where)} runs past its end")
                if shape is not None and field in shape:
                    count = counts[field] = counts.get(field, 0) + 1
                    self._entry(name, field, count, length, where)
                    inner, largest = shape[field]
                    if largest and length > largest:
                        raise SpecError(
                            f"{_spelled(where)}: field {field} of {name} entry {count} has {length:,} bytes, "
                            f"over {largest:,}"
                        )
                    if inner in _SHAPES:  # a message with nothing to count inside is only bounded in size
                        self.message(raw, pos, pos + length, inner, (where, inner, count - 1))
                pos += length
            elif wire_type == 0:
                _, pos = _varint(raw, pos, end, where)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            else:
                raise InvalidRequest(f"malformed request: wire type {wire_type} in {_spelled(where)}")
            if pos > end:
                raise InvalidRequest(f"malformed request: {_spelled(where)} is truncated")

    def _entry(self, name: str, field: int, count: int, length: int, where: _Where) -> None:
        if name in (GRAPH_SPEC, "PrefetchRequest", "WarmManifest"):
            self._entries += 1
            if self._entries > MAX_ENTRIES:
                raise ResourceExhausted(f"the request holds more than {MAX_ENTRIES:,} tensors, nodes and refs")
        limits = self._limits
        if name == GRAPH_SPEC:
            if field == 4 and count > limits.spec.max_tensors:
                raise SpecError(f"{_spelled(where)}: more than {limits.spec.max_tensors} tensors")
            if field == 5 and count > limits.spec.max_nodes:
                raise SpecError(f"{_spelled(where)}: more than {limits.spec.max_nodes} nodes")
            if field == 6 and length > 4 * limits.spec.max_name_length:
                raise SpecError(f"{_spelled(where)}: name longer than {limits.spec.max_name_length} characters")
        elif name == "PrefetchRequest" and count > limits.max_prefetch_refs:
            raise ResourceExhausted(
                f"a Prefetch takes at most {limits.max_prefetch_refs} plan refs: split the manifest"
            )
        elif name == "WarmManifest" and count > MAX_WARM_QUERIES:
            raise ResourceExhausted(f"a Warm manifest takes at most {MAX_WARM_QUERIES} specs")


# Where an entry is: "request", or (the enclosing entry, its message's name, its index).
_Where = str | tuple["_Where", str, int]


def _spelled(where: _Where) -> str:
    if isinstance(where, str):
        return where
    outer, name, index = where
    return f"{_spelled(outer)}.{name}[{index}]"


def _varint(raw: bytes, pos: int, end: int, where: _Where) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise InvalidRequest(f"malformed request: a bad varint in {_spelled(where)}")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7

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
    if method in ("Prefetch", "Warm"):
        bound = limits.max_prefetch_bytes
    elif method in ("Compile", "Explain", "BuildFamily"):
        bound = SPEC_REQUEST_BYTES
    else:
        bound = SMALL_REQUEST_BYTES
    if len(raw) > bound:
        raise ResourceExhausted(f"a {method} request takes at most {bound:,} bytes, this one has {len(raw):,}")
    message = {
        "Compile": "CompileRequest",
        "Explain": "ExplainRequest",
        "Prefetch": "PrefetchRequest",
        "Warm": "WarmRequest",
        "BuildFamily": "BuildFamilyRequest",
    }.get(method)
    # A small request parses into little however it is shaped (64 KB of the
    # tiniest messages: about 3 MB); the common case skips the walk.
    if message is not None and len(raw) > SMALL_REQUEST_BYTES:
        _Walk(limits).message(raw, 0, len(raw), message, "request")


class _Walk:
    def __init__(self, limits: WireLimits) -> None:
        self._limits = limits
        self._entries = 0

    def message(self, raw: bytes, start: int, end: int, name: str, where: str) -> None:
        shape = _SHAPES.get(name, {})
        counts: dict[int, int] = {}
        pos = start
        while pos < end:
            key, pos = _varint(raw, pos, end, where)
            field, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, pos = _varint(raw, pos, end, where)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                length, pos = _varint(raw, pos, end, where)
                if pos + length > end:
                    raise InvalidRequest(f"malformed request: a field of {where} runs past its end")
                if field in shape:
                    counts[field] = counts.get(field, 0) + 1
                    self._entry(name, field, counts[field], length, where)
                    inner, largest = shape[field]
                    if largest and length > largest:
                        raise SpecError(
                            f"{where}: field {field} of {name} entry {counts[field]} has {length:,} bytes, "
                            f"over {largest:,}"
                        )
                    if inner is not None:
                        self.message(raw, pos, pos + length, inner, f"{where}.{inner}[{counts[field] - 1}]")
                pos += length
            else:
                raise InvalidRequest(f"malformed request: wire type {wire_type} in {where}")
            if pos > end:
                raise InvalidRequest(f"malformed request: {where} is truncated")

    def _entry(self, name: str, field: int, count: int, length: int, where: str) -> None:
        if name in (GRAPH_SPEC, "PrefetchRequest", "WarmManifest"):
            self._entries += 1
            if self._entries > MAX_ENTRIES:
                raise ResourceExhausted(f"the request holds more than {MAX_ENTRIES:,} tensors, nodes and refs")
        limits = self._limits
        if name == GRAPH_SPEC and field == 4 and count > limits.spec.max_tensors:
            raise SpecError(f"{where}: more than {limits.spec.max_tensors} tensors")
        if name == GRAPH_SPEC and field == 5 and count > limits.spec.max_nodes:
            raise SpecError(f"{where}: more than {limits.spec.max_nodes} nodes")
        if name == GRAPH_SPEC and field == 6 and length > 4 * limits.spec.max_name_length:
            raise SpecError(f"{where}: name longer than {limits.spec.max_name_length} characters")
        if name == "PrefetchRequest" and count > limits.max_prefetch_refs:
            raise ResourceExhausted(
                f"a Prefetch takes at most {limits.max_prefetch_refs} plan refs: split the manifest"
            )
        if name == "WarmManifest" and count > MAX_WARM_QUERIES:
            raise ResourceExhausted(f"a Warm manifest takes at most {MAX_WARM_QUERIES} specs")


def _varint(raw: bytes, pos: int, end: int, where: str) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise InvalidRequest(f"malformed request: a bad varint in {where}")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7

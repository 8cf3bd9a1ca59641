"""A caller's query made a PlanQuery on the gateway: validated, normalized
and keyed here, whatever the caller claims.

The one resolve path of every call that sends a spec (Compile, GetPlan and
Prefetch by query, Explain, a Warm manifest, a graph family's members).
"""

from __future__ import annotations

from collections import OrderedDict

from plancache.errors import InvalidRequest
from plancache.graphspec.validation import Limits
from plancache.keys.plankey import parse_key
from plancache.keys.query import PlanQuery
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.offload import CpuOffload

# Resolved queries remembered by their wire form: a herd sends the same
# specs thousands of times, and normalizing and hashing one costs far more
# than looking it up. Large specs are not remembered. Bounded by count and by
# an estimate of the memory an entry holds: its wire form, the parsed and
# normalized spec and the query's own wire form made for its jobs. A 105-byte
# matmul spec's entry measured 4.9 KB (tracemalloc); the objects of a spec
# weigh tens of times its wire form, so 64 KB specs, counted alone, could
# hold gigabytes in 4,096 entries.
RESOLVED_KEPT = 4096
RESOLVED_MAX_SPEC_BYTES = 64 * 1024
RESOLVED_MAX_BYTES = 32 * 2**20
ENTRY_OVERHEAD_BYTES = 4096
BYTES_PER_WIRE_BYTE = 32


def entry_cost(wire: tuple[bytes, bytes, bytes]) -> int:
    """The estimated memory a remembered query holds."""
    return ENTRY_OVERHEAD_BYTES + BYTES_PER_WIRE_BYTE * sum(map(len, wire))


class QueryResolver:
    def __init__(self, offload: CpuOffload, limits: Limits) -> None:
        self._offload = offload
        self._limits = limits
        self._resolved: OrderedDict[tuple[bytes, bytes, bytes], PlanQuery] = OrderedDict()
        self.remembered_bytes = 0  # the estimate (entry_cost) of what _resolved holds

    async def resolve(self, spec: pb.GraphSpec, target: pb.Target, options: pb.CompileOptions) -> PlanQuery:
        """Validate everything the caller sent and compute the plan key."""
        size = spec.ByteSize()
        if size > RESOLVED_MAX_SPEC_BYTES:
            return await self._offload.run(size, self.resolve_now, spec, target, options)
        wire = (
            spec.SerializeToString(deterministic=True),
            target.SerializeToString(deterministic=True),
            options.SerializeToString(deterministic=True),
        )
        resolved = self._resolved.get(wire)
        if resolved is None:
            resolved = self.resolve_now(spec, target, options)
            self._resolved[wire] = resolved
            self.remembered_bytes += entry_cost(wire)
            while len(self._resolved) > RESOLVED_KEPT or self.remembered_bytes > RESOLVED_MAX_BYTES:
                oldest, _ = self._resolved.popitem(last=False)
                self.remembered_bytes -= entry_cost(oldest)
        else:
            self._resolved.move_to_end(wire)  # least recently used out first: a herd's spec stays
        return resolved

    @property
    def remembered(self) -> int:
        return len(self._resolved)

    def resolve_now(self, spec: pb.GraphSpec, target: pb.Target, options: pb.CompileOptions) -> PlanQuery:
        """A caller's query, validated and normalized here (what it claims is not trusted), its key derived."""
        query = PlanQuery.from_wire(spec, target, options, self._limits, refuse_unknown_fields=True)
        query.key  # noqa: B018 - hashed now, on this thread (a large spec's resolve runs in the CPU offload)
        return query

    async def ref_key(self, ref: pb.PlanRef) -> tuple[str, PlanQuery | None]:
        """A plan reference's key, and its query when it was sent one (a key alone has none to build from)."""
        kind = ref.WhichOneof("ref")
        if kind == "key":
            parse_key(ref.key)
            return ref.key, None
        if kind == "query":
            resolved = await self.resolve(ref.query.spec, ref.query.target, ref.query.options)
            return resolved.key, resolved
        raise InvalidRequest("a plan reference needs a plan key, or a spec with its target and options")

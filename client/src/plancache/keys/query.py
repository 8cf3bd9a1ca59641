"""A plan query: the normalized spec, the target it is for, the options it
is built with, and the plan key the three make.

One request is one PlanQuery in a process: `PlanQuery.of(spec, target,
options)` validates and normalizes the spec once and hashes it once (on
first use of `spec_hash` or `key`), and everything that request does after
that (the disk cache's lookup, the wire form of Compile, the check of the
plan that answers, the node's own build of a hedged miss) reads the same
object. A query crosses a trust boundary as its wire form (`to_proto`) and
is made again on the other side from what was sent (`from_proto`): a server
validates and normalizes a caller's spec, a worker derives the key of a job
it read from Redis. Inside one process nothing is normalized twice.

Plan keys are formatted in plancache.keys.plankey alone; a key is read back
with `parse_key`, never taken apart by hand.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from plancache.graphspec import spec_io
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.ops import anchor_family
from plancache.graphspec.validation import DEFAULT_LIMITS, Limits, normalize
from plancache.keys.arguments import check_options, check_spec
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import make_key
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb

# The options of a query that names none: one instance, its id made once (CompileOptions is frozen).
DEFAULT_OPTIONS = CompileOptions()


@dataclass(frozen=True, eq=False)
class PlanQuery:
    """What one request asks for. `spec` is normalized (made by `of`,
    `from_proto` or `normalized`): treat it as read-only."""

    spec: GraphSpec
    target: Target
    options: CompileOptions

    @classmethod
    def of(
        cls,
        spec: GraphSpec,
        target: Target,
        options: CompileOptions | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> PlanQuery:
        """Validate and normalize `spec` (SpecError naming what is wrong), once. A `spec` that is no GraphSpec,
        or `options` no CompileOptions, is InvalidRequest naming the type."""
        check_spec(spec, "PlanQuery.of()")
        check_options(options, "PlanQuery.of()")
        return cls(normalize(spec, limits), target, options or DEFAULT_OPTIONS)

    @classmethod
    def normalized(cls, spec: GraphSpec, target: Target, options: CompileOptions | None = None) -> PlanQuery:
        """A query of a spec this process normalized already (plancache.cudnn's
        capture, a worker's verified job): nothing is checked again."""
        return cls(spec, target, options or DEFAULT_OPTIONS)

    @classmethod
    def from_wire(
        cls,
        spec: pb.GraphSpec,
        target: pb.Target,
        options: pb.CompileOptions,
        limits: Limits = DEFAULT_LIMITS,
        *,
        refuse_unknown_fields: bool = False,
    ) -> PlanQuery:
        """A query as another process sent it: parsed, validated and normalized
        here (InvalidRequest or SpecError naming what does not hold).
        `refuse_unknown_fields`: a field this version does not know is an
        error (a caller's request), not skipped."""
        if refuse_unknown_fields:
            for message, where in ((spec, "spec"), (target, "target"), (options, "options")):
                spec_io.refuse_unknown_fields(message, where)
        parsed_target, parsed_options = Target.from_proto(target), CompileOptions.from_proto(options)
        return cls(normalize(spec_io.from_proto(spec), limits), parsed_target, parsed_options)

    @classmethod
    def from_proto(cls, msg: pb.PlanQuery, limits: Limits = DEFAULT_LIMITS) -> PlanQuery:
        return cls.from_wire(msg.spec, msg.target, msg.options, limits)

    @functools.cached_property
    def spec_hash(self) -> str:
        """sha256 of the canonical form (plancache.graphspec.canonical), computed once."""
        return hash_normalized(self.spec)

    @functools.cached_property
    def key(self) -> str:
        return make_key(self.spec_hash, self.target, self.options)

    @functools.cached_property
    def op_family(self) -> str:
        """The op family that anchors the graph (statistics count by it)."""
        return anchor_family([n.op for n in self.spec.nodes])

    @functools.cached_property
    def spec_proto(self) -> pb.GraphSpec:
        """The normalized spec's wire form, made once: do not modify it."""
        return spec_io.to_proto(self.spec)

    @functools.cached_property
    def proto(self) -> pb.PlanQuery:
        """The query's wire form, made once (a gateway hands it to every job of the query): do not modify it."""
        return pb.PlanQuery(spec=self.spec_proto, target=self.target.to_proto(), options=self.options.to_proto())

    def to_proto(self) -> pb.PlanQuery:
        """The wire form (the one made once: do not modify it)."""
        return self.proto

    def retargeted(self, target: Target | None = None, options: CompileOptions | None = None) -> PlanQuery:
        """The same spec (its hash and wire form kept) for another target or options."""
        other = dataclasses.replace(self, target=target or self.target, options=options or self.options)
        for kept in ("spec_hash", "op_family", "spec_proto"):  # not `proto` nor `key`: they name the target
            if kept in self.__dict__:
                other.__dict__[kept] = self.__dict__[kept]
        return other

    def __repr__(self) -> str:
        return f"PlanQuery({self.key})"

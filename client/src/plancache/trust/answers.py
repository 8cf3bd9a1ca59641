"""A plan is accepted only as the answer to what was asked.

A valid signature says a worker built the plan; it does not say the plan is
the one this call asked for. A rogue or intercepted server could answer a
request for plan A with a validly signed plan B (another graph, another
GPU). Every plan a client receives, from the server or from its disk cache,
is checked against the request: its key, and for a query also its spec
hash, the target it was built on and its options.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from plancache.errors import InvalidRequest, UntrustedPlan
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb


@dataclass(frozen=True)
class Asked:
    key: str
    spec_hash: str | None = None
    target: Target | None = None
    options: CompileOptions | None = None

    @classmethod
    def of(cls, query: PlanQuery) -> Asked:
        """What a query asks for: its key, spec hash, target and options."""
        return cls(query.key, query.spec_hash, query.target, query.options)

    def check(self, metadata: pb.PlanMetadata) -> None:
        """UntrustedPlan naming both plans unless `metadata` answers this request."""
        if metadata.key != self.key:
            raise UntrustedPlan(
                f"asked for plan {self.key} but was answered with plan {metadata.key[:300]}: refused (substituted plan)"
            )
        if self.spec_hash is not None and metadata.spec_hash != self.spec_hash:
            raise UntrustedPlan(
                f"plan {self.key}: its metadata names spec {metadata.spec_hash[:100]}, "
                f"not the spec asked for ({self.spec_hash})"
            )
        if self.options is not None and _options_id(metadata.options.SerializeToString()) != self.options.id:
            raise UntrustedPlan(f"plan {self.key}: built with other options than asked for")
        if self.target is not None:
            try:
                built_on = _target_of(metadata.target.SerializeToString())
            except InvalidRequest as e:
                raise UntrustedPlan(f"plan {self.key}: its build target does not parse ({e.message})") from None
            if not _satisfied(built_on, self.target):
                raise UntrustedPlan(
                    f"plan {self.key} was built on {built_on.id}, which is not the target asked for ({self.target.id})"
                )


# Every plan a call takes is checked: the few options and targets a process meets are parsed and
# hashed once each (a check cost 0.77 ms a plan on the H200's host, GPU run 27; issue 41).
@functools.lru_cache(maxsize=256)
def _options_id(serialized: bytes) -> str:
    return CompileOptions.from_proto(pb.CompileOptions.FromString(serialized)).id


@functools.lru_cache(maxsize=256)
def _target_of(serialized: bytes) -> Target:
    return Target.from_proto(pb.Target.FromString(serialized))


@functools.lru_cache(maxsize=256)
def _satisfied(built_on: Target, asked: Target) -> bool:
    return satisfies(built_on, asked)


def satisfies(built_on: Target, asked: Target) -> bool:
    """Whether a plan built on `built_on` runs where `asked` names (a generic
    target accepts any device of its kind and versions)."""
    if built_on.generic().id != asked.generic().id:
        return False
    device_ok = not asked.device_name or Target.parse(built_on.id).device_name == Target.parse(asked.id).device_name
    return device_ok and (not asked.sm_count or built_on.sm_count == asked.sm_count)

"""Warming, as an operator sees it (Client.warm, Client.warm_status, `plancache warm`).

A target warmed is one whose plans are built before its nodes ask: after an
upgrade of cuDNN or the frontend, or for a new GPU kind, the workers of the
new target build the specs another source served, most hit first.
"""

from __future__ import annotations

from dataclasses import dataclass

from plancache.v1 import plancache_pb2 as pb


@dataclass(frozen=True)
class WarmStatus:
    target_id: str
    source: str
    state: str  # "active", "done" or "cancelled"
    total: int
    built: int
    skipped: int  # already stored, or being built for a caller
    failed: int
    in_flight: int
    remaining: int
    coverage: float  # share of the source's last-24 h hits whose plan is stored for the target
    source_hits_24h: float
    covered_hits_24h: float
    missing_specs: int  # source plans built before workers kept their specs
    created_at: float
    updated_at: float
    failures: tuple[tuple[str, str], ...]  # (plan key, reason), newest first

    @classmethod
    def from_proto(cls, s: pb.WarmTargetStatus) -> WarmStatus:
        return cls(
            s.target_id,
            s.source,
            s.state,
            s.total,
            s.built,
            s.skipped,
            s.failed,
            s.in_flight,
            s.remaining,
            s.coverage,
            s.source_hits_24h,
            s.covered_hits_24h,
            s.missing_specs,
            s.created_at,
            s.updated_at,
            tuple((f.plan_key, f.reason) for f in s.failures),
        )

    def line(self) -> str:
        return (
            f"{self.target_id:70} {self.state:9} {self.built:6} built {self.skipped:6} skipped {self.failed:5} failed "
            f"{self.remaining:6} to do  {self.coverage:6.1%} of {self.source_hits_24h:.0f} hits covered  "
            f"(from {self.source})"
        )

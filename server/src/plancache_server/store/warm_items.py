"""A warming plan's items, the states a plan and its items go through, and
the reading of the plan's JSON fields (plancache_server.store.warming).

An item is a complete build query for the warmed target, as a job of its
own (WARM_JOB_PREFIX names a warm build's job); nothing here trusts
Redis: the worker derives an item's plan key again before building it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from plancache.v1 import plancache_pb2 as pb
from plancache_server.store.jobs import Job

WARM_JOB_PREFIX = "warm-"
# A plan's states, and an item's outcomes.
ACTIVE, DONE, CANCELLED = "active", "done", "cancelled"
BUILT, SKIPPED, FAILED = "built", "skipped", "failed"


@dataclass(frozen=True)
class WarmItem:
    index: int
    plan_key: str  # for the warmed target
    source_key: str  # the source plan it comes from ("" for a manifest's entry)
    hits: float  # the source's recent hits of it
    query: pb.PlanQuery

    def job(self) -> Job:
        return Job(job_id=f"{WARM_JOB_PREFIX}{uuid.uuid4().hex}", plan_key=self.plan_key, query=self.query)

    def encode(self) -> str:
        return json.dumps(
            {
                "plan_key": self.plan_key,
                "source_key": self.source_key,
                "hits": self.hits,
                "query": self.query.SerializeToString().hex(),
            }
        )

    @classmethod
    def decode(cls, index: int, raw: bytes) -> WarmItem:
        fields = json.loads(raw)
        return cls(
            index,
            str(fields["plan_key"]),
            str(fields["source_key"]),
            float(fields["hits"]),
            pb.PlanQuery.FromString(bytes.fromhex(fields["query"])),
        )


def loads(raw: bytes | str) -> Any:
    """A plan's or an outcome's JSON field; None when Redis holds something else."""
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return None

"""Graph families asked for per target (plancache.graphspec.family): what was
asked, under the family's key, and how much of it is stored now.

A record holds the family's definition (its wire form), the plan keys of
its graphs as the gateway derived them, and when it was asked. Nothing
is built from a record: the gateway queues each graph's build from the
definition it was sent (plancache_server.store.warming.Warming.extend), and
a worker derives the plan key of what it builds again. A forged record can
only make a status count wrong.

Blocking (gateways call it through a thread, as warming).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.redis_conn import text, translated_errors

# Plan keys counted per pipeline when a status is read.
_BATCH = 500


@dataclass(frozen=True)
class FamilyRecord:
    family_key: str
    target_id: str
    members: tuple[str, ...]
    created_at: float


class FamilyRecords:
    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._clock = clock

    def put(self, family_key: str, target_id: str, family: pb.GraphFamily, members: Sequence[str]) -> FamilyRecord:
        """Record a family (again: its first time is kept)."""
        now = self._clock()
        with translated_errors("recording a graph family"):
            name = keys.graph_family(family_key)
            self._redis.hsetnx(name, "created_at", json.dumps(now))
            self._redis.hset(
                name,
                mapping={
                    "target": target_id,
                    "members": "\n".join(members),
                    "family": family.SerializeToString().hex(),
                },
            )
            created = self._redis.hget(name, "created_at")
        return FamilyRecord(family_key, target_id, tuple(members), float(json.loads(created)) if created else now)

    def get(self, family_key: str) -> FamilyRecord | None:
        with translated_errors("reading a graph family"):
            raw = self._redis.hmget(keys.graph_family(family_key), ["target", "members", "created_at"])
        if raw[0] is None:
            return None
        try:
            created = float(json.loads(raw[2])) if raw[2] else 0.0
        except (ValueError, TypeError):
            created = 0.0
        members = tuple(m for m in text(raw[1] or b"").split("\n") if m)
        return FamilyRecord(family_key, text(raw[0]), members, created)

    def stored(self, members: Sequence[str]) -> list[bool]:
        """Which of `members` (plan keys) are stored now."""
        found: list[bool] = []
        with translated_errors("counting a family's stored plans"):
            for start in range(0, len(members), _BATCH):
                pipe = self._redis.pipeline(transaction=False)
                for key in members[start : start + _BATCH]:
                    pipe.exists(keys.plan(key))
                found += [bool(x) for x in pipe.execute()]
        return found

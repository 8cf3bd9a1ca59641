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


# Seconds a cancelled family's members stay skipped (a worker meets them within the warming queue's life).
CANCELLED_TTL_S = 7 * 86400
# A day's budget counts expire after two (the day asked for, and the one a late ask falls in).
BUDGET_TTL_S = 2 * 86400
# Families the index keeps (the latest asked; older records stay readable by key).
INDEXED = 1000


@dataclass(frozen=True)
class FamilyRecord:
    family_key: str
    target_id: str
    members: tuple[str, ...]
    created_at: float
    workload: str = ""
    cancelled: bool = False


@dataclass(frozen=True)
class MemberCounts:
    """A family's stored members now: how many, how many were ever served, their blobs' bytes."""

    stored: list[bool]
    fetched: int
    bytes: int


class FamilyRecords:
    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._clock = clock

    def put(
        self, family_key: str, target_id: str, family: pb.GraphFamily, members: Sequence[str], workload: str = ""
    ) -> FamilyRecord:
        """Record a family (again: its first time is kept; asked again, it is not cancelled any more)."""
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
                    "workload": workload,
                    "cancelled": "0",
                },
            )
            if members:
                self._redis.srem(keys.family_cancelled(target_id), *members)
            created = self._redis.hget(name, "created_at")
            self._redis.zadd(keys.GRAPH_FAMILIES, {family_key: float(json.loads(created)) if created else now}, nx=True)
            self._redis.zremrangebyrank(keys.GRAPH_FAMILIES, 0, -(INDEXED + 1))
        return FamilyRecord(
            family_key, target_id, tuple(members), float(json.loads(created)) if created else now, workload
        )

    def latest(self, count: int) -> list[FamilyRecord]:
        """The `count` families asked for last (newest first)."""
        with translated_errors("listing graph families"):
            found = [text(k) for k in self._redis.zrevrange(keys.GRAPH_FAMILIES, 0, count - 1)]
        return [record for key in found if (record := self.get(key)) is not None]

    def spend(self, target_id: str, workload: str, wanted: int, budget: int) -> int:
        """Of `wanted` members, how many `workload` may queue on `target_id` today within `budget`
        (those are counted); 0 <= granted <= wanted."""
        if wanted <= 0:
            return 0
        name = keys.family_budget(target_id, int(self._clock() // 86400))
        with translated_errors("counting a workload's family budget"):
            after = int(self._redis.hincrby(name, workload, wanted))
            self._redis.expire(name, BUDGET_TTL_S)
            granted = max(0, min(wanted, budget - (after - wanted)))
            if granted < wanted:  # give back what was not granted
                self._redis.hincrby(name, workload, granted - wanted)
        return granted

    def cancel(self, record: FamilyRecord) -> list[bool]:
        """Mark `record` cancelled; its members not stored are skipped by the workers. Their stored flags."""
        stored = self.stored(list(record.members))
        unbuilt = [key for key, present in zip(record.members, stored, strict=True) if not present]
        with translated_errors("cancelling a graph family"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hset(keys.graph_family(record.family_key), "cancelled", "1")
            if unbuilt:
                pipe.sadd(keys.family_cancelled(record.target_id), *unbuilt)
                pipe.expire(keys.family_cancelled(record.target_id), CANCELLED_TTL_S)
            pipe.execute()
        return stored

    def is_cancelled(self, target_id: str, plan_key: str) -> bool:
        """Whether a warming item of `plan_key` belongs to a cancelled family (a worker's check)."""
        with translated_errors("reading cancelled families"):
            return bool(self._redis.sismember(keys.family_cancelled(target_id), plan_key))

    def counts(self, members: Sequence[str]) -> MemberCounts:
        """Which members are stored, how many of those were ever served (in the index of last use:
        plancache_server.store.stats moves a served warmed plan there), and their blobs' bytes. Not "absent
        from the warmed index": a blob just written is in neither index until its worker accounts for it."""
        stored: list[bool] = []
        fetched = size = 0
        with translated_errors("counting a family's stored plans"):
            for start in range(0, len(members), _BATCH):
                chunk = members[start : start + _BATCH]
                pipe = self._redis.pipeline(transaction=False)
                for key in chunk:
                    pipe.hstrlen(keys.plan(key), "blob")
                pipe.zmscore(keys.PLAN_INDEX, list(chunk))
                *lengths, last_used = pipe.execute()
                for length, used in zip(lengths, last_used, strict=True):
                    stored.append(bool(length))
                    if length:
                        size += int(length)
                        fetched += used is not None
        return MemberCounts(stored, fetched, size)

    def get(self, family_key: str) -> FamilyRecord | None:
        with translated_errors("reading a graph family"):
            raw = self._redis.hmget(
                keys.graph_family(family_key), ["target", "members", "created_at", "workload", "cancelled"]
            )
        if raw[0] is None:
            return None
        workload, cancelled = raw[3], raw[4]
        try:
            created = float(json.loads(raw[2])) if raw[2] else 0.0
        except (ValueError, TypeError):
            created = 0.0
        members = tuple(m for m in text(raw[1] or b"").split("\n") if m)
        return FamilyRecord(family_key, text(raw[0]), members, created, text(workload or b""), cancelled == b"1")

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

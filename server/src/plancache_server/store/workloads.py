"""Workloads' start-up records: per workload and target, the stored plans its
processes used, in the order they first used them. A new process of the
workload reads its record (GetWorkload) and streams those plans before its
graphs ask for them (plancache.transport.workload is the client's side).

Nothing in a record is trusted. A name is one of NAME's. A key is recorded
only when it is one of the report's target whose plan this service holds or
builds or was asked to build (a job on record; the caller checks), and listed
only when its plan is stored when it is read. A record holds at most `capacity` keys (least recently used out),
and at most MAX_WORKLOADS records exist (the least recently reported goes,
with its record). A forged or stale record makes a process fetch plans it
does not use, within those bounds and the client's own; each graph of that
process still asks for its own key and verifies what answers it, so it never
runs a wrong plan.

Two processes of one name on one target share a record (a collision): each
streams the other's plans too, counted as wasted, and a process whose stream
brought none of its first graphs stops it and says so (`stopped`: what an
operator reads as "give these programs their own names"); names are per
program by default (plancache.transport.workload.default_name) and settable.

A process says once, at its end, whether its stream served it (a verdict:
it did not stop, and at most a quarter of the plans the record listed went
unused by the process). A record whose last verdicts (at most
VERDICTS_KEPT, at least one) all say served is settled: a new process
deserializes its plans as they arrive, before its graphs ask; otherwise it
holds them until its graphs have taken the record in order
(plancache.transport.workload). A forged verdict can only make a process
deserialize plans it does not use, within its bound; the verdicts read are
the newest VERDICTS_KEPT, whatever the key holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from plancache.errors import InvalidRequest
from plancache.keys.workload_names import NAME
from plancache_server.store import keys
from plancache_server.store.build_records import QUEUED, RUNNING
from plancache_server.store.redis_conn import AsyncRedis, text

# Records one service keeps (every target together); the least recently reported goes first.
MAX_WORKLOADS = 1024
# Plan keys one report may add to a record (a client sends at most this many a report).
MAX_USES = 512
# "served" and "mixed": processes' verdicts on their stream (module doc), as counted.
COUNTS = ("processes", "listed", "prefetched", "used", "wasted", "stopped", "recorded", "served", "mixed")
# A job's states while its plan is not stored yet: a record keeps such a key (listed once stored).
BUILDING = (QUEUED, RUNNING)
# Verdicts a record keeps (its processes' last): settled when every one kept says served.
VERDICTS_KEPT = 4
_SEP = "|"


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidRequest(f"a workload name is 1 to 128 of [A-Za-z0-9._:/@+-], not {name[:140]!r}")
    return name


@dataclass(frozen=True)
class WorkloadSummary:
    """One record, as the status page and /metrics show it."""

    target_id: str
    name: str
    plans: int
    last_seen: float
    counts: Mapping[str, int]


@dataclass(frozen=True)
class RecordRead:
    """A record as a new process reads it (GetWorkloadResponse)."""

    plan_keys: list[str]
    complete: bool
    settled: bool


class WorkloadRecords:
    def __init__(self, client: AsyncRedis, capacity: int, clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self.capacity = max(0, capacity)
        self._clock = clock

    async def record(
        self,
        target_id: str,
        name: str,
        uses: Sequence[tuple[str, int]],
        counts: Mapping[str, int],
        served: bool | None = None,
    ) -> int:
        """Add a process's first uses (plan key, order; already checked), its
        prefetch counts and its verdict on its stream (`served`; None: none
        said) to the record; trim it to `capacity`. How many keys it recorded."""
        if self.capacity == 0:
            return 0
        now = self._clock()
        recency, order = keys.workload_recency(target_id, name), keys.workload_order(target_id, name)
        pipe = self._redis.pipeline(transaction=False)
        if uses:
            # Within one report, a key first used later is the more recently used (a microsecond per place).
            pipe.zadd(recency, {key: now + position * 1e-6 for key, position in uses})
            pipe.hset(order, mapping={key: str(position) for key, position in uses})
        totals = {field: amount for field, amount in counts.items() if field in COUNTS and amount > 0}
        if uses:
            totals["recorded"] = totals.get("recorded", 0) + len(uses)
        if served is not None:
            totals["served" if served else "mixed"] = 1
        for field, amount in totals.items():
            pipe.hincrby(keys.workload_counts(target_id, name), field, amount)
        if served is not None:
            verdicts = keys.workload_verdicts(target_id, name)
            pipe.lpush(verdicts, "1" if served else "0")
            pipe.ltrim(verdicts, 0, VERDICTS_KEPT - 1)
        pipe.zadd(keys.WORKLOADS, {f"{target_id}{_SEP}{name}": now})
        pipe.zcard(recency)
        pipe.zcard(keys.WORKLOADS)
        *_, plans, workloads = await pipe.execute()
        if int(plans) > self.capacity:
            gone = cast(list[tuple[Any, float]], await self._redis.zpopmin(recency, int(plans) - self.capacity))
            if gone:
                await self._redis.hdel(order, *[text(member) for member, _ in gone])
                # From now on the record does not list everything the workload used (plans(): complete).
                await self._redis.hincrby(keys.workload_counts(target_id, name), "evicted", len(gone))
        if int(workloads) > MAX_WORKLOADS:
            extra = int(workloads) - MAX_WORKLOADS
            dropped = cast(list[tuple[Any, float]], await self._redis.zpopmin(keys.WORKLOADS, extra))
            for member, _ in dropped:
                old_target, _, old_name = text(member).partition(_SEP)
                await self._forget(old_target, old_name)
        return len(uses)

    async def stored(self, plan_keys: Sequence[str], *, or_built: bool = False) -> list[bool]:
        """Which of `plan_keys` have a stored plan now (one pipeline); `or_built`: or a build job on record
        (queued, running or ended: a graph someone asked this service to build, which a record may name; it lists
        it once it is stored)."""
        if not plan_keys:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for key in plan_keys:
            pipe.exists(keys.plan(key), *((keys.job_state(key),) if or_built else ()))
        return [bool(x) for x in await pipe.execute()]

    async def _building(self, plan_keys: Sequence[str]) -> set[str]:
        """Which of `plan_keys` (not stored) have a build queued or running (one pipeline)."""
        if not plan_keys:
            return set()
        pipe = self._redis.pipeline(transaction=False)
        for key in plan_keys:
            pipe.hget(keys.job_state(key), "state")
        states = await pipe.execute()
        return {key for key, state in zip(plan_keys, states, strict=True) if text(state or b"") in BUILDING}

    async def plans(self, target_id: str, name: str) -> RecordRead:
        """The record's keys whose plans are stored now, first used first (a
        process asking: counted, where a record exists; a read never makes one),
        whether the record is complete: it never let a plan go for its bound
        (a plan deleted from the store leaves it complete: not stored, it would
        miss anyway), and whether it is settled (module doc)."""
        if self.capacity == 0:
            return RecordRead([], complete=False, settled=False)
        recency, order = keys.workload_recency(target_id, name), keys.workload_order(target_id, name)
        members = [text(m) for m in await self._redis.zrange(recency, -self.capacity, -1)]
        if not members:
            return RecordRead([], complete=False, settled=False)
        newest = await self._redis.lrange(keys.workload_verdicts(target_id, name), 0, VERDICTS_KEPT - 1)
        settled = bool(newest) and all(text(v) == "1" for v in newest)
        # Complete unless it let a plan go, or holds more than it now lists (--workload-plans lowered since).
        evicted = await self._redis.hget(keys.workload_counts(target_id, name), "evicted")
        complete = evicted is None and int(await self._redis.zcard(recency)) <= self.capacity
        positions = await self._redis.hmget(order, members)
        stored = await self.stored(members)
        building = await self._building([key for key, exists in zip(members, stored, strict=True) if not exists])
        listed: list[tuple[int, str]] = []
        gone: list[str] = []
        for key, position, exists in zip(members, positions, stored, strict=True):
            if not exists:
                if key not in building:  # a build under way (a stored-only ask's): listed once stored
                    gone.append(key)
                continue
            try:
                rank = int(text(position)) if position is not None else 1 << 30
            except ValueError:
                rank = 1 << 30
            listed.append((rank, key))
        listed.sort()
        pipe = self._redis.pipeline(transaction=False)
        if gone:  # deleted or evicted since: out of the record
            pipe.zrem(recency, *gone)
            pipe.hdel(order, *gone)
        counts = keys.workload_counts(target_id, name)
        pipe.hincrby(counts, "processes", 1)
        pipe.hincrby(counts, "listed", len(listed))
        await pipe.execute()
        return RecordRead([key for _, key in listed], complete=complete, settled=settled)

    async def summaries(self, limit: int = 50) -> list[WorkloadSummary]:
        """The most recently reported records, newest first."""
        found = cast(
            list[tuple[Any, float]],
            await self._redis.zrevrange(keys.WORKLOADS, 0, max(0, limit - 1), withscores=True),
        )
        if not found:
            return []
        named = [(text(member).partition(_SEP), float(score)) for member, score in found]
        pipe = self._redis.pipeline(transaction=False)
        for (target_id, _, name), _ in named:
            pipe.zcard(keys.workload_recency(target_id, name))
            pipe.hgetall(keys.workload_counts(target_id, name))
        answers = await pipe.execute()
        out = []
        for index, ((target_id, _, name), seen) in enumerate(named):
            plans, raw = answers[2 * index], answers[2 * index + 1] or {}
            counts = {field: 0 for field in COUNTS}
            for field, value in raw.items():
                try:
                    counts[text(field)] = int(text(value))
                except ValueError:
                    continue
            out.append(WorkloadSummary(target_id, name, int(plans), seen, counts))
        return out

    async def _forget(self, target_id: str, name: str) -> None:
        await self._redis.delete(
            keys.workload_recency(target_id, name),
            keys.workload_order(target_id, name),
            keys.workload_counts(target_id, name),
            keys.workload_verdicts(target_id, name),
        )

"""Counters shared by every gateway: per target and per op family, in total
and over sliding windows (5 min, 1 h, 24 h).

Counting must not slow the hit path or fail it: a gateway adds to local
counters (a dict update on the event loop, no lock) and a background task
flushes them to Redis about once a second; a flush that cannot reach Redis
is dropped (dashboards lose a few counts during an outage, callers lose
nothing). Windows come from minute buckets (kept 2 h) and hour buckets
(kept 26 h) next to each total; the same buckets draw the status page's hit
rate over time. Hits are also counted per plan key (hits, build seconds
saved) for its top entries.

Counters exist per target only for targets that exist (see
plancache_server.store.directory): the rest share one bucket, so the number of
Redis keys does not grow with what callers invent.

What nodes report of their own graphs (ReportFirstUses: served, from their
disk cache, built locally and why) is counted the same way, in a fleet
scope per target whose fields plancache_server.store.fleet names, and races
in one fleet-wide scope; the spec hashes of graphs built locally (where a
node's operator opted in) are ranked like plans' hits.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import defaultdict
from dataclasses import dataclass

from plancache.errors import StoreUnavailable
from plancache_server.store import keys
from plancache_server.store.directory import OTHER_TARGETS, WorkerDirectory
from plancache_server.store.redis_conn import AsyncRedis, stop_task, text, translated_errors

log = logging.getLogger(__name__)

MINUTE_BUCKET_TTL_S = 2 * 3600
HOUR_BUCKET_TTL_S = 26 * 3600
PLAN_HITS_TTL_S = 26 * 3600
WINDOWS = ("5m", "1h", "24h", "total")
BUCKET_SECONDS = {"m": 60, "h": 3600}
# Plans ranked per leaderboard; past that the least-hit ones are dropped
# (a plan that comes back starts counting again).
TOP_ENTRIES_KEPT = 10_000
# Spec hashes of graphs built locally ranked (opted-in nodes); past that the least built are dropped.
LOCAL_SPECS_KEPT = 1_000
# Distinct unknown target ids one gateway keeps apart between two flushes;
# past it they are counted under OTHER_TARGETS at once (memory stays bounded).
MAX_PENDING_TARGETS = 1_000


class Counter(enum.Enum):
    HITS = "hits"
    MISSES = "misses"
    COMPILES = "compiles"
    FAILURES = "failures"
    JOINED = "joined"
    BYTES_SERVED = "bytes_served"
    SECONDS_SAVED = "build_seconds_saved"
    REFUSED = "refused"  # TargetUnavailable: no live worker for the target
    UNTRUSTED = "untrusted_builds"  # builds whose plan the gateway refused (UntrustedBuild)
    # Hedged misses as nodes reported them (ReportFirstUses): the node's own build ran first, or the service's plan.
    FIRST_USES_LOCAL = "first_uses_local"
    FIRST_USES_SERVED = "first_uses_served"


def target_scope(target_id: str) -> str:
    return f"target:{target_id}"


def family_scope(family: str) -> str:
    return f"family:{family}"


def fleet_scope(target_id: str) -> str:
    """Graphs nodes reported for one target (fields: plancache_server.store.fleet)."""
    return f"fleet:{target_id}"


# Races nodes reported, fleet-wide ("<path>|<result>" fields).
RACES_SCOPE = "fleet-races"


# scope -> window -> counter name -> value
Readings = dict[str, dict[str, dict[str, float]]]


@dataclass(frozen=True)
class Bucket:
    start: float  # unix seconds
    values: dict[str, float]


@dataclass(frozen=True)
class PlanCounts:
    plan_key: str
    hits: float
    build_seconds_saved: float


class Ranking(enum.Enum):
    HITS = keys.TOP_HITS
    SECONDS_SAVED = keys.TOP_SECONDS_SAVED


class Stats:
    def __init__(self, client: AsyncRedis, directory: WorkerDirectory, flush_interval_s: float = 1.0) -> None:
        self._redis = client
        self._directory = directory
        self._interval = flush_interval_s
        # (target id, or a family scope) -> counter -> amount, since the last flush
        self._pending: defaultdict[tuple[str, str], float] = defaultdict(float)
        self._pending_targets: set[str] = set()
        self._plan_hits: defaultdict[str, float] = defaultdict(float)
        self._plan_saved: defaultdict[str, float] = defaultdict(float)
        self._local_specs: defaultdict[str, float] = defaultdict(float)
        self._task: asyncio.Task[None] | None = None
        # A flush and forgetting plans never interleave: a flush's writes of a
        # plan's hits must not land after that plan was forgotten.
        self._writing = asyncio.Lock()

    def incr(self, counter: Counter, amount: float = 1.0, *, target_id: str, family: str | None = None) -> None:
        self._add(counter, amount, target_id, family)

    def hit(
        self, plan_key: str, bytes_served: int, seconds_saved: float, *, target_id: str, family: str | None = None
    ) -> None:
        """One served plan: the hit, its bytes, the build time it saved, and
        its per-plan counts for the top entries."""
        self._add(Counter.HITS, 1.0, target_id, family)
        self._add(Counter.BYTES_SERVED, bytes_served, target_id, family)
        self._add(Counter.SECONDS_SAVED, seconds_saved, target_id, family)
        self._plan_hits[plan_key] += 1
        self._plan_saved[plan_key] += seconds_saved

    def fleet(self, target_id: str, field: str, amount: float) -> None:
        """Graphs of one target a node reported (the field says which: plancache_server.store.fleet)."""
        self._pending[(fleet_scope(self._bounded(target_id)), field)] += amount

    def race(self, field: str, amount: float) -> None:
        """Races a node reported, fleet-wide."""
        self._pending[(RACES_SCOPE, field)] += amount

    def local_spec(self, member: str, amount: float) -> None:
        """A graph built locally, named by its spec hash (a node opted in): ranked in keys.FLEET_LOCAL_SPECS."""
        self._local_specs[member] += amount

    def _bounded(self, target_id: str) -> str:
        if target_id not in self._pending_targets:
            if len(self._pending_targets) >= MAX_PENDING_TARGETS and target_id not in self._directory.known:
                target_id = OTHER_TARGETS
            self._pending_targets.add(target_id)
        return target_id

    def _add(self, counter: Counter, amount: float, target_id: str, family: str | None) -> None:
        self._pending[(self._bounded(target_id), counter.value)] += amount
        if family:
            self._pending[(family_scope(family), counter.value)] += amount

    def _scope_of(self, where: str) -> str:
        """The scope a pending count goes to: a target's (bounded by the directory), or one made already."""
        if where.startswith((family_scope(""), RACES_SCOPE)):
            return where
        if where.startswith(fleet_scope("")):
            return fleet_scope(self._directory.scope(where.removeprefix(fleet_scope(""))))
        return target_scope(self._directory.scope(where))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="plancache-stats")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.flush()

    async def flush(self) -> None:
        async with self._writing:
            await self._flush()

    async def _flush(self) -> None:
        pending, self._pending = self._pending, defaultdict(float)
        targets, self._pending_targets = self._pending_targets, set()
        plan_hits, self._plan_hits = self._plan_hits, defaultdict(float)
        plan_saved, self._plan_saved = self._plan_saved, defaultdict(float)
        local_specs, self._local_specs = self._local_specs, defaultdict(float)
        if not pending and not plan_hits and not local_specs:
            return
        now = time.time()
        minute, hour = int(now // BUCKET_SECONDS["m"]), int(now // BUCKET_SECONDS["h"])
        try:
            if not targets <= self._directory.known | {OTHER_TARGETS}:
                # A target may have been advertised since the last refresh (at most one refresh per flush).
                await self._directory.refresh()
            scoped: defaultdict[tuple[str, str], float] = defaultdict(float)
            for (where, name), amount in pending.items():
                scoped[(self._scope_of(where), name)] += amount
            with translated_errors("counting"):
                pipe = self._redis.pipeline(transaction=False)
                for (scope, name), amount in scoped.items():
                    pipe.hincrbyfloat(keys.stats(scope), name, amount)
                    for bucket, ttl in (
                        (keys.stats_bucket(scope, "m", minute), MINUTE_BUCKET_TTL_S),
                        (keys.stats_bucket(scope, "h", hour), HOUR_BUCKET_TTL_S),
                    ):
                        pipe.hincrbyfloat(bucket, name, amount)
                        pipe.expire(bucket, ttl)
                    pipe.sadd(keys.STATS_SCOPES, scope)
                if plan_hits:  # last use, for retention and the store's bound (plancache_server.store.lifecycle)
                    pipe.zadd(keys.PLAN_INDEX, dict.fromkeys(plan_hits, now), gt=True)
                    pipe.zrem(keys.WARMED_INDEX, *plan_hits)  # a warmed plan, served: an ordinary one now
                    # This hour's hits per plan: warming orders specs by their recent hits
                    # (plancache_server.store.warming).
                    for plan_key, amount in plan_hits.items():
                        pipe.zincrby(keys.plan_hits(hour), amount, plan_key)
                    pipe.expire(keys.plan_hits(hour), PLAN_HITS_TTL_S)
                    pipe.zremrangebyrank(keys.plan_hits(hour), 0, -(TOP_ENTRIES_KEPT + 1))
                for member, amount in local_specs.items():
                    pipe.zincrby(keys.FLEET_LOCAL_SPECS, amount, member)
                if local_specs:
                    pipe.zremrangebyrank(keys.FLEET_LOCAL_SPECS, 0, -(LOCAL_SPECS_KEPT + 1))
                for ranking, per_plan in ((Ranking.HITS, plan_hits), (Ranking.SECONDS_SAVED, plan_saved)):
                    if per_plan:
                        for plan_key, amount in per_plan.items():
                            pipe.zincrby(ranking.value, amount, plan_key)
                        pipe.zremrangebyrank(ranking.value, 0, -(TOP_ENTRIES_KEPT + 1))
                await pipe.execute()
        except StoreUnavailable as e:
            log.debug("dropped %d pending counts: %s", len(pending), e)

    async def close(self) -> None:
        await stop_task(self._task)
        await self.flush()

    async def read(self) -> Readings:
        """Every scope's counters per window (this gateway's pending counts flushed first)."""
        await self.flush()
        now = time.time()
        scopes = await self.scopes()
        names: list[str] = []
        for scope in scopes:
            names.append(keys.stats(scope))
            names += [keys.stats_bucket(scope, "m", m) for m in _bucket_indices("m", 60, now)]
            names += [keys.stats_bucket(scope, "h", h) for h in _bucket_indices("h", 24, now)]
        replies = await self._hgetall(names)
        per_scope = 1 + 60 + 24
        readings: Readings = {}
        for i, scope in enumerate(scopes):
            total, minutes, hours = (
                replies[i * per_scope],
                replies[i * per_scope + 1 : i * per_scope + 61],
                replies[i * per_scope + 61 : (i + 1) * per_scope],
            )
            readings[scope] = {
                "5m": _sum(minutes[-5:]),
                "1h": _sum(minutes),
                "24h": _sum(hours),
                "total": _sum([total]),
            }
        return readings

    async def scopes(self) -> list[str]:
        with translated_errors("reading stats"):
            return sorted(text(s) for s in await self._redis.smembers(keys.STATS_SCOPES))

    async def history(self, scopes: list[str], unit: str, count: int) -> dict[str, list[Bucket]]:
        """The last `count` minute ("m") or hour ("h") buckets of each scope,
        oldest first, the current (partial) one last."""
        await self.flush()
        indices = _bucket_indices(unit, count, time.time())
        replies = await self._hgetall([keys.stats_bucket(scope, unit, i) for scope in scopes for i in indices])
        width = BUCKET_SECONDS[unit]
        return {
            scope: [
                Bucket(start=float(i * width), values=_sum([replies[n * count + j]])) for j, i in enumerate(indices)
            ]
            for n, scope in enumerate(scopes)
        }

    async def top(self, ranking: Ranking, count: int) -> list[PlanCounts]:
        """The plans with the most hits, or the most build seconds saved."""
        await self.flush()
        with translated_errors("reading top entries"):
            ranked = [text(key) for key in await self._redis.zrevrange(ranking.value, 0, count - 1)]
            if not ranked:
                return []
            pipe = self._redis.pipeline(transaction=False)
            pipe.zmscore(Ranking.HITS.value, ranked)
            pipe.zmscore(Ranking.SECONDS_SAVED.value, ranked)
            hits, saved = await pipe.execute()
        return [PlanCounts(key, float(h or 0), float(s or 0)) for key, h, s in zip(ranked, hits, saved, strict=True)]

    async def local_specs(self, count: int) -> list[tuple[str, float]]:
        """The graphs nodes built locally most (members of keys.FLEET_LOCAL_SPECS), with their counts."""
        await self.flush()
        with translated_errors("reading the graphs built locally"):
            ranked = await self._redis.zrevrange(keys.FLEET_LOCAL_SPECS, 0, count - 1, withscores=True)
        return [(text(pair[0]), float(pair[1])) for pair in ranked]

    async def forget_plans(self, plan_keys: list[str]) -> None:
        """Drop deleted plans from the top entries, with this gateway's
        counts of them not yet flushed (they would bring a plan back)."""
        if not plan_keys:
            return
        async with self._writing:
            for plan_key in plan_keys:
                self._plan_hits.pop(plan_key, None)
                self._plan_saved.pop(plan_key, None)
            with translated_errors("forgetting plans"):
                for ranking in Ranking:
                    await self._redis.zrem(ranking.value, *plan_keys)

    async def _hgetall(self, names: list[str]) -> list[dict[bytes, bytes]]:
        with translated_errors("reading stats"):
            pipe = self._redis.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(name)
            return list(await pipe.execute())


def target_ids(readings: Readings) -> set[str]:
    """Targets that have counters."""
    return {scope.removeprefix(target_scope("")) for scope in readings if scope.startswith(target_scope(""))}


def _bucket_indices(unit: str, count: int, now: float) -> range:
    current = int(now // BUCKET_SECONDS[unit])
    return range(current - count + 1, current + 1)


def _sum(hashes: list[dict[bytes, bytes]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for h in hashes:
        for k, v in h.items():
            out[k.decode()] += float(v)
    return dict(out)

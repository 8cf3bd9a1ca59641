"""Counters shared by every front end: per target and per op family, in total
and over sliding windows (5 min, 1 h, 24 h).

Counting must not slow the hit path or fail it: a front end adds to local
counters (a dict update) and a background thread flushes them to Redis about
once a second; a flush that cannot reach Redis is dropped (dashboards lose a
few counts during an outage, callers lose nothing). Windows come from minute
buckets (kept 2 h) and hour buckets (kept 26 h) next to each total; the
same buckets draw the status page's hit rate over time. Hits are also
counted per plan key (hits, build seconds saved) for its top entries.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import redis

from plancache.errors import StoreUnavailable
from plancache_server import keys
from plancache_server.redis_conn import translated_errors

log = logging.getLogger(__name__)

MINUTE_BUCKET_TTL_S = 2 * 3600
HOUR_BUCKET_TTL_S = 26 * 3600
WINDOWS = ("5m", "1h", "24h", "total")
BUCKET_SECONDS = {"m": 60, "h": 3600}
# Plans ranked per leaderboard; past that the least-hit ones are dropped
# (a plan that comes back starts counting again).
TOP_ENTRIES_KEPT = 10_000


class Counter(enum.Enum):
    HITS = "hits"
    MISSES = "misses"
    COMPILES = "compiles"
    FAILURES = "failures"
    JOINED = "joined"
    BYTES_SERVED = "bytes_served"
    SECONDS_SAVED = "build_seconds_saved"


def target_scope(target_id: str) -> str:
    return f"target:{target_id}"


def family_scope(family: str) -> str:
    return f"family:{family}"


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
    def __init__(self, client: redis.Redis, flush_interval_s: float = 1.0) -> None:
        self._redis = client
        self._interval = flush_interval_s
        self._lock = threading.Lock()
        self._pending: defaultdict[tuple[str, str], float] = defaultdict(float)
        self._plan_hits: defaultdict[str, float] = defaultdict(float)
        self._plan_saved: defaultdict[str, float] = defaultdict(float)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def incr(self, counter: Counter, amount: float = 1.0, *, target_id: str, family: str | None = None) -> None:
        with self._lock:
            self._add(counter, amount, target_id, family)
            self._ensure_flushing()

    def hit(self, plan_key: str, bytes_served: int, seconds_saved: float, *, target_id: str, family: str | None = None) -> None:
        """One served plan: the hit, its bytes, the build time it saved, and
        its per-plan counts for the top entries (one lock on the hit path)."""
        with self._lock:
            self._add(Counter.HITS, 1.0, target_id, family)
            self._add(Counter.BYTES_SERVED, bytes_served, target_id, family)
            self._add(Counter.SECONDS_SAVED, seconds_saved, target_id, family)
            self._plan_hits[plan_key] += 1
            self._plan_saved[plan_key] += seconds_saved
            self._ensure_flushing()

    def _add(self, counter: Counter, amount: float, target_id: str, family: str | None) -> None:
        self._pending[(target_scope(target_id), counter.value)] += amount
        if family:
            self._pending[(family_scope(family), counter.value)] += amount

    def _ensure_flushing(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="plancache-stats", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, defaultdict(float)
            plan_hits, self._plan_hits = self._plan_hits, defaultdict(float)
            plan_saved, self._plan_saved = self._plan_saved, defaultdict(float)
        if not pending and not plan_hits:
            return
        now = time.time()
        minute, hour = int(now // BUCKET_SECONDS["m"]), int(now // BUCKET_SECONDS["h"])
        try:
            with translated_errors("counting"):
                pipe = self._redis.pipeline(transaction=False)
                for (scope, name), amount in pending.items():
                    pipe.hincrbyfloat(keys.stats(scope), name, amount)
                    for bucket, ttl in ((keys.stats_bucket(scope, "m", minute), MINUTE_BUCKET_TTL_S), (keys.stats_bucket(scope, "h", hour), HOUR_BUCKET_TTL_S)):
                        pipe.hincrbyfloat(bucket, name, amount)
                        pipe.expire(bucket, ttl)
                    pipe.sadd(keys.STATS_SCOPES, scope)
                for ranking, per_plan in ((Ranking.HITS, plan_hits), (Ranking.SECONDS_SAVED, plan_saved)):
                    if per_plan:
                        for plan_key, amount in per_plan.items():
                            pipe.zincrby(ranking.value, amount, plan_key)
                        pipe.zremrangebyrank(ranking.value, 0, -(TOP_ENTRIES_KEPT + 1))
                pipe.execute()
        except StoreUnavailable as e:
            log.debug("dropped %d pending counts: %s", len(pending), e)

    def close(self) -> None:
        self._stop.set()
        self.flush()

    def read(self) -> Readings:
        """Every scope's counters per window (this front end's pending counts flushed first)."""
        self.flush()
        now = time.time()
        scopes = self.scopes()
        names: list[str] = []
        for scope in scopes:
            names.append(keys.stats(scope))
            names += [keys.stats_bucket(scope, "m", m) for m in _bucket_indices("m", 60, now)]
            names += [keys.stats_bucket(scope, "h", h) for h in _bucket_indices("h", 24, now)]
        replies = self._hgetall(names)
        per_scope = 1 + 60 + 24
        readings: Readings = {}
        for i, scope in enumerate(scopes):
            total, minutes, hours = replies[i * per_scope], replies[i * per_scope + 1 : i * per_scope + 61], replies[i * per_scope + 61 : (i + 1) * per_scope]
            readings[scope] = {"5m": _sum(minutes[-5:]), "1h": _sum(minutes), "24h": _sum(hours), "total": _sum([total])}
        return readings

    def scopes(self) -> list[str]:
        with translated_errors("reading stats"):
            return sorted(s.decode() for s in self._redis.smembers(keys.STATS_SCOPES))  # type: ignore[union-attr]

    def history(self, scopes: list[str], unit: str, count: int) -> dict[str, list[Bucket]]:
        """The last `count` minute ("m") or hour ("h") buckets of each scope,
        oldest first, the current (partial) one last."""
        self.flush()
        indices = _bucket_indices(unit, count, time.time())
        replies = self._hgetall([keys.stats_bucket(scope, unit, i) for scope in scopes for i in indices])
        width = BUCKET_SECONDS[unit]
        return {scope: [Bucket(start=float(i * width), values=_sum([replies[n * count + j]])) for j, i in enumerate(indices)] for n, scope in enumerate(scopes)}

    def top(self, ranking: Ranking, count: int) -> list[PlanCounts]:
        """The plans with the most hits, or the most build seconds saved."""
        self.flush()
        with translated_errors("reading top entries"):
            ranked = [key.decode() for key in self._redis.zrevrange(ranking.value, 0, count - 1)]  # type: ignore[union-attr]
            if not ranked:
                return []
            pipe = self._redis.pipeline(transaction=False)
            pipe.zmscore(Ranking.HITS.value, ranked)
            pipe.zmscore(Ranking.SECONDS_SAVED.value, ranked)
            hits, saved = pipe.execute()
        return [PlanCounts(key, float(h or 0), float(s or 0)) for key, h, s in zip(ranked, hits, saved, strict=True)]

    def forget_plans(self, plan_keys: list[str]) -> None:
        """Drop deleted plans from the top entries."""
        if plan_keys:
            with translated_errors("forgetting plans"):
                for ranking in Ranking:
                    self._redis.zrem(ranking.value, *plan_keys)

    def _hgetall(self, names: list[str]) -> list[dict[bytes, bytes]]:
        with translated_errors("reading stats"):
            pipe = self._redis.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(name)
            return pipe.execute()


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

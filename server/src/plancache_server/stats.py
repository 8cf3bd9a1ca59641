"""Counters shared by every front end: per target and per op family, in total
and over sliding windows (5 min, 1 h, 24 h).

Counting must not slow the hit path or fail it: a front end adds to local
counters (a dict update) and a background thread flushes them to Redis about
once a second; a flush that cannot reach Redis is dropped (dashboards lose a
few counts during an outage, callers lose nothing). Windows come from minute
buckets (kept 2 h) and hour buckets (kept 26 h) next to each total.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import defaultdict

import redis

from plancache.errors import StoreUnavailable
from plancache_server import keys
from plancache_server.redis_conn import translated_errors

log = logging.getLogger(__name__)

MINUTE_BUCKET_TTL_S = 2 * 3600
HOUR_BUCKET_TTL_S = 26 * 3600
WINDOWS = ("5m", "1h", "24h", "total")


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


class Stats:
    def __init__(self, client: redis.Redis, flush_interval_s: float = 1.0) -> None:
        self._redis = client
        self._interval = flush_interval_s
        self._lock = threading.Lock()
        self._pending: defaultdict[tuple[str, str], float] = defaultdict(float)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def incr(self, counter: Counter, amount: float = 1.0, *, target_id: str, family: str | None = None) -> None:
        with self._lock:
            self._pending[(target_scope(target_id), counter.value)] += amount
            if family:
                self._pending[(family_scope(family), counter.value)] += amount
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="plancache-stats", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, defaultdict(float)
        if not pending:
            return
        now = time.time()
        minute, hour = int(now // 60), int(now // 3600)
        try:
            with translated_errors("counting"):
                pipe = self._redis.pipeline(transaction=False)
                for (scope, name), amount in pending.items():
                    pipe.hincrbyfloat(keys.stats(scope), name, amount)
                    for bucket, ttl in ((keys.stats_bucket(scope, "m", minute), MINUTE_BUCKET_TTL_S), (keys.stats_bucket(scope, "h", hour), HOUR_BUCKET_TTL_S)):
                        pipe.hincrbyfloat(bucket, name, amount)
                        pipe.expire(bucket, ttl)
                    pipe.sadd(keys.STATS_SCOPES, scope)
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
        minute, hour = int(now // 60), int(now // 3600)
        with translated_errors("reading stats"):
            scopes = sorted(s.decode() for s in self._redis.smembers(keys.STATS_SCOPES))  # type: ignore[union-attr]
            pipe = self._redis.pipeline(transaction=False)
            for scope in scopes:
                pipe.hgetall(keys.stats(scope))
                for m in range(minute - 59, minute + 1):
                    pipe.hgetall(keys.stats_bucket(scope, "m", m))
                for h in range(hour - 23, hour + 1):
                    pipe.hgetall(keys.stats_bucket(scope, "h", h))
            replies = pipe.execute()
        per_scope = 1 + 60 + 24
        readings: Readings = {}
        for i, scope in enumerate(scopes):
            total, minutes, hours = replies[i * per_scope], replies[i * per_scope + 1 : i * per_scope + 61], replies[i * per_scope + 61 : (i + 1) * per_scope]
            readings[scope] = {"5m": _sum(minutes[-5:]), "1h": _sum(minutes), "24h": _sum(hours), "total": _sum([total])}
        return readings


def _sum(hashes: list[dict[bytes, bytes]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for h in hashes:
        for k, v in h.items():
            out[k.decode()] += float(v)
    return dict(out)

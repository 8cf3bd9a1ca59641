"""Counters per target, in Redis, so every front end adds to the same ones."""

from __future__ import annotations

import enum

import redis

from plancache_server import keys
from plancache_server.redis_conn import translated_errors


class Counter(enum.Enum):
    HITS = "hits"
    MISSES = "misses"
    COMPILES = "compiles"
    FAILURES = "failures"
    JOINED = "joined"


class Stats:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def incr(self, target_id: str, counter: Counter) -> None:
        with translated_errors("counting"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hincrby(keys.stats(target_id), counter.value, 1)
            pipe.sadd(keys.STATS_TARGETS, target_id)
            pipe.execute()

    def read(self) -> dict[str, dict[str, int]]:
        with translated_errors("reading stats"):
            targets = sorted(t.decode() for t in self._redis.smembers(keys.STATS_TARGETS))  # type: ignore[union-attr]
            pipe = self._redis.pipeline(transaction=False)
            for target in targets:
                pipe.hgetall(keys.stats(target))
            rows = pipe.execute()
        return {target: {k.decode(): int(v) for k, v in row.items()} for target, row in zip(targets, rows, strict=True)}

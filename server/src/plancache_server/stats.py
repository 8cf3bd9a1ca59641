"""Counters per target, in Redis, so every front end adds to the same ones."""

from __future__ import annotations

import enum
import logging

import redis

from plancache.errors import StoreUnavailable
from plancache_server import keys
from plancache_server.redis_conn import translated_errors

log = logging.getLogger(__name__)


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
        """Best effort: a plan served from a front end's memory while Redis is
        down must not fail for want of a counter (dashboards lose a few counts)."""
        try:
            with translated_errors("counting"):
                pipe = self._redis.pipeline(transaction=False)
                pipe.hincrby(keys.stats(target_id), counter.value, 1)
                pipe.sadd(keys.STATS_TARGETS, target_id)
                pipe.execute()
        except StoreUnavailable as e:
            log.debug("not counted (%s): %s", counter.value, e)

    def read(self) -> dict[str, dict[str, int]]:
        with translated_errors("reading stats"):
            targets = sorted(t.decode() for t in self._redis.smembers(keys.STATS_TARGETS))  # type: ignore[union-attr]
            pipe = self._redis.pipeline(transaction=False)
            for target in targets:
                pipe.hgetall(keys.stats(target))
            rows = pipe.execute()
        return {target: {k.decode(): int(v) for k, v in row.items()} for target, row in zip(targets, rows, strict=True)}

"""Redis connections, and the one place Redis errors become plancache errors.

Workers use the blocking client (one build at a time, a heartbeat thread).
Front ends use redis.asyncio: a caller waiting on Redis or on a build is a
coroutine, not a thread. Their pool is bounded and blocking: a herd of
callers queues for a connection instead of opening thousands of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from plancache.errors import StoreUnavailable

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# Connections one front end opens to a standalone Redis; callers beyond
# that wait for one (at most CONNECTION_WAIT_S, then UNAVAILABLE).
FRONT_END_CONNECTIONS = 64
CONNECTION_WAIT_S = 10.0
# Per node of a cluster (redis-py's cluster client does not queue: past it
# a command fails at once, so the bound is set high).
FRONT_END_CLUSTER_CONNECTIONS = 512

AsyncRedis = aioredis.Redis


def _cluster_url(url: str) -> str | None:
    scheme, sep, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES[scheme]}://{rest}" if sep and scheme in CLUSTER_SCHEMES else None


def connect(url: str) -> redis.Redis:
    """A blocking client that fails fast instead of hanging on a dead Redis.

    `redis+cluster://host:port` (or `rediss+cluster://`) connects to a Redis
    Cluster through any of its nodes. The cluster client speaks the same
    commands; every key plancache writes for one plan shares a hash tag.
    """
    cluster = _cluster_url(url)
    if cluster is not None:
        client = redis.RedisCluster.from_url(cluster, socket_connect_timeout=2.0, socket_timeout=10.0, decode_responses=False)
        return cast(redis.Redis, client)
    return redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=10.0, health_check_interval=30, decode_responses=False)


def connect_async(url: str) -> AsyncRedis:
    """The front end's client (same URL forms as `connect`)."""
    cluster = _cluster_url(url)
    if cluster is not None:
        client = AsyncRedisCluster.from_url(
            cluster, socket_connect_timeout=2.0, socket_timeout=10.0, decode_responses=False, max_connections=FRONT_END_CLUSTER_CONNECTIONS
        )
        return cast(AsyncRedis, client)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=FRONT_END_CONNECTIONS, timeout=CONNECTION_WAIT_S, socket_connect_timeout=2.0, socket_timeout=10.0,
        health_check_interval=30, decode_responses=False,
    )  # fmt: skip
    return aioredis.Redis(connection_pool=pool)


def text(value: object) -> str:
    """A Redis reply as text (replies are bytes: clients keep decode_responses off)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@contextlib.contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """Turn redis-py failures into StoreUnavailable (gRPC UNAVAILABLE); works
    around awaited calls too."""
    try:
        yield
    except redis.RedisError as e:
        raise StoreUnavailable(f"plan store unavailable while {doing}: {type(e).__name__}: {e}") from e
    except OSError as e:  # a socket error redis-py did not wrap
        raise StoreUnavailable(f"plan store unavailable while {doing}: {type(e).__name__}: {e}") from e

"""Redis connections, and the one place Redis errors become plancache errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import redis

from plancache.errors import StoreUnavailable

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def connect(url: str) -> redis.Redis:
    """A client that fails fast instead of hanging a gRPC thread on a dead Redis.

    `redis+cluster://host:port` (or `rediss+cluster://`) connects to a Redis
    Cluster through any of its nodes. The cluster client speaks the same
    commands; every key plancache writes for one plan shares a hash tag.
    """
    scheme, sep, rest = url.partition("://")
    if sep and scheme in CLUSTER_SCHEMES:
        cluster = redis.RedisCluster.from_url(
            f"{CLUSTER_SCHEMES[scheme]}://{rest}", socket_connect_timeout=2.0, socket_timeout=10.0, decode_responses=False
        )
        return cast(redis.Redis, cluster)
    return redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=10.0, health_check_interval=30, decode_responses=False)


@contextlib.contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """Turn redis-py failures into StoreUnavailable (gRPC UNAVAILABLE)."""
    try:
        yield
    except redis.RedisError as e:
        raise StoreUnavailable(f"plan store unavailable while {doing}: {type(e).__name__}: {e}") from e

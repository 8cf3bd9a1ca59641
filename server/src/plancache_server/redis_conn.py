"""Redis connections, and the one place Redis errors become plancache errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis

from plancache.errors import StoreUnavailable


def connect(url: str) -> redis.Redis:
    """A client that fails fast instead of hanging a gRPC thread on a dead Redis."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=2.0,
        socket_timeout=10.0,
        health_check_interval=30,
        decode_responses=False,
    )


@contextlib.contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """Turn redis-py failures into StoreUnavailable (gRPC UNAVAILABLE)."""
    try:
        yield
    except redis.RedisError as e:
        raise StoreUnavailable(f"plan store unavailable while {doing}: {type(e).__name__}: {e}") from e

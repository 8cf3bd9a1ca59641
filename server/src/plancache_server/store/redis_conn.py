"""Redis connections, and the one place Redis errors become plancache errors.

Workers use the blocking client (one build at a time, a heartbeat thread).
Gateways use redis.asyncio: a caller waiting on Redis or on a build is a
coroutine, not a thread. Their pool is bounded and blocking: a herd of
callers queues for a connection instead of opening thousands of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from plancache.errors import StoreUnavailable
from plancache.log_limits import LogLimiter

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# Connections one gateway opens to a standalone Redis; callers beyond
# that wait for one (at most CONNECTION_WAIT_S, then UNAVAILABLE).
GATEWAY_CONNECTIONS = 64
CONNECTION_WAIT_S = 10.0
# Per node of a cluster (redis-py's cluster client does not queue: past it
# a command fails at once, so the bound is set high).
GATEWAY_CLUSTER_CONNECTIONS = 512

AsyncRedis = aioredis.Redis
log = logging.getLogger(__name__)
_faults = LogLimiter(log)
# How long stopping a background task may take before it is left behind.
TASK_STOP_S = 5.0
TASK_RECANCEL_S = 0.2


def _cluster_url(url: str) -> str | None:
    scheme, sep, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES[scheme]}://{rest}" if sep and scheme in CLUSTER_SCHEMES else None


# A Redis that cannot write to its disk answers every write, and PING too, with
# MISCONF, while reads still answer: its connections are alive, and a stored
# plan must still be served (a full disk keeps every stored plan: docs/operations.md).
DISK_ERROR_PREFIX = "MISCONF"


def _disk_error(error: redis.ResponseError) -> bool:
    return str(error).startswith(DISK_ERROR_PREFIX)


def _text(reply: Any) -> Any:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply


def _judge_ping(reply: Any, error: redis.ResponseError | None) -> None:
    """A health check's PING answered: PONG, or MISCONF (alive, its disk full); anything else fails it."""
    if error is not None:
        if _disk_error(error):
            return
        raise error
    if _text(reply) != "PONG":
        raise redis.ConnectionError("Bad response from PING health check")


def _health_check_tolerating_disk_errors(base: type[Any]) -> type[Any]:
    """`base` (a redis-py connection class) whose health check takes MISCONF for
    a live server: redis-py's PING check reads it as a dead connection, and a
    connection idle past health_check_interval then failed its next read
    (a hit) while the disk was full."""

    def _send_ping(self: Any) -> None:
        self.send_command("PING", check_health=False)
        try:
            reply, error = self.read_response(), None
        except redis.ResponseError as e:
            reply, error = None, e
        _judge_ping(reply, error)

    return type(base.__name__, (base,), {"_send_ping": _send_ping})


def _async_health_check_tolerating_disk_errors(base: type[Any]) -> type[Any]:
    """As _health_check_tolerating_disk_errors, for redis.asyncio's connections."""

    async def _send_ping(self: Any) -> None:
        await self.send_command("PING", check_health=False)
        try:
            reply, error = await self.read_response(), None
        except redis.ResponseError as e:
            reply, error = None, e
        _judge_ping(reply, error)

    return type(base.__name__, (base,), {"_send_ping": _send_ping})


def connect(url: str) -> redis.Redis:
    """A blocking client that fails fast instead of hanging on a dead Redis.

    `redis+cluster://host:port` (or `rediss+cluster://`) connects to a Redis
    Cluster through any of its nodes. The cluster client speaks the same
    commands; every key plancache writes for one plan shares a hash tag.
    """
    cluster = _cluster_url(url)
    if cluster is not None:
        client = redis.RedisCluster.from_url(
            cluster, socket_connect_timeout=2.0, socket_timeout=10.0, decode_responses=False
        )
        return cast(redis.Redis, client)
    standalone = redis.Redis.from_url(
        url, socket_connect_timeout=2.0, socket_timeout=10.0, health_check_interval=30, decode_responses=False
    )
    pool = standalone.connection_pool
    pool.connection_class = _health_check_tolerating_disk_errors(pool.connection_class)
    return standalone


def connect_async(url: str) -> AsyncRedis:
    """The gateway's client (same URL forms as `connect`)."""
    cluster = _cluster_url(url)
    if cluster is not None:
        client = AsyncRedisCluster.from_url(
            cluster,
            socket_connect_timeout=2.0,
            socket_timeout=10.0,
            decode_responses=False,
            max_connections=GATEWAY_CLUSTER_CONNECTIONS,
        )
        return cast(AsyncRedis, client)
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=GATEWAY_CONNECTIONS,
        timeout=CONNECTION_WAIT_S,
        socket_connect_timeout=2.0,
        socket_timeout=10.0,
        health_check_interval=30,
        decode_responses=False,
    )
    pool.connection_class = _async_health_check_tolerating_disk_errors(pool.connection_class)
    return aioredis.Redis(connection_pool=pool)


def _seconds(reply: Any) -> float:
    if isinstance(reply, (list, tuple)) and len(reply) == 2:
        return int(reply[0]) + int(reply[1]) / 1e6
    if isinstance(reply, dict) and reply:  # a cluster answers per node: any node's clock will do
        return _seconds(next(iter(reply.values())))
    raise StoreUnavailable(f"Redis answered TIME with {str(reply)[:100]}")


def redis_seconds(client: redis.Redis) -> float:
    """Redis' clock (unix seconds). Heartbeats are written and read on it, so
    that a host whose own clock steps (NTP, a VM resumed) neither makes its
    live workers look dead to the others nor a dead one look alive."""
    try:
        with translated_errors("reading Redis' clock"):
            return _seconds(client.time())
    except StoreUnavailable as e:
        return _own_clock(e)


async def redis_seconds_async(client: AsyncRedis) -> float:
    try:
        with translated_errors("reading Redis' clock"):
            return _seconds(await client.time())
    except StoreUnavailable as e:
        return _own_clock(e)


def _own_clock(error: StoreUnavailable) -> float:
    """A user created with the ACL rules of before TIME was needed keeps working, on this host's clock."""
    if not isinstance(error.__cause__, redis.exceptions.NoPermissionError):
        raise error
    _faults.warning(
        "time",
        "this Redis user may not run TIME: heartbeats are read on this host's clock "
        "(a clock step makes workers look dead or alive); run the ACL SETUSER commands of docs/operations.md again",
    )
    return time.time()


def text(value: object) -> str:
    """A Redis reply as text (replies are bytes: clients keep decode_responses off)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# What Redis says when it refuses, and what the operator does about it:
# (fault kind, the start of Redis' error or redis-py's class, the way out).
_FAULTS = (
    (
        "credentials",
        ("WRONGPASS", "NOAUTH", "AuthenticationError", "invalid username-password"),
        "Redis refused the user or password of the Redis URL: "
        "create the user with the ACL SETUSER command of docs/operations.md, or correct the password",
    ),
    (
        "permissions",
        ("NOPERM", "NoPermissionError"),
        "the Redis user lacks a permission plancache needs: "
        "give it the ACL rules of docs/operations.md again (ACL SETUSER)",
    ),
    (
        "disk",
        ("MISCONF",),
        "Redis cannot write its data to disk (full or read-only?) "
        "and refuses every write until it can: free space or make its folder writable",
    ),
    (
        "memory",
        ("OOM",),
        "Redis is at its maxmemory and refuses writes: raise maxmemory, "
        "or bound the plans with --store-max-mb below it",
    ),
    ("replica", ("READONLY",), "this Redis is a read-only replica: point the Redis URL at the primary"),
    ("loading", ("LOADING",), "Redis is loading its data set after a restart: calls succeed once it is loaded"),
)


def store_fault(error: BaseException) -> tuple[str, str]:
    """(kind, way out) of a Redis failure: the kind is what an operator's log
    line is limited by (plancache.log_limits), the way out what it says."""
    said = f"{type(error).__name__}: {error}"
    for kind, signs, way_out in _FAULTS:
        if any(sign in said for sign in signs):
            return kind, way_out
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return "unreachable", "Redis does not answer: calls succeed again once it does"
    return type(error).__name__, ""


def describe(error: BaseException) -> str:
    """A Redis failure in one line, with the way out when one is known."""
    way_out = store_fault(error)[1]
    return f"{type(error).__name__}: {error}" + (f" ({way_out})" if way_out else "")


@contextlib.contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """Turn redis-py failures into StoreUnavailable (gRPC UNAVAILABLE); works
    around awaited calls too."""
    try:
        yield
    except redis.RedisError as e:
        raise StoreUnavailable(f"plan store unavailable while {doing}: {describe(e)}") from e
    except OSError as e:  # a socket error redis-py did not wrap
        raise StoreUnavailable(f"plan store unavailable while {doing}: {describe(e)}") from e


async def stop_task(task: asyncio.Task[Any] | None, timeout: float = TASK_STOP_S) -> None:
    """Cancels a background task that talks to Redis and waits for its end,
    at most `timeout` seconds. The cancel is repeated: one that lands as a
    redis-py read's own timeout fires is swallowed (asyncio.timeout turns it
    into that read's TimeoutError, answered as "no message"), and a task
    looping over such reads ran on: a server sent SIGTERM right after it
    started never exited (tests/integration/test_processes.py)."""
    if task is None:
        return
    deadline = asyncio.get_running_loop().time() + timeout
    while not task.done():
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            log.warning("background task %s did not stop within %.0f s; left behind", task.get_name(), timeout)
            return
        task.cancel()
        await asyncio.wait([task], timeout=min(TASK_RECANCEL_S, left))
    if not task.cancelled() and task.exception() is not None:
        log.debug("background task %s ended with %r", task.get_name(), task.exception())

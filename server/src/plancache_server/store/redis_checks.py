"""What a process checks of its Redis before it serves or builds: that the
URL's user and password are accepted, and that Redis' eviction policy
cannot drop plans, build jobs or leases under memory pressure.

A fault found here is said once, at start, in one line with the setting to
change; found later, every call would meet it and say less. A Redis that
does not answer yet is not a fault of its configuration: the process
starts and recovers when it answers (docs/reliability.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from plancache_server.store.redis_conn import describe

NO_EVICTION = "noeviction"


@dataclass(frozen=True)
class Finding:
    message: str
    fatal: bool  # the process must not start with it


def check_redis(client: redis.Redis, where: str) -> list[Finding]:
    """Findings about the Redis at `where` (its address, for the messages)."""
    try:
        client.ping()
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as e:
        return [Finding(f"Redis at {where} refused this process: {describe(e)}", fatal=True)]
    except (redis.ConnectionError, redis.TimeoutError) as e:
        return [
            Finding(
                f"Redis at {where} does not answer yet ({e}): starting anyway; calls succeed once it answers",
                fatal=False,
            )
        ]
    try:
        info = client.info("memory")
    except redis.exceptions.NoPermissionError:
        return [
            Finding(
                f"cannot check Redis' eviction policy at {where}: "
                "this user may not run INFO (give it the ACL rules of docs/operations.md again)",
                fatal=False,
            )
        ]
    except redis.RedisError as e:
        return [Finding(f"cannot check Redis' eviction policy at {where}: {describe(e)}", fatal=False)]
    return [
        f
        for node in _nodes(info)
        if (f := eviction_finding(str(node.get("maxmemory_policy", NO_EVICTION)), int(node.get("maxmemory", 0)), where))
    ]


def _nodes(info: dict[str, Any]) -> list[dict[str, Any]]:
    """INFO of a standalone Redis, or of each node of a cluster (node -> INFO)."""
    if "maxmemory_policy" in info:
        return [info]
    return [v for v in info.values() if isinstance(v, dict)]


def eviction_finding(policy: str, maxmemory: int, where: str) -> Finding | None:
    change = (
        f"set `maxmemory-policy {NO_EVICTION}` (CONFIG SET maxmemory-policy {NO_EVICTION}, and in redis.conf) "
        "and bound the plans with --store-max-mb below maxmemory: "
        "plancache then evicts least recently used plans itself, never a job or a lease"
    )
    if policy.startswith("allkeys-") and maxmemory > 0:
        return Finding(
            f"Redis at {where} has maxmemory-policy {policy} (maxmemory {maxmemory} bytes): "
            f"it would drop plans, build jobs and leases under memory pressure; {change}",
            fatal=True,
        )
    if policy.startswith("allkeys-"):
        return Finding(
            f"Redis at {where} has maxmemory-policy {policy}: "
            f"once a maxmemory is set it drops plans, build jobs and leases; {change}",
            fatal=False,
        )
    if policy.startswith("volatile-") and maxmemory > 0:
        return Finding(
            f"Redis at {where} has maxmemory-policy {policy} (maxmemory {maxmemory} bytes): "
            f"it would drop build leases and job states (a build may run twice; stored plans are kept); {change}",
            fatal=False,
        )
    return None

"""What Redis holds about a key's builds, as a gateway reads and writes it:
the build lease, the job's state, the negative cache, the recent failures
(the worker's side is plancache_server.store.build_records)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable

from plancache.errors import InvalidRequest, Unavailable
from plancache.keys.plankey import parse_key
from plancache.log_limits import LogLimiter
from plancache_server.settings.groups import HEDGED_HOLD_MAX_LIMIT_S
from plancache_server.store import keys
from plancache_server.store.build_records import (
    ABANDONED,
    JOB_STATE_TTL_S,
    QUEUED,
    RELEASE_IF_OWNER,
    TAKE_IF_WANTED,
    WANT,
    WANTED_TTL_S,
    FailedBuild,
    state_fields,
)
from plancache_server.store.redis_conn import AsyncRedis, text, translated_errors

log = logging.getLogger(__name__)
# Every flight meets a Redis outage twice a second: one line a minute says it.
_faults = LogLimiter(log)
# How long a yielding job's mark lasts: past the longest hold a worker may be set to (--hedged-hold-max, from its
# take) and a build; a hurry after the build began is acknowledged with it.
YIELDS_MARK_TTL_S = int(HEDGED_HOLD_MAX_LIMIT_S) + 60


class BuildStates:
    def __init__(self, client: AsyncRedis, lease_s: float, gateway_id: str) -> None:
        self._redis = client
        self._lease_s = lease_s
        self._gateway_id = gateway_id
        # Deletes a key while it names a given job: a build lease's release, a yield mark's take.
        self._delete_if_named = client.register_script(RELEASE_IF_OWNER)
        self._want = client.register_script(WANT)
        self._take_if_wanted = client.register_script(TAKE_IF_WANTED)

    async def mark_yields(self, plan_key: str, job_id: str) -> None:
        """Job `job_id` of the plan yields (its callers build the plan themselves): a caller that waits for the
        plan, on any gateway, hurries it (take_yields)."""
        with translated_errors("marking a build that yields"):
            await self._redis.set(keys.job_yields(plan_key), job_id, ex=YIELDS_MARK_TTL_S)

    async def take_yields(self, plan_key: str, job_id: str) -> bool:
        """Whether job `job_id` yields and no caller has hurried it yet; the mark is taken (once, whichever
        gateway asks first: one hurry per job, not one per caller that joins it)."""
        with translated_errors("taking a build's yield mark"):
            return bool(await self._delete_if_named(keys=[keys.job_yields(plan_key)], args=[job_id]))

    async def abandon_unless_wanted(self, plan_key: str, job_id: str) -> bool:
        """A job taken out of its stream: whether a gateway's callers want it after all (then it goes back);
        if none does, it is abandoned as a worker would (state, lease; counted)."""
        with translated_errors("abandoning a job"):
            wanted = await self._take_if_wanted(
                keys=[keys.job_wanted(plan_key), keys.job_state(plan_key), keys.build_lease(plan_key)],
                args=[job_id, ABANDONED, f"{time.time():.3f}", f"gateway {self._gateway_id}"],
            )
            if not wanted:
                target_id = parse_key(plan_key).target.id
                await self._redis.hincrby(keys.STORE_COUNTERS, keys.store_counter(ABANDONED, target_id), 1)
        return bool(wanted)

    async def want(self, plan_key: str, job_id: str) -> None:
        """This gateway's callers wait for `job_id` (for WANTED_TTL_S, renewed while they do)."""
        with translated_errors("saying that callers wait for a build"):
            await self._want(
                keys=[keys.job_wanted(plan_key)], args=[f"{self._gateway_id}|{job_id}", int(WANTED_TTL_S * 1000)]
            )

    async def unwant(self, plan_key: str, job_id: str) -> None:
        """This gateway's last caller waiting for `job_id` left; left to expire when Redis is away."""
        try:
            with translated_errors("saying that nobody waits for a build"):
                await self._redis.hdel(keys.job_wanted(plan_key), f"{self._gateway_id}|{job_id}")
        except Unavailable as e:
            _faults.warning("unwant", "could not withdraw the callers of %s: %s", plan_key, e.message)

    async def take_lease(self, plan_key: str, job_id: str) -> str | None:
        """Take the key's build lease for `job_id` (None), or the job id of the build holding it."""
        lease = keys.build_lease(plan_key)
        with translated_errors("taking a build lease"):
            while True:
                if await self._redis.set(lease, job_id, nx=True, px=int(self._lease_s * 1000)):
                    return None
                existing = await self._redis.get(lease)
                if existing is not None:
                    return text(existing)

    async def release_lease(self, plan_key: str, job_id: str) -> None:
        """Release the lease while it still names `job_id`; left to expire when Redis is away."""
        try:
            with translated_errors("releasing a build lease"):
                await self._delete_if_named(keys=[keys.build_lease(plan_key)], args=[job_id])
        except Unavailable as e:  # it expires on its own
            _faults.warning("lease", "could not release the lease of %s: %s", plan_key, e.message)

    async def mark_queued(self, plan_key: str, job_id: str) -> None:
        with translated_errors("recording a job state"):
            fields = state_fields(job_id, QUEUED)
            await self._redis.hset(keys.job_state(plan_key), mapping=fields)  # type: ignore[arg-type]
            await self._redis.expire(keys.job_state(plan_key), JOB_STATE_TTL_S)

    async def state(self, plan_key: str) -> dict[str, str]:
        with translated_errors("reading a job state"):
            raw = await self._redis.hgetall(keys.job_state(plan_key))
        return {text(k): text(v) for k, v in raw.items()}

    async def known_failure(self, plan_key: str) -> str | None:
        """Why cuDNN rejected this key's graph, if it did recently."""
        with translated_errors("reading the negative cache"):
            reason = await self._redis.get(keys.failure(plan_key))
            ttl = await self._redis.ttl(keys.failure(plan_key)) if reason is not None else 0
        if reason is None:
            return None
        return f"{text(reason)} (remembered from an earlier build; retried after {ttl} s)"

    async def recent_failures(self, count: int) -> list[FailedBuild]:
        """The latest failed builds, newest first."""
        with translated_errors("reading recent failures"):
            raw = await self._redis.lrange(keys.RECENT_FAILURES, 0, count - 1)
        return list(_failures(item for item in raw if isinstance(item, bytes)))


def _failures(raw: Iterable[bytes]) -> Iterable[FailedBuild]:
    for item in raw:
        try:
            failure = FailedBuild(**json.loads(item))
            failure.target_id  # noqa: B018 -- a record whose key does not parse is skipped
        except (ValueError, TypeError, InvalidRequest):
            log.warning("ignoring a malformed failure record %r", item[:200])
            continue
        yield failure

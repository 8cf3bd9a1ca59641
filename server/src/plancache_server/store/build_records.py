"""What Redis holds about builds, and the worker's side of it.

Per plan key: a build lease (SET NX with expiry, holding the job id; one
build per key across the deployment), the latest job's state (a hash), and
cuDNN's rejection for the negative cache. Deployment-wide: a capped list of
recent failed builds (status page) and a pub/sub channel on which workers
announce finished jobs. Gateways take leases and wait
(plancache_server.gateway.builds); workers record progress and outcomes here.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass

import redis

from plancache.keys.plankey import parse_key
from plancache_server.store import keys
from plancache_server.store.redis_conn import text, translated_errors

log = logging.getLogger(__name__)

QUEUED, RUNNING, PROVISIONAL, DONE, FAILED = "queued", "running", "provisional", "done", "failed"
# A job nobody waited for any more when a worker took it: dropped, never built (its lease released).
ABANDONED = "abandoned"
# How long a gateway's claim that callers wait for a job lasts unless renewed (a flight renews it every
# 2 s while it follows the job, and takes it back when its last caller leaves): a gateway that died
# stops wanting its jobs this long after.
WANTED_TTL_S = 10.0
JOB_STATE_TTL_S = 24 * 3600  # a job's state while it waits or runs (a queue may hold a job for long)
# A finished job's state: read by the callers following that job, within seconds of its end (they poll
# every 0.5 s and on each announcement, and wait at most their deadline, --compile-timeout 900 s by
# default). Kept 24 h like the others, the state of every miss outlived it by a day: ~300 bytes each,
# bench/soak.py's Redis census found them all of Redis' growth (+12,900 records an hour at four misses a
# second, ~100 MB at a day's steady state, outside --store-max-mb).
FINISHED_STATE_TTL_S = 3600
# Failed builds kept for the status page, newest first.
RECENT_FAILURES_KEPT = 200

# Delete the lease only while it still names our job: a lease that expired
# and was retaken by another build must not be released by us.
RELEASE_IF_OWNER = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
# Extend the lease only while it names our job.
RENEW_IF_OWNER = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""


# A gateway's callers wait for a job: KEYS[1] the plan's wanted hash, ARGV[1] "<gateway id>|<job id>",
# ARGV[2] for how long (ms). Claims past their time are cleared. Redis' own clock: gateways' may differ.
WANT = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local claims = redis.call('hgetall', KEYS[1])
for i = 1, #claims, 2 do
  if tonumber(claims[i + 1]) == nil or tonumber(claims[i + 1]) <= now then redis.call('hdel', KEYS[1], claims[i]) end
end
redis.call('hset', KEYS[1], ARGV[1], now + tonumber(ARGV[2]))
redis.call('pexpire', KEYS[1], 2 * tonumber(ARGV[2]))
return 1
"""
# A worker about to build job ARGV[1]: 1 when a gateway's claim on it is still live; else 0, and the job
# is abandoned: its state says so (while it still names the job) and its lease is released (while it
# names it), so that the next caller queues the plan anew. KEYS: wanted, job state, lease.
TAKE_IF_WANTED = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local suffix = '|' .. ARGV[1]
local claims = redis.call('hgetall', KEYS[1])
for i = 1, #claims, 2 do
  local field = claims[i]
  if #field > #suffix and string.sub(field, -#suffix) == suffix and (tonumber(claims[i + 1]) or 0) > now then
    return 1
  end
end
if redis.call('hget', KEYS[2], 'job_id') == ARGV[1] then
  redis.call('hset', KEYS[2], 'state', ARGV[2], 'updated_at', ARGV[3], 'worker', ARGV[4])
end
if redis.call('get', KEYS[3]) == ARGV[1] then redis.call('del', KEYS[3]) end
return 0
"""

# A worker about to start building job ARGV[1]'s first plan (ARGV[2]: its id): 1 when it may, the job marked as
# being built by it; 0 when another worker has started it (a job queued again to hurry it reached two workers).
# ARGV[3] '1': the job was reclaimed from a worker that stopped answering, whose mark is not waited for. A state
# that names another job (or none) says nothing of this one: 1. KEYS: the plan's job state.
CLAIM_START = """
if redis.call('hget', KEYS[1], 'job_id') ~= ARGV[1] then return 1 end
local building = redis.call('hget', KEYS[1], 'building')
if building and building ~= '' and building ~= ARGV[2] and ARGV[3] ~= '1' then return 0 end
redis.call('hset', KEYS[1], 'building', ARGV[2])
return 1
"""


@dataclass(frozen=True)
class FailedBuild:
    at: float  # unix seconds
    plan_key: str
    worker: str
    reason: str
    # cuDNN refused the graph (remembered by the negative cache), as opposed
    # to the build failing for another reason (a crash, a lost worker).
    rejected: bool

    @property
    def target_id(self) -> str:
        return parse_key(self.plan_key).target.id


def state_fields(job_id: str, state: str, **extra: str) -> dict[str, str]:
    """Every field, every time: one HSET replaces the previous job's state."""
    return {
        "job_id": job_id,
        "state": state,
        "updated_at": f"{time.time():.3f}",
        "worker": "",
        "error": "",
        "building": "",  # the worker that started building the job's first plan (BuildRecorder.claim_start)
        **extra,
    }


def finished_event(job_id: str, plan_key: str) -> str:
    return json.dumps({"job_id": job_id, "plan_key": plan_key})


class BuildRecorder:
    """The worker's side: progress, lease renewal, outcome, announcement."""

    def __init__(self, client: redis.Redis, lease_s: float, negative_ttl_s: float = 3600.0) -> None:
        self._redis = client
        self._lease_s = lease_s
        self._negative_ttl_s = negative_ttl_s
        self._release = client.register_script(RELEASE_IF_OWNER)
        self._renew = client.register_script(RENEW_IF_OWNER)
        self._take_if_wanted = client.register_script(TAKE_IF_WANTED)
        self._claim_start = client.register_script(CLAIM_START)

    def take_lease(self, plan_key: str, job_id: str) -> str | None:
        """A build nobody asked for (warming) takes the key's lease as a
        gateway would (plancache_server.gateway.build_states): None when
        taken, else the job id of the build under way that holds it. A lease
        that runs out between the two commands is taken on the next turn: read
        as held by nobody, it made warming skip the item as "being built for a
        caller" (CI saw a warming plan done with an item never built, its dead
        worker's lease expiring as the next worker asked)."""
        lease = keys.build_lease(plan_key)
        with translated_errors("taking a build lease"):
            while True:
                if self._redis.set(lease, job_id, nx=True, px=int(self._lease_s * 1000)):
                    return None
                holder = self._redis.get(lease)
                if holder is not None:
                    return text(holder)

    def wanted(self, plan_key: str, job_id: str, worker_id: str) -> bool:
        """Whether a gateway's callers still wait for this job; if not, the job is marked abandoned and its
        lease released (atomically: a caller joining meanwhile either keeps it or queues it anew), and
        counted for the status page."""
        with translated_errors("checking that a job is waited for"):
            live = self._take_if_wanted(
                keys=[keys.job_wanted(plan_key), keys.job_state(plan_key), keys.build_lease(plan_key)],
                args=[job_id, ABANDONED, f"{time.time():.3f}", worker_id],
            )
            if not live:
                target_id = parse_key(plan_key).target.id
                self._redis.hincrby(keys.STORE_COUNTERS, keys.store_counter(ABANDONED, target_id), 1)
        return bool(live)

    def mark_running(self, plan_key: str, job_id: str, worker_id: str) -> None:
        """Taken by a worker: announced (no plan changed) to the gateway whose caller's slot in the build
        queue it held (plancache_server.gateway.shares.QueueSlots)."""
        self._set_state(plan_key, state_fields(job_id, RUNNING, worker=worker_id))
        with translated_errors("announcing a job taken"):
            self._redis.publish(keys.EVENTS_CHANNEL, finished_event(job_id, ""))

    def provisional(self, plan_key: str, job_id: str, worker_id: str) -> None:
        """A provisional plan is stored: its waiters can have it, while this
        worker (still holding the lease) autotunes."""
        self._set_state(plan_key, state_fields(job_id, PROVISIONAL, worker=worker_id))
        with translated_errors("announcing a provisional plan"):
            self._redis.publish(keys.EVENTS_CHANNEL, finished_event(job_id, plan_key))

    def built_elsewhere(self, plan_key: str, job_id: str, worker_id: str) -> bool:
        """Whether another worker builds job `job_id`: it started its first plan (claim_start), or stored it
        provisional and autotunes it now."""
        with translated_errors("reading a job's state"):
            raw = self._redis.hmget(keys.job_state(plan_key), ["job_id", "state", "worker", "building"])
        owner, state, worker, building = (text(v) if v is not None else "" for v in raw)
        if owner != job_id:
            return False
        if state == PROVISIONAL:
            return worker not in ("", worker_id)
        return state == RUNNING and building not in ("", worker_id)

    def claim_start(self, plan_key: str, job_id: str, worker_id: str, reclaimed: bool = False) -> bool:
        """Whether this worker may start building job `job_id`'s first plan: no other worker has (CLAIM_START)."""
        with translated_errors("claiming a build's start"):
            return bool(
                self._claim_start(keys=[keys.job_state(plan_key)], args=[job_id, worker_id, "1" if reclaimed else "0"])
            )

    def renew(self, plan_key: str, job_id: str) -> None:
        """Keep the lease while building: a dead worker's lease runs out."""
        with translated_errors("renewing a build lease"):
            self._renew(keys=[keys.build_lease(plan_key)], args=[job_id, int(self._lease_s * 1000)])

    def finish(
        self, plan_key: str, job_id: str, worker_id: str, error: str | None = None, rejected: bool = False
    ) -> None:
        """Record the outcome; `rejected`: cuDNN refused the graph, remembered
        for the negative cache's lifetime (the key carries the versions)."""
        if error and rejected:
            with translated_errors("recording a rejection"):
                self._redis.set(keys.failure(plan_key), error, ex=max(1, int(self._negative_ttl_s)))
        self._set_state(
            plan_key,
            state_fields(job_id, FAILED if error else DONE, worker=worker_id, error=error or ""),
            ttl_s=FINISHED_STATE_TTL_S,
        )
        if error:
            self._record_failure(
                FailedBuild(at=time.time(), plan_key=plan_key, worker=worker_id, reason=error, rejected=rejected)
            )
        with translated_errors("releasing a build lease"):
            self._release(keys=[keys.build_lease(plan_key)], args=[job_id])
        with translated_errors("announcing a finished build"):
            self._redis.publish(keys.EVENTS_CHANNEL, finished_event(job_id, plan_key))

    def release(self, plan_key: str, job_id: str) -> None:
        """Let go of a lease without an outcome (a warming build not started)."""
        with translated_errors("releasing a build lease"):
            self._release(keys=[keys.build_lease(plan_key)], args=[job_id])

    def record_refusal(self, plan_key: str, worker_id: str, reason: str) -> None:
        """A job this worker refused (forged, or not for it): listed with the
        failed builds for operators; the plan it names is not touched."""
        self._record_failure(
            FailedBuild(at=time.time(), plan_key=plan_key[:512], worker=worker_id, reason=reason[:2000], rejected=False)
        )

    def _record_failure(self, failure: FailedBuild) -> None:
        with translated_errors("recording a failed build"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.lpush(keys.RECENT_FAILURES, json.dumps(asdict(failure)))
            pipe.ltrim(keys.RECENT_FAILURES, 0, RECENT_FAILURES_KEPT - 1)
            pipe.execute()

    def _set_state(self, plan_key: str, fields: dict[str, str], ttl_s: float = JOB_STATE_TTL_S) -> None:
        name = keys.job_state(plan_key)
        with translated_errors("recording a job state"):
            self._redis.hset(name, mapping=fields)  # type: ignore[arg-type]
            self._redis.expire(name, int(ttl_s))

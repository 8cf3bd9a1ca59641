"""One build per plan key, and waiting for it.

A front end that misses takes the plan's build lease (SET NX with expiry,
holding a job id) and queues the job; any other caller, on this front end or
another, finds the lease and waits for that job instead of starting a second
build. The worker records the job's outcome, releases the lease (only if it
still holds its own job id) and publishes an event; one pub/sub subscription
per front end wakes the local waiters. Waiters also re-check every half
second, so a lost event costs latency, never a result.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import redis

from plancache.errors import CompileFailed, CompileTimeout, InvalidRequest, Unavailable
from plancache.plankey import parse_key
from plancache.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server import keys
from plancache_server.jobs import Job, JobQueue
from plancache_server.redis_conn import translated_errors
from plancache_server.store import PlanStore, StoredPlan

log = logging.getLogger(__name__)

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
JOB_STATE_TTL_S = 24 * 3600
# Failed builds kept for the status page, newest first.
RECENT_FAILURES_KEPT = 200
RECHECK_S = 0.5

# Delete the lease only while it still names our job: a lease that expired
# and was retaken by another build must not be released by us.
_RELEASE_IF_OWNER = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
# Extend the lease only while it names our job.
_RENEW_IF_OWNER = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
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


class CompletionWatcher:
    """One pub/sub subscription per process; wakes waiters by job id."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def register(self, job_id: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(event)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="plancache-events", daemon=True)
                self._thread.start()
        return event

    def unregister(self, job_id: str, event: threading.Event) -> None:
        with self._lock:
            events = self._waiters.get(job_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[job_id]

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=3.0)

    def _wake(self, job_id: str) -> None:
        with self._lock:
            for event in self._waiters.get(job_id, ()):
                event.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(keys.EVENTS_CHANNEL)
                while not self._stopped.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "message":
                        try:
                            self._wake(json.loads(message["data"])["job_id"])
                        except (ValueError, KeyError, TypeError):
                            log.warning("ignoring malformed event %r", message.get("data"))
            except (redis.RedisError, OSError, ValueError) as e:
                # Waiters keep polling meanwhile; resubscribe when Redis is back.
                log.debug("event subscription lost (%s); retrying", e)
                self._stopped.wait(1.0)
            finally:
                try:
                    pubsub.close()
                except (redis.RedisError, OSError):
                    pass


class Builds:
    def __init__(self, client: redis.Redis, store: PlanStore, queue: JobQueue, lease_s: float, negative_ttl_s: float = 3600.0) -> None:
        self._redis = client
        self._store = store
        self._queue = queue
        self._lease_s = lease_s
        self._negative_ttl_s = negative_ttl_s
        self._release = client.register_script(_RELEASE_IF_OWNER)
        self._renew = client.register_script(_RENEW_IF_OWNER)
        self._watcher = CompletionWatcher(client)
        self._closing = threading.Event()

    def close(self) -> None:
        """Stop waiting: callers still waiting get Unavailable (the builds go
        on and their plans are stored for the next call)."""
        self._closing.set()
        self._watcher.stop()

    # ---- front end side ----------------------------------------------------

    def start_or_join(self, target: Target, plan_key: str, query: pb.PlanQuery) -> tuple[str, bool]:
        """The job building this key, and whether this call started it."""
        job_id = uuid.uuid4().hex
        lease = keys.build_lease(plan_key)
        with translated_errors("taking a build lease"):
            while True:
                if self._redis.set(lease, job_id, nx=True, px=int(self._lease_s * 1000)):
                    break
                existing = self._redis.get(lease)
                if existing is not None:
                    return existing.decode(), False  # type: ignore[union-attr]
        if self._store.get(plan_key) is not None:
            # The previous build finished between the caller's miss and our
            # lease: nothing to build, wait() returns its plan at once.
            self._release_lease(plan_key, job_id)
            return job_id, False
        self._set_state(plan_key, job_id, QUEUED)
        self._queue.enqueue(target, Job(job_id=job_id, plan_key=plan_key, query=query))
        return job_id, True

    def wait(self, plan_key: str, job_id: str, deadline: float) -> StoredPlan:
        """The plan once built; CompileFailed with cuDNN's reason; or CompileTimeout."""
        event = self._watcher.register(job_id)
        try:
            while True:
                plan = self._store.get(plan_key)
                if plan is not None:
                    return plan
                state = self.state(plan_key)
                if state.get("job_id") == job_id and state.get("state") == FAILED:
                    raise CompileFailed(state.get("error") or "build failed without a reason")
                if self._closing.is_set():
                    raise Unavailable(f"this front end is shutting down; plan {plan_key} is still building: call again")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CompileTimeout(
                        f"plan {plan_key} is still building (job {job_id}, {state.get('state', 'unknown')}); "
                        "the build continues and its plan will be stored: call again later"
                    )
                event.wait(min(remaining, RECHECK_S))
                event.clear()
        finally:
            self._watcher.unregister(job_id, event)

    def state(self, plan_key: str) -> dict[str, str]:
        with translated_errors("reading a job state"):
            raw = self._redis.hgetall(keys.job_state(plan_key))
        return {k.decode(): v.decode(errors="replace") for k, v in raw.items()}  # type: ignore[union-attr]

    def known_failure(self, plan_key: str) -> str | None:
        """Why cuDNN rejected this key's graph, if it did recently."""
        with translated_errors("reading the negative cache"):
            reason = self._redis.get(keys.failure(plan_key))
            ttl = self._redis.ttl(keys.failure(plan_key)) if reason is not None else 0
        if reason is None:
            return None
        return f"{reason.decode(errors='replace')} (remembered from an earlier build; retried after {ttl} s)"  # type: ignore[union-attr]

    # ---- worker side -------------------------------------------------------

    def mark_running(self, plan_key: str, job_id: str, worker_id: str) -> None:
        self._set_state(plan_key, job_id, RUNNING, worker=worker_id)

    def renew(self, plan_key: str, job_id: str) -> None:
        """Keep the lease while building: a dead worker's lease runs out."""
        with translated_errors("renewing a build lease"):
            self._renew(keys=[keys.build_lease(plan_key)], args=[job_id, int(self._lease_s * 1000)])

    def finish(self, plan_key: str, job_id: str, worker_id: str, error: str | None = None, rejected: bool = False) -> None:
        """Record the outcome; `rejected`: cuDNN refused the graph, remembered
        for the negative cache's lifetime (the key carries the versions)."""
        if error and rejected:
            with translated_errors("recording a rejection"):
                self._redis.set(keys.failure(plan_key), error, ex=max(1, int(self._negative_ttl_s)))
        self._set_state(plan_key, job_id, FAILED if error else DONE, worker=worker_id, error=error or "")
        if error:
            self._record_failure(FailedBuild(at=time.time(), plan_key=plan_key, worker=worker_id, reason=error, rejected=rejected))
        self._release_lease(plan_key, job_id)
        with translated_errors("announcing a finished build"):
            self._redis.publish(keys.EVENTS_CHANNEL, json.dumps({"job_id": job_id, "plan_key": plan_key}))

    def _record_failure(self, failure: FailedBuild) -> None:
        with translated_errors("recording a failed build"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.lpush(keys.RECENT_FAILURES, json.dumps(asdict(failure)))
            pipe.ltrim(keys.RECENT_FAILURES, 0, RECENT_FAILURES_KEPT - 1)
            pipe.execute()

    def recent_failures(self, count: int) -> list[FailedBuild]:
        """The latest failed builds, newest first."""
        with translated_errors("reading recent failures"):
            raw = self._redis.lrange(keys.RECENT_FAILURES, 0, count - 1)
        failures = []
        for item in raw:  # type: ignore[union-attr]
            try:
                failure = FailedBuild(**json.loads(item))
                failure.target_id  # noqa: B018 -- a record whose key does not parse is skipped
            except (ValueError, TypeError, InvalidRequest):
                log.warning("ignoring a malformed failure record %r", item[:200])
                continue
            failures.append(failure)
        return failures

    def _release_lease(self, plan_key: str, job_id: str) -> None:
        with translated_errors("releasing a build lease"):
            self._release(keys=[keys.build_lease(plan_key)], args=[job_id])

    def _set_state(self, plan_key: str, job_id: str, state: str, **extra: str) -> None:
        name = keys.job_state(plan_key)
        # Every field, every time: one HSET replaces the previous job's state.
        fields: dict[str, str] = {"job_id": job_id, "state": state, "updated_at": f"{time.time():.3f}", "worker": "", "error": "", **extra}
        with translated_errors("recording a job state"):
            self._redis.hset(name, mapping=fields)  # type: ignore[arg-type]
            self._redis.expire(name, JOB_STATE_TTL_S)

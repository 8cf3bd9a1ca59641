"""The worker's side of the job streams (blocking: a worker builds one job
at a time and keeps its heartbeat on a thread). See plancache_server.store.jobs."""

from __future__ import annotations

from typing import Any, cast

import redis

from plancache.keys.target import Target
from plancache_server.store import keys
from plancache_server.store.jobs import Delivery, delivery
from plancache_server.store.redis_conn import redis_seconds, translated_errors

# Pending jobs looked at per reclaim (the oldest first).
DEAD_SCAN = 100

# Acknowledge and delete a finished job in one step: an acknowledged entry
# left in the stream would count against the queue's bound forever.
_ACK_AND_DELETE = """
redis.call('xack', KEYS[1], ARGV[1], ARGV[2])
return redis.call('xdel', KEYS[1], ARGV[2])
"""


# Hand a job back: queued again as a new entry (for any worker) with every field it had (ARGV[3..]:
# Job.stream_fields; its callers' `waited` and `yields` included: without them a handed-back build of a hedged
# node's plan went at once on the next worker, and one its callers had left was built for no one), this one
# acknowledged and deleted.
_HAND_BACK = """
redis.call('xadd', KEYS[1], '*', unpack(ARGV, 3))
redis.call('xack', KEYS[1], ARGV[1], ARGV[2])
return redis.call('xdel', KEYS[1], ARGV[2])
"""


class WorkerQueue:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._ack_and_delete = client.register_script(_ACK_AND_DELETE)
        self._hand_back = client.register_script(_HAND_BACK)

    def join(self, targets: list[Target]) -> None:
        """Create each target's stream and consumer group if missing."""
        with translated_errors("joining job streams"):
            for target in targets:
                try:
                    self._redis.xgroup_create(keys.job_stream(target), keys.JOB_GROUP, id="0", mkstream=True)
                except redis.ResponseError as e:
                    if "BUSYGROUP" not in str(e):
                        raise

    def heartbeat(self, worker_id: str, targets: list[Target], ttl_s: float) -> None:
        now = redis_seconds(self._redis)
        with translated_errors("sending a heartbeat"):
            pipe = self._redis.pipeline(transaction=False)
            for target in targets:
                pipe.zadd(keys.workers(target.id), {worker_id: now + ttl_s})
                pipe.zremrangebyscore(keys.workers(target.id), "-inf", now - ttl_s)
                pipe.sadd(keys.KNOWN_TARGETS, target.id)
                pipe.hset(
                    keys.TARGETS_LAST_SEEN, target.id, str(now)
                )  # for retirement (plancache_server.store.lifecycle)
            pipe.execute()

    def leave(self, worker_id: str, targets: list[Target]) -> None:
        with translated_errors("leaving"):
            for target in targets:
                self._redis.zrem(keys.workers(target.id), worker_id)

    def drain_requested(self, worker_id: str) -> bool:
        with translated_errors("checking for a drain request"):
            return bool(self._redis.exists(keys.drain(worker_id)))

    def read(self, worker_id: str, targets: list[Target], block_ms: int | None, count: int = 1) -> list[Delivery]:
        """Up to `count` new jobs (per stream): waiting up to `block_ms` for the first, or not at all (None)."""
        streams = {keys.job_stream(t): ">" for t in targets}
        with translated_errors("reading jobs"):
            read = self._redis.xreadgroup(keys.JOB_GROUP, worker_id, streams, count=count, block=block_ms)  # type: ignore[arg-type]
            reply = cast(list[Any], read)
        return [
            delivery(stream.decode(), entry_id, fields)
            for stream, entries in reply or []
            for entry_id, fields in entries
        ]

    def reclaim(self, worker_id: str, targets: list[Target], min_idle_ms: int) -> list[Delivery]:
        """Jobs another worker took and will not finish, claimed for this
        worker with how often they were handed out: at once when the worker
        holding one has no live heartbeat (it died), else after `min_idle_ms`
        of silence (it hangs while its heartbeat thread still beats)."""
        deliveries = []
        with translated_errors("reclaiming jobs"):
            for target in targets:
                stream = keys.job_stream(target)
                entry_ids = self._held_by_dead_workers(stream, target)
                if entry_ids:
                    claimed: Any = self._redis.xclaim(
                        stream, keys.JOB_GROUP, worker_id, 0, cast(list[Any], entry_ids[:1])
                    )
                    entries = [(entry_id, fields) for entry_id, fields in claimed]
                else:
                    reply: Any = self._redis.xautoclaim(
                        stream, keys.JOB_GROUP, worker_id, min_idle_ms, start_id="0-0", count=1
                    )
                    entries = list(reply[1])
                for entry_id, fields in entries:
                    if fields is None:
                        continue  # deleted from the stream meanwhile
                    pending = self._redis.xpending_range(stream, keys.JOB_GROUP, min=entry_id, max=entry_id, count=1)
                    attempts = int(pending[0]["times_delivered"]) if pending else 1
                    deliveries.append(delivery(stream, entry_id, fields, attempts))
                if deliveries:
                    break
        return deliveries

    def _held_by_dead_workers(self, stream: str, target: Target) -> list[str]:
        """Pending entries whose consumer has no live heartbeat for the target."""
        pending: Any = self._redis.xpending_range(stream, keys.JOB_GROUP, min="-", max="+", count=DEAD_SCAN)
        if not pending:
            return []
        owners = sorted({p["consumer"] for p in pending})
        expiries = self._redis.zmscore(keys.workers(target.id), owners)
        now = redis_seconds(self._redis)
        dead = {owner for owner, expiry in zip(owners, expiries, strict=True) if expiry is None or float(expiry) < now}
        return [p["message_id"] for p in pending if p["consumer"] in dead]

    def touch(self, job: Delivery, worker_id: str) -> None:
        """Tell the group this worker is still on the job (resets its idle time)."""
        with translated_errors("touching a job"):
            self._redis.xclaim(job.stream, keys.JOB_GROUP, worker_id, 0, [job.entry_id], justid=True)

    def hand_back(self, job: Delivery) -> None:
        """A job this worker took but will not build (it is stopping): queued
        again for the next worker, in one step."""
        if job.job is None:
            return self.ack(job)
        with translated_errors("handing a job back"):
            self._hand_back(keys=[job.stream], args=[keys.JOB_GROUP, job.entry_id, *job.job.stream_fields()])

    def ack(self, job: Delivery) -> None:
        """Done with a job: acknowledged and deleted, so that the stream's
        length stays the number of unfinished jobs (the queue's bound)."""
        with translated_errors("acknowledging a job"):
            self._ack_and_delete(keys=[job.stream], args=[keys.JOB_GROUP, job.entry_id])

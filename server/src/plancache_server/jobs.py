"""Build jobs: one Redis stream per target, read by workers in a consumer group.

The same path serves one host and many: a front end appends a job to the
stream of the requested target; any worker of that target, on any host,
reads it through the shared consumer group. Workers announce themselves
with a heartbeat in a sorted set per target, so a front end can refuse at
once a target no live worker can build.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, cast

import redis
from google.protobuf.message import DecodeError

from plancache.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server import keys
from plancache_server.redis_conn import translated_errors

log = logging.getLogger(__name__)

STREAM_MAX_LEN = 100_000


@dataclass(frozen=True)
class Job:
    job_id: str
    plan_key: str
    # The normalized spec, the requested target and the options.
    query: pb.PlanQuery

    def encode(self) -> dict[str, bytes]:
        return {"job_id": self.job_id.encode(), "plan_key": self.plan_key.encode(), "query": self.query.SerializeToString()}

    @classmethod
    def decode(cls, fields: dict[bytes, bytes]) -> Job:
        query = pb.PlanQuery()
        query.ParseFromString(fields[b"query"])
        return cls(job_id=fields[b"job_id"].decode(), plan_key=fields[b"plan_key"].decode(), query=query)


@dataclass(frozen=True)
class Delivery:
    stream: str
    entry_id: str
    job: Job | None  # None when the entry does not decode
    attempts: int = 1  # how many times the job was handed to a worker


class JobQueue:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    # ---- front end side ----------------------------------------------------

    def enqueue(self, target: Target, job: Job) -> None:
        with translated_errors("queueing a build"):
            self._redis.xadd(keys.job_stream(target), job.encode(), maxlen=STREAM_MAX_LEN, approximate=True)  # type: ignore[arg-type]

    def live_workers(self, target: Target) -> int:
        with translated_errors("looking up workers"):
            return int(self._redis.zcount(keys.workers(target.id), time.time(), "+inf"))

    def workers_of(self, target_id: str) -> list[str]:
        with translated_errors("listing workers"):
            members = self._redis.zrangebyscore(keys.workers(target_id), time.time(), "+inf")
        return sorted(m.decode() for m in members)  # type: ignore[union-attr]

    def request_drain(self, worker_id: str) -> bool:
        """Ask a worker to leave; whether a live worker has that id."""
        known = any(worker_id in self.workers_of(t) for t in self.known_targets())
        with translated_errors("asking a worker to drain"):
            self._redis.set(keys.drain(worker_id), "1", ex=24 * 3600)
        return known

    def drain_requested(self, worker_id: str) -> bool:
        with translated_errors("checking for a drain request"):
            return bool(self._redis.exists(keys.drain(worker_id)))

    def depth(self, target: Target) -> tuple[int, int]:
        """(builds queued and not yet taken, builds taken and not finished)."""
        stream = keys.job_stream(target)
        with translated_errors("reading a queue's depth"):
            groups = self._redis.xinfo_groups(stream) if self._redis.exists(stream) else []
        names = (keys.JOB_GROUP, keys.JOB_GROUP.encode())
        group: dict[str, Any] = next((g for g in groups if g["name"] in names), {})  # type: ignore[union-attr]
        # Redis reports lag as nil when it cannot tell (after deletions): count it as 0.
        return int(group.get("lag") or 0), int(group.get("pending") or 0)

    def known_targets(self) -> list[str]:
        """Targets with a live worker now, for error messages and stats."""
        with translated_errors("listing targets"):
            ids = sorted(t.decode() for t in self._redis.smembers(keys.KNOWN_TARGETS))  # type: ignore[union-attr]
            now = time.time()
            return [t for t in ids if int(self._redis.zcount(keys.workers(t), now, "+inf")) > 0]

    # ---- worker side -------------------------------------------------------

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
        expires = time.time() + ttl_s
        with translated_errors("sending a heartbeat"):
            pipe = self._redis.pipeline(transaction=False)
            for target in targets:
                pipe.zadd(keys.workers(target.id), {worker_id: expires})
                pipe.zremrangebyscore(keys.workers(target.id), "-inf", time.time() - ttl_s)
                pipe.sadd(keys.KNOWN_TARGETS, target.id)
            pipe.execute()

    def leave(self, worker_id: str, targets: list[Target]) -> None:
        with translated_errors("leaving"):
            for target in targets:
                self._redis.zrem(keys.workers(target.id), worker_id)

    def read(self, worker_id: str, targets: list[Target], block_ms: int) -> list[Delivery]:
        streams = {keys.job_stream(t): ">" for t in targets}
        with translated_errors("reading jobs"):
            reply = cast(list[Any], self._redis.xreadgroup(keys.JOB_GROUP, worker_id, streams, count=1, block=block_ms))  # type: ignore[arg-type]
        return [_delivery(stream.decode(), entry_id, fields) for stream, entries in reply or [] for entry_id, fields in entries]

    def reclaim(self, worker_id: str, targets: list[Target], min_idle_ms: int) -> list[Delivery]:
        """Jobs another worker took and went silent on (it died mid-build):
        claimed for this worker, with how often they were handed out."""
        deliveries = []
        with translated_errors("reclaiming jobs"):
            for target in targets:
                stream = keys.job_stream(target)
                reply: Any = self._redis.xautoclaim(stream, keys.JOB_GROUP, worker_id, min_idle_ms, start_id="0-0", count=1)
                for entry_id, fields in reply[1]:
                    if fields is None:
                        continue  # trimmed from the stream meanwhile
                    pending = self._redis.xpending_range(stream, keys.JOB_GROUP, min=entry_id, max=entry_id, count=1)
                    attempts = int(pending[0]["times_delivered"]) if pending else 1
                    deliveries.append(_delivery(stream, entry_id, fields, attempts))
        return deliveries

    def touch(self, delivery: Delivery, worker_id: str) -> None:
        """Tell the group this worker is still on the job (resets its idle time)."""
        with translated_errors("touching a job"):
            self._redis.xclaim(delivery.stream, keys.JOB_GROUP, worker_id, 0, [delivery.entry_id], justid=True)

    def ack(self, delivery: Delivery) -> None:
        with translated_errors("acknowledging a job"):
            self._redis.xack(delivery.stream, keys.JOB_GROUP, delivery.entry_id)


def _delivery(stream: str, entry_id: bytes | str, fields: dict[bytes, bytes], attempts: int = 1) -> Delivery:
    entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    try:
        job: Job | None = Job.decode(fields)
    except (KeyError, ValueError, DecodeError) as e:
        log.error("job %s on %s does not decode (%s); dropping it", entry, stream, e)
        job = None
    return Delivery(stream, entry, job, attempts)

"""Build jobs: one Redis stream per target, read by workers in a consumer group.

The same path serves one host and many: a gateway appends a job to the
stream of the requested target; any worker of that target, on any host,
reads it through the shared consumer group. Workers announce themselves
with a heartbeat in a sorted set per target, so a gateway can refuse at
once a target no live worker can build.

A stream holds only unfinished jobs (a worker deletes a job when it acks
it), so its length is the queue's depth, and the queue is bounded at
admission: a gateway adds a job only while the stream is shorter than
its bound (atomically, in one script), and otherwise refuses the caller at
once with a retry delay. Nothing is ever trimmed out of a stream.

Gateways use `JobQueue` (asynchronous); workers use
plancache_server.worker.worker_queue.WorkerQueue (blocking).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from plancache.errors import ResourceExhausted
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.redis_conn import AsyncRedis, redis_seconds_async, text, translated_errors

log = logging.getLogger(__name__)

# Entries read by workers and not finished, looked through for one job (JobQueue.holds): a few per worker.
PENDING_SCAN = 200
# How long one read of a target's depth serves JobQueue.holds for every flight of the gateway.
DEPTH_REUSE_S = 1.0

# Add a job (its fields: ARGV[2..], name, value, ... as Job.stream_fields gives them) only while the stream holds
# fewer than ARGV[1] entries.
_ENQUEUE_IF_ROOM = """
if redis.call('xlen', KEYS[1]) >= tonumber(ARGV[1]) then return false end
return redis.call('xadd', KEYS[1], '*', unpack(ARGV, 2))
"""


# Delete entry ARGV[2] while no worker of group ARGV[1] has read it: 1 when deleted.
_WITHDRAW_IF_UNREAD = """
local ok, pending = pcall(redis.call, 'xpending', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if ok and #pending > 0 then return 0 end
return redis.call('xdel', KEYS[1], ARGV[2])
"""


@dataclass(frozen=True)
class Job:
    job_id: str
    plan_key: str
    # The normalized spec, the requested target and the options.
    query: pb.PlanQuery
    # Queued for callers who say, while they wait, that they do (plancache_server.store.build_records.WANT):
    # a worker drops it when none does any more. A job without it (a gateway of an earlier version) is built.
    waited: bool = False
    # Its callers build the plan themselves meanwhile (CompileRequest.builds_itself: hedged misses): the worker
    # lets it wait while such callers keep asking (plancache_server.worker.lanes.YieldGate), within a bound. A job
    # without it is built at once; one claiming it falsely only delays its own build, by that bound.
    yields: bool = False
    # Queued again by a caller that waits, to hurry a build a worker may hold already (a warm or yielding one:
    # plancache_server.gateway.flight.Flight._promote). The worker holding it moves it to the callers' lanes; a
    # worker that does not hold it builds it, unless another one has started it (BuildRecorder.claim_start).
    hurries: bool = False

    def encode(self) -> dict[str, bytes]:
        return {
            "job_id": self.job_id.encode(),
            "plan_key": self.plan_key.encode(),
            "query": self.query.SerializeToString(),
            "waited": b"1" if self.waited else b"0",
            "yields": b"1" if self.yields else b"0",
            "hurries": b"1" if self.hurries else b"0",
        }

    def stream_fields(self) -> list[bytes]:
        """The job's stream entry as a script's arguments: name, value, name, value, ... (every field of encode():
        the one list the gateway's enqueue and a stopping worker's hand-back both write)."""
        return [part for name, value in self.encode().items() for part in (name.encode(), value)]

    @classmethod
    def decode(cls, fields: dict[bytes, bytes]) -> Job:
        query = pb.PlanQuery()
        query.ParseFromString(fields[b"query"])
        return cls(
            job_id=fields[b"job_id"].decode(),
            plan_key=fields[b"plan_key"].decode(),
            query=query,
            waited=fields.get(b"waited") == b"1",
            yields=fields.get(b"yields") == b"1",
            hurries=fields.get(b"hurries") == b"1",
        )


@dataclass(frozen=True)
class Delivery:
    stream: str
    entry_id: str
    job: Job | None  # None when the entry does not decode
    attempts: int = 1  # how many times the job was handed to a worker


def delivery(stream: str, entry_id: bytes | str, fields: dict[bytes, bytes], attempts: int = 1) -> Delivery:
    entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    try:
        job: Job | None = Job.decode(fields)
    except (KeyError, ValueError, DecodeError) as e:
        log.error("job %s on %s does not decode (%s); dropping it", entry, stream, e)
        job = None
    return Delivery(stream, entry, job, attempts)


class JobQueue:
    """The gateway's side: queue jobs, and look at queues and workers."""

    def __init__(self, client: AsyncRedis, max_jobs: int, retry_delay_s: float) -> None:
        self._redis = client
        self._max_jobs = max_jobs
        self._retry_delay_s = retry_delay_s
        self._enqueue_if_room = client.register_script(_ENQUEUE_IF_ROOM)
        # Per target: when its depth was read for holds(), and the depth. Every flight of a gateway whose job
        # waits looks every few seconds; behind a long queue (a flood's thousands of jobs) they share one read
        # of it a DEPTH_REUSE_S, not one each: the Redis every caller's hits use is not theirs to fill.
        self._depth_seen: dict[str, tuple[float, int, int]] = {}
        self._withdraw_if_unread = client.register_script(_WITHDRAW_IF_UNREAD)

    async def withdraw(self, target: Target, entry_id: str) -> bool:
        """Take a job back out of its stream while no worker has read it (its callers all left): whether
        it was taken out."""
        with translated_errors("withdrawing a job"):
            return bool(await self._withdraw_if_unread(keys=[keys.job_stream(target)], args=[keys.JOB_GROUP, entry_id]))

    async def enqueue(self, target: Target, job: Job) -> str:
        """Queue a job, or refuse it (ResourceExhausted) when the target's queue is full; its entry id."""
        with translated_errors("queueing a build"):
            added = await self._enqueue_if_room(
                keys=[keys.job_stream(target)], args=[self._max_jobs, *job.stream_fields()]
            )
        if not added:
            raise ResourceExhausted(
                f"the build queue of target {target.id} is full ({self._max_jobs} unfinished builds); "
                f"nothing was queued for {job.plan_key}: call again later",
                retry_after=self._retry_delay_s,
            )
        return text(added)

    async def live_workers(self, target: Target) -> int:
        now = await redis_seconds_async(self._redis)  # the clock heartbeats are written on
        with translated_errors("looking up workers"):
            return int(await self._redis.zcount(keys.workers(target.id), now, "+inf"))

    async def seconds_since_expiry(self, target: Target) -> float | None:
        """How long ago the entry of `target`'s last worker expired, when it is still there and none is live; None
        when none is there (none ever beat, or each one left: a worker that stops, or loses its GPU, takes its
        entry out at once). An entry that expired a moment ago is a worker whose beats did not reach Redis for a
        while (a failover longer than --heartbeat-ttl: its next beat renews it) or that is restarting."""
        now = await redis_seconds_async(self._redis)
        with translated_errors("looking up workers"):
            latest = await self._redis.zrevrange(keys.workers(target.id), 0, 0, withscores=True)
        if not latest:
            return None
        return max(0.0, now - float(latest[0][1]))

    async def advertised_targets(self) -> set[str]:
        """Every target a worker ever announced (live or not)."""
        with translated_errors("listing targets"):
            return {text(t) for t in await self._redis.smembers(keys.KNOWN_TARGETS)}

    async def live_targets(self) -> dict[str, list[str]]:
        """Targets with a live worker now, and those workers."""
        ids = sorted(await self.advertised_targets())
        now = await redis_seconds_async(self._redis)
        with translated_errors("listing workers"):
            pipe = self._redis.pipeline(transaction=False)
            for target_id in ids:
                pipe.zrangebyscore(keys.workers(target_id), now, "+inf")
            replies = await pipe.execute()
        return {t: sorted(text(m) for m in members) for t, members in zip(ids, replies, strict=True) if members}

    async def request_drain(self, worker_id: str) -> bool:
        """Ask a worker to leave; whether a live worker has that id."""
        known = any(worker_id in workers for workers in (await self.live_targets()).values())
        with translated_errors("asking a worker to drain"):
            await self._redis.set(keys.drain(worker_id), "1", ex=24 * 3600)
        return known

    async def holds(self, target: Target, job_id: str, entry_id: str = "") -> bool | None:
        """Whether job `job_id` is in `target`'s stream, read by a worker or not; None when that cannot be told
        cheaply. False is a job lost: a Redis failover drops the last writes its master had not replicated, a
        queued job's entry among them, while its state on another shard says it is queued (found by
        tests/integration/test_cluster_failover.py under load).

        `entry_id`, the entry the caller queued the job under (a flight knows its own): looked up by id, one
        command whatever waits before it, so a job lost behind unread entries is found too. Absent, the job may
        also have moved to a new entry (a stopping worker hands unstarted jobs back as new entries): that reads
        as lost, and costs the caller's one queueing again (a worker that meets the old job's entry later finds
        its plan stored, or builds it once more). Without one (a flight that joined another's job): nothing is
        told while entries wait unread (it may be one of them), else the entries read and unfinished are looked
        through (None past PENDING_SCAN of them)."""
        stream = keys.job_stream(target)
        wanted = job_id.encode()
        if entry_id:
            with translated_errors("looking for a job in its stream"):
                found: Any = await self._redis.xrange(stream, min=entry_id, max=entry_id, count=1)
            if found and found[0][1] and found[0][1].get(b"job_id") == wanted:
                return True
        unread, read = await self._shared_depth(target)
        if unread:
            # Its entry gone while others wait unread: lost (or moved: the docstring). Without its entry: untold.
            return False if entry_id else None
        if not read:
            return False
        with translated_errors("looking for a job in its stream"):
            held: list[dict[str, Any]] = await self._redis.xpending_range(
                stream, keys.JOB_GROUP, min="-", max="+", count=PENDING_SCAN
            )
            if len(held) >= PENDING_SCAN:
                return None
            pipe = self._redis.pipeline(transaction=False)  # one round trip (one key: one shard)
            for entry in held:
                pipe.xrange(stream, min=entry["message_id"], max=entry["message_id"], count=1)
            entries: list[Any] = await pipe.execute()
        return any(found and found[0][1] and found[0][1].get(b"job_id") == wanted for found in entries)

    async def _shared_depth(self, target: Target) -> tuple[int, int]:
        """depth(), read at most once every DEPTH_REUSE_S per target for all of this gateway's looks while entries
        wait unread (a flood's thousands of flights behind one queue do not each read it); a drained queue is read
        afresh (the case where a look acts)."""
        seen = self._depth_seen.get(target.id)
        if seen is not None and seen[1] and time.monotonic() - seen[0] < DEPTH_REUSE_S:
            return seen[1], seen[2]
        unread, read = await self.depth(target)
        if len(self._depth_seen) >= 1024:  # targets: a few; a bound all the same
            self._depth_seen.clear()
        self._depth_seen[target.id] = (time.monotonic(), unread, read)
        return unread, read

    async def depth(self, target: Target) -> tuple[int, int]:
        """(builds queued and not yet taken, builds taken and not finished)."""
        stream = keys.job_stream(target)
        with translated_errors("reading a queue's depth"):
            length = int(await self._redis.xlen(stream))
            groups: list[dict[str, Any]] = await self._redis.xinfo_groups(stream) if length else []
        names = (keys.JOB_GROUP, keys.JOB_GROUP.encode())
        pending = int(next((g for g in groups if g["name"] in names), {}).get("pending") or 0)
        return max(0, length - pending), pending

"""Warming: plans built for a target before its nodes ask.

Every upgrade of cuDNN or the frontend, and every new GPU kind, is a new
target with no plans. Warming builds, for a target T, the specs another
source served, in order of their recent hits: a sibling target's plans (the
same compute capability with other versions, or the same versions on
another device), the specs any target served in the last N days, or a
manifest.

A *warming plan* is written once per target: its items in build order, each
a complete build query (the spec the source's worker stored, T, the source
plan's options) and the source's recent hits of it; the share of the
source's hits the items cover once built is the plan's coverage. Workers of
T take the items one by one at the lowest priority (plancache_server.worker.worker:
a real miss is never delayed by warming beyond one candidate build) under a
per-target lease (one worker warms a target at a time across the fleet),
record each item's outcome (built, skipped because stored or being built,
failed with the reason) and resume where a restart left off: an item in
flight on a worker whose lease moved to another is built again.

Nothing here trusts Redis: an item is a job like any other, and the worker
derives its plan key from its spec, target and options before building it
(a forged or damaged item fails, is recorded and skipped).

Blocking (a worker, and gateways through a thread, as the janitor).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from google.protobuf.message import DecodeError

from plancache.errors import InvalidRequest, ResourceExhausted
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import make_key, parse_key
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.jobs import Job
from plancache_server.store.redis_conn import text, translated_errors

log = logging.getLogger(__name__)

# Bounds an operator's request is held to.
MAX_TOP = 10_000
DEFAULT_TOP = 1_000
MAX_DAYS = 366
HIT_HOURS = 24
WARM_JOB_PREFIX = "warm-"
ACTIVE, DONE, CANCELLED = "active", "done", "cancelled"
# Items one target's warming list may hold, appended graph families included.
MAX_QUEUED_ITEMS = 50_000
FAMILIES_SOURCE = "graph families"
BUILT, SKIPPED, FAILED = "built", "skipped", "failed"
FAILURES_SHOWN = 20


@dataclass(frozen=True)
class WarmItem:
    index: int
    plan_key: str  # for the warmed target
    source_key: str  # the source plan it comes from ("" for a manifest's entry)
    hits: float  # the source's recent hits of it
    query: pb.PlanQuery

    def job(self) -> Job:
        return Job(job_id=f"{WARM_JOB_PREFIX}{uuid.uuid4().hex}", plan_key=self.plan_key, query=self.query)

    def encode(self) -> str:
        return json.dumps(
            {
                "plan_key": self.plan_key,
                "source_key": self.source_key,
                "hits": self.hits,
                "query": self.query.SerializeToString().hex(),
            }
        )

    @classmethod
    def decode(cls, index: int, raw: bytes) -> WarmItem:
        fields = json.loads(raw)
        return cls(
            index,
            str(fields["plan_key"]),
            str(fields["source_key"]),
            float(fields["hits"]),
            pb.PlanQuery.FromString(bytes.fromhex(fields["query"])),
        )


@dataclass
class WarmStatus:
    target_id: str
    source: str
    state: str
    total: int
    built: int = 0
    skipped: int = 0
    failed: int = 0
    in_flight: int = 0
    source_hits: float = 0.0  # the source's hits in the last 24 h when the plan was made
    covered_hits: float = 0.0  # of those, the hits of items whose plan is stored for the target now
    missing_specs: int = 0  # source plans no worker stored a spec for (built before specs were kept)
    created_at: float = 0.0
    updated_at: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (plan key, reason), newest first

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.built - self.skipped - self.failed)

    @property
    def coverage(self) -> float:
        return (
            self.covered_hits / self.source_hits
            if self.source_hits
            else (1.0 if self.total == self.built + self.skipped else 0.0)
        )

    def to_proto(self) -> pb.WarmTargetStatus:
        return pb.WarmTargetStatus(
            target_id=self.target_id,
            source=self.source,
            state=self.state,
            total=self.total,
            built=self.built,
            skipped=self.skipped,
            failed=self.failed,
            in_flight=self.in_flight,
            remaining=self.remaining,
            source_hits_24h=self.source_hits,
            covered_hits_24h=self.covered_hits,
            coverage=self.coverage,
            missing_specs=self.missing_specs,
            created_at=self.created_at,
            updated_at=self.updated_at,
            failures=[pb.WarmFailure(plan_key=k, reason=r) for k, r in self.failures],
        )


@dataclass(frozen=True)
class Source:
    """Where a plan's items come from: a target's plans, any target's plans
    served in the last `days`, or a manifest's queries."""

    target_id: str = ""
    days: int = 0
    manifest: tuple[pb.PlanQuery, ...] = ()

    @property
    def text(self) -> str:
        if self.target_id:
            return f"target {self.target_id}"
        if self.days:
            return f"specs served in the last {self.days} day(s)"
        return f"a manifest of {len(self.manifest)} spec(s)"


def record_spec(client: redis.Redis, spec_hash: str, spec: pb.GraphSpec) -> None:
    """A worker keeps the normalized spec of what it built (its hash derived by it)."""
    with translated_errors("keeping a spec"):
        client.set(keys.spec_body(spec_hash), spec.SerializeToString())


def recent_plan_hits(client: redis.Redis, now: float | None = None) -> dict[str, float]:
    """Plan key -> hits in the last 24 hours (the gateways' hour buckets)."""
    hour = int((now or time.time()) // 3600)
    totals: defaultdict[str, float] = defaultdict(float)
    with translated_errors("reading recent hits"):
        pipe = client.pipeline(transaction=False)
        for h in range(hour - HIT_HOURS + 1, hour + 1):
            pipe.zrange(keys.plan_hits(h), 0, -1, withscores=True)
        for bucket in pipe.execute():
            for member, score in bucket:
                totals[text(member)] += float(score)
    return dict(totals)


class Warming:
    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._clock = clock

    # ---- plans --------------------------------------------------------------------

    def plan(
        self,
        target: Target,
        source: Source,
        top: int = DEFAULT_TOP,
        min_hits: float = 0.0,
        by: str = "operator",
        keep_empty: bool = True,
    ) -> WarmStatus | None:
        """Write the warming plan of `target` (replacing any earlier one);
        with `keep_empty` off, a plan with nothing to build is not written
        (None). InvalidRequest for bounds or sources that do not hold."""
        if not 1 <= top <= MAX_TOP:
            raise InvalidRequest(f"top must be between 1 and {MAX_TOP}, not {top}")
        if min_hits < 0:
            raise InvalidRequest(f"min_hits must not be negative, not {min_hits:g}")
        if source.days and not 1 <= source.days <= MAX_DAYS:
            raise InvalidRequest(f"days must be between 1 and {MAX_DAYS}, not {source.days}")
        if source.target_id == target.id:
            raise InvalidRequest(f"a target cannot be warmed from itself ({target.id})")
        hits = recent_plan_hits(self._redis)
        candidates, missing = self._candidates(source, hits)
        source_hits = sum(h for _, h, _ in candidates) + missing[1]
        items: list[WarmItem] = []
        seen: set[str] = set()
        for source_key, item_hits, query in sorted(candidates, key=lambda c: -c[1]):
            if item_hits < min_hits or len(items) >= top:
                continue
            options = CompileOptions.from_proto(query.options)
            # The source plan's spec, for this target (its worker derives the key again from the spec).
            spec_hash = parse_key(source_key).spec_hash if source_key else _spec_hash(query)
            plan_key = make_key(spec_hash, target, options)
            if plan_key in seen:
                continue  # the same spec and options from several source targets (days)
            seen.add(plan_key)
            for_target = pb.PlanQuery(spec=query.spec, target=target.to_proto(), options=query.options)
            items.append(WarmItem(len(items), plan_key, source_key, item_hits, for_target))
        if not items and not keep_empty:
            return None
        now = self._clock()
        record = {
            "source": source.text,
            "state": ACTIVE,
            "total": len(items),
            "cursor": 0,
            "source_hits": source_hits,
            "missing_specs": missing[0],
            "created_at": now,
            "updated_at": now,
            "by": by,
            "top": top,
            "min_hits": min_hits,
        }
        with translated_errors("writing a warming plan"):
            pipe = self._redis.pipeline(transaction=True)
            for part in (keys.warm_plan, keys.warm_items, keys.warm_outcomes, keys.warm_in_flight):
                pipe.delete(part(target.id))
            pipe.hset(keys.warm_plan(target.id), mapping={k: json.dumps(v) for k, v in record.items()})
            for chunk in range(0, len(items), 500):
                pipe.rpush(keys.warm_items(target.id), *[i.encode() for i in items[chunk : chunk + 500]])
            pipe.sadd(keys.WARM_TARGETS, target.id)
            pipe.execute()
        log.info(
            "warming %s from %s: %d item(s) (%s), %.0f recent hits of the source",
            target.id,
            source.text,
            len(items),
            by,
            source_hits,
        )
        return self.status(target.id)

    def extend(self, target: Target, items: Sequence[tuple[str, pb.PlanQuery]], by: str) -> int:
        """Queue (plan key, query for `target`) items at warming's priority
        (graph families): appended to the target's active plan, or starting
        one after a finished or cancelled plan's items (those are not taken
        up again). Returns how many were queued; ResourceExhausted past
        MAX_QUEUED_ITEMS in the target's list."""
        if not items:
            return 0
        with translated_errors("queueing warming items"):
            length = int(self._redis.llen(keys.warm_items(target.id)))
            if length + len(items) > MAX_QUEUED_ITEMS:
                raise ResourceExhausted(
                    f"target {target.id} has {length:,} warming items queued; {len(items):,} more would pass {MAX_QUEUED_ITEMS:,}: "
                    "wait for them to be built (or cancel the target's warming)"
                )
            state = _loads(self._redis.hget(keys.warm_plan(target.id), "state") or b'""')
            now = self._clock()
            pipe = self._redis.pipeline(transaction=True)
            if state != ACTIVE:
                # A new plan over the old list: the cursor past the old items, counts of these alone.
                record = {
                    "source": FAMILIES_SOURCE,
                    "state": ACTIVE,
                    "total": 0,
                    "cursor": length,
                    "source_hits": 0.0,
                    "missing_specs": 0,
                    "created_at": now,
                    "by": by,
                    "top": 0,
                    "min_hits": 0.0,
                }
                pipe.delete(keys.warm_outcomes(target.id), keys.warm_in_flight(target.id), keys.warm_retry(target.id))
                pipe.hset(keys.warm_plan(target.id), mapping={k: json.dumps(v) for k, v in record.items()})
            pipe.rpush(
                keys.warm_items(target.id),
                *[WarmItem(length + i, plan_key, "", 0.0, query).encode() for i, (plan_key, query) in enumerate(items)],
            )
            pipe.hincrby(keys.warm_plan(target.id), "total", len(items))
            pipe.hset(keys.warm_plan(target.id), "updated_at", json.dumps(now))
            pipe.sadd(keys.WARM_TARGETS, target.id)
            pipe.execute()
        log.info("warming %s: %d item(s) queued (%s)", target.id, len(items), by)
        return len(items)

    def _candidates(
        self, source: Source, hits: dict[str, float]
    ) -> tuple[list[tuple[str, float, pb.PlanQuery]], tuple[int, float]]:
        """(source key, recent hits, query without target) per source plan
        whose spec is stored; and (how many were not, their hits)."""
        if source.manifest:
            return [("", 0.0, q) for q in source.manifest], (0, 0.0)
        if source.target_id:
            pattern = keys.plan_pattern_for_target(source.target_id)
            with translated_errors("listing the source's plans"):
                source_keys = sorted(
                    {keys.plan_key_of(text(k)) for k in self._redis.scan_iter(match=pattern, count=1000)}
                )
            if not source_keys:
                raise InvalidRequest(f"target {source.target_id} has no stored plans to warm from")
        else:
            since = self._clock() - source.days * 86400
            with translated_errors("listing recently served plans"):
                source_keys = sorted(text(k) for k in self._redis.zrangebyscore(keys.PLAN_INDEX, since, "+inf"))
        found: list[tuple[str, float, pb.PlanQuery]] = []
        missing, missing_hits = 0, 0.0
        for batch in _batches(source_keys, 200):
            with translated_errors("reading the source's plans"):
                pipe = self._redis.pipeline(transaction=False)
                for key in batch:
                    pipe.hget(keys.plan(key), "meta")
                metas = pipe.execute()
            parsed: list[tuple[str, pb.PlanMetadata]] = []
            for key, raw in zip(batch, metas, strict=True):
                meta = _metadata(raw)
                if meta is not None and meta.key == key:
                    parsed.append((key, meta))
            with translated_errors("reading the source's specs"):
                pipe = self._redis.pipeline(transaction=False)
                for _, meta in parsed:
                    pipe.get(keys.spec_body(meta.spec_hash))
                bodies = pipe.execute()
            for (key, meta), body in zip(parsed, bodies, strict=True):
                spec = _spec(body)
                if spec is None:
                    missing += 1
                    missing_hits += hits.get(key, 0.0)
                    continue
                found.append((key, hits.get(key, 0.0), pb.PlanQuery(spec=spec, options=meta.options)))
        return found, (missing, missing_hits)

    def cancel(self, target_id: str) -> WarmStatus:
        with translated_errors("cancelling a warming plan"):
            if not self._redis.exists(keys.warm_plan(target_id)):
                raise InvalidRequest(f"target {target_id} has no warming plan to cancel")
            self._redis.hset(
                keys.warm_plan(target_id),
                mapping={"state": json.dumps(CANCELLED), "updated_at": json.dumps(self._clock())},
            )
        return self.status(target_id)

    # ---- status -------------------------------------------------------------------

    def targets(self) -> list[str]:
        with translated_errors("listing warmed targets"):
            return sorted(text(t) for t in self._redis.smembers(keys.WARM_TARGETS))

    def status(self, target_id: str) -> WarmStatus:
        with translated_errors("reading a warming plan"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hgetall(keys.warm_plan(target_id))
            pipe.hgetall(keys.warm_outcomes(target_id))
            pipe.hlen(keys.warm_in_flight(target_id))
            pipe.lrange(keys.warm_items(target_id), 0, -1)
            raw_plan, raw_outcomes, in_flight, raw_items = pipe.execute()
        if not raw_plan:
            raise InvalidRequest(f"target {target_id} has no warming plan")
        record = {text(k): _loads(v) for k, v in raw_plan.items()}
        status = WarmStatus(
            target_id,
            str(record.get("source", "")),
            str(record.get("state", ACTIVE)),
            int(record.get("total", 0)),
            in_flight=int(in_flight),
            source_hits=float(record.get("source_hits", 0.0)),
            missing_specs=int(record.get("missing_specs", 0)),
            created_at=float(record.get("created_at", 0.0)),
            updated_at=float(record.get("updated_at", 0.0)),
        )
        failures: list[tuple[float, str, str]] = []
        for _, raw in raw_outcomes.items():
            outcome = _loads(raw)
            if not isinstance(outcome, dict):
                continue
            kind = outcome.get("outcome")
            if kind == BUILT:
                status.built += 1
            elif kind == SKIPPED:
                status.skipped += 1
            elif kind == FAILED:
                status.failed += 1
                failures.append(
                    (
                        float(outcome.get("at", 0.0)),
                        str(outcome.get("plan_key", ""))[:300],
                        str(outcome.get("reason", ""))[:500],
                    )
                )
        status.failures = [(k, r) for _, k, r in sorted(failures, reverse=True)[:FAILURES_SHOWN]]
        items = [WarmItem.decode(i, raw) for i, raw in enumerate(raw_items)]
        with translated_errors("reading what is stored"):
            pipe = self._redis.pipeline(transaction=False)
            for item in items:
                pipe.exists(keys.plan(item.plan_key))
            stored = pipe.execute() if items else []
        status.covered_hits = sum(item.hits for item, present in zip(items, stored, strict=True) if present)
        return status

    def all_status(self) -> list[WarmStatus]:
        found = []
        for target_id in self.targets():
            try:
                found.append(self.status(target_id))
            except InvalidRequest:
                continue  # listed, then replaced or gone
        return found

    # ---- a worker's side ---------------------------------------------------------------

    def active_targets(self, served: Iterable[Target]) -> list[str]:
        """The targets among `served` with a warming plan still to do."""
        found = []
        for target in served:
            with translated_errors("reading a warming plan"):
                raw = self._redis.hmget(keys.warm_plan(target.id), ["state", "cursor", "total"])
            if raw[0] is not None and _loads(raw[0]) == ACTIVE:
                found.append(target.id)
        return found

    def hold(self, target_id: str, worker_id: str, lease_s: float) -> bool:
        """Take or keep the target's warming lease; when this worker takes it
        over, items another worker had in flight are queued again."""
        lease = keys.warm_lease(target_id)
        with translated_errors("taking a warming lease"):
            if self._redis.set(lease, worker_id, nx=True, px=int(lease_s * 1000)):
                orphans = [
                    k for k, v in self._redis.hgetall(keys.warm_in_flight(target_id)).items() if text(v) != worker_id
                ]
                if orphans:
                    self._redis.hdel(keys.warm_in_flight(target_id), *orphans)
                    self._redis.rpush(keys.warm_retry(target_id), *orphans)
                    log.info(
                        "warming %s: %d item(s) another worker left in flight will be built again",
                        target_id,
                        len(orphans),
                    )
                return True
            holder = self._redis.get(lease)
            if holder is not None and text(holder) == worker_id:
                self._redis.pexpire(lease, int(lease_s * 1000))
                return True
        return False

    def release(self, target_id: str, worker_id: str) -> None:
        with translated_errors("releasing a warming lease"):
            if text(self._redis.get(keys.warm_lease(target_id)) or b"") == worker_id:
                self._redis.delete(keys.warm_lease(target_id))

    def next_item(self, target_id: str, worker_id: str) -> WarmItem | None:
        """The next item to build (an orphan first), marked in flight for
        this worker; None when the plan has none left (then it is done)."""
        with translated_errors("taking a warming item"):
            retried = cast(bytes | None, self._redis.lpop(keys.warm_retry(target_id)))
            index = (
                int(retried)
                if retried is not None
                else int(self._redis.hincrby(keys.warm_plan(target_id), "cursor", 1)) - 1
            )
            raw = cast(bytes | None, self._redis.lindex(keys.warm_items(target_id), index))
            if raw is None:
                if not self._redis.hlen(keys.warm_in_flight(target_id)):
                    self._finish_plan(target_id)
                return None
            self._redis.hset(keys.warm_in_flight(target_id), str(index), worker_id)
        try:
            return WarmItem.decode(index, raw)
        except (ValueError, KeyError, TypeError, DecodeError) as e:
            self.record(target_id, index, FAILED, f"the item does not decode ({type(e).__name__})", "")
            return self.next_item(target_id, worker_id)

    def retry_later(self, target_id: str, index: int) -> None:
        with translated_errors("deferring a warming item"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hdel(keys.warm_in_flight(target_id), str(index))
            pipe.rpush(keys.warm_retry(target_id), str(index))
            pipe.execute()

    def record(self, target_id: str, index: int, outcome: str, reason: str = "", plan_key: str = "") -> None:
        """An item's outcome (built, skipped, failed with the reason)."""
        entry = {"outcome": outcome, "reason": reason[:1000], "plan_key": plan_key[:512], "at": self._clock()}
        with translated_errors("recording a warming outcome"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hset(keys.warm_outcomes(target_id), str(index), json.dumps(entry))
            pipe.hdel(keys.warm_in_flight(target_id), str(index))
            pipe.hset(keys.warm_plan(target_id), "updated_at", json.dumps(self._clock()))
            pipe.execute()

    def _finish_plan(self, target_id: str) -> None:
        with translated_errors("finishing a warming plan"):
            state = _loads(self._redis.hget(keys.warm_plan(target_id), "state") or b'""')
            if state == ACTIVE:
                self._redis.hset(
                    keys.warm_plan(target_id),
                    mapping={"state": json.dumps(DONE), "updated_at": json.dumps(self._clock())},
                )
                log.info("warming %s: done", target_id)

    def created_at(self, target_id: str) -> float | None:
        """When the target's warming plan was made (None: it has none)."""
        with translated_errors("reading a warming plan"):
            raw = self._redis.hget(keys.warm_plan(target_id), "created_at")
        value = _loads(raw) if raw is not None else None
        return float(value) if isinstance(value, int | float) else None

    @property
    def client(self) -> redis.Redis:
        return self._redis


def siblings(target: Target, known: Iterable[str]) -> list[Target]:
    """Targets whose history can warm `target`: the same compute capability
    with other versions, or the same versions on another device (the
    generic target of an exact one, and the other way round)."""
    found = []
    for target_id in known:
        try:
            other = Target.parse(target_id)
        except InvalidRequest:
            continue
        if other.id == target.id or other.compute_capability != target.compute_capability:
            continue
        same_versions = (other.cudnn_version, other.frontend_version) == (target.cudnn_version, target.frontend_version)
        if not same_versions or (other.device_name, other.sm_count) != (target.device_name, target.sm_count):
            found.append(other)
    return found


def _batches(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _metadata(raw: bytes | None) -> pb.PlanMetadata | None:
    if raw is None:
        return None
    try:
        return pb.PlanMetadata.FromString(raw)
    except DecodeError:
        return None


def _spec(raw: bytes | None) -> pb.GraphSpec | None:
    if raw is None:
        return None
    try:
        return pb.GraphSpec.FromString(raw)
    except DecodeError:
        return None


def _spec_hash(query: pb.PlanQuery) -> str:
    """The spec hash of a manifest's query (it names no target: the warmed one is the plan's)."""
    from plancache.graphspec import spec_io
    from plancache.graphspec.canonical import spec_hash

    return spec_hash(spec_io.from_proto(query.spec))


def _loads(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return None

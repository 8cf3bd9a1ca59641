"""Writing a target's warming plan: its items in build order, from a
source's recent hits (a sibling target's plans, any target's served in the
last days, or a manifest), or appended (graph families); and cancelling
it (plancache_server.store.warming)."""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import redis
from google.protobuf.message import DecodeError

from plancache.errors import InvalidRequest, ResourceExhausted
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import make_key, parse_key
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.redis_conn import text, translated_errors
from plancache_server.store.warm_items import ACTIVE, CANCELLED, WarmItem
from plancache_server.store.warm_progress import WarmProgress, WarmStatus

log = logging.getLogger(__name__)

# Bounds an operator's request is held to.
MAX_TOP = 10_000
DEFAULT_TOP = 1_000
MAX_DAYS = 366
HIT_HOURS = 24
# Items one target's warming list may hold, appended graph families included.
MAX_QUEUED_ITEMS = 50_000
FAMILIES_SOURCE = "graph families"

# Appends items to a target's warming list in turns with those not taken yet (past the plan's cursor), each
# in its own order: a program sweeping sizes asks for one family per function it calls (rms_norm, then
# linear), and a size is a hit only when every graph of it is built; appended one after the other, the
# second family's members waited for all of the first's (GPU run 31: 509 linear members before the first
# rms_norm one). Items before the cursor (taken: built, in flight or to retry) keep their places; an item's
# index is its place, and only untaken places move. Over a finished or cancelled plan (or none) a new plan
# starts past the old list (its untaken items are not taken up again): its record written, the old
# outcomes dropped. All in one step: two families asked at the same instant each read "no active plan"
# when the state was read first, and both were appended one after the other (GPU run 33: 458 rms_norm
# members before the first linear one). Run on its own, not in a MULTI: a script in a pipeline needs
# SCRIPT EXISTS (another ACL permission) and redis-py's pipeline loading.
# KEYS: plan, items, outcomes, in-flight, retry. ARGV: the time (JSON), the most items the list may hold, n,
# then n field/value pairs of a new plan's record (JSON values; its cursor is set here), then the items.
# Returns {1, how many waiting items the new ones took turns with}, or {0, the list's length} when the new
# ones would pass the bound (nothing appended: checked here, two asks racing cannot both pass it).
_APPEND_IN_TURNS = """
local length = redis.call('llen', KEYS[2])
local fields = tonumber(ARGV[3])
local first = 4 + 2 * fields
if length + #ARGV - first + 1 > tonumber(ARGV[2]) then return {0, length} end
local cursor
if redis.call('hget', KEYS[1], 'state') == '"active"' then
  cursor = tonumber(redis.call('hget', KEYS[1], 'cursor') or '0') or 0
  if cursor > length then
    cursor = length
    redis.call('hset', KEYS[1], 'cursor', cursor)
  end
else
  cursor = length
  redis.call('del', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
  for f = 4, first - 1, 2 do redis.call('hset', KEYS[1], ARGV[f], ARGV[f + 1]) end
  redis.call('hset', KEYS[1], 'cursor', cursor, 'total', 0)
end
local waiting = {}
if cursor < length then
  waiting = redis.call('lrange', KEYS[2], cursor, -1)
  if cursor == 0 then redis.call('del', KEYS[2]) else redis.call('ltrim', KEYS[2], 0, cursor - 1) end
end
local i, j = 1, first
while i <= #waiting or j <= #ARGV do
  if i <= #waiting then redis.call('rpush', KEYS[2], waiting[i]); i = i + 1 end
  if j <= #ARGV then redis.call('rpush', KEYS[2], ARGV[j]); j = j + 1 end
end
redis.call('hincrby', KEYS[1], 'total', #ARGV - first + 1)
redis.call('hset', KEYS[1], 'updated_at', ARGV[1])
return {1, #waiting}
"""


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


class WarmPlans:
    def __init__(self, client: redis.Redis, clock: Callable[[], float], progress: WarmProgress) -> None:
        self._redis = client
        self._clock = clock
        self._progress = progress
        self._append_in_turns = client.register_script(_APPEND_IN_TURNS)

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
            pipe.execute()
            # Outside the transaction: the index of warmed targets lives in another hash slot of a cluster.
            self._redis.sadd(keys.WARM_TARGETS, target.id)
        log.info(
            "warming %s from %s: %d item(s) (%s), %.0f recent hits of the source",
            target.id,
            source.text,
            len(items),
            by,
            source_hits,
        )
        return self._progress.status(target.id)

    def extend(self, target: Target, items: Sequence[tuple[str, pb.PlanQuery]], by: str) -> int:
        """Queue (plan key, query for `target`) items at warming's priority
        (graph families): appended to the target's active plan in turns with
        its items not taken yet (_APPEND_IN_TURNS), or starting
        one after a finished or cancelled plan's items (those are not taken
        up again). Returns how many were queued; ResourceExhausted past
        MAX_QUEUED_ITEMS in the target's list."""
        if not items:
            return 0
        with translated_errors("queueing warming items"):
            now = self._clock()
            # A new plan's record, where the target has no active one (the script decides, atomically).
            record = {
                "source": FAMILIES_SOURCE,
                "state": ACTIVE,
                "source_hits": 0.0,
                "missing_specs": 0,
                "created_at": now,
                "by": by,
                "top": 0,
                "min_hits": 0.0,
            }
            appended, value = self._append_in_turns(
                keys=[
                    keys.warm_plan(target.id),
                    keys.warm_items(target.id),
                    keys.warm_outcomes(target.id),
                    keys.warm_in_flight(target.id),
                    keys.warm_retry(target.id),
                ],
                args=[
                    json.dumps(now),
                    MAX_QUEUED_ITEMS,
                    len(record),
                    *(part for k, v in record.items() for part in (k, json.dumps(v))),
                    # An item's index is its place in the list (taken at the cursor), not what it encodes.
                    *(WarmItem(i, key, "", 0.0, query).encode() for i, (key, query) in enumerate(items)),
                ],
            )
            if not int(appended):
                raise ResourceExhausted(
                    f"target {target.id} has {int(value):,} warming items queued; {len(items):,} more would pass "
                    f"{MAX_QUEUED_ITEMS:,}: wait for them to be built (or cancel the target's warming)"
                )
            # Outside the transaction: the index of warmed targets lives in another hash slot of a cluster.
            self._redis.sadd(keys.WARM_TARGETS, target.id)
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
        return self._progress.status(target_id)


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

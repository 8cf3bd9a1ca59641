"""A plan's lifecycle in the store: accounted when written, its last use
recorded, deleted when unused past the retention or when the store is over
its bound (least recently used first).

- **Accounting.** Workers write plans; each write adds the plan's bytes and
  count to its target's counters (`keys.STORE_COUNTERS`) and puts the plan
  in the index of last use (`keys.PLAN_INDEX`, a sorted set: plan key ->
  unix seconds). Only plans are ever deleted here: leases, job streams,
  statistics and the negative cache are other keys, never touched (Redis'
  own maxmemory eviction would take any of them).
- **Last use.** Gateways record it with their statistics flush (about once
  a second, one ZADD GT per plan hit since the last flush): never a write
  per hit on the hot path.
- **Claims.** Deleting starts with one atomic script on the index that
  removes and returns the members it claims (the expired ones, or the least
  recently used ones); a member goes to exactly one caller, so several front
  ends and workers sweeping at once delete each plan once and nothing else.
  The claimer then deletes the plan hash and, if it existed, takes its bytes
  off its target's counters.
- A hit landing between a claim and the deletion is served; the plan's next
  lookup misses and rebuilds it. Plans stored before this accounting (no
  size field) are indexed on their first hit and deleted like the others,
  but not counted in the store's size.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import redis

from plancache.errors import InvalidRequest, PlanCacheError
from plancache.keys.plankey import parse_key
from plancache_server.store import keys
from plancache_server.store.redis_conn import stop_task, text, translated_errors

log = logging.getLogger(__name__)

# KEYS[1]: the index; ARGV[1]: claim members scored at most this; ARGV[2]:
# at most this many; ARGV[3]: a member never to claim ("" for none).
_CLAIM = """
local limit = tonumber(ARGV[2])
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit + 1)
local claimed = {}
for _, member in ipairs(members) do
  if member ~= ARGV[3] and #claimed < limit then table.insert(claimed, member) end
end
if #claimed > 0 then redis.call('ZREM', KEYS[1], unpack(claimed)) end
return claimed
"""
CLAIM_BATCH = 64
REASONS = ("expired", "evicted", "invalidated")


@dataclass
class TargetUsage:
    stored_bytes: int = 0
    stored_plans: int = 0
    evicted: int = 0
    expired: int = 0
    abandoned: int = 0  # callers' jobs dropped by a worker as waited for by nobody (never built)


@dataclass
class SweepResult:
    expired: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)


class Janitor:
    """Blocking (workers, and gateways through a thread): accounting,
    retention and the capacity bound, all through claims on the index."""

    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._clock = clock
        self._claim = client.register_script(_CLAIM)

    # ---- writes ----------------------------------------------------------------

    def record_put(self, plan_key: str, size: int, previous_size: int | None, warmed: bool = False) -> None:
        """After a worker's write: counters (a replaced plan counts once) and
        the index of last use; `warmed` (built before anyone asked): the
        index of warmed plans instead, which the bound empties before it
        touches a plan that was served, and which the retention counts from
        when it was warmed. Its first hit moves it to the index of last use."""
        target = _target_of(plan_key)
        index, other = (keys.WARMED_INDEX, keys.PLAN_INDEX) if warmed else (keys.PLAN_INDEX, keys.WARMED_INDEX)
        with translated_errors("accounting a stored plan"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hincrby(keys.STORE_COUNTERS, keys.store_counter("bytes", target), size - (previous_size or 0))
            if previous_size is None:
                pipe.hincrby(keys.STORE_COUNTERS, keys.store_counter("plans", target), 1)
            pipe.zadd(index, {plan_key: self._clock()})
            pipe.zrem(other, plan_key)
            pipe.execute()

    # ---- plans lost to a repair of the private store (plancache_server.store.repair) ----

    def record_lost(self, named: Iterable[str]) -> list[str]:
        """After a repair: those of `named` (the plans named in what it cut)
        that are no longer stored, recorded until they are rebuilt."""
        candidates = sorted(named)
        if not candidates:
            return []
        with translated_errors("recording the plans a repair lost"):
            pipe = self._redis.pipeline(transaction=False)
            for plan_key in candidates:
                pipe.exists(keys.plan(plan_key))
            lost = [k for k, stored in zip(candidates, pipe.execute(), strict=True) if not stored]
            if lost:
                self._redis.zadd(keys.REPAIR_LOST, {k: self._clock() for k in lost})
        return lost

    def lost_to_repair(self) -> list[str]:
        """Plans a repair lost that are not stored again yet (those rebuilt
        since leave the record here)."""
        with translated_errors("reading the plans a repair lost"):
            recorded = [text(k) for k in self._redis.zrange(keys.REPAIR_LOST, 0, -1)]
            if not recorded:
                return []
            pipe = self._redis.pipeline(transaction=False)
            for plan_key in recorded:
                pipe.exists(keys.plan(plan_key))
            stored = pipe.execute()
            rebuilt = [k for k, there in zip(recorded, stored, strict=True) if there]
            if rebuilt:
                self._redis.zrem(keys.REPAIR_LOST, *rebuilt)
        return [k for k, there in zip(recorded, stored, strict=True) if not there]

    # ---- deletions ---------------------------------------------------------------

    def remove(self, plan_key: str, reason: str) -> bool:
        """Delete one plan and take it off the counters, if it was there (its
        index entry too). True when this call deleted it."""
        assert reason in REASONS
        target = _target_of(plan_key)
        with translated_errors("deleting a plan"):
            size = self._redis.hget(keys.plan(plan_key), "size")
            deleted = bool(self._redis.delete(keys.plan(plan_key)))
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrem(keys.PLAN_INDEX, plan_key)
            pipe.zrem(keys.WARMED_INDEX, plan_key)
            if deleted and size is not None:
                pipe.hincrby(keys.STORE_COUNTERS, keys.store_counter("bytes", target), -int(size))
                pipe.hincrby(keys.STORE_COUNTERS, keys.store_counter("plans", target), -1)
            if deleted and reason != "invalidated":
                pipe.hincrby(keys.STORE_COUNTERS, keys.store_counter(reason, target), 1)
            pipe.execute()
            if deleted:
                self._forget_spec(plan_key)
        return deleted

    def _forget_spec(self, plan_key: str) -> None:
        """The plan off its spec's index, and the spec's body (what warming builds from) once no plan of the
        spec is left: a soak with four new plans a second grew Redis ~1 KB for every plan ever evicted
        (bench/soak.py). Not atomic with another worker storing a plan of the same spec meanwhile (the index
        and the body live on other shards than the plan in a cluster): that plan's spec then has no body,
        which warming counts as missing and skips, until a build of the spec writes it again."""
        spec_hash = plan_key.split("/", 1)[0]
        pipe = self._redis.pipeline(transaction=False)
        pipe.srem(keys.spec_index(spec_hash), plan_key)
        pipe.scard(keys.spec_index(spec_hash))
        _, left = pipe.execute()
        if not left:
            self._redis.delete(keys.spec_body(spec_hash))

    def expire(self, retention_s: float) -> list[str]:
        """Delete every plan unused for `retention_s`; the ones this call deleted."""
        cutoff = self._clock() - retention_s
        deleted: list[str] = []
        for index in (keys.WARMED_INDEX, keys.PLAN_INDEX):
            while True:
                claimed = self._claimed(cutoff, CLAIM_BATCH, index=index)
                deleted += [key for key in claimed if self.remove(key, "expired")]
                if len(claimed) < CLAIM_BATCH:
                    break
        return deleted

    def enforce_capacity(self, max_bytes: int, keep: str | None = None) -> list[str]:
        """Delete least recently used plans until the store holds at most
        `max_bytes` (never `keep`, the plan just written)."""
        deleted: list[str] = []
        while self.total_bytes() > max_bytes:
            # Warmed plans nobody asked for yet go first, the oldest first.
            claimed = self._claimed(float("inf"), 1, keep, index=keys.WARMED_INDEX) or self._claimed(
                float("inf"), 1, keep
            )
            if not claimed:
                break  # nothing left but `keep`: it stays, over the bound
            if self.remove(claimed[0], "evicted"):
                deleted.append(claimed[0])
        return deleted

    def retirable(self, after_s: float) -> dict[str, float | None]:
        """Targets with stored plans that no worker has advertised for `after_s`:
        target -> when one last did (None: never, as far as the store knows)."""
        with translated_errors("reading when targets were last served"):
            seen = {text(k): float(v) for k, v in self._redis.hgetall(keys.TARGETS_LAST_SEEN).items()}
        cutoff = self._clock() - after_s
        return {t: seen.get(t) for t, u in self.usage().items() if u.stored_plans > 0 and seen.get(t, 0.0) < cutoff}

    def retire(self, target_id: str) -> list[str]:
        """Delete every stored plan of a target; the ones this call deleted."""
        with translated_errors("listing a target's plans"):
            found = sorted(
                {
                    keys.plan_key_of(text(k))
                    for k in self._redis.scan_iter(match=keys.plan_pattern_for_target(target_id), count=1000)
                }
            )
        return [key for key in found if self.remove(key, "invalidated")]

    def sweep(
        self, retention_s: float | None, max_bytes: int | None, retire_after_s: float | None = None
    ) -> SweepResult:
        """One pass of the rules (gateways run it every --sweep-interval);
        `retire_after_s`: also drop targets no worker advertised for that long."""
        result = SweepResult()
        if retire_after_s:
            for target_id in self.retirable(retire_after_s):
                result.retired += self.retire(target_id)
        if retention_s:
            result.expired = self.expire(retention_s)
        if max_bytes:
            result.evicted = self.enforce_capacity(max_bytes)
        if result.expired or result.evicted or result.retired:
            log.info(
                "store sweep: %d plan(s) unused past the retention deleted, "
                "%d evicted for the bound, %d of retired targets",
                len(result.expired),
                len(result.evicted),
                len(result.retired),
            )
        return result

    # ---- reading -------------------------------------------------------------------

    def usage(self) -> dict[str, TargetUsage]:
        with translated_errors("reading the store's size"):
            raw = self._redis.hgetall(keys.STORE_COUNTERS)
        usage: dict[str, TargetUsage] = {}
        for name, value in raw.items():
            kind, _, target = text(name).partition(":")
            attribute = {
                "bytes": "stored_bytes",
                "plans": "stored_plans",
                "evicted": "evicted",
                "expired": "expired",
                "abandoned": "abandoned",
            }.get(kind)
            if attribute:
                setattr(usage.setdefault(target, TargetUsage()), attribute, int(value))
        return usage

    def total_bytes(self) -> int:
        return sum(u.stored_bytes for u in self.usage().values())

    def _claimed(self, cutoff: float, limit: int, keep: str | None = None, index: str = keys.PLAN_INDEX) -> list[str]:
        with translated_errors("claiming plans to delete"):
            bound = "+inf" if cutoff == float("inf") else repr(cutoff)
            return [text(k) for k in self._claim(keys=[index], args=[bound, limit, keep or ""])]


def _target_of(plan_key: str) -> str:
    try:
        return parse_key(plan_key).target.id
    except InvalidRequest:
        return "(unparsable keys)"


class Sweeper:
    """A gateway's periodic sweep (retention and the bound) on a thread:
    the janitor's client is blocking, and a sweep is rare and small."""

    def __init__(
        self,
        janitor: Janitor,
        retention_s: float,
        max_bytes: int,
        interval_s: float,
        retire_after_s: float | None = None,
    ) -> None:
        self._retire_after_s = retire_after_s
        self._janitor = janitor
        self._retention_s = retention_s
        self._max_bytes = max_bytes
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Sweeper:
        if self._retention_s or self._max_bytes or self._retire_after_s:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="plancache-sweeper")
        return self

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await asyncio.to_thread(self._janitor.sweep, self._retention_s, self._max_bytes, self._retire_after_s)
            except PlanCacheError as e:  # Redis away: the next sweep tries again
                log.warning("store sweep skipped: %s", e.message)

    async def stop(self) -> None:
        await stop_task(self._task)

"""A worker's side of warming: the target's warming lease, its next item
(an orphan first), each item's outcome, and the plan's end
(plancache_server.store.warming)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import cast

import redis
from google.protobuf.message import DecodeError

from plancache.keys.target import Target
from plancache_server.store import keys
from plancache_server.store.build_records import RELEASE_IF_OWNER, RENEW_IF_OWNER
from plancache_server.store.redis_conn import text, translated_errors
from plancache_server.store.warm_items import ACTIVE, DONE, FAILED, WarmItem, loads

log = logging.getLogger(__name__)

# The next item to build, marked in flight for the worker (ARGV[1]): an item to build again (popped from the
# retry list) first, else the one at the plan's cursor (the cursor moved past it); nothing when the retry list
# is empty and the items list has none at the cursor. In one step: a worker that found nothing (the last items
# still building) used to move the cursor past the list's end anyway, every look, and the graph family
# appended next lost that many items (never built, always "queued"); and a worker killed between taking an
# item (popped, or past the cursor) and marking it in flight left it nowhere a new lease holder looks: never
# built again, never recorded, and the plan finished without it (built 5 of 6, "done").
# A retry entry that is not an item's index (anyone on the network can write to Redis: a word, a negative or
# past-the-end index) is dropped, up to MAX_DROPPED a look, and the look goes on: it cannot end the plan early
# (a look that finds nothing, with nothing in flight, finishes it) nor rebuild another item.
# KEYS: plan, items, retry, in-flight. Returns {index, item}, or false.
MAX_DROPPED = 64
_TAKE_ITEM = """
local length = redis.call('llen', KEYS[2])
for _ = 1, tonumber(ARGV[2]) do
  local retried = redis.call('lpop', KEYS[3])
  if not retried then break end
  local index = tonumber(retried)
  if index and index >= 0 and index < length and index == math.floor(index) then
    redis.call('hset', KEYS[4], tostring(index), ARGV[1])
    return {index, redis.call('lindex', KEYS[2], index)}
  end
end
local cursor = tonumber(redis.call('hget', KEYS[1], 'cursor') or '0') or 0
if cursor >= length then return false end
redis.call('hset', KEYS[1], 'cursor', cursor + 1)
redis.call('hset', KEYS[4], tostring(cursor), ARGV[1])
return {cursor, redis.call('lindex', KEYS[2], cursor)}
"""


class WarmItemQueue:
    def __init__(self, client: redis.Redis, clock: Callable[[], float]) -> None:
        self._redis = client
        self._clock = clock
        self._take_item = client.register_script(_TAKE_ITEM)
        self._renew_if_holder = client.register_script(RENEW_IF_OWNER)
        self._release_if_holder = client.register_script(RELEASE_IF_OWNER)

    def active_targets(self, served: Iterable[Target]) -> list[str]:
        """The targets among `served` with a warming plan still to do."""
        found = []
        for target in served:
            with translated_errors("reading a warming plan"):
                raw = self._redis.hmget(keys.warm_plan(target.id), ["state", "cursor", "total"])
            if raw[0] is not None and loads(raw[0]) == ACTIVE:
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
                    # Together: a worker killed between the two would lose them too.
                    pipe = self._redis.pipeline(transaction=True)
                    pipe.hdel(keys.warm_in_flight(target_id), *orphans)
                    pipe.rpush(keys.warm_retry(target_id), *orphans)
                    pipe.execute()
                    log.info(
                        "warming %s: %d item(s) another worker left in flight will be built again",
                        target_id,
                        len(orphans),
                    )
                return True
            # Kept in one step: a lease that ran out between a read and a PEXPIRE, taken meanwhile by another
            # worker, would have been extended as this one's, two workers then warming one target.
            return bool(self._renew_if_holder(keys=[lease], args=[worker_id, int(lease_s * 1000)]))

    def release(self, target_id: str, worker_id: str) -> None:
        """Let go of the target's warming lease while it is this worker's (one step: read and then deleted, a lease
        another worker took in between was deleted as this one's)."""
        with translated_errors("releasing a warming lease"):
            self._release_if_holder(keys=[keys.warm_lease(target_id)], args=[worker_id])

    def cancelled(self, target_id: str, plan_key: str) -> bool:
        """Whether `plan_key` is a member of a cancelled graph family not built yet (CancelFamily)."""
        with translated_errors("reading cancelled graph families"):
            return bool(self._redis.sismember(keys.family_cancelled(target_id), plan_key))

    def next_item(self, target_id: str, worker_id: str) -> WarmItem | None:
        """The next item to build (an orphan first), marked in flight for
        this worker; None when the plan has none left (then it is done)."""
        with translated_errors("taking a warming item"):
            taken = self._take_item(
                keys=[
                    keys.warm_plan(target_id),
                    keys.warm_items(target_id),
                    keys.warm_retry(target_id),
                    keys.warm_in_flight(target_id),
                ],
                args=[worker_id, MAX_DROPPED],
            )
            index, raw = (int(taken[0]), cast(bytes | None, taken[1])) if taken else (-1, None)
            if raw is None:
                if not self._redis.hlen(keys.warm_in_flight(target_id)):
                    self._finish_plan(target_id)
                return None
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
            state = loads(self._redis.hget(keys.warm_plan(target_id), "state") or b'""')
            if state == ACTIVE:
                self._redis.hset(
                    keys.warm_plan(target_id),
                    mapping={"state": json.dumps(DONE), "updated_at": json.dumps(self._clock())},
                )
                log.info("warming %s: done", target_id)

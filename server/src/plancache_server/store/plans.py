"""The plan store: serialized plans and their metadata, in Redis.

A plan is one Redis hash (blob + metadata + signature) written by one HSET,
so a reader sees all or nothing. A blob whose sha256 does not match its
metadata, or metadata naming another key, is never returned: it reads as a
miss, and the next Compile rebuilds it.

Workers write plans with the blocking `RedisPlanStore`; gateways read
them with the asynchronous `AsyncRedisPlanStore` (usually behind the
memory cache, plancache_server.gateway.memory_cache). Both use one codec.

Anyone who can write to Redis can write a plan hash. A gateway that knows
the workers' public keys (`--trusted-keys`, or the key it generated for its
own workers) checks each plan's signature when it reads it: a plan that
fails reads as a miss and is counted (plancache_plans_refused_total); the
next Compile has it rebuilt, since a worker checks a stored plan's
signature too before it takes it as built, unless the build it waits for
is the one refused (plancache_server.gateway.builds: UntrustedBuild). Gateways never write plans
(their Redis user need not be able to). Clients check signatures again.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import redis
from google.protobuf.message import DecodeError
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, TryAgainError

from plancache.errors import IntegrityError, UntrustedPlan
from plancache.log_limits import LogLimiter
from plancache.trust.signing import TrustPolicy
from plancache.v1 import plancache_pb2 as pb
from plancache_server import telemetry
from plancache_server.store import keys
from plancache_server.store.lifecycle import Janitor
from plancache_server.store.redis_conn import AsyncRedis, text, translated_errors

log = logging.getLogger(__name__)
_unreplicated_log = LogLimiter(log)

PLAN_FIELDS = ["blob", "meta", "sig", "replicating"]
# A plan's "replicating" field is b"1" while its first write waits for --store-replicas replicas: readers treat
# it as not stored yet, so that no reader (a hit on another gateway, a GetPlan) is given a plan a failover could
# lose; its build's callers get it once the build is announced. A plan that replaces another is not hidden (its
# readers keep a plan either way: the previous one, should a failover lose the new one).
REPLICATING = b"1"
# After a WAIT for --store-replicas timed out, how long a worker stores plans without waiting for them.
REPLICAS_LATE_S = 10.0
# A build's final plan over its own provisional one: written only while a plan is stored there, in one step, so that
# an operator's Invalidate (or the store's bound) made while the build was tuning stands (GPU run 43: a provisional
# plan invalidated 6 ms before its tuned plan was stored came back as that tuned plan). ARGV: field, value, ...
_REPLACE_IF_STORED = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""


@dataclass(frozen=True)
class StoredPlan:
    blob: bytes
    metadata: pb.PlanMetadata
    signature: pb.PlanSignature | None = None  # the worker's; None when unsigned

    @property
    def proto(self) -> pb.Plan:
        """The plan as a message, made for an encoding and not kept: the encodings are (a copy of the blob each)."""
        return pb.Plan(metadata=self.metadata, blob=self.blob, signature=self.signature)

    @functools.cached_property
    def get_plan_response(self) -> bytes:
        """The serialized GetPlanResponse, built once per stored plan: a hot
        plan's hit path then encodes no 75 KB message per request."""
        return pb.GetPlanResponse(plan=self.proto).SerializeToString()

    def compile_response(self, source: int) -> bytes:
        """A serialized CompileResponse. Its field 1 (the plan) is encoded
        exactly like GetPlanResponse's, and protobuf merges concatenated
        messages, so the plan's bytes are reused as they are."""
        return self.get_plan_response + pb.CompileResponse(source=source).SerializeToString()  # type: ignore[arg-type]

    @functools.cached_property
    def _prefetch_plan_field(self) -> bytes:
        return pb.PrefetchItem(plan=self.proto).SerializeToString()

    def prefetch_item(self, index: int, key: str, source: int) -> bytes:
        """A serialized PrefetchItem: the per-stream fields, then the plan's
        bytes encoded once for every stream that receives it."""
        fields = pb.PrefetchItem(index=index, key=key, source=source)  # type: ignore[arg-type]
        return fields.SerializeToString() + self._prefetch_plan_field

    @property
    def provisional(self) -> bool:
        return bool(self.metadata.provisional)

    @functools.cached_property
    def size(self) -> int:
        """Bytes it may hold in memory, for cache bounds: its blob and metadata, and the two encodings a hot
        plan keeps (GetPlan's response, Prefetch's item), each a copy of them. Counting the blob alone let the
        gateway's memory cache hold three to four times --memory-cache-mb (bench/soak.py: the gateway's RSS
        grew 20 MB a minute past 550 MB with a 256 MiB cache)."""
        return 3 * (len(self.blob) + self.metadata.ByteSize())


def encode_plan(plan: StoredPlan) -> dict[str, bytes]:
    meta = plan.metadata
    if hashlib.sha256(plan.blob).hexdigest() != meta.blob_sha256:
        raise ValueError(f"plan {meta.key}: refusing to store a blob that does not match its sha256")
    fields = {
        "blob": plan.blob,
        "meta": meta.SerializeToString(),
        "sig": plan.signature.SerializeToString() if plan.signature else b"",
    }
    # What the plan costs the store (plancache_server.store.lifecycle counts it).
    fields["size"] = str(sum(len(v) for v in fields.values())).encode()
    return fields


def checked_plan(plan_key: str, blob: bytes | None, meta: bytes | None, sig: bytes | None) -> StoredPlan | None:
    """The stored plan; None when absent; IntegrityError when it is there
    but not intact (metadata that does not parse, a blob that does not match
    its sha256, metadata naming another key)."""
    if blob is None and meta is None:
        return None
    if blob is None or meta is None:
        raise IntegrityError(f"plan {plan_key} is stored without its {'blob' if blob is None else 'metadata'}")
    try:
        metadata = pb.PlanMetadata.FromString(meta)
        signature = pb.PlanSignature.FromString(sig) if sig else None
    except DecodeError:
        raise IntegrityError(f"plan {plan_key}: its stored metadata or signature does not parse") from None
    digest = hashlib.sha256(blob).hexdigest()
    if digest != metadata.blob_sha256:
        raise IntegrityError(
            f"plan {plan_key}: its blob's sha256 {digest} is not the one its metadata names "
            f"({metadata.blob_sha256[:64]})"
        )
    if metadata.key != plan_key:
        raise IntegrityError(f"plan {plan_key}: its metadata names another plan ({metadata.key[:300]})")
    return StoredPlan(blob=blob, metadata=metadata, signature=signature)


def decode_plan(plan_key: str, blob: bytes | None, meta: bytes | None, sig: bytes | None) -> StoredPlan | None:
    """The stored plan, or None when absent or not intact (logged)."""
    try:
        return checked_plan(plan_key, blob, meta, sig)
    except IntegrityError as e:
        log.warning("%s; treating it as a miss", e.message)
        return None


class RefusalLog:
    """Logs each refused plan once a minute at most: a gateway re-reads a
    plan while callers wait for it, and one refusal is one line, not one
    every half second."""

    def __init__(self, every_s: float = 60.0, kept: int = 1024) -> None:
        self._every_s = every_s
        self._kept = kept
        self._last: dict[tuple[str, str], float] = {}

    def warn(self, plan_key: str, error: IntegrityError) -> None:
        now = time.monotonic()
        seen = (plan_key, error.message)
        if now - self._last.get(seen, -self._every_s) < self._every_s:
            return
        if len(self._last) >= self._kept:
            self._last.clear()
        self._last[seen] = now
        log.warning("%s; it reads as a miss", error.message)


class RedisPlanStore:
    """Blocking: workers (check, then store what they built) and tools."""

    def __init__(
        self,
        client: redis.Redis,
        trust: TrustPolicy | None = None,
        max_bytes: int = 0,
        clock: Callable[[], float] = time.time,
        *,
        replicas: int = 0,
        replicas_wait_ms: int = 1000,
    ) -> None:
        """`trust`: what a stored plan must be signed by to count as built;
        `max_bytes`: the store's bound (least recently used plans go first; 0: none);
        `replicas`: how many replicas must hold a plan before `put` returns (waiting at most `replicas_wait_ms`)."""
        self._redis = client
        self._trust = trust
        self._max_bytes = max_bytes
        self._replicas, self._replicas_wait_ms = replicas, replicas_wait_ms
        self._replicas_late_until = 0.0  # monotonic: past a WAIT that timed out, none until then
        self.janitor = Janitor(client, clock)
        self._replace_if_stored = client.register_script(_REPLACE_IF_STORED)

    def get(self, plan_key: str) -> StoredPlan | None:
        with translated_errors("reading a plan"):
            blob, meta, sig, replicating = cast(list[bytes | None], self._redis.hmget(keys.plan(plan_key), PLAN_FIELDS))
        if replicating == REPLICATING:
            return None  # its first write waits for its replicas: not stored yet
        plan = decode_plan(plan_key, blob, meta, sig)
        if plan is not None and self._trust is not None:
            try:
                self._trust.check(plan.metadata, plan.signature)
            except UntrustedPlan as e:
                log.warning("plan %s: %s; treated as not built", plan_key, e.message)
                return None
        return plan

    def put(
        self, plan: StoredPlan, spec: pb.GraphSpec | None = None, warmed: bool = False, *, replacing: bool = False
    ) -> bool:
        """Store a plan this worker built; `spec`: the normalized spec it was
        built from (kept for warming); `warmed`: built before anyone asked,
        so it enters the store's LRU as the least recently used plan, and
        the bound evicts it before any plan that was served (it is kept for
        the retention from when it was warmed). `replacing`: the build's
        final plan over its own provisional one, written only if a plan is
        still stored at its key (_REPLACE_IF_STORED: deleted meanwhile, by an
        Invalidate or the store's bound, the deletion stands). Whether it was
        written."""
        fields = encode_plan(plan)
        plan_key = plan.metadata.key
        with translated_errors("writing a plan"):
            # One build per key at a time (the build lease): the previous size is this worker's to replace.
            previous, marked = self._redis.hmget(keys.plan(plan_key), ["size", "replicating"])
            if replacing and previous is None:
                return False
            if self._replicas and time.monotonic() >= self._replicas_late_until:
                # A new plan hidden from readers until its replicas hold it (or the wait ends): REPLICATING. So is
                # one replacing a plan still hidden (its worker died in its wait): readers had no plan there.
                hidden = previous is None or marked == REPLICATING
                fields["replicating"] = REPLICATING if hidden else b""
                if not self._write_replicated(plan_key, fields, replacing):
                    return False
                if hidden:
                    self._redis.hdel(keys.plan(plan_key), "replicating")  # a no-op if the plan was deleted meanwhile
            else:
                if self._replicas:  # late a moment ago: not waited for again yet (see _write_replicated)
                    telemetry.UNREPLICATED.inc()
                if replacing:
                    # A mark left by a write that never finished is cleared by writing it empty (readers hide b"1").
                    unmarked = {**fields, "replicating": b""}
                    if not self._replace_if_stored(keys=[keys.plan(plan_key)], args=_flat(unmarked)):
                        return False
                else:
                    pipe = self._redis.pipeline(transaction=False)
                    pipe.hset(keys.plan(plan_key), mapping=fields)  # type: ignore[arg-type]
                    pipe.hdel(keys.plan(plan_key), "replicating")  # a mark left by a write that never finished
                    pipe.execute()
            # An index for operators (which keys exist for a spec); not atomic
            # with the plan because it lives on another shard in a cluster.
            self._redis.sadd(keys.spec_index(plan.metadata.spec_hash), plan_key)
            if spec is not None:
                self._redis.set(keys.spec_body(plan.metadata.spec_hash), spec.SerializeToString())
        self.janitor.record_put(
            plan_key, int(fields["size"]), int(previous) if previous is not None else None, warmed=warmed
        )
        if self._max_bytes:
            self.janitor.enforce_capacity(self._max_bytes, keep=None if warmed else plan_key)
        return True

    def delete(self, plan_key: str) -> None:
        self.janitor.remove(plan_key, "invalidated")

    def _write_replicated(self, plan_key: str, fields: dict[str, Any], replacing: bool = False) -> bool:
        """The plan's HSET, then WAIT for `replicas` on the same connection (WAIT counts the replicas that
        acknowledged this connection's writes): the worker announces the build only after this returns, so a
        caller is never given a plan that a failover promoting one of them would lose. In a cluster the two go to
        the master of the plan's slot; if the slot moved meanwhile (a failover under way, or a resharding), the plan
        is written through the cluster client, which follows it, and counted as not replicated."""
        name = keys.plan(plan_key)
        client: Any = self._redis
        if isinstance(client, RedisCluster):
            client = client.get_redis_connection(client.get_node_from_key(name))  # type: ignore[no-untyped-call]
        pipe = client.pipeline(transaction=False)
        if replacing:
            self._replace_if_stored(keys=[name], args=_flat(fields), client=pipe)
        else:
            pipe.hset(name, mapping=fields)
        pipe.execute_command("WAIT", self._replicas, self._replicas_wait_ms)
        try:
            written, acknowledged = pipe.execute()
        except (AskError, TryAgainError, ClusterDownError, redis.ConnectionError, redis.TimeoutError) as e:  # MOVED too
            if not isinstance(self._redis, RedisCluster):
                raise
            log.info(
                "plan %s: its master changed while it was written (%s); written again through the cluster", plan_key, e
            )
            if replacing:
                written = self._replace_if_stored(keys=[name], args=_flat(fields))
            else:
                written = self._redis.hset(name, mapping=fields)  # type: ignore[arg-type]
            acknowledged = 0
        if replacing and not written:
            return False  # nothing written: nothing to wait for
        if int(acknowledged) < self._replicas:
            # A worker stores its plans one at a time: replicas that are down would add the whole wait to every
            # build after this one, so none is waited for during REPLICAS_LATE_S (counted meanwhile).
            self._replicas_late_until = time.monotonic() + REPLICAS_LATE_S
            telemetry.UNREPLICATED.inc()
            _unreplicated_log.warning(  # once a minute: a deployment without its replicas says it at every build
                "unreplicated",
                "plan %s: %d of the %d replicas of --store-replicas held it within %d ms; announced anyway, and "
                "plans stored in the next %.0f s are not waited for (a failover now could lose them; counted in "
                "plancache_unreplicated_plans_total)",
                plan_key,
                int(acknowledged),
                self._replicas,
                self._replicas_wait_ms,
                REPLICAS_LATE_S,
            )
        return True

    @property
    def client(self) -> redis.Redis:
        return self._redis


def _flat(fields: dict[str, Any]) -> list[Any]:
    """A hash's fields as HSET's arguments: field, value, field, value, ..."""
    return [item for pair in fields.items() for item in pair]


class Offload(Protocol):
    """Runs CPU work of a large message off the event loop (the gateway's
    plancache_server.gateway.offload.CpuOffload), small work inline; a plan's checks outside the callers'
    turns (a hit never waits one)."""

    async def run_ungated(self, size: int, fn: Callable[..., Any], *args: Any) -> Any: ...


class PlanStore(Protocol):
    """What a gateway reads plans through."""

    def cached(self, plan_key: str) -> StoredPlan | None:
        """The plan if this process holds it already (no I/O), else None."""
        ...

    async def get(self, plan_key: str) -> StoredPlan | None: ...

    async def fresh(self, plan_key: str) -> StoredPlan | None:
        """What Redis holds now (a plan may have been replaced: provisional,
        then tuned). Where `get` reads a refused plan as a miss, this raises
        why: UntrustedPlan (its signature), IntegrityError (damaged)."""
        ...

    def forget(self, plan_key: str) -> None:
        """Drop what this process holds of a plan (it changed elsewhere)."""
        ...

    async def keys_of_spec(self, spec_hash: str) -> list[str]: ...

    async def keys_of_target(self, target_id: str | None) -> list[str]:
        """Stored plan keys of a target (None: of every target)."""
        ...


class AsyncRedisPlanStore:
    def __init__(
        self, client: AsyncRedis, offload: Offload, trust: TrustPolicy | None = None, reads: AsyncRedis | None = None
    ) -> None:
        """`trust`: the workers' keys; None serves plans without checking
        their signatures (clients still check). `reads`: the client whose
        pool only callers' lookups use (`get`: the hit path), apart from
        `client`'s, which builds followed (`fresh`), listings and everything
        else on the gateway share: no amount of other work can hold every
        connection a hit needs (issue 44)."""
        self._redis = client
        self._reads = reads or client
        self._offload = offload
        self._trust = trust
        self._refusals = RefusalLog()

    def cached(self, plan_key: str) -> StoredPlan | None:
        return None

    def forget(self, plan_key: str) -> None:
        pass

    async def fresh(self, plan_key: str) -> StoredPlan | None:
        return await self._read(self._redis, plan_key)

    async def _read(self, client: AsyncRedis, plan_key: str) -> StoredPlan | None:
        with translated_errors("reading a plan"):
            blob, meta, sig, replicating = cast(
                list[bytes | None], await client.hmget(keys.plan(plan_key), PLAN_FIELDS)
            )
        if replicating == REPLICATING:
            return None  # its first write waits for its replicas (--store-replicas): not stored yet
        try:
            # Checking the sha256 of a large blob (and a signature) is CPU work: off the loop for large ones.
            checked: StoredPlan | None = await self._offload.run_ungated(
                len(blob or b""), self._checked, plan_key, blob, meta, sig
            )
            return checked
        except IntegrityError as e:
            telemetry.child(telemetry.PLANS_REFUSED, "signature" if isinstance(e, UntrustedPlan) else "integrity").inc()
            self._refusals.warn(plan_key, e)
            raise

    async def get(self, plan_key: str) -> StoredPlan | None:
        try:
            return await self._read(self._reads, plan_key)
        except IntegrityError:
            return None  # a miss: a Compile has it rebuilt, or fails with the reason

    def _checked(self, plan_key: str, blob: bytes | None, meta: bytes | None, sig: bytes | None) -> StoredPlan | None:
        plan = checked_plan(plan_key, blob, meta, sig)
        if plan is not None and self._trust is not None:
            self._trust.check(plan.metadata, plan.signature)
        return plan

    async def keys_of_spec(self, spec_hash: str) -> list[str]:
        with translated_errors("listing a spec's plans"):
            members = await self._redis.smembers(keys.spec_index(spec_hash))
        return sorted(text(k) for k in members)

    async def keys_of_target(self, target_id: str | None) -> list[str]:
        pattern = keys.plan_pattern_for_target(target_id) if target_id is not None else keys.plan("*")
        with translated_errors("listing a target's plans"):
            found = {keys.plan_key_of(text(k)) async for k in self._redis.scan_iter(match=pattern, count=1000)}
        return sorted(found)

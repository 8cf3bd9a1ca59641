"""The plan store: serialized plans and their metadata, in Redis.

A plan is one Redis hash (blob + metadata) written by one HSET, so a reader
sees both or neither. A blob whose sha256 does not match its metadata is
never returned: it reads as a miss, and the next Compile rebuilds it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, cast

import redis
from google.protobuf.message import DecodeError

from plancache.v1 import plancache_pb2 as pb
from plancache_server import keys
from plancache_server.redis_conn import translated_errors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredPlan:
    blob: bytes
    metadata: pb.PlanMetadata
    signature: pb.PlanSignature | None = None  # the worker's; None when unsigned

    @functools.cached_property
    def proto(self) -> pb.Plan:
        """Built once per stored plan (a hot plan is served many times); read-only."""
        return pb.Plan(metadata=self.metadata, blob=self.blob, signature=self.signature)

    @functools.cached_property
    def get_plan_response(self) -> bytes:
        """The serialized GetPlanResponse, built once per stored plan: a hot
        plan's hit path then copies no 75 KB message per request."""
        return pb.GetPlanResponse(plan=self.proto).SerializeToString()


class PlanStore(Protocol):
    def get(self, plan_key: str) -> StoredPlan | None: ...

    def put(self, plan: StoredPlan) -> None: ...

    def delete(self, plan_key: str) -> None: ...

    def keys_of_spec(self, spec_hash: str) -> list[str]: ...

    def keys_of_target(self, target_id: str) -> list[str]: ...


class RedisPlanStore:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def get(self, plan_key: str) -> StoredPlan | None:
        with translated_errors("reading a plan"):
            blob, meta, sig = cast(list[bytes | None], self._redis.hmget(keys.plan(plan_key), ["blob", "meta", "sig"]))
        if blob is None or meta is None:
            return None
        try:
            metadata = pb.PlanMetadata.FromString(meta)
            signature = pb.PlanSignature.FromString(sig) if sig else None
        except DecodeError:
            log.warning("plan %s: metadata or signature does not parse; treating as a miss", plan_key)
            return None
        digest = hashlib.sha256(blob).hexdigest()
        if digest != metadata.blob_sha256 or metadata.key != plan_key:
            log.warning("plan %s: blob sha256 %s does not match metadata %s; treating as a miss", plan_key, digest, metadata.blob_sha256)
            return None
        return StoredPlan(blob=blob, metadata=metadata, signature=signature)

    def put(self, plan: StoredPlan) -> None:
        meta = plan.metadata
        if hashlib.sha256(plan.blob).hexdigest() != meta.blob_sha256:
            raise ValueError(f"plan {meta.key}: refusing to store a blob that does not match its sha256")
        with translated_errors("writing a plan"):
            fields = {"blob": plan.blob, "meta": meta.SerializeToString(), "sig": plan.signature.SerializeToString() if plan.signature else b""}
            self._redis.hset(keys.plan(meta.key), mapping=fields)  # type: ignore[arg-type]
            # An index for operators (which keys exist for a spec); not atomic
            # with the plan because it lives on another shard in a cluster.
            self._redis.sadd(keys.spec_index(meta.spec_hash), meta.key)

    def delete(self, plan_key: str) -> None:
        with translated_errors("deleting a plan"):
            self._redis.delete(keys.plan(plan_key))

    def keys_of_spec(self, spec_hash: str) -> list[str]:
        with translated_errors("listing a spec's plans"):
            return sorted(k.decode() for k in self._redis.smembers(keys.spec_index(spec_hash)))  # type: ignore[union-attr]

    def keys_of_target(self, target_id: str) -> list[str]:
        with translated_errors("listing a target's plans"):
            found = self._redis.scan_iter(match=keys.plan_pattern_for_target(target_id), count=1000)
            return sorted({keys.plan_key_of(k.decode()) for k in found})


class MemoryCachedStore:
    """A front end's in-process cache of verified plans, in front of Redis.

    A hit needs no Redis round trip and no re-hash (on a 2-core machine a
    75 KB HMGET plus its sha256 cost ~0.3 ms of a ~1 ms GetPlan). Serving a
    cached copy is always correct: entries were verified when read, and any
    build stored under a key is a valid plan for that key. The TTL bounds how
    long a plan deleted from Redis can still be served by this front end.
    Bounded by bytes, least recently used out first; misses are not cached.
    """

    def __init__(self, inner: PlanStore, max_bytes: int, ttl_s: float) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, StoredPlan]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, plan_key: str) -> StoredPlan | None:
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(plan_key)
            if entry is not None and now - entry[0] < self._ttl_s:
                self._entries.move_to_end(plan_key)
                return entry[1]
        plan = self._inner.get(plan_key)
        if plan is not None:
            self._remember(plan, now)
        else:
            self._forget(plan_key)
        return plan

    def put(self, plan: StoredPlan) -> None:
        self._inner.put(plan)
        self._remember(plan, time.monotonic())

    def delete(self, plan_key: str) -> None:
        self._forget(plan_key)
        self._inner.delete(plan_key)

    def keys_of_spec(self, spec_hash: str) -> list[str]:
        return self._inner.keys_of_spec(spec_hash)

    def keys_of_target(self, target_id: str) -> list[str]:
        return self._inner.keys_of_target(target_id)

    def _size(self, plan: StoredPlan) -> int:
        return len(plan.blob) + plan.metadata.ByteSize()

    def _remember(self, plan: StoredPlan, now: float) -> None:
        size = self._size(plan)
        if size > self._max_bytes:
            return
        with self._lock:
            self._drop(plan.metadata.key)
            self._entries[plan.metadata.key] = (now, plan)
            self._bytes += size
            while self._bytes > self._max_bytes:
                self._drop(next(iter(self._entries)))

    def _forget(self, plan_key: str) -> None:
        with self._lock:
            self._drop(plan_key)

    def _drop(self, plan_key: str) -> None:
        entry = self._entries.pop(plan_key, None)
        if entry is not None:
            self._bytes -= self._size(entry[1])

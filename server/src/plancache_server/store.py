"""The plan store: serialized plans and their metadata, in Redis.

A plan is one Redis hash (blob + metadata) written by one HSET, so a reader
sees both or neither. A blob whose sha256 does not match its metadata is
never returned: it reads as a miss, and the next Compile rebuilds it.
"""

from __future__ import annotations

import hashlib
import logging
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

    def to_proto(self) -> pb.Plan:
        return pb.Plan(metadata=self.metadata, blob=self.blob)


class PlanStore(Protocol):
    def get(self, plan_key: str) -> StoredPlan | None: ...

    def put(self, plan: StoredPlan) -> None: ...

    def delete(self, plan_key: str) -> None: ...


class RedisPlanStore:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def get(self, plan_key: str) -> StoredPlan | None:
        with translated_errors("reading a plan"):
            blob, meta = cast(list[bytes | None], self._redis.hmget(keys.plan(plan_key), ["blob", "meta"]))
        if blob is None or meta is None:
            return None
        metadata = pb.PlanMetadata()
        try:
            metadata.ParseFromString(meta)
        except DecodeError:
            log.warning("plan %s: metadata does not parse; treating as a miss", plan_key)
            return None
        digest = hashlib.sha256(blob).hexdigest()
        if digest != metadata.blob_sha256 or metadata.key != plan_key:
            log.warning("plan %s: blob sha256 %s does not match metadata %s; treating as a miss", plan_key, digest, metadata.blob_sha256)
            return None
        return StoredPlan(blob=blob, metadata=metadata)

    def put(self, plan: StoredPlan) -> None:
        meta = plan.metadata
        if hashlib.sha256(plan.blob).hexdigest() != meta.blob_sha256:
            raise ValueError(f"plan {meta.key}: refusing to store a blob that does not match its sha256")
        with translated_errors("writing a plan"):
            self._redis.hset(keys.plan(meta.key), mapping={"blob": plan.blob, "meta": meta.SerializeToString()})
            # An index for operators (which keys exist for a spec); not atomic
            # with the plan because it lives on another shard in a cluster.
            self._redis.sadd(keys.spec_index(meta.spec_hash), meta.key)

    def delete(self, plan_key: str) -> None:
        with translated_errors("deleting a plan"):
            self._redis.delete(keys.plan(plan_key))

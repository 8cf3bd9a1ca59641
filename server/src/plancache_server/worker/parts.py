"""What a worker process needs from the store: blocking clients (it builds
one job at a time), its job queue, its build records and the plan store that
trusts what the worker trusts."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from plancache.trust.key_ring import KeyRing
from plancache.trust.signing import Signer, TrustPolicy
from plancache_server.settings import Settings
from plancache_server.store.build_records import BuildRecorder
from plancache_server.store.plans import RedisPlanStore
from plancache_server.worker.worker_queue import WorkerQueue


@dataclass(frozen=True)
class WorkerParts:
    queue: WorkerQueue
    builds: BuildRecorder
    store: RedisPlanStore


def worker_parts(client: redis.Redis, settings: Settings, signer: Signer | None = None) -> WorkerParts:
    """What a worker process needs: blocking clients (it builds one job at a
    time). A stored plan counts as built only if it bears a signature the
    worker trusts (its own key and its ring, and --trusted-keys): a damaged or forged one
    is rebuilt over."""
    trust = None
    if signer is not None:
        # Its key's ring too: a plan signed before a rotation (plancache.trust.key_ring) is no damaged plan.
        ring = [k.public_pem for k in KeyRing(settings.signing_key).read()] if settings.signing_key else []
        trust = TrustPolicy.create(
            [signer.public_pem(), *ring, *settings.trusted_keys], allow_unsigned=False, pinned=False
        )
    elif settings.unsigned and settings.trusted_keys:
        trust = TrustPolicy.create(settings.trusted_keys, allow_unsigned=True, pinned=False)
    store = RedisPlanStore(
        client, trust, settings.store_max_mb * 2**20, replicas=settings.store_replicas,
        replicas_wait_ms=settings.store_replicas_wait_ms,
    )  # fmt: skip
    return WorkerParts(
        WorkerQueue(client), BuildRecorder(client, settings.build_lease_s, settings.negative_ttl_s), store
    )

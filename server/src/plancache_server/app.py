"""Assembly: Redis-backed parts wired into a gRPC server (no processes here)."""

from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass

import grpc
import redis

from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.auth import Authorizer
from plancache_server.builds import Builds
from plancache_server.interceptors import ErrorMappingInterceptor
from plancache_server.jobs import JobQueue
from plancache_server.service import PlanService
from plancache_server.servicer import PlanCacheServicer
from plancache_server.settings import Settings
from plancache_server.stats import Stats
from plancache_server.store import MemoryCachedStore, PlanStore, RedisPlanStore

log = logging.getLogger(__name__)


@dataclass
class Components:
    store: PlanStore
    queue: JobQueue
    builds: Builds
    stats: Stats


def components(client: redis.Redis, settings: Settings, memory_cache: bool = False) -> Components:
    """Redis-backed parts. Front ends put a memory cache before the store;
    workers read Redis directly (they check for a plan before building)."""
    store: PlanStore = RedisPlanStore(client)
    if memory_cache and settings.memory_cache_bytes > 0:
        store = MemoryCachedStore(store, settings.memory_cache_bytes, settings.memory_cache_ttl_s)
    queue = JobQueue(client)
    return Components(store, queue, Builds(client, store, queue, settings.build_lease_s, settings.negative_ttl_s), Stats(client))


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS when a certificate is configured; mutual TLS when a client CA is too."""
    if settings.tls_cert is None and settings.tls_key is None:
        if settings.tls_ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key")
        return None
    if settings.tls_cert is None or settings.tls_key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    ca = settings.tls_ca.read_bytes() if settings.tls_ca else None
    return grpc.ssl_server_credentials([(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())], root_certificates=ca, require_client_auth=ca is not None)


def build_grpc_server(client: redis.Redis, settings: Settings) -> tuple[grpc.Server, int, Components]:
    """A started-ready server bound to settings.listen; returns the bound port."""
    parts = components(client, settings, memory_cache=True)
    service = PlanService(parts.store, parts.queue, parts.builds, parts.stats, settings.limits, settings.compile_timeout_s)
    authorizer = Authorizer.from_file(settings.tokens_file)
    if authorizer.open:
        log.warning("no --tokens-file: every caller may compile and read plans")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=settings.grpc_threads, thread_name_prefix="plancache-rpc"),
        interceptors=[ErrorMappingInterceptor(authorizer)],
        options=[
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
        ],
    )
    pb_grpc.add_PlanCacheServicer_to_server(PlanCacheServicer(service), server)
    port = server.add_secure_port(settings.listen, credentials) if (credentials := server_credentials(settings)) else server.add_insecure_port(settings.listen)
    if port == 0:
        raise OSError(f"cannot listen on {settings.listen}")
    return server, port, parts

"""Assembly: Redis-backed parts wired into a gRPC server (no processes here)."""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
import redis
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from plancache.v1 import plancache_pb2 as pb
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
    health: HealthReporter | None = None


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


class HealthReporter:
    """Standard gRPC health: SERVING while Redis answers, NOT_SERVING when it
    does not (a load balancer then sends callers elsewhere) or at shutdown."""

    SERVICES = ("", "plancache.v1.PlanCache")

    def __init__(self, servicer: health.HealthServicer, client: redis.Redis, interval_s: float = 2.0) -> None:
        self._servicer = servicer
        self._redis = client
        self._interval = interval_s
        self._stop = threading.Event()
        self._set(True)
        self._thread = threading.Thread(target=self._run, name="plancache-health", daemon=True)
        self._thread.start()

    def _set(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self.SERVICES:
            self._servicer.set(name, status)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._redis.ping()
                self._set(True)
            except (redis.RedisError, OSError):
                self._set(False)

    def shutdown(self) -> None:
        self._stop.set()
        self._servicer.enter_graceful_shutdown()


def add_health_and_reflection(server: grpc.Server, client: redis.Redis) -> HealthReporter:
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    names = (pb.DESCRIPTOR.services_by_name["PlanCache"].full_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    return HealthReporter(servicer, client)


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
    parts.health = add_health_and_reflection(server, client)
    port = server.add_secure_port(settings.listen, credentials) if (credentials := server_credentials(settings)) else server.add_insecure_port(settings.listen)
    if port == 0:
        raise OSError(f"cannot listen on {settings.listen}")
    return server, port, parts

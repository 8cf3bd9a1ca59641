"""Assembly: the gateway's Redis-backed parts wired into a grpc.aio server
(no processes here: plancache_server.main runs it)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from plancache.keys.plankey import parse_key
from plancache.trust.key_ring import KeyRing
from plancache.trust.signing import Signer, TrustPolicy
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server import telemetry
from plancache_server.gateway.admin import AdminService
from plancache_server.gateway.auth import Authorizer
from plancache_server.gateway.builds import Admission, Builds
from plancache_server.gateway.guard import add_guarded
from plancache_server.gateway.health import HealthReporter, ListingHealthServicer, enable_reflection
from plancache_server.gateway.lookups import PlanLookups
from plancache_server.gateway.loop_load import LoopLoad
from plancache_server.gateway.memory_cache import MemoryCachedStore
from plancache_server.gateway.offload import CpuOffload
from plancache_server.gateway.prefetch import PrefetchService
from plancache_server.gateway.reports import NodeReports
from plancache_server.gateway.resolver import QueryResolver
from plancache_server.gateway.service import PlanService
from plancache_server.gateway.servicer import PlanCacheServicer, Services
from plancache_server.gateway.shares import ShareLimits, Shares
from plancache_server.gateway.signing_keys import SigningKeys
from plancache_server.gateway.warm_service import WarmService
from plancache_server.gateway.wire import SPEC_REQUEST_BYTES, WireLimits
from plancache_server.gateway.workloads import WorkloadService
from plancache_server.settings import Settings
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.families import FamilyRecords
from plancache_server.store.jobs import JobQueue
from plancache_server.store.lifecycle import Janitor, Sweeper
from plancache_server.store.plans import AsyncRedisPlanStore, PlanStore
from plancache_server.store.redis_conn import AsyncRedis, connect, connect_async
from plancache_server.store.stats import Counter, Stats
from plancache_server.store.warming import Warming
from plancache_server.store.workloads import WorkloadRecords

log = logging.getLogger(__name__)


def gateway_trust(settings: Settings) -> TrustPolicy | None:
    """The keys a gateway checks stored plans against: --trusted-keys and,
    always, the key its own workers sign with (--signing-key, or the one the
    server generated) with the rest of its ring: the staged next key and the
    previous ones, whose plans stay stored after a rotation. None when there
    is nothing to check against."""
    sources: list[Path | bytes] = list(settings.trusted_keys)
    if settings.signing_key is not None:
        own = Signer.from_file(settings.signing_key)
        listed = (
            TrustPolicy.create(settings.trusted_keys, allow_unsigned=False, pinned=False)
            if settings.trusted_keys
            else None
        )
        if listed is not None and own.key_id not in listed.keys:
            log.warning(
                "the key this server's workers sign with (%s, key %s) is not among --trusted-keys (%s): "
                "trusted as well",
                settings.signing_key,
                own.key_id,
                listed.trusted_text,
            )
        sources.append(own.public_pem())
        sources += [k.public_pem for k in KeyRing(settings.signing_key).read() if k.key_id != own.key_id]
    if not sources:
        return None
    return TrustPolicy.create(sources, allow_unsigned=settings.unsigned, holder="this gateway", pinned=False)


def count_untrusted_build(stats: Stats, directory: WorkerDirectory, plan_key: str) -> None:
    """On the status page (per target) and in /metrics."""
    target_id = parse_key(plan_key).target.id
    stats.incr(Counter.UNTRUSTED, target_id=target_id)
    telemetry.UNTRUSTED_BUILDS.labels(directory.scope(target_id)).inc()


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS when a certificate is configured; mutual TLS when a client CA is too."""
    if settings.tls_cert is None and settings.tls_key is None:
        if settings.tls_ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key")
        return None
    if settings.tls_cert is None or settings.tls_key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    ca = settings.tls_ca.read_bytes() if settings.tls_ca else None
    return grpc.ssl_server_credentials(
        [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


@dataclass
class Gateway:
    """A started gateway: the gRPC server and the parts behind it."""

    server: grpc.aio.Server
    port: int
    redis: AsyncRedis
    store: PlanStore
    queue: JobQueue
    builds: Builds
    stats: Stats
    directory: WorkerDirectory
    offload: CpuOffload
    health: HealthReporter
    settings: Settings
    sweeper: Sweeper | None = None
    janitor: Janitor | None = None
    warming: Warming | None = None
    signing_keys: SigningKeys | None = None
    workloads: WorkloadService | None = None
    family_records: FamilyRecords | None = None
    plan_reads: AsyncRedis | None = None  # the hit path's own pool (AsyncRedisPlanStore's `reads`)
    loop_load: LoopLoad | None = None  # how busy the event loop is (turns' pacing)
    shares: Shares | None = None

    @classmethod
    async def start(cls, settings: Settings, redis_url: str) -> Gateway:
        """Bind settings.listen and start serving (OSError when the port is taken)."""
        client = connect_async(redis_url)
        offload = CpuOffload(
            settings.cpu_threads, waiting_per_caller=settings.caller_streams, retry_delay_s=settings.retry_delay_s
        )
        trust = gateway_trust(settings)
        if trust is None:
            log.warning(
                "no --trusted-keys and no --signing-key: stored plans are served without checking their signatures "
                "(clients still check)"
            )
        # Callers' lookups read plans through a pool of their own: builds followed, queues, statistics and
        # every other Redis call share `client`'s, and cannot take the connections a hit needs.
        plan_reads = connect_async(redis_url)
        store: PlanStore = AsyncRedisPlanStore(client, offload, trust, reads=plan_reads)
        if settings.memory_cache_bytes > 0:
            store = MemoryCachedStore(store, settings.memory_cache_bytes, settings.memory_cache_ttl_s)
        queue = JobQueue(client, settings.max_queued_jobs, settings.retry_delay_s)
        directory = WorkerDirectory(queue, settings.listed_targets)
        stats = Stats(client, directory)
        admission = Admission(settings.max_waiters, settings.max_waiters_per_key, settings.retry_delay_s)
        loop_load = LoopLoad(settings.busy_loop_share).start()
        shares = Shares(
            ShareLimits(
                streams=settings.caller_streams,
                refs=settings.caller_refs,
                waiters=settings.caller_waiters,
                builds=settings.caller_builds,
                retry_delay_s=settings.retry_delay_s,
                work_slots=settings.work_slots,
                queued=settings.caller_queued,
            ),
            load=loop_load,
        )
        builds = Builds(
            client,
            store,
            queue,
            settings.build_lease_s,
            admission,
            lambda plan_key: count_untrusted_build(stats, directory, plan_key),
            shares,
            settings.compile_timeout_s,
            announced_only=settings.store_replicas > 0,
        )
        blocking = connect(redis_url)  # for the janitor and warming, on threads
        janitor = Janitor(blocking)
        warming = Warming(blocking)
        resolver = QueryResolver(offload, settings.limits)
        lookups = PlanLookups(store, builds, stats, directory, settings.compile_timeout_s)
        signing_keys = SigningKeys.of(settings)
        workloads = WorkloadService(WorkloadRecords(client, settings.workload_plans), store, builds)
        family_records = FamilyRecords(blocking)
        services = Services(
            plans=PlanService(store, resolver, lookups, shares),
            prefetch=PrefetchService(store, resolver, lookups, settings.max_prefetch_refs, shares),
            reports=NodeReports(store, builds, stats, directory, workloads),
            admin=AdminService(store, resolver, queue, stats, directory, janitor),
            warm=WarmService(warming, directory, resolver, family_records, settings.family_budget),
            keys=signing_keys,
            workloads=workloads,
        )
        authorizer = Authorizer.from_file(settings.tokens_file)
        if authorizer.open:
            log.warning("no --tokens-file: every caller may compile and read plans")
        server = grpc.aio.server(
            options=[
                # Nothing larger than the largest request a method takes is even read.
                ("grpc.max_receive_message_length", max(settings.max_prefetch_bytes, SPEC_REQUEST_BYTES)),
                ("grpc.max_send_message_length", settings.max_message_bytes),
                # A second server on a busy port fails to start instead of
                # silently sharing (and taking) its traffic.
                ("grpc.so_reuseport", 0),
                # No bandwidth-delay probing of callers' uploads: with it, gRPC widened a stream's window to
                # megabytes and took in that much of a request refused before it is read (an unknown caller's:
                # plancache_server.gateway.guard._TokenGate), which the allocator kept (bench/oversize.py:
                # 95 MB for five 15 MiB requests, 0.4 MB without). Requests are small; a 15 MiB Prefetch
                # uploads as fast on a local link either way.
                ("grpc.http2.bdp_probe", 0),
                # gRPC's own backlog of calls not yet taken up by the event
                # loop: past 1,000 (its default) it drops calls at random as
                # CANCELLED, which a burst of callers hit (1% of a 2,000-call
                # burst). Admission control (RESOURCE_EXHAUSTED with a retry
                # delay) is ours to do, once a call is read.
                ("grpc.server.max_pending_requests", settings.max_pending_calls),
                ("grpc.server.max_pending_requests_hard_limit", 2 * settings.max_pending_calls),
                # gRPC takes new calls up one at a time, in arrival order: a client's burst of 1,160 calls on
                # one connection (bench/flood.py) stood ~1.2 s before every other caller's next call. Bounded
                # per connection, the rest of a burst waits in its own client (or, sent as another of its
                # streams ends and before the server has let that one go, is refused by HTTP/2 unseen:
                # REFUSED_STREAM, which plancache's client retries after a delay).
                ("grpc.max_concurrent_streams", settings.max_streams_per_connection),
            ],
        )
        limits = WireLimits(settings.limits, settings.max_prefetch_refs, settings.max_prefetch_bytes)

        servicer = PlanCacheServicer(services)
        add_guarded(pb_grpc.add_PlanCacheServicer_to_server, servicer, server, authorizer, offload, limits, shares)
        health_servicer = ListingHealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        enable_reflection(
            server,
            (
                pb.DESCRIPTOR.services_by_name["PlanCache"].full_name,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            ),
        )
        credentials = server_credentials(settings)
        try:
            port = (
                server.add_secure_port(settings.listen, credentials)
                if credentials
                else server.add_insecure_port(settings.listen)
            )
        except RuntimeError as e:
            raise OSError(f"cannot listen on {settings.listen}: {e} (is another server using it?)") from e
        if port == 0:
            raise OSError(f"cannot listen on {settings.listen}")
        reporter = HealthReporter(health_servicer, client)
        front = cls(server, port, client, store, queue, builds, stats, directory, offload, reporter, settings)
        front.janitor = janitor
        front.warming = warming
        front.signing_keys = signing_keys
        front.workloads = workloads
        front.family_records = family_records
        front.plan_reads = plan_reads
        front.loop_load = loop_load
        front.shares = shares
        signing_keys.log_at_start(settings.listen, port)
        front.sweeper = Sweeper(
            janitor,
            settings.retention_days * 86400,
            settings.store_max_mb * 2**20,
            settings.sweep_interval_s,
            settings.retire_after_days * 86400 if settings.retire_unserved else None,
        ).start()
        await server.start()
        await reporter.start()
        directory.start()
        stats.start()
        builds.start()
        return front

    async def stop(self, grace: float | None) -> None:
        """Health goes NOT_SERVING; calls in flight get `grace` seconds (a
        build under way can land); then waiting callers are released."""
        await self.health.shutdown()
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await asyncio.sleep(0)  # new calls are refused from here on
        if grace:
            # Callers still waiting just before the grace ends are told to
            # call again (UNAVAILABLE) rather than cut off (CANCELLED).
            await asyncio.wait([stopping], timeout=max(0.0, grace - 0.5))
        await self.builds.close()
        if self.sweeper is not None:
            await self.sweeper.stop()
        await stopping
        await self.directory.stop()
        if self.loop_load is not None:
            await self.loop_load.stop()
        await self.stats.close()
        self.offload.close()
        await self.redis.aclose()
        if self.plan_reads is not None:
            await self.plan_reads.aclose()

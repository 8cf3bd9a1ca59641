"""Standard gRPC health checking and server reflection, for generic tools
(load balancers, Kubernetes probes, grpcurl, grpc_health_probe).

- Health: Check, Watch (a message when the status changes) and List (every
  service's status); SERVING while Redis answers, NOT_SERVING when it does
  not or at shutdown.
- Reflection: grpc.reflection.v1 and v1alpha (grpcio-reflection serves only
  v1alpha; the two protocols have the same messages, so one servicer
  answers both).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from plancache.errors import PlanCacheError
from plancache_server.store.redis_conn import AsyncRedis, stop_task, translated_errors

REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


class ListingHealthServicer(HealthServicer):  # type: ignore[misc]
    """grpcio-health-checking's servicer, plus List (it answers INTERNAL there)."""

    async def List(
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status) for name, status in self._server_status.items()
            }
        )


class HealthReporter:
    """Keeps the health status in step with Redis; watchers hear of changes only."""

    SERVICES = ("", "plancache.v1.PlanCache")

    def __init__(self, servicer: HealthServicer, client: AsyncRedis, interval_s: float = 2.0) -> None:
        self._servicer = servicer
        self._redis = client
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None
        self._serving: bool | None = None

    async def start(self) -> None:
        await self._set(True)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="plancache-health")

    async def _set(self, serving: bool) -> None:
        if serving == self._serving:
            return
        self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self.SERVICES:
            await self._servicer.set(name, status)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                with translated_errors("checking health"):
                    await self._redis.ping()
                await self._set(True)
            except PlanCacheError:
                await self._set(False)

    async def shutdown(self) -> None:
        await stop_task(self._task)
        await self._servicer.enter_graceful_shutdown()


def enable_reflection(server: grpc.aio.Server, services: Sequence[str]) -> None:
    """Reflection over `services` (and itself) on both protocol versions."""
    names = (*services, reflection.SERVICE_NAME, REFLECTION_V1)
    servicer = ReflectionServicer(names)

    async def info(
        requests: AsyncIterator[reflection_pb2.ServerReflectionRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        async for response in servicer.ServerReflectionInfo(requests, context):
            yield response

    handler = grpc.stream_stream_rpc_method_handler(
        info,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(reflection.SERVICE_NAME, {"ServerReflectionInfo": handler}),)
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )

"""gRPC servicer: proto in, domain call, proto (or pre-serialized bytes) out.
Errors: see interceptors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.frontend.service import PlanService
from plancache_server.frontend.warm_service import WarmService


class PlanCacheServicer(pb_grpc.PlanCacheServicer):  # type: ignore[misc]
    def __init__(self, service: PlanService, warm: WarmService) -> None:
        self._service = service
        self._warm = warm

    # Compile, GetPlan and Prefetch answer with bytes serialized once per plan
    # (see StoredPlan); the error interceptor's serializer passes bytes through.

    async def Compile(self, request: pb.CompileRequest, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]
        return await self._service.compile(request, context.time_remaining(), lambda done: context.add_done_callback(lambda _: done()))  # type: ignore[arg-type]

    async def ReportFirstUses(self, request: pb.ReportFirstUsesRequest, context: grpc.aio.ServicerContext) -> pb.ReportFirstUsesResponse:  # type: ignore[type-arg]
        return await self._service.report(request)

    async def GetPlan(self, request: pb.GetPlanRequest, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]
        return (await self._service.get(request.ref)).get_plan_response

    async def Prefetch(self, request: pb.PrefetchRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes | pb.PrefetchItem]:  # type: ignore[type-arg]
        async for item in self._service.prefetch(request, context.time_remaining()):
            yield item

    async def ListTargets(self, request: pb.ListTargetsRequest, context: grpc.aio.ServicerContext) -> pb.ListTargetsResponse:  # type: ignore[type-arg]
        return pb.ListTargetsResponse(targets=await self._service.list_targets())

    async def Invalidate(self, request: pb.InvalidateRequest, context: grpc.aio.ServicerContext) -> pb.InvalidateResponse:  # type: ignore[type-arg]
        return pb.InvalidateResponse(deleted=await self._service.invalidate(request))

    async def Explain(self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext) -> pb.ExplainResponse:  # type: ignore[type-arg]
        return await self._service.explain(request.query)

    async def ListPlans(self, request: pb.ListPlansRequest, context: grpc.aio.ServicerContext) -> pb.ListPlansResponse:  # type: ignore[type-arg]
        return pb.ListPlansResponse(keys=await self._service.list_plans(request.target_id))

    async def DrainWorker(self, request: pb.DrainWorkerRequest, context: grpc.aio.ServicerContext) -> pb.DrainWorkerResponse:  # type: ignore[type-arg]
        return pb.DrainWorkerResponse(known=await self._service.drain_worker(request.worker_id))

    async def Warm(self, request: pb.WarmRequest, context: grpc.aio.ServicerContext) -> pb.WarmResponse:  # type: ignore[type-arg]
        return pb.WarmResponse(status=(await self._warm.warm(request)).to_proto())

    async def WarmStatus(self, request: pb.WarmStatusRequest, context: grpc.aio.ServicerContext) -> pb.WarmStatusResponse:  # type: ignore[type-arg]
        return pb.WarmStatusResponse(targets=[s.to_proto() for s in await self._warm.status(request)])

    async def BuildFamily(self, request: pb.BuildFamilyRequest, context: grpc.aio.ServicerContext) -> pb.FamilyStatus:  # type: ignore[type-arg]
        return await self._warm.build_family(request)

    async def GetFamily(self, request: pb.GetFamilyRequest, context: grpc.aio.ServicerContext) -> pb.FamilyStatus:  # type: ignore[type-arg]
        return await self._warm.get_family(request)

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.GetStatsResponse:  # type: ignore[type-arg]
        return await self._service.stats()

"""gRPC servicer: proto in, domain call, proto (or pre-serialized bytes) out.
Errors: see interceptors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.gateway.admin import AdminService
from plancache_server.gateway.prefetch import PrefetchService
from plancache_server.gateway.reports import NodeReports
from plancache_server.gateway.service import PlanService
from plancache_server.gateway.signing_keys import SigningKeys
from plancache_server.gateway.warm_service import WarmService
from plancache_server.gateway.workloads import WorkloadService

# grpc-stubs' context is generic in the request and response types; the servicer's methods answer bytes too.
Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class Services:
    """The domain objects behind the servicer, one per kind of call."""

    plans: PlanService
    prefetch: PrefetchService
    reports: NodeReports
    admin: AdminService
    warm: WarmService
    keys: SigningKeys
    workloads: WorkloadService


class PlanCacheServicer(pb_grpc.PlanCacheServicer):  # type: ignore[misc]
    def __init__(self, services: Services) -> None:
        self._plans = services.plans
        self._prefetch = services.prefetch
        self._reports = services.reports
        self._admin = services.admin
        self._warm = services.warm
        self._keys = services.keys
        self._workloads = services.workloads

    # Compile, GetPlan and Prefetch answer with bytes serialized once per plan
    # (see StoredPlan); the error interceptor's serializer passes bytes through.

    async def Compile(self, request: pb.CompileRequest, context: Context) -> bytes:
        def on_done(done: Callable[[], None]) -> None:
            context.add_done_callback(_Once(done))  # type: ignore[arg-type]

        return await self._plans.compile(request, context.time_remaining(), on_done)

    async def ReportFirstUses(self, request: pb.ReportFirstUsesRequest, context: Context) -> pb.ReportFirstUsesResponse:
        return await self._reports.report(request)

    async def GetPlan(self, request: pb.GetPlanRequest, context: Context) -> bytes:
        return (await self._plans.get(request.ref)).get_plan_response

    async def Prefetch(self, request: pb.PrefetchRequest, context: Context) -> AsyncIterator[bytes | pb.PrefetchItem]:
        async for item in self._prefetch.prefetch(request, context.time_remaining()):
            yield item

    async def ListTargets(self, request: pb.ListTargetsRequest, context: Context) -> pb.ListTargetsResponse:
        return pb.ListTargetsResponse(targets=await self._admin.list_targets())

    async def Invalidate(self, request: pb.InvalidateRequest, context: Context) -> pb.InvalidateResponse:
        return pb.InvalidateResponse(deleted=await self._admin.invalidate(request))

    async def Explain(self, request: pb.ExplainRequest, context: Context) -> pb.ExplainResponse:
        return await self._admin.explain(request.query)

    async def ListPlans(self, request: pb.ListPlansRequest, context: Context) -> pb.ListPlansResponse:
        return pb.ListPlansResponse(keys=await self._admin.list_plans(request.target_id))

    async def DrainWorker(self, request: pb.DrainWorkerRequest, context: Context) -> pb.DrainWorkerResponse:
        return pb.DrainWorkerResponse(known=await self._admin.drain_worker(request.worker_id))

    async def Warm(self, request: pb.WarmRequest, context: Context) -> pb.WarmResponse:
        return pb.WarmResponse(status=(await self._warm.warm(request)).to_proto())

    async def WarmStatus(self, request: pb.WarmStatusRequest, context: Context) -> pb.WarmStatusResponse:
        return pb.WarmStatusResponse(targets=[s.to_proto() for s in await self._warm.status(request)])

    async def BuildFamily(self, request: pb.BuildFamilyRequest, context: Context) -> pb.FamilyStatus:
        return await self._warm.build_family(request)

    async def GetFamily(self, request: pb.GetFamilyRequest, context: Context) -> pb.FamilyStatus:
        return await self._warm.get_family(request)

    async def CancelFamily(self, request: pb.GetFamilyRequest, context: Context) -> pb.FamilyStatus:
        return await self._warm.cancel_family(request)

    async def GetStats(self, request: pb.GetStatsRequest, context: Context) -> pb.GetStatsResponse:
        return await self._admin.stats()

    async def GetSigningKeys(self, request: pb.GetSigningKeysRequest, context: Context) -> pb.GetSigningKeysResponse:
        return await self._keys.response()

    async def GetWorkload(self, request: pb.GetWorkloadRequest, context: Context) -> pb.GetWorkloadResponse:
        return await self._workloads.plans(request)


class _Once:
    """A call's done-callback that lets go of what it calls once it ran.

    grpc keeps a call's callbacks in a cycle with its context (each one a
    partial of the context, in the call state's list), which only a full
    collection frees, and full collections are rare here (main.GC_THRESHOLDS).
    A lambda over the waiter kept its flight and the plan's blob and response
    in that cycle after every miss: the gateway's RSS grew ~270 MB an hour
    under the soak's mix (bench/soak.py; 72 MB with Python's own thresholds)."""

    __slots__ = ("_call",)

    def __init__(self, call: Callable[[], None]) -> None:
        self._call: Callable[[], None] | None = call

    def __call__(self, _: object) -> None:
        call, self._call = self._call, None
        if call is not None:
            call()

"""gRPC servicer: proto in, domain call, proto out. Errors: see interceptors."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.service import PlanService


class PlanCacheServicer(pb_grpc.PlanCacheServicer):  # type: ignore[misc]
    def __init__(self, service: PlanService) -> None:
        self._service = service

    def Compile(self, request: pb.CompileRequest, context: grpc.ServicerContext) -> pb.CompileResponse:
        plan, source = self._service.compile(request, context.time_remaining())
        return pb.CompileResponse(plan=plan.proto, source=source)  # type: ignore[arg-type]

    def GetPlan(self, request: pb.GetPlanRequest, context: grpc.ServicerContext) -> bytes:
        # Pre-serialized GetPlanResponse (see StoredPlan.get_plan_response);
        # the interceptor's serializer passes bytes through.
        return self._service.get(request.ref).get_plan_response

    def Prefetch(self, request: pb.PrefetchRequest, context: grpc.ServicerContext) -> Iterator[pb.PrefetchItem]:
        yield from self._service.prefetch(request, context.time_remaining())

    def ListTargets(self, request: pb.ListTargetsRequest, context: grpc.ServicerContext) -> pb.ListTargetsResponse:
        return pb.ListTargetsResponse(targets=self._service.list_targets())

    def Invalidate(self, request: pb.InvalidateRequest, context: grpc.ServicerContext) -> pb.InvalidateResponse:
        return pb.InvalidateResponse(deleted=self._service.invalidate(request))

    def Explain(self, request: pb.ExplainRequest, context: grpc.ServicerContext) -> pb.ExplainResponse:
        return self._service.explain(request.query)

    def DrainWorker(self, request: pb.DrainWorkerRequest, context: grpc.ServicerContext) -> pb.DrainWorkerResponse:
        return pb.DrainWorkerResponse(known=self._service.drain_worker(request.worker_id))

    def GetStats(self, request: pb.GetStatsRequest, context: grpc.ServicerContext) -> pb.GetStatsResponse:
        return self._service.stats()

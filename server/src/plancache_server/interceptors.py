"""The one place domain errors become gRPC statuses."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import grpc

from plancache.errors import ERROR_CLASS_METADATA_KEY, PlanCacheError

log = logging.getLogger(__name__)


def _guard(behavior: Callable[[Any, grpc.ServicerContext], Any], method: str) -> Callable[[Any, grpc.ServicerContext], Any]:
    def guarded(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return behavior(request, context)
        except PlanCacheError as e:
            context.set_trailing_metadata(((ERROR_CLASS_METADATA_KEY, type(e).__name__),))
            context.abort(e.code, e.message)
        except Exception:
            incident = uuid.uuid4().hex[:12]
            log.exception("%s failed (incident %s)", method, incident)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; server log incident {incident}")

    return guarded


def _bytes_pass_through(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """Let a handler answer with a response it serialized once and cached
    (GetPlan of a hot plan): 75 KB are not re-encoded on every call."""
    if serialize is None:
        return None
    return lambda response: response if isinstance(response, bytes) else serialize(response)


class ErrorMappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self) -> None:
        # Guarded handlers are built once per method, not on every call.
        self._guarded: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None], handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        guarded = self._guarded.get(method)
        if guarded is not None:
            return guarded
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        guarded = grpc.unary_unary_rpc_method_handler(
            _guard(handler.unary_unary, method),
            request_deserializer=handler.request_deserializer,
            response_serializer=_bytes_pass_through(handler.response_serializer),
        )
        self._guarded[method] = guarded
        return guarded

"""The one place domain errors become gRPC statuses (and tokens are checked)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from plancache.errors import ERROR_CLASS_METADATA_KEY, InvalidRequest, PlanCacheError
from plancache_server import metrics
from plancache_server.auth import Authorizer

log = logging.getLogger(__name__)


def _count(method: str, started: float, code: str) -> None:
    name = method.rsplit("/", 1)[-1]
    metrics.REQUESTS.labels(name, code).inc()
    metrics.REQUEST_SECONDS.labels(name).observe(time.perf_counter() - started)


def _code(error: Exception) -> str:
    return error.code.name if isinstance(error, PlanCacheError) else "INTERNAL"


def _abort(context: grpc.ServicerContext, method: str, error: Exception) -> None:
    if isinstance(error, PlanCacheError):
        context.set_trailing_metadata(((ERROR_CLASS_METADATA_KEY, type(error).__name__),))
        context.abort(error.code, error.message)
    incident = uuid.uuid4().hex[:12]
    log.error("%s failed (incident %s)", method, incident, exc_info=error)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; server log incident {incident}")


Deserializer = Callable[[bytes], Any] | None


def _parse(deserialize: Deserializer, raw: bytes, method: str) -> Any:
    """The request message; a malformed one is INVALID_ARGUMENT (grpc's own
    deserializer would answer a bare INTERNAL)."""
    if deserialize is None:
        return raw
    try:
        return deserialize(raw)
    except Exception as e:
        raise InvalidRequest(f"malformed {method.rsplit('/', 1)[-1]} request ({len(raw)} bytes): {e}") from e


def _guard(
    behavior: Callable[[Any, grpc.ServicerContext], Any], method: str, authorizer: Authorizer, deserialize: Deserializer
) -> Callable[[bytes, grpc.ServicerContext], Any]:
    def guarded(raw: bytes, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            request = _parse(deserialize, raw, method)
            authorizer.check(method, request, context)
            response = behavior(request, context)
        except Exception as e:
            _count(method, started, _code(e))
            _abort(context, method, e)
        _count(method, started, "OK")
        return response

    return guarded


def _guard_stream(
    behavior: Callable[[Any, grpc.ServicerContext], Iterator[Any]], method: str, authorizer: Authorizer, deserialize: Deserializer
) -> Callable[[bytes, grpc.ServicerContext], Iterator[Any]]:
    def guarded(raw: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
        started = time.perf_counter()
        try:
            request = _parse(deserialize, raw, method)
            authorizer.check(method, request, context)
            yield from behavior(request, context)
        except Exception as e:
            _count(method, started, _code(e))
            _abort(context, method, e)
        _count(method, started, "OK")

    return guarded


def _bytes_pass_through(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """Let a handler answer with a response it serialized once and cached
    (GetPlan of a hot plan): 75 KB are not re-encoded on every call."""
    if serialize is None:
        return None
    return lambda response: response if isinstance(response, bytes) else serialize(response)


class ErrorMappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, authorizer: Authorizer | None = None) -> None:
        self._authorizer = authorizer or Authorizer(None)
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
        if handler is None:
            return None
        serializer = _bytes_pass_through(handler.response_serializer)
        if handler.unary_unary is not None:
            guarded = grpc.unary_unary_rpc_method_handler(
                _guard(handler.unary_unary, method, self._authorizer, handler.request_deserializer), response_serializer=serializer
            )
        elif handler.unary_stream is not None:
            guarded = grpc.unary_stream_rpc_method_handler(
                _guard_stream(handler.unary_stream, method, self._authorizer, handler.request_deserializer), response_serializer=serializer
            )
        else:
            return handler
        self._guarded[method] = guarded
        return guarded

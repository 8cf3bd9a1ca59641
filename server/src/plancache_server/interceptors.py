"""The front end's interceptors, one job each, in a fixed order (outer first):

1. `MetricsInterceptor`: counts every call by method and final status code,
   with its latency.
2. `ErrorInterceptor`: the one place domain errors become gRPC statuses (with
   the standard rich error details, plancache.rich_status). It also parses
   requests itself: a malformed one answers INVALID_ARGUMENT instead of
   grpc's bare INTERNAL, and a large one is parsed off the event loop.
3. `AuthInterceptor`: checks the bearer token from the call's metadata
   before anything reads its body; a refused caller's request is never
   parsed.

Wrapped handlers are built once per method (and outcome), not per call.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import grpc

from plancache.errors import InvalidRequest, PermissionDenied, PlanCacheError
from plancache.rich_status import bounded, trailing_metadata
from plancache_server import metrics
from plancache_server.auth import SERVICE_PREFIX, Authorizer, Role, needed_role
from plancache_server.offload import CpuOffload

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # grpc's classes are generic in its stubs only
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]
    ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler, Context, ServerInterceptor = grpc.RpcMethodHandler, grpc.aio.ServicerContext, grpc.aio.ServerInterceptor
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler]]
Unary = Callable[[Any, Context], Awaitable[Any]]
Streaming = Callable[[Any, Context], AsyncIterator[Any]]


def _behaviors(handler: Handler) -> tuple[Unary, Streaming]:
    """The handler's coroutine behaviors (grpc's stubs type them as blocking)."""
    return cast(Unary, handler.unary_unary), cast(Streaming, handler.unary_stream)


def _rebuild(handler: Handler, unary: Unary | None, stream: Streaming | None, deserializer: Any, serializer: Any) -> Handler:
    """The same kind of handler with other behaviors, (de)serializers."""
    if handler.unary_unary is not None:
        assert unary is not None
        return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=deserializer, response_serializer=serializer)
    assert stream is not None
    return grpc.unary_stream_rpc_method_handler(stream, request_deserializer=deserializer, response_serializer=serializer)


def _wrappable(handler: Handler | None) -> bool:
    return handler is not None and (handler.unary_unary is not None or handler.unary_stream is not None)


class _Interceptor(ServerInterceptor):
    """Wraps each unary-unary and unary-stream handler once (streaming
    requests, as reflection's, pass through untouched)."""

    def __init__(self) -> None:
        self._handlers = _PerHandler(self._wrap)

    async def intercept_service(self, continuation: Continuation, details: grpc.HandlerCallDetails) -> Handler:
        handler = await continuation(details)
        return self._handlers.get(handler, details.method) if _wrappable(handler) else handler

    def _wrap(self, handler: Handler, method: str) -> Handler:
        raise NotImplementedError


class _PerHandler:
    """Wrapped handlers, built once per handler object (handlers are long-lived)."""

    def __init__(self, wrap: Callable[[Handler, str], Handler]) -> None:
        self._wrap = wrap
        self._cache: dict[int, tuple[Handler, Handler]] = {}

    def get(self, handler: Handler, method: str) -> Handler:
        entry = self._cache.get(id(handler))
        if entry is None or entry[0] is not handler:
            entry = (handler, self._wrap(handler, method))
            self._cache[id(handler)] = entry
        return entry[1]


# ---- 1. metrics ----------------------------------------------------------------


def _count(name: str, started: float, context: Context, failed: BaseException | None) -> None:
    code = context.code()
    label = code.name if isinstance(code, grpc.StatusCode) else ("CANCELLED" if failed is not None else "OK")
    metrics.REQUESTS.labels(name, label).inc()
    metrics.REQUEST_SECONDS.labels(name).observe(time.perf_counter() - started)


class MetricsInterceptor(_Interceptor):
    def _wrap(self, handler: Handler, method: str) -> Handler:
        name = method.rsplit("/", 1)[-1]
        inner_unary, inner_stream = _behaviors(handler)

        async def unary(request: Any, context: Context) -> Any:
            started, failed = time.perf_counter(), None
            try:
                return await inner_unary(request, context)
            except BaseException as e:
                failed = e
                raise
            finally:
                _count(name, started, context, failed)

        async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
            started, failed = time.perf_counter(), None
            try:
                async for item in inner_stream(request, context):
                    yield item
            except BaseException as e:
                failed = e
                raise
            finally:
                _count(name, started, context, failed)

        return _rebuild(handler, unary, stream, handler.request_deserializer, handler.response_serializer)


# ---- 2. errors -------------------------------------------------------------------


async def abort(context: Context, method: str, error: BaseException) -> None:
    """End the call with the status `error` stands for (raises AbortError)."""
    if isinstance(error, PlanCacheError):
        await context.abort(error.code, bounded(error.message), trailing_metadata=trailing_metadata(error))
    incident = uuid.uuid4().hex[:12]
    log.error("%s failed (incident %s)", method, incident, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; server log incident {incident}")


class _Malformed:
    """What the deserializer hands on for a request that does not parse."""

    def __init__(self, size: int, error: Exception) -> None:
        self.size, self.error = size, error


class ErrorInterceptor(_Interceptor):
    def __init__(self, offload: CpuOffload) -> None:
        super().__init__()
        self._offload = offload

    def _wrap(self, handler: Handler, method: str) -> Handler:
        name = method.rsplit("/", 1)[-1]
        inner_unary, inner_stream = _behaviors(handler)
        parse = cast(Callable[[bytes], Any] | None, handler.request_deserializer)
        offload = self._offload

        def deserialize(raw: bytes) -> Any:
            assert parse is not None
            if len(raw) >= offload.large_bytes:
                return raw  # parsed by the behavior, off the event loop
            try:
                return parse(raw)
            except Exception as e:
                return _Malformed(len(raw), e)

        async def request_of(raw: Any) -> Any:
            if isinstance(raw, bytes):
                assert parse is not None
                try:
                    return await offload.run(len(raw), parse, raw)
                except Exception as e:
                    raw = _Malformed(len(raw), e)
            if isinstance(raw, _Malformed):
                raise InvalidRequest(f"malformed {name} request ({raw.size} bytes): {raw.error}")
            return raw

        async def unary(raw: Any, context: Context) -> Any:
            try:
                return await inner_unary(await request_of(raw) if parse else raw, context)
            except grpc.aio.AbortError:
                raise
            except Exception as e:
                await abort(context, method, e)

        async def stream(raw: Any, context: Context) -> AsyncIterator[Any]:
            try:
                async for item in inner_stream(await request_of(raw) if parse else raw, context):
                    yield item
            except grpc.aio.AbortError:
                raise
            except Exception as e:
                await abort(context, method, e)

        serialize = handler.response_serializer
        # A handler may answer with a response it serialized once and cached
        # (a hot plan's 75 KB are not encoded again for every caller).
        pass_bytes = None if serialize is None else (lambda response: response if isinstance(response, bytes) else serialize(response))
        return _rebuild(handler, unary, stream, deserialize if parse else None, pass_bytes)


# ---- 3. authentication -----------------------------------------------------------


class AuthInterceptor(ServerInterceptor):
    """Health checks and reflection stay open (load balancers, tools)."""

    def __init__(self, authorizer: Authorizer) -> None:
        self._authorizer = authorizer
        self._handlers: dict[tuple[str, str], tuple[Handler, Handler]] = {}

    async def intercept_service(self, continuation: Continuation, details: grpc.HandlerCallDetails) -> Handler:
        handler = await continuation(details)
        method = details.method
        if self._authorizer.open or not method.startswith(SERVICE_PREFIX) or not _wrappable(handler):
            return handler
        try:
            role = self._authorizer.role_of(details.invocation_metadata)
            self._authorizer.require(method, role)
        except PlanCacheError as e:
            error = e
            return self._cached(handler, method, f"refuse:{e.message}", lambda h: _refusal(h, error))
        if method == SERVICE_PREFIX + "Prefetch" and role < Role.COMPILE:
            return self._cached(handler, method, f"role:{role.name}", lambda h: _checking_body(h, role))
        return handler

    def _cached(self, handler: Handler, method: str, outcome: str, make: Callable[[Handler], Handler]) -> Handler:
        entry = self._handlers.get((method, outcome))
        if entry is None or entry[0] is not handler:
            entry = (handler, make(handler))
            self._handlers[(method, outcome)] = entry
        return entry[1]


def _refusal(handler: Handler, error: PlanCacheError) -> Handler:
    """A handler that refuses without reading the request (no deserializer)."""

    async def unary(raw: bytes, context: Context) -> Any:
        raise error

    async def stream(raw: bytes, context: Context) -> AsyncIterator[Any]:
        raise error
        yield  # pragma: no cover - makes this an async generator

    return _rebuild(handler, unary, stream, None, handler.response_serializer)


def _checking_body(handler: Handler, role: Role) -> Handler:
    """Prefetch needs the compile role only when it asks for builds."""
    _, inner = _behaviors(handler)

    async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
        needed = needed_role("Prefetch", request)
        if role < needed:
            raise PermissionDenied(f"Prefetch with compile_missing needs a {needed.name.lower()} token; this token's role is {role.name.lower()}")
        async for item in inner(request, context):
            yield item

    return _rebuild(handler, None, stream, handler.request_deserializer, handler.response_serializer)

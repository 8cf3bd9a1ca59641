"""What every plancache call goes through, in a fixed order, around the servicer:

1. authenticate: the bearer token from the call's metadata, before anything
   reads the request's body (_TokenGate: a refused caller's request is not
   even received; the call's own handler checks it again and names the caller);
2. parse: the request bytes, once their size and shape passed the limits
   (plancache_server.gateway.wire: a hostile request is refused before anything is
   allocated for it); a malformed request answers INVALID_ARGUMENT instead
   of grpc's bare INTERNAL; a large one is parsed off the event loop;
3. authorize the body: Prefetch asking for builds needs the compile role;
4. the servicer method;
5. errors: the one place a domain error becomes a gRPC status, with the
   standard rich error details (plancache.wire.rich_status);
6. metrics: every call counted by method and final status code, with its
   latency.

Each step is its own small function. They are composed into one wrapper per
method when the service is registered rather than chained as grpc.aio
interceptors: an interceptor costs coroutine dispatch on every call, which
on the hit path (tens of microseconds of work in all) was measurable.
Health checking and reflection are registered unwrapped: open to load
balancers and tools, and not counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, cast

import grpc

from plancache.errors import InvalidRequest, PermissionDenied, PlanCacheError, StoreUnavailable
from plancache.log_limits import LogLimiter
from plancache.wire.rich_status import bounded, trailing_metadata
from plancache_server import telemetry
from plancache_server.gateway import wire
from plancache_server.gateway.auth import Authorizer, Role, needed_role
from plancache_server.gateway.offload import CpuOffload
from plancache_server.gateway.shares import CALLER, Shares, caller_id
from plancache_server.gateway.wire import WireLimits
from plancache_server.store.redis_conn import store_fault

log = logging.getLogger(__name__)
# Redis failing fails every call that needs it: one line per kind of failure a minute.
_store_faults = LogLimiter(log)

if TYPE_CHECKING:  # grpc's classes are generic in its stubs only
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]
else:
    Handler, Context = grpc.RpcMethodHandler, grpc.aio.ServicerContext
Unary = Callable[[Any, Context], Awaitable[Any]]
Streaming = Callable[[Any, Context], AsyncIterator[Any]]


class _Capture:
    """Stands in for a server to collect what generated code registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.service = ""

    def add_generic_rpc_handlers(self, generic_handlers: Any) -> None:
        pass  # the same handlers also arrive below, by name

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        self.service, self.handlers = service, handlers


def add_guarded(
    register: Callable[[Any, Any], None],
    servicer: Any,
    server: grpc.aio.Server,
    authorizer: Authorizer,
    offload: CpuOffload,
    limits: WireLimits,
    shares: Shares | None = None,
) -> None:
    """Register `servicer` (with its generated `add_..._to_server`) on
    `server`, every method wrapped by the steps above; `shares` is told of
    every call's caller (who shares the event loop: its turns' pacing)."""
    captured = _Capture()
    register(servicer, captured)
    guarded = {
        name: _guard(handler, f"/{captured.service}/{name}", authorizer, offload, limits, shares)
        for name, handler in captured.handlers.items()
    }
    if authorizer.open:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(captured.service, guarded),))
        server.add_registered_method_handlers(captured.service, guarded)  # type: ignore[attr-defined]
    else:
        # Only a generic handler sees a call's metadata before its body is read: an unknown caller is refused
        # there, by a handler that never reads the request (registered handlers are read whole first: five
        # refused 15 MiB requests grew the server's RSS by 86 MB).
        server.add_generic_rpc_handlers((_TokenGate(captured.service, guarded, authorizer),))


if TYPE_CHECKING:
    GenericHandler = grpc.GenericRpcHandler[Any, Any]
else:
    GenericHandler = grpc.GenericRpcHandler


class _TokenGate(GenericHandler):
    """The service's methods for callers whose token may call them; for any other caller, a handler that
    answers why without reading the request (step 1, before anything is received)."""

    def __init__(self, service: str, guarded: dict[str, Handler], authorizer: Authorizer) -> None:
        self._handlers = {f"/{service}/{name}": handler for name, handler in guarded.items()}
        self._authorizer = authorizer

    def service(self, details: grpc.HandlerCallDetails) -> Handler | None:
        method: str = details.method  # type: ignore[attr-defined]
        handler = self._handlers.get(method)
        if handler is None:
            return None
        try:
            role, _ = self._authorizer.identify(details.invocation_metadata)  # type: ignore[attr-defined]
            self._authorizer.require(method, role)
        except PlanCacheError as e:
            return _refusal(method, e, streaming=handler.unary_stream is not None)
        return handler


def _refusal(method: str, error: PlanCacheError, *, streaming: bool) -> Handler:
    """A handler that refuses the call with `error`, its request never read (a request-streaming
    handler: gRPC reads a message only when asked for one; on the wire a unary call is the same)."""
    name = method.rsplit("/", 1)[-1]

    async def refuse(requests: Any, context: Context) -> Any:
        started = time.perf_counter()
        try:
            await abort(context, method, error)
        finally:
            count(name, started, error)

    if streaming:

        async def refuse_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
            await refuse(requests, context)
            yield b""  # never reached: abort raised

        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.stream_unary_rpc_method_handler(refuse)


# ---- the steps -------------------------------------------------------------------


def authenticate(authorizer: Authorizer, method: str, context: Context) -> Role:
    """1. The caller's role (ADMIN on an open service); raises before the body is read. Who the caller is
    (its share: plancache_server.gateway.shares) is set for the rest of the call."""
    if authorizer.open:
        CALLER.set(caller_id("", context.peer(), open_service=True))
        return Role.ADMIN
    role, token_id = authorizer.identify(context.invocation_metadata())
    authorizer.require(method, role)
    CALLER.set(caller_id(token_id, context.peer(), open_service=False))
    return role


class _Malformed:
    def __init__(self, size: int, error: Exception) -> None:
        self.size, self.error = size, error


async def parse(
    name: str,
    raw: bytes,
    parser: Callable[[bytes], Any],
    offload: CpuOffload,
    limits: WireLimits,
    shares: Shares | None = None,
) -> Any:
    """2. A request over 64 KB from its bytes: its size checked at once (a method without specs takes no more,
    so what passes has specs to walk), then its shape walked and the message parsed in the CPU threads, one of
    its caller's at a time (plancache_server.gateway.offload): a caller's large requests never hold the loop,
    nor more than one thread. A small request is parsed on the loop (`prepared`).

    The walk is Python: in its thread it holds the GIL the event loop needs, and the loop, giving it up at
    every wait for the network, gets it back only at the next switch interval. So the walk is a step of its
    caller's like any on the loop (`shares.turn`): paced to the caller's share while the loop is busy, its
    time charged to the caller (a flood's first second: eleven 680 KB Prefetch requests walked back to back
    held the GIL ~0.5 s, and every other caller's hits stalled ~400 ms). Its turn is taken once the request is
    the caller's one in the pool, so a caller's large requests waiting there hold no turn. The turn holds one
    of the `--work-slots` (one by default) while the walk runs: walks and the loop's other steps take turns,
    which the GIL had them do anyway, and a hit takes no turn."""
    wire.check_size(name, raw, limits)
    async with offload.caller_turn(len(raw)), shares.turn() if shares is not None else nullcontext():
        return await offload.in_pool(_checked_and_parsed, name, raw, parser, limits)


def _checked_and_parsed(name: str, raw: bytes, parser: Callable[[bytes], Any], limits: WireLimits) -> Any:
    wire.check(name, raw, limits)
    return _parsed(name, raw, parser)


def _parsed(name: str, raw: bytes, parser: Callable[[bytes], Any]) -> Any:
    try:
        return parser(raw)
    except Exception as e:
        raise InvalidRequest(f"malformed {name} request ({len(raw)} bytes): {e}") from e


def authorize_body(name: str, request: Any, role: Role) -> None:
    """3. Prefetch needs the compile role only when it asks for builds."""
    needed = needed_role(name, request)
    if role < needed:
        raise PermissionDenied(
            f"{name} with compile_missing needs a {needed.name.lower()} token; this token's role is {role.name.lower()}"
        )


async def abort(context: Context, method: str, error: BaseException) -> None:
    """5. End the call with the status `error` stands for (raises AbortError)."""
    if isinstance(error, StoreUnavailable):
        kind = store_fault(error.__cause__)[0] if error.__cause__ is not None else "store"
        _store_faults.error(kind, "the plan store fails calls: %s; callers get UNAVAILABLE", error.message)
    if isinstance(error, PlanCacheError):
        await context.abort(error.code, bounded(error.message), trailing_metadata=trailing_metadata(error))
    incident = uuid.uuid4().hex[:12]
    log.error("%s failed (incident %s)", method, incident, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; server log incident {incident}")


def status_of(error: BaseException | None) -> str:
    if error is None:
        return "OK"
    if isinstance(error, PlanCacheError):
        return error.code.name
    if isinstance(error, asyncio.CancelledError):
        return "CANCELLED"
    return "INTERNAL"


def count(name: str, started: float, error: BaseException | None) -> None:
    """6. One call, by method and status code, with its latency."""
    telemetry.child(telemetry.REQUESTS, name, status_of(error)).inc()
    telemetry.child(telemetry.REQUEST_SECONDS, name).observe(time.perf_counter() - started)


# ---- composed --------------------------------------------------------------------


def _guard(
    handler: Handler,
    method: str,
    authorizer: Authorizer,
    offload: CpuOffload,
    limits: WireLimits,
    shares: Shares | None = None,
) -> Handler:
    name = method.rsplit("/", 1)[-1]
    parser = cast(Callable[[bytes], Any], handler.request_deserializer)
    serialize = cast(Callable[[Any], bytes], handler.response_serializer)

    def serialize_or_pass(response: Any) -> bytes:
        # A response serialized once and cached (a hot plan's 75 KB) goes out as is.
        return response if isinstance(response, bytes) else serialize(response)

    async def prepared(raw: bytes, context: Context) -> Any:
        role = authenticate(authorizer, method, context)
        if shares is not None:
            shares.seen(CALLER.get())
        if len(raw) <= wire.SMALL_REQUEST_BYTES:  # the common case: no walk, no await, no thread hop
            wire.check_size(name, raw, limits)
            request = _parsed(name, raw, parser)
        else:
            request = await parse(name, raw, parser, offload, limits, shares)
        if role < Role.ADMIN:
            authorize_body(name, request, role)
        return request

    if handler.unary_unary is not None:
        inner_unary = cast(Unary, handler.unary_unary)

        async def unary(raw: bytes, context: Context) -> Any:
            started, failed = time.perf_counter(), cast(BaseException | None, None)
            try:
                return await inner_unary(await prepared(raw, context), context)
            except Exception as e:
                failed = e
                await abort(context, method, e)
            except asyncio.CancelledError as e:
                failed = e
                raise
            finally:
                count(name, started, failed)

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=None, response_serializer=serialize_or_pass
        )

    inner_stream = cast(Streaming, handler.unary_stream)

    async def stream(raw: bytes, context: Context) -> AsyncIterator[Any]:
        started, failed = time.perf_counter(), cast(BaseException | None, None)
        try:
            async for item in inner_stream(await prepared(raw, context), context):
                yield item
        except Exception as e:
            failed = e
            await abort(context, method, e)
        except (asyncio.CancelledError, GeneratorExit) as e:
            failed = asyncio.CancelledError() if isinstance(e, GeneratorExit) else e
            raise
        finally:
            count(name, started, failed)

    return grpc.unary_stream_rpc_method_handler(
        stream, request_deserializer=None, response_serializer=serialize_or_pass
    )

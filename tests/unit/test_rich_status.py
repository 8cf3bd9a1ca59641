"""Errors on the wire: the standard rich error model, and the client's retry pause."""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from plancache.errors import CompileFailed, ResourceExhausted, TargetUnavailable
from plancache.transport.calls import RETRY_BACKOFF_CAP_S, typed
from plancache.transport.calls import retry_pause as _retry_pause
from plancache.wire.rich_status import (
    DETAILS_METADATA_KEY,
    ERROR_DOMAIN,
    MAX_MESSAGE_BYTES,
    bounded,
    error_of,
    trailing_metadata,
)


def test_error_class_and_retry_delay_survive_the_round_trip() -> None:
    for error in (
        TargetUnavailable("no worker"),
        CompileFailed("cuDNN said no"),
        ResourceExhausted("busy", retry_after=1.25),
    ):
        trailers = trailing_metadata(error)
        decoded = error_of(error.code, error.message, trailers)
        assert type(decoded) is type(error) and decoded.code == error.code and decoded.retry_after == error.retry_after
    # The class comes from ErrorInfo even without the legacy trailer (a client of another language's server).
    only_details = [(k, v) for k, v in trailing_metadata(CompileFailed("x")) if k == DETAILS_METADATA_KEY]
    assert type(error_of(grpc.StatusCode.FAILED_PRECONDITION, "x", only_details)) is CompileFailed
    # Garbage details never hide the status code.
    assert (
        type(error_of(grpc.StatusCode.FAILED_PRECONDITION, "x", [(DETAILS_METADATA_KEY, b"\xff\x00")]))
        is TargetUnavailable
    )


@pytest.mark.parametrize("char", ["x", "é", "中", "🙂"])
def test_messages_are_bounded_in_bytes_and_say_how_much_was_cut(char: str) -> None:
    long = char * 10_000
    cut = bounded(long)
    assert len(cut.encode()) <= MAX_MESSAGE_BYTES
    assert cut.startswith(char * 10) and cut.endswith(f"({10_000 - cut.index('…')} more characters)")
    assert bounded("short") == "short"


@pytest.mark.parametrize("char", ["x", "é", "中", "🙂", "%"])
def test_a_refusals_trailers_stay_under_grpcs_soft_limit(char: str) -> None:
    """Past 8 KiB grpc rejects trailers at random: the peer would read "Stream removed", not the error.
    (A 4,096-character message once made 8,620 bytes, and the test below failed now and then.)"""
    error = ResourceExhausted(char * 10_000, retry_after=1.5)
    message = bounded(error.message)
    size = len("grpc-message") + len(urllib.parse.quote(message.encode(), safe=" "))  # percent-encoded, as grpc does
    for key, value in trailing_metadata(error):
        size += len(key) + (len(base64.b64encode(value)) if isinstance(value, bytes) else len(value))
    assert size < 7_500


def test_retry_pause_is_jittered_grows_and_respects_the_deadline() -> None:
    import time

    assert _retry_pause(None, 0, None) is None  # no retry delay: not retried
    pauses = [_retry_pause(1.0, 0, None) for _ in range(200)]
    assert all(p is not None and 0.5 <= p < 1.5 for p in pauses) and len({round(p or 0, 3) for p in pauses}) > 50
    assert all(2.0 <= (_retry_pause(1.0, 2, None) or 0) < 6.0 for _ in range(50))  # doubled per attempt
    assert all((_retry_pause(1.0, 20, None) or 0) < RETRY_BACKOFF_CAP_S * 1.5 for _ in range(50))  # capped
    assert _retry_pause(1.0, 0, time.monotonic() + 0.4) is None  # would end after the deadline


@pytest.mark.parametrize("retry_after", [0.2, 3.0])
def test_retry_pause_never_below_half_the_servers_delay(retry_after: float) -> None:
    assert min(_retry_pause(retry_after, 0, None) or 0 for _ in range(100)) >= retry_after * 0.5


@pytest.fixture(scope="module")
def refusing_server() -> Iterator[grpc.Channel]:
    """A gRPC server whose one method fails as the gateway's error interceptor fails a call."""

    def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
        error = ResourceExhausted("x" * (2 * MAX_MESSAGE_BYTES), retry_after=1.5)
        context.abort_with_status(_Status(error.code, bounded(error.message), trailing_metadata(error)))
        raise AssertionError("unreachable")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    handler = grpc.unary_unary_rpc_method_handler(refuse)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"Refuse": handler})])
    # Port 0: the kernel's free port. A port picked beforehand can be taken by a parallel test, and gRPC binds with
    # SO_REUSEPORT, so both servers would share it and this call could reach the other one.
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel
    server.stop(None)


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str | bytes], ...]) -> None:
        self.code, self.details, self.trailing_metadata = code, details, trailing


def test_grpcs_own_helper_reads_our_trailers_as_we_do(refusing_server: grpc.Channel) -> None:
    """What a Python peer using grpcio-status (or grpc-go's, grpc-java's status helpers) reads of a refusal."""
    with pytest.raises(grpc.RpcError) as failed:
        refusing_server.unary_unary("/t.T/Refuse")(b"", timeout=10)
    status = rpc_status.from_call(failed.value)  # type: ignore[arg-type]  # raises if code or message disagree
    assert status is not None and status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info) and status.details[1].Unpack(retry)
    assert (info.domain, info.reason) == (ERROR_DOMAIN, "ResourceExhausted")
    assert retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9 == 1.5
    ours = typed(failed.value)
    assert type(ours) is ResourceExhausted and ours.retry_after == 1.5 and ours.message == status.message


def test_a_stream_the_server_refused_unread_is_tried_again_and_other_unavailable_calls_are_not() -> None:
    """RST_STREAM REFUSED_STREAM (a burst on a new connection past the server's streams per connection, before
    the client learned the limit): nothing was done, so the call is tried again; a server that is down is not
    retried here (the caller's own fallback decides)."""
    from plancache.errors import Unavailable
    from plancache.wire.rich_status import REFUSED_STREAM_RETRY_S, error_of

    refused = error_of(
        grpc.StatusCode.UNAVAILABLE, "Stream removed (RST_STREAM (Received RST_STREAM with error code 7))", None
    )
    assert isinstance(refused, Unavailable) and refused.retry_after == REFUSED_STREAM_RETRY_S
    down = error_of(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused", None)
    assert down.retry_after is None
    reset = error_of(
        grpc.StatusCode.UNAVAILABLE, "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))", None
    )
    assert reset.retry_after is None  # an internal error: the call may have been done

"""The standard rich error model on the wire, written and read in one place.

A failed call carries a google.rpc.Status in the `grpc-status-details-bin`
trailer (what grpcio-status, grpc-go and grpc-js read) with an ErrorInfo
(domain "plancache.v1", reason: the plancache error class) and, when
calling again can succeed, a RetryInfo with the delay. The legacy
`plancache-error` trailer names the class too, for older clients.

Not through grpcio-status (docs/design.md "Libraries"): its to_status and
from_call are the trailer's key and one parse, it versions in lockstep with
grpcio (grpcio-status X needs grpcio >= X: a dependency would upgrade the
grpcio of every node), and from_call raises where a peer's message differs
from its status, where this module keeps the code. What it reads of these
trailers is tested (tests/unit/test_rich_status.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2

from plancache.errors import ERROR_CLASS_METADATA_KEY, PlanCacheError, error_from_status

DETAILS_METADATA_KEY = "grpc-status-details-bin"
ERROR_DOMAIN = "plancache.v1"
# A message is for people and logs; an unbounded one (echoing a hostile
# request) would cost memory on both sides. It travels twice in a refusal's
# trailers (grpc-message, percent-encoded: up to 3 bytes per UTF-8 byte; and
# inside grpc-status-details-bin, base64), and grpc rejects trailers past
# its 8 KiB soft limit at random (the peer reads "Stream removed" instead of
# the error): 1,536 UTF-8 bytes keep the trailers under 7 KB whatever the text.
MAX_MESSAGE_BYTES = 1536
TRUNCATION_NOTE_BYTES = 48  # "… (N more characters)"


def bounded(message: str) -> str:
    """`message`, or its start and how many characters were left out: at most MAX_MESSAGE_BYTES in UTF-8."""
    encoded = message.encode()
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return message
    kept = encoded[: MAX_MESSAGE_BYTES - TRUNCATION_NOTE_BYTES].decode(errors="ignore")  # a cut character dropped
    return f"{kept}… ({len(message) - len(kept)} more characters)"


def duration(seconds: float) -> duration_pb2.Duration:
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def seconds_of(value: duration_pb2.Duration) -> float:
    return value.seconds + value.nanos / 1e9


def trailing_metadata(error: PlanCacheError) -> tuple[tuple[str, str | bytes], ...]:
    """The trailers a failed call carries for `error`."""
    status = status_pb2.Status(code=error.code.value[0], message=bounded(error.message))
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=type(error).__name__, domain=ERROR_DOMAIN))
    if error.retry_after is not None:
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=duration(error.retry_after)))
    return ((ERROR_CLASS_METADATA_KEY, type(error).__name__), (DETAILS_METADATA_KEY, status.SerializeToString()))


def error_of(code: grpc.StatusCode, details: str, trailing: Iterable[Any] | None) -> PlanCacheError:
    """The typed error a failed call stands for, from its status and trailers."""
    error_class: str | None = None
    retry_after: float | None = None
    for item in trailing or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        if key == DETAILS_METADATA_KEY and isinstance(value, bytes):
            error_class, retry_after = _details(value, error_class)
        elif key == ERROR_CLASS_METADATA_KEY and error_class is None:
            error_class = str(value)
    if retry_after is None and code == grpc.StatusCode.UNAVAILABLE and _refused_stream(details):
        retry_after = REFUSED_STREAM_RETRY_S
    return error_from_status(code, details, error_class, retry_after)


# A call the server's HTTP/2 layer refused unread (RST_STREAM REFUSED_STREAM, code 7): more calls at once on a
# new connection than the server takes per connection (--max-streams-per-connection), sent before the client
# learned the limit. Nothing of it was done, so it is tried again at once (gRPC retries it only before any of
# it was sent).
REFUSED_STREAM_RETRY_S = 0.02


def _refused_stream(details: str) -> bool:
    return "RST_STREAM" in details and "error code 7" in details


def _details(raw: bytes, error_class: str | None) -> tuple[str | None, float | None]:
    status = status_pb2.Status()
    try:
        status.ParseFromString(raw)
    except Exception:  # a peer's garbage must not hide the status code itself
        return error_class, None
    retry_after = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                error_class = info.reason
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after = seconds_of(retry.retry_delay)
    return error_class, retry_after

"""Errors on the wire: the standard rich error model, and the client's retry pause."""

from __future__ import annotations

import grpc
import pytest

from plancache.errors import CompileFailed, ResourceExhausted, TargetUnavailable
from plancache.transport.calls import RETRY_BACKOFF_CAP_S
from plancache.transport.calls import retry_pause as _retry_pause
from plancache.wire.rich_status import (
    DETAILS_METADATA_KEY,
    MAX_MESSAGE_CHARS,
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


def test_messages_are_bounded() -> None:
    long = "x" * (10 * MAX_MESSAGE_CHARS)
    assert len(bounded(long)) <= MAX_MESSAGE_CHARS + 40 and "more characters" in bounded(long)
    assert bounded("short") == "short"


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

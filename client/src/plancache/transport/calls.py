"""What every call of the client shares: the one mapping of a gRPC failure
to a plancache error, the one backoff for a call the server refused
for now (admission control), and how a call's target is resolved."""

from __future__ import annotations

import random
import time

import grpc

from plancache.errors import PlanCacheError
from plancache.keys.arguments import check_target
from plancache.keys.target import Target
from plancache.wire.rich_status import error_of

# Longest pause between two attempts of a call the server refused for now
# (admission control); the server's retry delay is the first pause.
RETRY_BACKOFF_CAP_S = 10.0


def remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def retry_pause(retry_after: float | None, attempt: int, deadline: float | None) -> float | None:
    """Seconds to wait before trying again: the server's delay, doubled per
    attempt up to a cap, times a random factor in [0.5, 1.5) so that a herd
    refused together does not come back together. None when the server did
    not ask for a retry or the deadline would pass first."""
    if retry_after is None:
        return None
    pause: float = min(retry_after * 2**attempt, max(retry_after, RETRY_BACKOFF_CAP_S)) * random.uniform(0.5, 1.5)
    if deadline is not None and time.monotonic() + pause >= deadline:
        return None
    return pause


def typed(exc: grpc.RpcError) -> PlanCacheError:
    """The plancache error a gRPC failure stands for."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    error = error_of(code, details or "", trailing)
    error.__cause__ = exc
    return error


def resolve_target(target: Target | str | None, call: str = "target") -> Target:
    """A call's target: as given, parsed from its id, or this machine's GPU 0 (detected: needs the [gpu] extra).
    Any other type is InvalidRequest naming it (`call` names the call)."""
    check_target(target, call)
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        return Target.parse(target)
    from plancache.gpu.target import detect_target

    return detect_target()

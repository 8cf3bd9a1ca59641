"""One set of typed errors for the whole system.

The server raises these from domain code and ONE interceptor turns them into
gRPC statuses; the client turns statuses back into the same classes. Each
class carries its gRPC code, so the mapping lives here and nowhere else.
"""

from __future__ import annotations

import grpc

# Trailing-metadata key that names the error class (kept beside the standard
# google.rpc.ErrorInfo for clients written before it; see plancache.wire.rich_status).
ERROR_CLASS_METADATA_KEY = "plancache-error"


class PlanCacheError(Exception):
    """Base of every error plancache raises on purpose.

    `retry_after` (seconds) is set when calling again after that delay can
    succeed (admission control refused the call); None otherwise.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class SpecError(PlanCacheError):
    """The graph specification is malformed; the message names the node or tensor."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidRequest(PlanCacheError):
    """A request field other than the spec is malformed (target, options, key)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class Unauthenticated(PlanCacheError):
    """No bearer token, or one the server does not know."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(PlanCacheError):
    """The token's role does not allow this call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class NotFound(PlanCacheError):
    """No stored plan for that key (GetPlan never compiles)."""

    code = grpc.StatusCode.NOT_FOUND


class NotStored(NotFound):
    """No stored plan for the graph yet, and the service has started
    building it (a stored-only ask: `Client.compile(stored_only=True)`,
    which plancache.torch makes with a hedging client, torch's function
    running the call meanwhile). Raised by the client; never on the wire."""

    reason_class = "not_stored"  # plancache.wire.outcome_labels.REASONS


class TargetUnavailable(PlanCacheError):
    """No live GPU worker can build for the requested target."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class CompileFailed(PlanCacheError):
    """cuDNN rejected the graph on this target; the message carries cuDNN's reason."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class UntrustedBuild(PlanCacheError):
    """The plan a worker built for this call fails the gateway's checks
    (signed by a key it does not trust, or damaged): its callers are failed
    at once, naming the plan, the key that signed it and the trusted ones. A
    rebuild would be signed the same way, so none is started until the
    deployment's keys are mended (a worker's --signing-key, a gateway's
    --trusted-keys)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(PlanCacheError):
    """The service cannot be reached right now; retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class StoreUnavailable(Unavailable):
    """The plan store (Redis) cannot be reached; retry later."""


class CompileTimeout(PlanCacheError):
    """The build did not finish within the caller's deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class ResourceExhausted(PlanCacheError):
    """The server refused the call to protect the callers it already serves
    (too many waiting callers, a full build queue, too many refs in one call).
    With `retry_after` set the client retries after that delay, with jitter,
    within its deadline; without it, the request itself is too big."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class IntegrityError(PlanCacheError):
    """A plan's bytes do not match the sha256 in its metadata."""

    code = grpc.StatusCode.DATA_LOSS


class UntrustedPlan(IntegrityError):
    """A plan whose signature is missing, unknown or does not verify: never deserialized.

    `signer`: the key id the plan names ("" when unsigned); `unknown_key`:
    refused for who signed it (an untrusted key, or no signature), which a
    plan signed by the same key again would be too, as opposed to a
    signature that does not verify (an altered plan)."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, signer: str = "", unknown_key: bool = False
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.signer = signer
        self.unknown_key = unknown_key


class ServerError(PlanCacheError):
    """The server failed in a way it did not classify (a bug; see its log)."""

    code = grpc.StatusCode.INTERNAL


_BY_NAME: dict[str, type[PlanCacheError]] = {
    cls.__name__: cls
    for cls in (
        SpecError,
        InvalidRequest,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        TargetUnavailable,
        CompileFailed,
        UntrustedBuild,
        Unavailable,
        StoreUnavailable,
        CompileTimeout,
        ResourceExhausted,
        IntegrityError,
        UntrustedPlan,
        ServerError,
    )
}

_BY_CODE: dict[grpc.StatusCode, type[PlanCacheError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: SpecError,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.FAILED_PRECONDITION: TargetUnavailable,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,  # e.g. the server shut down mid-call
    grpc.StatusCode.DEADLINE_EXCEEDED: CompileTimeout,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DATA_LOSS: IntegrityError,
}


ERROR_CLASSES = tuple(_BY_NAME)


def error_from_status(
    code: grpc.StatusCode, details: str, error_class: str | None, retry_after: float | None = None
) -> PlanCacheError:
    """The typed error for a gRPC status, preferring the class the server named."""
    cls = _BY_NAME.get(error_class or "") or _BY_CODE.get(code, ServerError)
    err = cls(details or code.name, retry_after=retry_after)
    err.code = code
    return err

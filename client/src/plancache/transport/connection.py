"""One channel to a plancache server, shared by the calls made over it.

A `Client` (the hot path: compile, get, prefetch) and an `AdminClient`
(an operator's calls) speak through a Connection: the channel (opened and
owned from "host:port", or the caller's own), the stub, the bearer token,
and `call`: one unary call whose refusal for now (admission control) is
tried again after the server's retry delay, within the call's deadline.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from plancache.addresses import grpc_target
from plancache.errors import InvalidRequest
from plancache.transport.calls import remaining, retry_pause, typed
from plancache.v1 import plancache_pb2_grpc as pb_grpc

Response = TypeVar("Response")
log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
MAX_MESSAGE_BYTES = 64 * 2**20
TOKEN_ENV = "PLANCACHE_TOKEN"


@dataclass(frozen=True)
class TLSConfig:
    """TLS to the server: `ca` verifies it (default: the system roots);
    `cert` and `key` are this client's certificate for mutual TLS."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca), private_key=read(self.key), certificate_chain=read(self.cert)
        )


class Connection:
    """The channel, its stub and the call metadata (the token) of one server."""

    def __init__(
        self,
        server: str | grpc.Channel,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        token: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        """`server`: "host:port" (a channel is opened and owned here; a host
        alone is port 50051, warned once; see plancache.addresses for the
        forms taken) or a grpc.Channel the caller configured and keeps owning. `token`: the
        bearer token of every call (default PLANCACHE_TOKEN). `timeout`: the
        seconds a call may take unless it says otherwise."""
        bearer = token or os.environ.get(TOKEN_ENV)
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {bearer}"),) if bearer else ()
        if isinstance(server, str):
            target = grpc_target(server)  # InvalidRequest for an address that is not one
            options = [
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # A channel of its own connections: gRPC shares a process's connections to one address between
                # channels, and a new client then inherited an older one's reconnect backoff to a server since
                # restarted on that address (UNAVAILABLE "Connection refused" at once, for up to the backoff).
                ("grpc.use_local_subchannel_pool", 1),
            ]
            credentials = tls.credentials() if tls is not None else None
            self.channel = (
                grpc.secure_channel(target, credentials, options=options)
                if credentials is not None
                else grpc.insecure_channel(target, options=options)
            )
            self._owns_channel = True
        elif hasattr(server, "unary_unary"):  # a grpc.Channel, or what a test gives as one
            self.channel = server
            self._owns_channel = False
        else:
            raise InvalidRequest(
                f"server must be an address (str: host:port) or a grpc.Channel, not {type(server).__name__}"
            )
        self.stub = pb_grpc.PlanCacheStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        if self._owns_channel:
            self.channel.close()

    def budget(self, timeout: float | None) -> float | None:
        """A call's seconds: its own, else the connection's."""
        return timeout if timeout is not None else self.timeout

    def call(self, method: Callable[..., Response], request: Any, timeout: float | None) -> Response:
        """One unary call; a refusal for now (admission control) is tried
        again after the server's retry delay, with jittered backoff, as long
        as the deadline allows. Failures are typed plancache errors."""
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = 0
        while True:
            try:
                return method(request, timeout=remaining(deadline), metadata=self.metadata)
            except grpc.RpcError as exc:
                error = typed(exc)
                pause = retry_pause(error.retry_after, attempt, deadline)
                if pause is None:
                    raise error from exc
            log.debug("server asked to retry later (%s); retrying in %.2f s", error.message, pause)
            time.sleep(pause)
            attempt += 1

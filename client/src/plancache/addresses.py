"""A plancache server's address as people write it, made the gRPC target it means.

gRPC reads "host" without a port as port 443 (its https default): `Client("127.0.0.1")` silently dialled a
port no plancache server listens on. Here an address without a port takes plancache-server's own default
(DEFAULT_PORT, its --listen), and says so once per process (a warning on this module's logger);
"host:port", "[v6 address]:port", a bare v6 address, "dns:[//authority/]host[:port]" and gRPC's other
schemes ("unix:path", "unix-abstract:", "ipv4:", "ipv6:", "vsock:", "xds:") are kept as they are; a port that
is no number in 1..65535 is InvalidRequest. The client's channels and the server's --listen read addresses
here, so both sides agree on what a bare host means.
"""

from __future__ import annotations

import ipaddress
import logging
import threading

from plancache.errors import InvalidRequest

log = logging.getLogger(__name__)

DEFAULT_PORT = 50051
# gRPC's URI schemes besides dns: what follows them is the resolver's (a path, a list of addresses, ...).
_OTHER_SCHEMES = ("unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:", "xds:", "google-c2p:")
_FORM = "host:port, [v6 address]:port, unix:PATH or dns:///host:port"
_warned = threading.Event()


def grpc_target(address: str, *, listening: bool = False) -> str:
    """The gRPC target of `address`, its port made explicit. `listening`: a server's own address, where port 0
    (any free one) is allowed."""
    if not isinstance(address, str):
        raise InvalidRequest(f"a server address is a str ({_FORM}), not {type(address).__name__}")
    text = address.strip()
    if not text:
        raise InvalidRequest(f"empty server address: write {_FORM}")
    if text.startswith(_OTHER_SCHEMES):
        return text
    if text.startswith("dns:"):
        rest = text[len("dns:") :]
        prefix = "dns:"
        if rest.startswith("//"):  # dns://[authority]/name
            authority_end = rest.find("/", 2)
            if authority_end < 0:
                raise InvalidRequest(f"server address {address!r}: dns:// needs a name after the authority's '/'")
            prefix, rest = "dns:" + rest[: authority_end + 1], rest[authority_end + 1 :]
        return prefix + _host_port(rest, address, listening)
    if "://" in text:
        raise InvalidRequest(f"server address {address!r} is a URL; gRPC takes {_FORM}")
    return _host_port(text, address, listening)


def _host_port(text: str, address: str, listening: bool) -> str:
    host, port = _split(text, address)
    if not host or any(c.isspace() or c == "/" for c in host):
        raise InvalidRequest(f"server address {address!r}: no host in it (write {_FORM})")
    if port is None:
        if not _warned.is_set():
            _warned.set()
            log.warning(
                "plancache server address %r has no port: using %d, plancache-server's default "
                "(write host:port to choose; said once per process)",
                address,
                DEFAULT_PORT,
            )
        return f"{host}:{DEFAULT_PORT}"
    lowest = 0 if listening else 1
    if not port.isdigit() or not lowest <= int(port) <= 65535:
        raise InvalidRequest(
            f"server address {address!r}: port {port!r} is not a number from {lowest} to 65535 (write {_FORM})"
        )
    return f"{host}:{int(port)}"


def _split(text: str, address: str) -> tuple[str, str | None]:
    """(host, port or None); a v6 host keeps its brackets."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise InvalidRequest(f"server address {address!r}: '[' without ']' (write [v6 address]:port)")
        host, rest = text[: end + 1], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidRequest(f"server address {address!r}: after ']' comes ':port', not {rest!r}")
        return host, rest[1:] if rest else None
    if text.count(":") > 1:
        try:
            ipaddress.IPv6Address(text)
        except ValueError:
            raise InvalidRequest(
                f"server address {address!r}: a v6 address with a port is written [address]:port"
            ) from None
        return f"[{text}]", None
    if ":" in text:
        host, port = text.rsplit(":", 1)
        return host, port
    return text, None

"""The HTTP side of a process (`--metrics-port`): Prometheus `/metrics` on
every server and worker process; on a server also the status page (`/`),
its data as JSON (`/status.json`), a liveness probe (`/healthz`) and
Prometheus's HTTP service discovery (`/prometheus/targets`: the server's
own /metrics and one target per compile worker it started, so Prometheus
scrapes the workers that exist, not a fixed list of ports).

Plain HTTP, no authentication: bind it to an operators' network (the gRPC
port carries the auth). Pages are read-only. Requests are served on a
thread; the status report itself runs on the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from plancache.errors import InvalidRequest, StoreUnavailable
from plancache_server.web import status_page
from plancache_server.web.status import StatusSource

log = logging.getLogger(__name__)
T = TypeVar("T")
REPORT_TIMEOUT_S = 30.0
# Prometheus's HTTP service discovery (http_sd_configs in docker/prometheus.yml).
SCRAPE_TARGETS_PATH = "/prometheus/targets"


@dataclass(frozen=True)
class ScrapeTargets:
    """What Prometheus scrapes for one server: its own metrics port and each worker it started (GPU -> port)."""

    gateway_port: int
    worker_ports: dict[int, int] = field(default_factory=dict)

    def groups(self, host: str) -> list[dict[str, Any]]:
        """Prometheus's http_sd format. `host`: the name Prometheus reached this server by (its Host
        header), which reaches the workers too: a server's workers run beside it."""
        shown = f"[{host}]" if ":" in host else host
        groups: list[dict[str, Any]] = [{"targets": [f"{shown}:{self.gateway_port}"], "labels": {"role": "gateway"}}]
        for gpu, port in sorted(self.worker_ports.items()):
            groups.append({"targets": [f"{shown}:{port}"], "labels": {"role": "worker", "gpu": str(gpu)}})
        return groups


def _request_host(header: str | None, fallback: str) -> str:
    """ "plancache:9464" -> "plancache", "[::1]:9464" -> "::1"; `fallback` without a Host header."""
    if not header:
        return fallback
    if header.startswith("["):
        return header[1 : header.find("]")]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class _Handler(BaseHTTPRequestHandler):
    server: WebServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, content_type, encoder(REGISTRY))
            elif url.path == "/healthz":
                self._send(200, "text/plain; charset=utf-8", b"ok\n")
            elif url.path == SCRAPE_TARGETS_PATH and self.server.scrape is not None:
                host = _request_host(self.headers.get("Host"), str(self.server.server_address[0]) or "127.0.0.1")
                self._send(200, "application/json", json.dumps(self.server.scrape.groups(host)).encode())
            elif url.path in ("/", "/status", "/status.json") and self.server.status is not None:
                report = self.server.on_loop(self.server.status.report(parse_qs(url.query).get("range", ["1h"])[0]))
                if url.path == "/status.json":
                    self._send(200, "application/json", json.dumps(report.to_json(), indent=1).encode())
                else:
                    self._send(200, "text/html; charset=utf-8", status_page.render(report).encode())
            else:
                self._send(
                    404,
                    "text/plain; charset=utf-8",
                    b"not found: /metrics, /healthz"
                    + (b", /, /status.json" if self.server.status else b"")
                    + (f", {SCRAPE_TARGETS_PATH}".encode() if self.server.scrape else b"")
                    + b"\n",
                )
        except InvalidRequest as e:
            self._send(400, "text/plain; charset=utf-8", f"{e.message}\n".encode())
        except StoreUnavailable as e:
            self._send(503, "text/plain; charset=utf-8", f"status unavailable: {e.message}\n".encode())
        except TimeoutError:  # the event loop did not gather it in time: said, not a traceback on the server's stderr
            self._send(
                503,
                "text/plain; charset=utf-8",
                f"status unavailable: not gathered within {REPORT_TIMEOUT_S:.0f} s\n".encode(),
            )

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http %s: " + format, self.client_address[0], *args)


class WebServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        port: int,
        status: StatusSource | None,
        host: str = "",
        loop: asyncio.AbstractEventLoop | None = None,
        scrape: ScrapeTargets | None = None,
    ) -> None:
        if status is not None and loop is None:
            raise ValueError("a status page needs the event loop its sources run on")
        self.status = status
        self.scrape = scrape
        self.loop = loop
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self._thread = threading.Thread(target=self.serve_forever, name="plancache-http", daemon=True)

    def on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the gateway's loop and wait for its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=REPORT_TIMEOUT_S)

    def start(self) -> WebServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def serve(
    port: int,
    status: StatusSource | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    host: str = "127.0.0.1",
    scrape: ScrapeTargets | None = None,
) -> WebServer | None:
    """Serve on host:port (port 0: off). No authentication there: bind it
    wider than localhost (0.0.0.0 in a container) only on purpose."""
    if not port:
        return None
    server = WebServer(port, status, host=host, loop=loop, scrape=scrape).start()
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "HTTP on %s:%d: /metrics%s",
        shown,
        port,
        f"; status page http://{shown or '127.0.0.1'}:{port}/" if status else "",
    )
    return server


def listen_host(address: str) -> str:
    """The host part of a gRPC listen address ("0.0.0.0:50051", "[::1]:50051", "localhost:50051")."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host

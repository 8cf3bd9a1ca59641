"""Prometheus metrics of a server process and of the worker it starts."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from plancache import Client, SpecError
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.processes import server_process, wait_for_workers
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET

pytestmark = pytest.mark.slow


def _port_with_free_successor() -> int:
    """A free port whose next port is free too (the worker takes port + 1 + device 0)."""
    import socket

    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


def _scrape(port: int) -> str:
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _value(text: str, prefix: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert lines, f"no {prefix} in metrics"
    return float(lines[0].rsplit(" ", 1)[1])


def test_server_and_worker_metrics(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    address, port = f"127.0.0.1:{free_port()}", _port_with_free_successor()
    try:
        with server_process(
            address,
            redis_server.url,
            tmp_path / "server.log",
            "--gpus",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--unsigned",
            "--metrics-port",
            str(port),
        ) as server:
            wait_for_workers(address, proc=server)
            with Client(address, cache=False) as client:
                client.compile(matmul_spec(), TARGET)
                client.compile(matmul_spec(), TARGET)
                bad = matmul_spec()
                bad.tensors[1].dim = (8, 500, 256)
                with pytest.raises(SpecError):  # refused by the client itself: not counted on the server
                    client.compile(bad, TARGET)
            front = _scrape(port)
            worker = _scrape(port + 1)
        target = TARGET.id
        assert _value(front, 'plancache_requests_total{code="OK",method="Compile"}') == 2
        assert _value(front, f'plancache_lookups_total{{result="hit",target="{target}"}}') == 1
        assert _value(front, f'plancache_lookups_total{{result="miss",target="{target}"}}') == 1
        assert _value(front, f'plancache_live_workers{{target="{target}"}}') == 1
        assert _value(front, f'plancache_jobs_waiting{{target="{target}"}}') == 0
        assert _value(front, 'plancache_request_duration_seconds_count{method="Compile"}') == 2
        assert _value(front, f'plancache_store_plans{{target="{target}"}}') == 1
        assert (
            _value(front, f'plancache_store_bytes{{target="{target}"}}') > 75_000
        )  # the stand-in's blob, metadata and signature
        assert _value(front, f'plancache_store_evicted_total{{target="{target}"}}') == 0
        # The one plan served from Redis stays in the gateway's memory cache, counted as its blob and two encodings.
        assert _value(front, "plancache_gateway_memory_cache_plans") == 1
        assert _value(front, "plancache_gateway_memory_cache_bytes") > 3 * 75_000
        assert _value(worker, f'plancache_builds_total{{outcome="built",target="{target}"}}') == 1
        assert _value(worker, "plancache_worker_busy") == 0
    finally:
        redis_server.stop()

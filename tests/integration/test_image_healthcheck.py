"""The image's HEALTHCHECK (docker/Dockerfile), run as the engine runs it,
against a running server and against a port nobody serves."""

from __future__ import annotations

import subprocess
import sys

from plancache_server.store.embedded_redis import free_port
from tests.conftest import Stack
from tests.support.processes import child_env
from tests.unit.test_compose import healthcheck_program


def _check(port: int) -> int:
    env = child_env(PLANCACHE_LISTEN=f"0.0.0.0:{port}")  # the image's ENV
    return subprocess.run(
        [sys.executable, "-c", healthcheck_program()], env=env, capture_output=True, timeout=30, check=False
    ).returncode


def test_healthy_while_the_server_serves(gpuless_stack: Stack) -> None:
    assert _check(int(gpuless_stack.address.rsplit(":", 1)[1])) == 0


def test_unhealthy_where_nothing_answers() -> None:
    assert _check(free_port()) != 0

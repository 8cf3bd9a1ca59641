"""Dependency boundaries: the client never imports Redis; the gateway never
imports torch or cuDNN (only a worker's compiler does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import child_env


def _imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "statement", ["import plancache, plancache.cli, plancache.transport.client, plancache.run.plan"]
)
def test_client_does_not_import_redis_or_the_gpu_stack(statement: str) -> None:
    assert not {"redis", "torch", "cudnn", "plancache_server"} & _imported_after(statement)


def test_front_end_does_not_import_the_gpu_stack() -> None:
    imported = _imported_after(
        "import plancache_server.main, plancache_server.worker_main, plancache_server.gateway.app"
    )
    assert not {"torch", "cudnn"} & imported
    assert "redis" in imported

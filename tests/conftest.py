"""Shared fixtures: a real redis-server on a free port, and the in-process
plancache stack (the asyncio gateway on a background event loop + a worker
thread with the stand-in compiler)."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from plancache import Client
from plancache.trust.signing import Signer
from plancache_server.settings import Settings
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.store.redis_conn import connect
from plancache_server.store.warming import Warming
from plancache_server.worker.build_pool import ThreadBuildPool
from plancache_server.worker.parts import worker_parts
from plancache_server.worker.warm_runner import WarmRunner
from plancache_server.worker.worker import Worker
from tests.support import hermetic, run_summary
from tests.support.frontend import ThreadedFrontEnd
from tests.support.standin import StandInCompiler

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """A caller's PLANCACHE_* variables never reach what the suite tests."""
    removed = hermetic.scrub(os.environ)
    # Every test process of a suite is one workload ("pytest"): a test's client streaming the plans
    # other tests used would change what that test watches. Tests of the start-up prefetch turn it
    # on for their own clients (tests/integration/test_workloads.py, tests/gpu/test_gpu_workload.py).
    os.environ["PLANCACHE_WORKLOAD_PREFETCH"] = "0"
    if not config.pluginmanager.has_plugin("tests.support.run_summary"):
        config.pluginmanager.register(run_summary, "tests.support.run_summary")
    if removed:
        config.stash[REMOVED_VARIABLES] = removed


def pytest_report_header(config: pytest.Config) -> str | None:
    removed = config.stash.get(REMOVED_VARIABLES, [])
    return f"removed from the environment (tests.support.hermetic): {', '.join(removed)}" if removed else None


REMOVED_VARIABLES = pytest.StashKey[list[str]]()


@pytest.fixture(autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the real ~/.cache/plancache, nor trusts the keys pinned
    in the real ~/.config/plancache (child processes inherit both)."""
    monkeypatch.setenv("PLANCACHE_CACHE_DIR", str(tmp_path_factory.mktemp("plancache-cache")))
    monkeypatch.setenv("PLANCACHE_CONFIG_DIR", str(tmp_path_factory.mktemp("plancache-config")))


@pytest.fixture(autouse=True)
def accept_unsigned_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most tests watch other behaviour and run unsigned workers; the signing
    tests (tests/*/test_signing.py) set their clients' trust explicitly."""
    monkeypatch.setenv("PLANCACHE_ALLOW_UNSIGNED", "1")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), binary=hermetic.redis_server_bin(), persist=False).start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = connect(redis_server.url)
    client.flushdb()
    yield client
    client.close()


@dataclasses.dataclass
class Stack:
    address: str
    settings: Settings
    redis: redis.Redis
    compiler: StandInCompiler
    worker: Worker | None
    gateway: ThreadedFrontEnd

    def client(self, **kwargs: Any) -> Client:
        """A client without a disk cache: these tests watch the server."""
        return Client(self.address, **{"cache": False, **kwargs})


def start_stack(
    redis_url: str,
    compiler: StandInCompiler | None,
    signer: Signer | None = None,
    worker_redis_url: str | None = None,
    pool_size: int = 4,
    warm: bool = False,
    auto_warm_after_s: float | None = None,
    worker_id: str = "test-worker",
    heartbeat_ttl_s: float = 5,
    **overrides: object,
) -> tuple[Stack, Callable[[], None]]:
    """`worker_redis_url`: the worker's own Redis user (default: the gateway's);
    `pool_size`: the worker's build threads (ThreadBuildPool: the stand-in builds on threads);
    `warm`: the worker builds warming plans (and plans its own after `auto_warm_after_s` idle);
    `heartbeat_ttl_s`: how long the worker's entry lives past its last beat (it beats every 0.2 s)."""
    settings = dataclasses.replace(
        Settings(listen="127.0.0.1:0", redis_url=redis_url, heartbeat_interval_s=0.2), **overrides
    )  # type: ignore[arg-type]
    client = connect(redis_url)
    worker_client = connect(worker_redis_url) if worker_redis_url else client
    gateway = ThreadedFrontEnd(settings, redis_url)
    worker = None
    thread = None
    if compiler is not None:
        parts = worker_parts(worker_client, settings, signer)
        pool = ThreadBuildPool(compiler, pool_size)
        targets = [compiler.target, compiler.target.generic()]
        runner = (
            WarmRunner(Warming(worker_client), parts.store.janitor, worker_id, targets, 2.0, auto_warm_after_s)
            if warm
            else None
        )
        worker = Worker(
            compiler,
            parts.queue,
            parts.builds,
            parts.store,
            worker_id,
            pool=pool,
            heartbeat_interval_s=0.2,
            heartbeat_ttl_s=heartbeat_ttl_s,
            signer=signer,
            warm=runner,
            tune_after_quiet_s=settings.tune_after_quiet_s,
            hedged_quiet_s=settings.hedged_quiet_s,
            hedged_hold_max_s=settings.hedged_hold_max_s,
            warm_beside_callers=settings.warm_beside_callers,
        )
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        parts.queue.heartbeat(worker.worker_id, targets, heartbeat_ttl_s)
    stack = Stack(f"127.0.0.1:{gateway.port}", settings, client, compiler or StandInCompiler(), worker, gateway)

    def stop() -> None:
        if worker is not None:
            worker.stop()
            assert thread is not None
            thread.join(timeout=5)
        gateway.stop()
        client.close()
        worker_client.close()

    return stack, stop


@pytest.fixture
def stack(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Iterator[Stack]:
    """Server + one worker with a stand-in compiler (no build delay)."""
    s, stop = start_stack(redis_server.url, StandInCompiler())
    yield s
    stop()


@pytest.fixture
def uncached_stack(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Iterator[Stack]:
    """Server (no memory cache: every read goes to Redis) + one stand-in worker."""
    s, stop = start_stack(redis_server.url, StandInCompiler(), memory_cache_bytes=0)
    yield s
    stop()


@pytest.fixture
def slow_stack(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Iterator[Stack]:
    """Server + one worker whose stand-in build takes 1 s."""
    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=1.0))
    yield s
    stop()


@pytest.fixture
def gpuless_stack(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Iterator[Stack]:
    """Server with no worker at all: stored plans only."""
    s, stop = start_stack(redis_server.url, None)
    yield s
    stop()

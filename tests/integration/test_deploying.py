"""docs/deploying.md's two-host set-up, both hosts played on this one: a
server without a GPU whose private Redis is opened to remote workers
(--redis-listen, `make run REDIS_LISTEN=...`), and a compile worker that
joins it with the URL the server wrote (the worker's Redis user, its own
signing key, which the server and the clients trust)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import redis

from plancache import Client, TargetUnavailable
from plancache.trust.signing import generate_keypair
from plancache_server.store.embedded_redis import WORKER_URL_FILE, free_port
from tests.support.processes import Proc, child_env, wait_for_workers
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET

pytestmark = pytest.mark.slow


def _server(tmp_path: Path, *args: str) -> tuple[Proc, str]:
    port = free_port()
    server = Proc(
        [
            sys.executable,
            "-m",
            "plancache_server.main",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(tmp_path / "data"),
            *args,
        ],
        tmp_path / "server.log",
    )
    server.wait_for(r"plancache-server listening on")
    return server, f"127.0.0.1:{port}"


def test_a_worker_on_another_host_joins_a_servers_private_redis(tmp_path: Path) -> None:
    redis_port = free_port()
    private, public = generate_keypair(tmp_path / "worker-keys")  # `plancache keygen --out` on the GPU host
    server, address = _server(
        tmp_path, "--gpus", "none", "--redis-listen", f"127.0.0.1:{redis_port}", "--trusted-keys", str(public)
    )
    worker = None
    try:
        url_file = tmp_path / "data" / "redis" / WORKER_URL_FILE
        worker_url = url_file.read_text().strip()
        assert oct(url_file.stat().st_mode & 0o777) == "0o600"
        assert re.fullmatch(rf"redis://plancache-worker:[0-9a-f]{{48}}@127\.0\.0\.1:{redis_port}/0", worker_url)
        password = worker_url.split(":")[2].split("@")[0]
        assert password not in server.text()  # no password in the log

        # Nobody gets in without a password, and the worker's user has the worker's rules only.
        anonymous = redis.Redis(port=redis_port)
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("plancache:x", "1")
        anonymous.close()
        as_worker = redis.Redis.from_url(worker_url)
        assert as_worker.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_worker.config_get("requirepass")
        as_worker.close()

        with Client(address, trusted_keys=[public], allow_unsigned=False, cache=False, hedge=False) as client:
            with pytest.raises(TargetUnavailable, match=r"plancache-worker --redis-url .*docs/deploying\.md"):
                client.compile(matmul_spec(), STANDIN_TARGET)  # no worker yet: the message says what to start
            worker = Proc(
                [
                    sys.executable,
                    "-m",
                    "plancache_server.worker_main",
                    "--device",
                    "0",
                    "--compiler",
                    "tests.support.standin:factory",
                    "--signing-key",
                    str(private),
                ],
                tmp_path / "worker.log",
                env=child_env(PLANCACHE_REDIS_URL=worker_url),  # by environment, as docs/deploying.md says
            )
            wait_for_workers(address, proc=worker.proc)
            first = client.compile(matmul_spec(), STANDIN_TARGET)
            second = client.compile(matmul_spec(), STANDIN_TARGET)
        assert (first.source, second.source) == ("compiled", "hit")
        assert "STAND-IN COMPILER" in worker.text()
    finally:
        if worker is not None:
            worker.stop()
        assert server.stop() == 0
    # Started again without --redis-listen: a unix socket only, and no URL left that would not work.
    again, _ = _server(tmp_path, "--gpus", "none")
    assert again.stop() == 0
    assert not url_file.exists()


def test_a_password_with_any_character_reaches_redis(tmp_path: Path) -> None:
    """--redis-password-file (the compose file's secret): the password is put into the URL quoted."""
    from plancache_server.store.embedded_redis import EmbeddedRedis

    password = 'p@ss:w/o#r?d% "x"'
    shared = EmbeddedRedis(tmp_path / "redis", persist=False, password=password).start()
    secret = tmp_path / "redis_password"
    secret.write_text(password + "\n")
    try:
        server, address = _server(
            tmp_path,
            "--gpus",
            "none",
            "--redis-url",
            f"redis://127.0.0.1:{shared.port}/0",
            "--redis-password-file",
            str(secret),
        )
        with Client(address, cache=False) as client:
            assert client.admin.stats() is not None
        assert server.stop() == 0
        assert password not in server.text()
    finally:
        shared.stop()


def test_redis_listen_is_for_the_private_store(tmp_path: Path) -> None:
    run = Proc(
        [
            sys.executable,
            "-m",
            "plancache_server.main",
            "--gpus",
            "none",
            "--redis-url",
            "redis://127.0.0.1:1/0",
            "--redis-listen",
            "0.0.0.0:6379",
            "--data-dir",
            str(tmp_path / "d"),
        ],
        tmp_path / "log",
    )
    assert run.proc.wait(timeout=60) == 1
    run.stop()
    assert "--redis-listen opens the private store" in run.text()
    assert os.path.exists(tmp_path / "log")


def test_make_run_opens_its_redis_when_asked() -> None:
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    asked = subprocess.run(
        ["make", "-n", "run", "REDIS_LISTEN=0.0.0.0:6379"], cwd=repo, capture_output=True, text=True, check=True
    )
    assert "plancache-server --metrics-port 9464 --redis-listen 0.0.0.0:6379" in asked.stdout
    plain = subprocess.run(["make", "-n", "run"], cwd=repo, capture_output=True, text=True, check=True)
    assert "--redis-listen" not in plain.stdout

"""Issue 33: a shared Redis configured so that plancache cannot work, met
by real plancache-server and plancache-worker processes: an eviction
policy that would drop plans, jobs and leases; a user docs/operations.md describes
that was never created; a wrong password, at start and mid-run. Each is one
line with the way out, never a traceback; mid-run, callers get a typed
error with the reason and the service recovers by itself."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from plancache import Client, StoreUnavailable
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.operator_view import assert_no_traceback, lines_matching, problem_lines, report
from tests.support.processes import REPO, child_env, server_process, wait_for_workers, worker_process
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

STANDIN = ("--compiler", "tests.support.standin:factory", "--unsigned")


def _exits(program: str, redis_url: str, tmp: Path, *args: str) -> tuple[int, str]:
    """Runs plancache-server or plancache-worker until it exits: (status, its output)."""
    module = {"server": "plancache_server.main", "worker": "plancache_server.worker_main"}[program]
    command = [sys.executable, "-m", module, *args]
    if program == "server":
        command += ["--listen", f"127.0.0.1:{free_port()}", "--gpus", "none", "--data-dir", str(tmp / "server-data")]
    done = subprocess.run(
        command,
        env=child_env(PLANCACHE_REDIS_URL=redis_url),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def _the_one_problem(output: str) -> str:
    assert_no_traceback(output)
    (line,) = problem_lines(output)
    return line


def test_a_redis_that_would_evict_plans_is_refused_at_start_with_the_setting_to_change(tmp_path: Path) -> None:
    shared = EmbeddedRedis(
        tmp_path / "redis", persist=False, extra_args=("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    ).start()
    try:
        code, output = _exits("server", shared.url, tmp_path)
        line = _the_one_problem(output)
        assert (
            code == 1
            and "ERROR" in line
            and "maxmemory-policy allkeys-lru" in line
            and "maxmemory-policy noeviction" in line
        ), output
        code, output = _exits("worker", shared.url, tmp_path, "--device", "0", *STANDIN)
        line = _the_one_problem(output)
        assert code == 3 and "maxmemory-policy allkeys-lru" in line and "--store-max-mb" in line, output
        # volatile-*: leases and job states could go (a build twice), never a plan: said, and served.
        redis.Redis.from_url(shared.url).config_set("maxmemory-policy", "volatile-lru")
        address = f"127.0.0.1:{free_port()}"
        with server_process(address, shared.url, tmp_path / "volatile.log", "--gpus", "none"):
            pass
        (warning,) = lines_matching((tmp_path / "volatile.log").read_text(), "maxmemory-policy")
        assert "WARNING" in warning and "volatile-lru" in warning and "stored plans are kept" in warning
        redis.Redis.from_url(shared.url).config_set("maxmemory-policy", "noeviction")
        with server_process(address, shared.url, tmp_path / "noeviction.log", "--gpus", "none"):
            pass
        assert not lines_matching((tmp_path / "noeviction.log").read_text(), "maxmemory-policy")
    finally:
        shared.stop()


def test_missing_users_and_wrong_passwords_are_one_line_at_start(tmp_path: Path) -> None:
    shared = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    try:
        admin = redis.Redis.from_url(shared.url)
        admin.execute_command("ACL", "SETUSER", *keys.acl_setuser("gateway", "plancache-gateway", "right-password"))
        url = f"redis://{{user}}:{{password}}@127.0.0.1:{shared.port}/0"
        never_created = url.format(user="plancache-worker", password="whatever")
        wrong = url.format(user="plancache-gateway", password="wrong-password")
        for program, redis_url, args, status in [
            ("server", wrong, (), 1),
            ("server", never_created, (), 1),
            ("worker", never_created, ("--device", "0", *STANDIN), 3),
        ]:
            code, output = _exits(program, redis_url, tmp_path, *args)
            line = _the_one_problem(output)
            assert code == status, output
            assert "refused this process" in line and "AuthenticationError" in line and "ACL SETUSER" in line
            assert "wrong-password" not in line and "whatever" not in line, line  # the URL's password is never logged
    finally:
        shared.stop()


def test_a_password_changed_mid_run_fails_calls_with_the_reason_once_a_minute_and_recovers(tmp_path: Path) -> None:
    shared = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    admin = redis.Redis.from_url(shared.url)
    password = {role: secrets.token_hex(8) for role in keys.ACL_RULES}
    for role in keys.ACL_RULES:
        admin.execute_command("ACL", "SETUSER", *keys.acl_setuser(role, f"plancache-{role}", password[role]))
    url = {role: f"redis://plancache-{role}:{password[role]}@127.0.0.1:{shared.port}/0" for role in keys.ACL_RULES}
    address = f"127.0.0.1:{free_port()}"
    log = tmp_path / "server.log"
    try:
        with ExitStack() as stack:
            stack.enter_context(
                server_process(address, url["gateway"], log, "--gpus", "none", "--memory-cache-mb", "0")
            )
            worker = stack.enter_context(
                worker_process(url["worker"], tmp_path / "worker.log", "--device", "0", *STANDIN)
            )
            wait_for_workers(address, proc=worker)
            client = stack.enter_context(Client(address, cache=False, timeout=5))
            plans = [client.compile(matmul_spec(m=8 * (i + 1)), TARGET) for i in range(5)]
            # The gateway's password is changed under it (a rotation done half-way).
            admin.execute_command("ACL", "SETUSER", "plancache-gateway", "resetpass", ">another-password")
            admin.execute_command("CLIENT", "KILL", "USER", "plancache-gateway")
            errors, started = [], time.monotonic()
            for _ in range(4):
                for plan in plans:
                    with pytest.raises(StoreUnavailable) as refused:
                        client.get(plan.key)
                    errors.append(refused.value.message)
            slowest = (time.monotonic() - started) / len(errors)
            # The connections Redis closed fail once each as such; then every call says why.
            assert all("refused the user or password" in e for e in errors[-10:]), errors
            # Mended: served again without a restart.
            admin.execute_command("ACL", "SETUSER", "plancache-gateway", "resetpass", f">{password['gateway']}")
            mended = time.monotonic()
            wait_until(lambda: _served(client, plans[0].key), 30, "serving again")
            recovered_after = time.monotonic() - mended
            assert all(client.get(p.key).blob == p.blob for p in plans)
        text = log.read_text()
        assert_no_traceback(text, (tmp_path / "worker.log").read_text())
        said = lines_matching(text, "refused the user or password")
        assert len(said) == 1 and "ERROR" in said[0], said  # 20 failed calls, one line
        report(
            "gateway's Redis password changed mid-run",
            {
                "calls_failed": len(errors),
                "typed": "StoreUnavailable",
                "mean_call_s": round(slowest, 3),
                "log_lines": len(said),
                "recovered_after_s": round(recovered_after, 2),
            },
        )
    finally:
        shared.stop()


def _served(client: Client, key: str) -> bool:
    try:
        return bool(client.get(key).blob)
    except StoreUnavailable:
        return False

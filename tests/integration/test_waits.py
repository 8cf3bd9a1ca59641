"""Issue 33, item 3: bounds on waiting that no other test holds to (the
full list, with the tests of the others: docs/reliability.md, "Every wait").

- A caller waiting for a build whose every worker died (no other worker of
  the target): TargetUnavailable once none was live for 30 s (a worker's
  restart fits in it), not at its deadline.
- The private redis-server that never answers: the server says so in one
  line after its start bound (10 s), instead of waiting forever."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

from plancache import Client, TargetUnavailable
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.operator_view import assert_no_traceback, problem_lines, report
from tests.support.processes import REPO, child_env, standin_deployment
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_a_caller_whose_only_worker_died_is_told_so_long_before_its_deadline(
    redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path
) -> None:
    started_dir = tmp_path / "started"
    started_dir.mkdir()
    with ExitStack() as stack:
        address, _, worker = stack.enter_context(
            standin_deployment(
                stack,
                redis_server.url,
                tmp_path,
                30.0,
                "--heartbeat-interval",
                "0.5",
                "--heartbeat-ttl",
                "2",
                "--build-processes",
                "1",
                started_dir=started_dir,
            )
        )
        client = stack.enter_context(Client(address, cache=False, timeout=120))
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.compile, matmul_spec(m=8), TARGET)
            wait_until(lambda: any(started_dir.iterdir()), 30, "the build under way")
            worker.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(TargetUnavailable) as told:
                waiting.result(timeout=60)
            told_after = time.monotonic() - killed
    assert "no live GPU worker" in told.value.message and "still queued" in told.value.message
    assert (
        30 <= told_after < 45
    )  # heartbeat ttl 2 s + 30 s without a live worker (checked every 2 s); the deadline was 120 s
    report(
        "the only worker killed while a caller waits (deadline 120 s)", {"caller_told_after_s": round(told_after, 2)}
    )


def test_a_private_redis_that_never_answers_is_one_line_after_its_start_bound(tmp_path: Path) -> None:
    silent = tmp_path / "silent-redis-server"
    silent.write_text("#!/bin/sh\nexec sleep 120\n")
    silent.chmod(0o755)
    data_dir = Path(tempfile.mkdtemp(prefix="pc-"))
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache_server.main",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(data_dir),
            "--gpus",
            "none",
            "--redis-server-bin",
            str(silent),
        ],
        env=child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1 and elapsed < 30
    assert_no_traceback(done.stderr)
    (line,) = problem_lines(done.stderr)
    assert "did not answer" in line and "within 10 s" in line, line

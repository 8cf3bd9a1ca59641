"""Issue 33: a clock step on one host. A worker's wall clock jumps an hour
back, then an hour ahead, mid-run (tests/support/clock_step plays it in the
worker process and its build processes). Heartbeats are written and read on
Redis' clock, so the gateway keeps seeing a live worker and every miss is
built; before, an hour back made every heartbeat expire as it was written
(TargetUnavailable for every miss), and an hour ahead made a dead worker
look alive for an hour."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from plancache import Client
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.operator_view import assert_no_traceback, problem_lines, report
from tests.support.processes import REPO, child_env, server_process, wait_for_workers, worker_process
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET

pytestmark = pytest.mark.slow


def test_a_workers_clock_stepping_an_hour_either_way_changes_nothing_for_callers(
    redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path
) -> None:
    address, clock = f"127.0.0.1:{free_port()}", tmp_path / "clock-offset"
    clock.write_text("0")
    env = child_env(PLANCACHE_TEST_CLOCK_FILE=str(clock))
    env["PYTHONPATH"] = f"{REPO / 'tests' / 'support' / 'clock_step'}:{env['PYTHONPATH']}"
    with ExitStack() as stack:
        stack.enter_context(server_process(address, redis_server.url, tmp_path / "server.log", "--gpus", "none"))
        worker = stack.enter_context(
            worker_process(
                redis_server.url,
                tmp_path / "worker.log",
                "--device",
                "0",
                "--compiler",
                "tests.support.standin:factory",
                "--unsigned",
                "--heartbeat-interval",
                "0.5",
                "--heartbeat-ttl",
                "2",
                env=env,
            )
        )
        wait_for_workers(address, proc=worker)
        client = stack.enter_context(Client(address, cache=False, timeout=30))
        sources = [client.compile(matmul_spec(m=8), TARGET).source]
        for step, m in ((-3600, 16), (3600, 24)):
            clock.write_text(str(step))
            time.sleep(3)  # several heartbeats, past the ttl, on the stepped clock
            sources.append(client.compile(matmul_spec(m=m), TARGET).source)
            assert client.admin.stats()[0].live_workers == 1
    assert sources == ["compiled"] * 3
    text = (tmp_path / "server.log").read_text() + (tmp_path / "worker.log").read_text()
    assert_no_traceback(text)
    report(
        "a worker's clock stepped -1 h then +1 h",
        {"misses_built": len(sources), "problem_lines": len(problem_lines(text))},
    )

"""Issue 33: GPU faults in a build, on real server, worker and build
processes with the stand-in compiler playing them (tests/support/standin.py:
CUDA's own words, or a SIGKILL as the kernel's OOM killer sends it). The
same faults on the H200 are in tests/gpu/test_gpu_faults.py.

- CUDA out of memory: the caller gets CompileFailed with the reason at once;
  nothing is remembered against the graph; the worker goes on.
- A build process killed by the OOM killer: its piece is tried again in a
  new process, then the caller gets the reason (SIGKILL, the OOM killer).
- The GPU lost mid-run (an Xid): the waiting caller gets the reason, new
  misses get TargetUnavailable at once, and once the GPU answers again the
  server's supervisor has a worker building again."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from plancache import Client, CompileFailed, PlanCacheError, TargetUnavailable
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.operator_view import assert_no_traceback, problem_lines, report
from tests.support.processes import child_env, server_process, wait_for_workers
from tests.support.specs import matmul_spec
from tests.support.standin import GPU_GONE_ENV, GPU_LOST_NAME, GPU_OOM_NAME, OOM_KILLED_NAME
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

STANDIN_WORKERS = (
    "--gpus",
    "0",
    "--compiler",
    "tests.support.standin:factory",
    "--unsigned",
    "--build-processes",
    "2",
    "--heartbeat-interval",
    "0.5",
    "--heartbeat-ttl",
    "2",
)


def _fails(client: Client, m: int, name: str) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(CompileFailed) as failed:
        client.compile(matmul_spec(m=m, name=name), TARGET)
    return failed.value.message, time.monotonic() - started


def test_out_of_memory_and_the_oom_killer_fail_the_call_with_the_reason_and_the_worker_goes_on(
    redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path
) -> None:
    address, log = f"127.0.0.1:{free_port()}", tmp_path / "server.log"
    with (
        server_process(address, redis_server.url, log, *STANDIN_WORKERS) as server,
        Client(address, cache=False, timeout=60) as client,
    ):
        wait_for_workers(address, proc=server)
        oom, oom_s = _fails(client, 8, GPU_OOM_NAME)
        assert "out of GPU memory" in oom and "CUDA out of memory" in oom, oom
        again, _ = _fails(client, 8, GPU_OOM_NAME)
        assert "remembered" not in again  # built again when asked again: the device's fault, not the graph's
        assert client.compile(matmul_spec(m=16), TARGET).source == "compiled"
        killed, killed_s = _fails(client, 24, OOM_KILLED_NAME)
        assert "SIGKILL" in killed and "out-of-memory killer" in killed and "3 times" in killed, killed
        assert client.compile(matmul_spec(m=32), TARGET).source == "compiled"
    text = log.read_text()
    assert_no_traceback(text)
    sigkill_lines = [line for line in problem_lines(text) if "SIGKILL" in line]
    assert len(sigkill_lines) <= 2, (
        sigkill_lines
    )  # 3 deaths: one line for the process ending, one for the piece tried again
    report(
        "CUDA out of memory in a build; a build process OOM-killed 3 times",
        {
            "oom_failed_in_s": round(oom_s, 2),
            "oom_killed_failed_in_s": round(killed_s, 2),
            "lines_about_sigkill": len(sigkill_lines),
            "reason": killed[:160],
        },
    )


def test_a_gpu_lost_mid_run_fails_its_builds_with_the_reason_and_the_worker_returns_with_it(
    redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path
) -> None:
    address, log, gone = f"127.0.0.1:{free_port()}", tmp_path / "server.log", tmp_path / "gpu-gone"
    env = child_env(**{GPU_GONE_ENV: str(gone)})
    with (
        server_process(address, redis_server.url, log, *STANDIN_WORKERS, env=env) as server,
        Client(address, cache=False, timeout=60) as client,
    ):
        wait_for_workers(address, proc=server)
        assert client.compile(matmul_spec(m=16), TARGET).source == "compiled"
        lost, lost_s = _fails(client, 40, GPU_LOST_NAME)
        assert "was lost" in lost and "fallen off the bus" in lost, lost
        assert gone.exists()
        started = time.monotonic()
        wait_until(lambda: _refused_for_want_of_a_worker(client, 48), 30, "new misses answered TargetUnavailable")
        unavailable_s = time.monotonic() - started
        gone.unlink()  # the GPU answers again (reset, or the node back)
        back = time.monotonic()
        plan = wait_until(lambda: _compiled(client, 48), 90, "a worker building again")
        recovered_s = time.monotonic() - back
        assert plan.source == "compiled" and client.get(plan.key).blob == plan.blob
    text = log.read_text()
    assert_no_traceback(text)
    lost_lines = [line for line in problem_lines(text) if "was lost" in line or "is lost" in line]
    by_logger = Counter(line.split()[3] for line in lost_lines)  # "<date> <time> <LEVEL> <logger>: ..."
    assert by_logger and max(by_logger.values()) == 1, (
        lost_lines
    )  # one line per kind (the worker's, its build process's, the supervisor's)
    report(
        "GPU lost mid-build (Xid 79, stand-in)",
        {
            "caller_failed_in_s": round(lost_s, 2),
            "target_unavailable_after_s": round(unavailable_s, 2),
            "rebuilt_after_gpu_back_s": round(recovered_s, 2),
            "lines_about_the_loss": len(lost_lines),
        },
    )


def _refused_for_want_of_a_worker(client: Client, m: int) -> bool:
    try:
        client.compile(matmul_spec(m=m), TARGET)
    except TargetUnavailable:
        return True
    except PlanCacheError:
        return False
    raise AssertionError("compiled while the GPU is gone")


def _compiled(client: Client, m: int) -> object:
    try:
        return client.compile(matmul_spec(m=m), TARGET)
    except TargetUnavailable:
        return None

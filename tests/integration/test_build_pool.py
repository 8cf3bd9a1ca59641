"""A miss never waits behind autotuning, and the build pool survives its processes.

The stand-in compiler plays a build's pieces: a heuristic plan after
BUILD_S, then candidates of TUNE_S / 9 each (10 candidates, the heuristic
one among them). A worker builds them in its pool, heuristic plans first
and one process (or thread) kept for them; the real pieces are checked on
the GPU (tests/gpu, bench/startup.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from plancache import Client, Manifest, Plan
from plancache.graphspec.canonical import spec_hash
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import make_key
from plancache.v1 import plancache_pb2 as pb
from plancache_server.settings import Settings
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from plancache_server.worker.build_pool import default_pool_size
from tests.conftest import start_stack
from tests.support.processes import child_env, server_process, wait_for_workers, worker_process
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

BUILD_S, TUNE_S = 0.2, 3.6
CANDIDATE_S = TUNE_S / 9
# What a test's clock may add to a build: a poll of the worker's loop, Redis, gRPC, a 2-core machine.
SLACK_S = 0.35


def _stored(client: redis.Redis, plan_key: str) -> pb.PlanMetadata | None:
    raw = client.hget(keys.plan(plan_key), "meta")
    return pb.PlanMetadata.FromString(raw) if raw else None  # type: ignore[arg-type]


def _wait_until_tuned(client: redis.Redis, plan_key: str, timeout: float) -> pb.PlanMetadata:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = _stored(client, plan_key)
        if meta is not None and not meta.provisional:
            return meta
        time.sleep(0.02)
    raise AssertionError(f"plan {plan_key} was not tuned within {timeout} s")


def _key(spec_m: int) -> str:
    return make_key(spec_hash(matmul_spec(m=spec_m)), TARGET, CompileOptions())


@pytest.mark.parametrize("pool_size", [1, 4])
def test_a_miss_during_another_jobs_autotuning_gets_its_plan_within_one_candidate_build(
    redis_server: EmbeddedRedis, redis_client: redis.Redis, pool_size: int
) -> None:
    """With one build thread, the second miss waits for at most the candidate
    under way; with more, one is kept for heuristic plans and it waits for nothing."""
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=BUILD_S, tune_seconds=TUNE_S), pool_size=pool_size
    )
    try:
        with stack.client(timeout=30) as client:
            first = client.compile(matmul_spec(m=16), TARGET)
            assert first.provisional
            time.sleep(CANDIDATE_S * 1.5)  # its autotuning is under way
            started = time.monotonic()
            second = client.compile(matmul_spec(m=32), TARGET)
            waited = time.monotonic() - started
        assert second.provisional
        bound = BUILD_S + (CANDIDATE_S if pool_size == 1 else 0.0) + SLACK_S
        assert waited <= bound, (
            f"the second miss waited {waited:.2f} s behind the first one's autotuning (bound {bound:.2f} s)"
        )
        assert _stored(redis_client, first.key).provisional, "the first job's tuning should still be under way"  # type: ignore[union-attr]
        # Both autotunings still finish, every candidate built and timed.
        for plan in (first, second):
            meta = _wait_until_tuned(redis_client, plan.key, timeout=2 * TUNE_S + 5)
            assert (
                len(meta.candidates) == 10
                and not any(c.error for c in meta.candidates)
                and meta.plan_name == "standin_eng7_k3"
            )
    finally:
        stop()


def test_a_manifest_of_misses_is_built_side_by_side(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    """Eight misses at once on four build threads: every provisional plan
    after two rounds of heuristic builds, not eight."""
    build_s = 0.5
    stack, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=build_s, tune_seconds=1.8), pool_size=4)
    try:
        specs = [matmul_spec(m=16 * (i + 1)) for i in range(8)]
        arrived: list[float] = []
        with stack.client(timeout=60) as client:
            started = time.monotonic()
            result = client.prefetch(
                Manifest.from_specs(specs, TARGET),
                compile_missing=True,
                on_plan=lambda i, p: arrived.append(time.monotonic() - started),
            )
        assert result.provisional == 8 and len(arrived) == 8
        assert max(arrived) <= 2 * build_s + SLACK_S + 0.2, sorted(arrived)
        for key in result.keys.values():
            _wait_until_tuned(redis_client, key, timeout=30)
    finally:
        stop()


def test_the_default_pool_follows_the_hosts_cores() -> None:
    assert default_pool_size(1, cores=16) == 8
    assert default_pool_size(2, cores=16) == 7
    assert default_pool_size(8, cores=16) == 1
    assert default_pool_size(1, cores=2) == 1
    assert default_pool_size(4, cores=4) == 1


# ---- real processes: plancache-worker and its build processes -------------------------------


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry))
    return found


@pytest.fixture
def fleet_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    yield server
    server.stop()


def _deployment(stack: ExitStack, redis_url: str, tmp: Path, workers: int, *flags: str) -> tuple[str, list[int]]:
    """A server and `workers` stand-in worker processes of 2 build processes each: (address, worker pids)."""
    env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS=str(BUILD_S), PLANCACHE_STANDIN_TUNE_SECONDS=str(TUNE_S))
    address = f"127.0.0.1:{free_port()}"
    stack.enter_context(server_process(address, redis_url, tmp / "server.log", "--gpus", "none", "--unsigned"))
    pids = [
        stack.enter_context(
            worker_process(
                redis_url,
                tmp / f"worker{i}.log",
                "--device",
                "0",
                "--compiler",
                "tests.support.standin:factory",
                "--unsigned",
                "--build-processes",
                "2",
                *flags,
                env=env,
            )
        ).pid
        for i in range(workers)
    ]
    wait_for_workers(address, count=workers)
    return address, pids


@pytest.mark.slow
def test_a_crashed_build_process_is_replaced_and_its_candidate_built_again(
    fleet_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        address, (worker_pid,) = _deployment(stack, fleet_redis.url, tmp_path, 1)
        wait_until(lambda: len(_children(worker_pid)) == 2, 30, "the worker did not start its 2 build processes")
        before = _children(worker_pid)
        with Client(address, cache=False, timeout=60) as client:
            first = client.compile(matmul_spec(m=16), TARGET)
            assert first.provisional
            # Autotuning starts --tune-after-quiet after the last miss (its default here), then a candidate builds.
            time.sleep(Settings().tune_after_quiet_s + CANDIDATE_S * 1.5)
            for pid in before:  # both build processes die mid-tuning (the OOM killer, say)
                os.kill(pid, signal.SIGKILL)
            meta = _wait_until_tuned(redis.Redis.from_url(fleet_redis.url), first.key, timeout=TUNE_S + 30)
            wait_until(lambda: len(_children(worker_pid)) == 2, 30, "the build processes were not replaced")
            assert not (_children(worker_pid) & before)
            # The worker goes on serving misses.
            second = client.compile(matmul_spec(m=32), TARGET)
    log = (tmp_path / "worker0.log").read_text()
    assert len(meta.candidates) == 10 and not any(c.error for c in meta.candidates), meta.candidates
    assert (
        "was killed by SIGKILL" in log and "building it; building its candidate" in log and "again (try 2 of 3)" in log
    ), log[-3000:]
    assert second.provisional or second.source == "compiled"


@pytest.mark.slow
def test_build_processes_end_with_their_worker(fleet_redis: EmbeddedRedis, tmp_path: Path) -> None:
    env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS="0")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with worker_process(
            fleet_redis.url,
            tmp_path / f"worker-{sig.name}.log",
            "--device",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--unsigned",
            "--build-processes",
            "3",
            env=env,
        ) as worker:
            wait_until(lambda: len(_children(worker.pid)) == 3, 30, "the worker did not start its build processes")
            pool = _children(worker.pid)
            os.kill(worker.pid, sig)
            worker.wait(timeout=30)
            wait_until(
                lambda pool=pool: not any(_state(pid) != "Z" for pid in pool),
                15,
                f"build processes outlived their worker ({sig.name})",
            )


def _state(pid: int) -> str:
    """A process's state letter; "Z" for a zombie, or one that is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.slow
def test_a_worker_killed_mid_tuning_loses_no_job(fleet_redis: EmbeddedRedis, tmp_path: Path) -> None:
    """The provisional plan stays served; another worker claims the job and tunes it."""
    with ExitStack() as stack:
        address, _ = _deployment(
            stack,
            fleet_redis.url,
            tmp_path,
            2,
            "--heartbeat-interval",
            "0.3",
            "--heartbeat-ttl",
            "2",
            "--claim-idle",
            "1.5",
        )
        client_redis = redis.Redis.from_url(fleet_redis.url)
        with Client(address, cache=False, timeout=60) as client:
            first = client.compile(matmul_spec(m=16), TARGET)
            assert first.provisional
            tuner = client_redis.hget(keys.job_state(first.key), "worker").decode()  # type: ignore[union-attr]
            os.kill(int(tuner.split("-")[-2]), signal.SIGKILL)
            served: list[Plan] = []
            stop = threading.Event()

            def keep_fetching() -> None:
                while not stop.is_set():
                    served.append(client.get(first.key))
                    time.sleep(0.1)

            fetcher = threading.Thread(target=keep_fetching)
            fetcher.start()
            try:
                meta = _wait_until_tuned(client_redis, first.key, timeout=2 * TUNE_S + 30)
            finally:
                stop.set()
                fetcher.join()
    assert served and all(p.key == first.key for p in served)  # never a miss meanwhile
    assert meta.built_by != tuner and len(meta.candidates) == 10

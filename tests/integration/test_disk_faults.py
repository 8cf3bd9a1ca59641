"""Issue 33: the private store's folder read-only, or its disk full, met by
a real plancache-server, its redis-server and a stand-in worker. The folder
is a real file system (a tmpfs: tests/support/filesystems.py), so Redis
meets the kernel's own EROFS and ENOSPC."""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from plancache import Client, StoreUnavailable, Unavailable
from plancache_server.store.embedded_redis import free_port
from tests.support.filesystems import read_only_folder, small_file_system
from tests.support.operator_view import assert_no_traceback, lines_matching, problem_lines, report
from tests.support.processes import REPO, Proc, child_env, wait_for_workers
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def _server(data_dir: Path, address: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "plancache_server.main",
        "--listen",
        address,
        "--data-dir",
        str(data_dir),
        "--gpus",
        "0",
        "--compiler",
        "tests.support.standin:factory",
        "--unsigned",
        "--build-processes",
        "1",
        "--memory-cache-mb",
        "0",
    ]


def test_a_read_only_store_folder_is_one_line_at_start() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="pc-"))
    try:
        with read_only_folder(data_dir / "redis"):
            done = subprocess.run(
                _server(data_dir, f"127.0.0.1:{free_port()}"),
                env=child_env(),
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        assert done.returncode == 1
        assert_no_traceback(done.stdout + done.stderr)
        (line,) = problem_lines(done.stderr)
        assert "cannot be written" in line and "Read-only file system" in line and "--data-dir" in line, line
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _refused_for_the_disk(client: Client, m: int) -> str | None:
    try:
        client.compile(matmul_spec(m=m), TARGET)
    except StoreUnavailable as e:
        return e.message if "MISCONF" in e.message else None
    return None


def test_a_full_disk_refuses_new_plans_with_the_reason_keeps_every_stored_one_and_recovers(tmp_path: Path) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="pc-"))
    address = f"127.0.0.1:{free_port()}"
    try:
        with ExitStack() as stack:
            folder = stack.enter_context(small_file_system(data_dir / "redis", 8 * 2**20))
            server = Proc(_server(data_dir, address), tmp_path / "server.log")
            stack.callback(server.stop)
            wait_for_workers(address, proc=server.proc)
            client = stack.enter_context(Client(address, cache=False, timeout=10))
            stored = {p.key: p.blob for p in (client.compile(matmul_spec(m=8 * (i + 1)), TARGET) for i in range(5))}
            # The disk fills up (another program's file), and Redis meets it at its next write.
            filler = folder / "filler"
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, check=False)
            admin = redis.Redis(unix_socket_path=str(folder / "redis.sock"))
            try:
                admin.set("plancache-test:probe", "x" * 4096)
            except redis.exceptions.ResponseError as e:  # a write of the service's own met the full disk first
                assert "MISCONF" in str(e), e
            wait_until(
                lambda: admin.info("persistence")["aof_last_write_status"] == "err", 20, "Redis meets the full disk"
            )
            started = time.monotonic()
            reasons = [
                wait_until(lambda m=m: _refused_for_the_disk(client, m), 10, "a miss refused for the disk")
                for m in range(100, 120)
            ]
            refused_in = (time.monotonic() - started) / len(reasons)
            assert all("cannot write its data to disk" in r for r in reasons), reasons[0]
            assert all(client.get(k).blob == b for k, b in stored.items())  # every stored plan still served
            filler.unlink()  # space again
            freed = time.monotonic()
            plan = wait_until(lambda: _compiled(client, 200), 30, "building again")
            recovered_after = time.monotonic() - freed
            stored[plan.key] = plan.blob
            assert server.stop() == 0
            text = server.text()
            # Restarted on the same files: nothing acknowledged was lost.
            again = Proc(_server(data_dir, address), tmp_path / "again.log")
            stack.callback(again.stop)
            wait_for_workers(address, proc=again.proc)
            # The client saw its server go: it connects again after gRPC's reconnect backoff (under a second),
            # its calls refused UNAVAILABLE meanwhile; then every plan acknowledged before is there.
            wait_until(lambda: _reachable(client, next(iter(stored))), 5, "the client reconnected")
            assert all(client.get(k).blob == b for k, b in stored.items())
        assert_no_traceback(text)
        said = lines_matching(text, "cannot write its data to disk")
        # 20 refused calls, not a line each: one line per part that met it (the calls' guard; under load the
        # counters' flush too), once a minute at most.
        minutes = 1 + int((time.monotonic() - started) // 60)
        per_part = collections.Counter(line.split()[3] for line in said)
        assert said and all(n <= minutes for n in per_part.values()) and len(per_part) <= 3, said
        report(
            "private store's disk full mid-run",
            {
                "misses_refused": len(reasons),
                "mean_refusal_s": round(refused_in, 3),
                "stored_plans_kept": len(stored),
                "recovered_after_space_freed_s": round(recovered_after, 2),
                "log_lines": len(said),
            },
        )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _reachable(client: Client, key: str) -> bool:
    try:
        client.get(key)
    except Unavailable:
        return False
    return True


def _compiled(client: Client, m: int) -> object:
    try:
        return client.compile(matmul_spec(m=m), TARGET)
    except StoreUnavailable:
        return None


def test_a_full_disk_fails_no_read_on_a_connection_that_checks_its_health(tmp_path: Path) -> None:
    """Redis answers PING with MISCONF while it cannot write to its disk, reads
    still answering: a connection whose health check came due (idle past
    health_check_interval) must still read a stored plan, for the gateway's
    asynchronous pool and the workers' blocking one (it failed hits in the
    full-disk test above, at random, when a connection had been idle 30 s)."""
    import asyncio

    from plancache_server.store.embedded_redis import EmbeddedRedis
    from plancache_server.store.redis_conn import connect, connect_async

    interval_s = 1.0  # here; 30 s in the product

    async def connected() -> object:
        gateway = connect_async(server.url)
        gateway.connection_pool.connection_kwargs["health_check_interval"] = interval_s
        assert await gateway.hget("plan", "blob") == b"stored"  # a connection made, and idle from now on
        return gateway

    async def read(gateway: object) -> bytes | None:
        try:
            return await gateway.hget("plan", "blob")  # type: ignore[attr-defined,no-any-return]
        finally:
            await gateway.aclose()  # type: ignore[attr-defined]

    with small_file_system(tmp_path / "redis", 8 * 2**20) as folder:
        server = EmbeddedRedis(folder, persist=True).start()
        loop = asyncio.new_event_loop()
        try:
            blocking = connect(server.url)
            blocking.connection_pool.connection_kwargs["health_check_interval"] = interval_s
            blocking.hset("plan", mapping={"blob": b"stored"})
            gateway = loop.run_until_complete(connected())
            admin = redis.Redis.from_url(server.url)
            with pytest.raises(redis.ResponseError):
                while True:  # the disk fills up: writes until Redis meets it
                    admin.set(f"filler-{time.monotonic_ns()}", "x" * 65536)
            wait_until(lambda: admin.info("persistence")["aof_last_write_status"] == "err", 20, "Redis meets the disk")
            with pytest.raises(redis.ResponseError, match="MISCONF"):
                admin.ping()  # Redis's own answer to PING now: what a health check meets
            time.sleep(interval_s * 1.2)  # both connections' health checks come due
            assert blocking.hget("plan", "blob") == b"stored"
            assert loop.run_until_complete(read(gateway)) == b"stored"
        finally:
            loop.close()
            server.stop()

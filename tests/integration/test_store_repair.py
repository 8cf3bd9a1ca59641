"""Issue 33, item 1: a damaged private store, as an operator meets it.

Garbage over a command header in the middle of the embedded Redis'
append-only file: `plancache-server` says so in one line with the command
that repairs it, and `plancache-server --repair-store` backs the folder up,
cuts the damage away, starts, and reports the plans lost, which the status
page lists until they are rebuilt. Real processes: the server, its private
redis-server and a stand-in worker."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from plancache import Client, NotFound
from plancache_server.store import keys
from plancache_server.store.embedded_redis import free_port
from tests.support.aof import commands, incremental_file
from tests.support.operator_view import assert_no_traceback, problem_lines, report
from tests.support.processes import REPO, Proc, child_env, free_port_pair, wait_for_workers
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET

pytestmark = pytest.mark.slow

PLANS = 20


def _status(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=10) as answer:
        result: dict[str, object] = json.load(answer)
        return result


def _damage_a_plan_write_in_the_middle(redis_dir: Path) -> tuple[bytes, set[str]]:
    """Garbage over the header of the plan write in the middle of the file; the damaged file's bytes and the plan it wrote."""
    path = incremental_file(redis_dir)
    data = path.read_bytes()
    writes = [
        (offset, args)
        for offset, args in commands(data)
        if args[0].lower() == b"hset" and keys.plan_keys_named_in(args[1])
    ]
    assert len(writes) >= PLANS, len(writes)
    offset, args = writes[len(writes) // 2]
    damaged = data[:offset] + b"GARBAGE!" + data[offset + 8 :]
    path.write_bytes(damaged)
    return damaged, keys.plan_keys_named_in(args[1])


def test_a_damaged_store_is_one_line_and_repair_store_mends_it_losing_only_what_it_lists(tmp_path: Path) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="pc-"))  # short: a unix socket path has at most 107 bytes
    address, metrics_port = f"127.0.0.1:{free_port()}", free_port_pair()
    server = [
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
        "--metrics-port",
        str(metrics_port),
    ]
    try:
        first = Proc(server, tmp_path / "first.log")
        wait_for_workers(address, proc=first.proc)
        with Client(address, cache=False, timeout=30) as client:
            originals = {
                p.key: p.blob for p in (client.compile(matmul_spec(m=8 * (i + 1)), TARGET) for i in range(PLANS))
            }
        assert first.stop() == 0
        damaged, hit = _damage_a_plan_write_in_the_middle(data_dir / "redis")

        started = time.monotonic()
        refused = subprocess.run(
            server, env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=120, check=False
        )
        refused_after = time.monotonic() - started
        assert refused.returncode == 1
        assert_no_traceback(refused.stdout + refused.stderr)
        (line,) = problem_lines(refused.stderr)
        assert (
            "ERROR" in line
            and "is damaged" in line
            and "appendonly.aof" in line
            and "`plancache-server --repair-store`" in line
        ), line

        started = time.monotonic()
        repaired = Proc([*server, "--repair-store"], tmp_path / "repaired.log")
        try:
            wait_for_workers(address, proc=repaired.proc)
            serving_after = time.monotonic() - started
            (summary,) = [line for line in problem_lines(repaired.text()) if "store repaired" in line]
            with Client(address, cache=False, timeout=30) as client:
                kept, lost = {}, set()
                for key in originals:
                    try:
                        kept[key] = client.get(key).blob
                    except NotFound:
                        lost.add(key)
                listed = set(_status(metrics_port)["lost_to_repair"])  # type: ignore[arg-type]
                assert lost and listed == lost, (lost, listed)
                assert lost <= hit, (
                    lost,
                    hit,
                )  # only the plan whose write was damaged: every later write is kept (store/aof_salvage.py)
                assert f"{len(lost)} plan(s) lost" in summary and next(iter(sorted(lost))) in summary
                assert all(kept[k] == originals[k] for k in kept)  # no wrong plan
                # The backup holds the files as they were before the repair.
                (backup,) = (data_dir / "redis-backups").iterdir()
                assert (backup / "appendonlydir" / incremental_file(data_dir / "redis").name).read_bytes() == damaged
                # Each lost plan is rebuilt on its next request, and leaves the list.
                rebuilt = {
                    key: client.compile(matmul_spec(m=8 * (i + 1)), TARGET)
                    for i, key in enumerate(originals)
                    if key in lost
                }
                assert all(
                    p.source in ("compiled", "joined") and p.blob == originals[k] for k, p in rebuilt.items()
                )  # joined: a job the cut left queued
                assert _status(metrics_port)["lost_to_repair"] == []
        finally:
            assert repaired.stop() == 0
        assert_no_traceback(repaired.text())
        report(
            "damaged private store (garbage over a plan write mid-AOF)",
            {
                "plans": PLANS,
                "lost": len(lost),
                "wrong": 0,
                "refused_in_s": round(refused_after, 2),
                "repaired_and_serving_in_s": round(serving_after, 2),
                "refusal": line.split(": ", 1)[-1][:160],
            },
        )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)

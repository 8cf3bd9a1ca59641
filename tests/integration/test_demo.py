"""`make demo` (examples/try_without_gpu.py): on a machine without a GPU, a
server with the CPU stand-in compiler builds, stores and then serves a plan,
and its status page shows it; the stand-in's plans are for a target no GPU has."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from examples import try_without_gpu as demo
from plancache.keys.target import Target
from plancache_server.store.embedded_redis import free_port
from tests.support.hermetic import inherited_environment
from tests.support.standin import CPU_DEMO_TARGET, STANDIN_TARGET

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_make_demo_compiles_stores_and_then_hits(tmp_path: Path) -> None:
    """What `make demo ARGS=--exit` runs, as a newcomer's shell runs it."""
    run = subprocess.run(
        [
            sys.executable,
            "examples/try_without_gpu.py",
            "--exit",
            "--port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
        ],
        cwd=REPO,
        env={**inherited_environment(), "PYTHONPATH": ""},  # the script itself makes the stand-in importable
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert re.search(r"1\. compile  -> compiled: built by the stand-in worker, signed, stored", out), out
    assert re.search(r"2\. compile  -> hit: the stored plan", out), out
    assert re.search(r"hits 1, misses 1, compiles 1, live workers 1", out), out
    assert "status page http://127.0.0.1:" in out
    assert "STAND-IN COMPILER, not cuDNN" in out  # the server's own log says what builds its plans
    data_dir = re.search(r"data in (\S+)", out)
    assert data_dir is not None and not Path(data_dir.group(1)).exists()  # the demo's store is gone with it


def test_the_status_page_shows_the_demo_target(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    data_dir = tmp_path / "demo"
    server = demo.start_server(data_dir, port, metrics_port, verbose=False)
    try:
        demo.wait_until_ready(f"127.0.0.1:{port}", server)
        assert demo.tour(f"127.0.0.1:{port}", data_dir / "keys" / "plan-signing.pub.pem", "http://status")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/", timeout=10) as page:
            html = page.read().decode()
        assert CPU_DEMO_TARGET.id in html
    finally:
        demo.stop(server)


def test_the_demo_plans_are_for_no_gpu() -> None:
    """A worker serves its target and the target's generic form: neither is any real GPU's."""
    assert CPU_DEMO_TARGET.id == demo.DEMO_TARGET
    assert CPU_DEMO_TARGET.compute_capability == "sm_00" and "standin" in CPU_DEMO_TARGET.generic().id
    real = Target("sm_90", STANDIN_TARGET.cudnn_version, "1.32.0", "NVIDIA H200", 132)  # docs/gpu-runs
    assert CPU_DEMO_TARGET.generic().id != real.generic().id
    assert "not a GPU" in CPU_DEMO_TARGET.device_name


def test_make_demo_serves_until_ctrl_c_then_stops_in_order(tmp_path: Path) -> None:
    """Without --exit (what `make demo` does): the status page is up until Ctrl-C, then everything stops."""
    import os
    import signal
    import socket
    import time

    port, metrics_port = free_port(), free_port()
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "examples/try_without_gpu.py", "--port", str(port), "--metrics-port", str(metrics_port)],
            cwd=REPO,
            env=inherited_environment(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's foreground group: Ctrl-C signals every process in it
        )
        try:
            deadline = time.monotonic() + 90
            while "runs until Ctrl-C" not in out.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
                time.sleep(0.2)
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/", timeout=10) as page:
                assert page.status == 200
            os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does
            assert proc.wait(timeout=60) == 0, out.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
    text = out.read_text()
    assert "demo: stopping the server" in text
    assert "restarting" not in text and "unavailable" not in text  # stopped in order, not all at once
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # the server is gone
    data_dir = re.search(r"data in (\S+)", text)
    assert data_dir is not None and not Path(data_dir.group(1)).exists()

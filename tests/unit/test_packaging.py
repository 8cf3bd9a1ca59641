"""Both distributions build wheels carrying their typing marker, stubs, the status page's templates and
entry points."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import REPO

pytestmark = pytest.mark.slow


def test_wheels_carry_py_typed_stubs_and_entry_points(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            "./client",
            "./server",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (client,) = tmp_path.glob("plancache-0*.whl")
    (server,) = tmp_path.glob("plancache_server-*.whl")
    client_files = set(zipfile.ZipFile(client).namelist())
    server_files = set(zipfile.ZipFile(server).namelist())
    assert {
        "plancache/py.typed",
        "plancache/v1/plancache_pb2.py",
        "plancache/v1/plancache_pb2.pyi",
        "plancache/v1/plancache_pb2_grpc.py",
    } <= client_files
    assert "plancache_server/py.typed" in server_files
    templates = REPO / "server" / "src" / "plancache_server" / "web" / "templates"
    assert {f"plancache_server/web/templates/{p.name}" for p in templates.iterdir()} <= server_files
    assert not any(name.startswith("tests/") for name in client_files | server_files)
    entry_points = (
        zipfile.ZipFile(server).read(next(n for n in server_files if n.endswith("entry_points.txt"))).decode()
    )
    assert (
        "plancache-server = plancache_server.main:main" in entry_points
        and "plancache-worker = plancache_server.worker_main:main" in entry_points
    )
    client_entry = (
        zipfile.ZipFile(client).read(next(n for n in client_files if n.endswith("entry_points.txt"))).decode()
    )
    assert "plancache = plancache.cli:main" in client_entry

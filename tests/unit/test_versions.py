"""`--version` on every console command the two pyproject.toml files declare: the distribution's version
(from its metadata), Python's, and on the server's programs the GPU stack a worker would build with, read
without importing torch or the cuDNN frontend (instant, and no GPU touched)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from plancache.versions import NOT_INSTALLED, stack_versions, version_line

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = [
    (script, entry, distribution)
    for folder, distribution in (("client", "plancache"), ("server", "plancache-server"))
    for script, entry in tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"]["scripts"].items()
]
PROBE = """
import importlib, json, sys
module, function = sys.argv[1].split(":")
try:
    getattr(importlib.import_module(module), function)(["--version"])
    code = None
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "cudnn": "cudnn" in sys.modules}))
"""


def test_every_console_command_is_checked() -> None:
    assert {s for s, _, _ in SCRIPTS} == {
        "plancache",
        "plancache-server",
        "plancache-worker",
        "plancache-server-import",
    }


@pytest.mark.parametrize(("script", "entry", "distribution"), SCRIPTS)
def test_every_command_prints_its_version_and_exits_0(script: str, entry: str, distribution: str) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, entry], capture_output=True, text=True, timeout=60, check=True, cwd=REPO
    )
    out, result = probe.stdout.splitlines()[:-1], json.loads(probe.stdout.splitlines()[-1])
    assert result["code"] in (0, None), probe.stderr
    assert out[0].startswith(f"{script} {importlib.metadata.version(distribution)} (Python ")
    assert not result["torch"] and not result["cudnn"], "--version imported the GPU stack"
    if script in ("plancache-server", "plancache-worker"):
        assert "builds with cuDNN frontend " in out[0] and ", torch " in out[0]


def test_the_stack_is_read_from_metadata() -> None:
    found = stack_versions()
    assert set(found) == {"cudnn_frontend", "cudnn", "torch"}
    for key, distribution in (("cudnn_frontend", "nvidia-cudnn-frontend"), ("torch", "torch")):
        try:
            assert found[key] == importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            assert found[key] in (NOT_INSTALLED, "installed")


def test_a_client_line_names_no_stack() -> None:
    line = version_line("plancache", "plancache")
    assert line.startswith("plancache ") and "builds with" not in line

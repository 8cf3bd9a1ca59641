"""A run without a GPU leaves the GPU tests out and says so in one line
(tests.support.run_summary); a run that asks for them (`-m gpu`, as
scripts/gpu-check.sh does) still gets them; other skips are said once per reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.run_summary import NO_GPU_ENV

REPO = Path(__file__).resolve().parents[2]

SUITE = """
import pytest

@pytest.mark.gpu
@pytest.mark.parametrize("n", range(3))
def test_on_the_gpu(n):
    pass

def test_here():
    pass

def test_here_too():
    pass
"""

SKIPS = """
import pytest

@pytest.mark.parametrize("n", range(4))
def test_needs_a_tmpfs(n):
    pytest.skip("mounting a tmpfs needs CAP_SYS_ADMIN")

def test_needs_tls():
    pytest.skip("this redis-server was built without TLS")

def test_runs():
    pass
"""


def _run(tmp_path: Path, *args: str, suite: str = SUITE) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -ra\nmarkers =\n    gpu: needs a GPU\n")
    (tmp_path / "test_suite.py").write_text(suite)
    env = {**os.environ, "PYTHONPATH": str(REPO), NO_GPU_ENV: "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.run_summary", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_a_gpu_the_gpu_tests_are_one_line_not_a_skip_each(tmp_path: Path) -> None:
    run = _run(tmp_path, "-n", "0")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert out.count("GPU tests not run") == 1
    assert f"3 GPU tests not run (no GPU here: {NO_GPU_ENV}=1); run `pytest -m gpu` on a GPU machine" in out
    assert "2 passed, 3 deselected" in out
    assert "skipped" not in out.lower() and "SKIPPED" not in out  # nothing reads as a skip, nothing as a pass


def test_under_xdist_the_controller_says_it_once(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    run = _run(tmp_path, "-n", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("3 GPU tests not run") == 1, run.stdout
    assert "2 passed" in run.stdout and "skipped" not in run.stdout.lower()


def test_asking_for_the_gpu_tests_still_selects_them(tmp_path: Path) -> None:
    """scripts/gpu-check.sh: `pytest -m gpu -o addopts=""` (here they pass: the tiny suite needs no GPU)."""
    run = _run(tmp_path, "-n", "0", "-m", "gpu", "-o", "addopts=")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed, 2 deselected" in run.stdout and "GPU tests not run" not in run.stdout


def test_gpu_check_script_still_asks_for_them() -> None:
    script = (REPO / "scripts" / "gpu-check.sh").read_text()
    assert "-m gpu" in script and 'addopts=""' in script


def test_skips_are_said_once_per_reason(tmp_path: Path) -> None:
    (tmp_path / "test_more.py").write_text(SKIPS.replace("def test_runs", "def test_also_runs"))
    run = _run(tmp_path, "-n", "0", suite=SKIPS)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "10 skipped: what this machine cannot run, by reason" in out
    assert "    8 skipped: mounting a tmpfs needs CAP_SYS_ADMIN (test_more.py and 1 more files)" in out
    assert "    2 skipped: this redis-server was built without TLS (test_more.py and 1 more files)" in out
    assert "SKIPPED [" not in out  # not a line per place as well
    assert "2 passed, 10 skipped" in out

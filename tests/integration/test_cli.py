"""The command line as an operator meets it in the first hour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plancache.cli import main
from plancache_server.store.embedded_redis import free_port
from tests.conftest import Stack
from tests.support.processes import REPO, child_env
from tests.support.standin import STANDIN_TARGET

MATMUL = str(REPO / "examples" / "matmul_fp16.json")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_targets_says_when_no_worker_is_live(gpuless_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "targets", "--server", gpuless_stack.address)
    assert code == 0 and "no live worker" in out


def test_a_connection_error_prints_once_and_nothing_else(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    code, out, err = cli(capsys, "stats", "--server", dead, "--timeout", "3")
    assert code == 1 and out == "", "no table header before the error"
    assert err.count("Unavailable") == 1
    manifest = tmp_path / "m.json"
    assert (
        main(
            [
                "manifest",
                *[str(p) for p in sorted((REPO / "examples").glob("*.json"))],
                "--target",
                STANDIN_TARGET.id,
                "--out",
                str(manifest),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code, out, err = cli(capsys, "prefetch", str(manifest), "--server", dead, "--no-cache", "--timeout", "3")
    assert code == 1
    n = len(list((REPO / "examples").glob("*.json")))
    assert err.count("failed to connect") == 1, err  # every entry, one line for their one error
    assert (
        f"{n} failed with Unavailable" in err
        and f"{n} plans: 0 from the disk cache, 0 fetched, 0 compiled, {n} failed" in out
    )


def test_prefetch_prints_a_table_and_a_summary_or_json(
    stack: Stack, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = tmp_path / "m.json"
    assert (
        main(
            [
                "manifest",
                MATMUL,
                str(REPO / "examples" / "conv_bias_relu_fp16.json"),
                "--target",
                STANDIN_TARGET.id,
                "--out",
                str(manifest),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code, out, _ = cli(capsys, "prefetch", str(manifest), "--server", stack.address, "--no-cache")
    assert code == 1 and "NotFound" in out and "2 plans: 0 from the disk cache, 0 fetched, 0 compiled, 2 failed" in out
    code, out, _ = cli(
        capsys, "prefetch", str(manifest), "--server", stack.address, "--no-cache", "--compile-missing", "--json"
    )
    assert code == 0 and json.loads(out)["compiled"] == 2


def test_a_target_prefix_resolves_against_the_servers_workers(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "compile", MATMUL, "--server", stack.address, "--no-cache", "--target", "sm_90")
    assert code == 0, err
    assert (
        json.loads(out)["key"].split("/", 1)[1].startswith(STANDIN_TARGET.id) and f"target: {STANDIN_TARGET.id}" in err
    )
    code, _, err = cli(capsys, "compile", MATMUL, "--server", stack.address, "--no-cache", "--target", "sm_75")
    assert code == 1 and "matches none the server has workers for" in err and STANDIN_TARGET.id in err


def test_compile_without_a_local_gpu_names_the_flag_and_the_servers_targets(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("plancache.run.gpu")
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: compile uses it")
    except ImportError:
        pass
    code, _, err = cli(capsys, "compile", MATMUL, "--server", stack.address, "--no-cache")
    assert code == 1 and "pass --target" in err and "target=" not in err and STANDIN_TARGET.id in err


def test_a_closed_pipe_ends_the_output_quietly(stack: Stack) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line (`plancache stats | head -0`)
    proc = subprocess.run(
        [sys.executable, "-m", "plancache.cli", "stats", "--server", stack.address],
        stdout=write,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=REPO,
        timeout=60,
        check=False,
        text=True,
    )
    os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 141

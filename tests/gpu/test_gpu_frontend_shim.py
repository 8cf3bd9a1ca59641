"""Frontend code with one line changed, on a real GPU: the walkthrough's
sections 5 and 6 (tests/gpu/programs/walkthrough.py, their code verbatim
but for `import plancache.cudnn as cudnn`) run in processes of their own
against the session's server. The first run gets every graph from the
service (the SDPA one compiled by this run), a second process with an
empty disk cache gets hits, a third with the first's disk cache reads it;
with the server down, without a server, and with plans from a key the
client does not trust, the program builds locally, says why once, and its
outputs still match torch (the program prints its own relative errors)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plancache import Client, GraphSpec
from plancache.trust.signing import generate_keypair
from plancache_server.store.embedded_redis import free_port
from tests.support.processes import REPO, child_env, trusting_env

pytestmark = pytest.mark.gpu

PROGRAM = Path(__file__).parent / "programs" / "walkthrough.py"
# The program prints "rel err : X" (SDPA against torch) and "rel err after reload: X" (the reloaded matmul against torch.bmm).
REL_ERR = re.compile(r"rel err[^:]*:\s*([0-9.eE+-]+)")
TOLERANCE = 1e-2
SERVED = {"hit", "compiled", "joined", "provisional", "cache", "stored"}


def _run(env: dict[str, str], out: Path, name: str) -> dict[str, Any]:
    report = out / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.gpu.programs.run_program", str(PROGRAM), str(report)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    (out / f"{name}.log").write_text(f"{proc.stdout}\n--- stderr\n{proc.stderr}")
    assert proc.returncode == 0, f"{name}: the program failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(report.read_text())
    result["stdout"], result["stderr"] = proc.stdout, proc.stderr
    errors = [float(m) for m in REL_ERR.findall(proc.stdout)]
    assert len(errors) == 2, f"{name}: expected the program's two relative errors, found {errors} in:\n{proc.stdout}"
    assert all(e < TOLERANCE for e in errors), f"{name}: relative errors {errors} (limit {TOLERANCE})"
    assert [g["name"] for g in result["graphs"]] == ["sdpa", "serializable_mm"], result["graphs"]
    return result


def _env(gpu_session: dict[str, Any], cache: Path, **extra: str) -> dict[str, str]:
    return {
        **trusting_env(gpu_session["public_key"]),
        "PLANCACHE_CACHE_DIR": str(cache),
        "PLANCACHE_SERVER": gpu_session["address"],
        **extra,
    }


def _fallback_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "built locally" in line]


def test_one_changed_line_gets_the_plans_from_the_service_then_hits(
    gpu_session: dict[str, Any], tmp_path: Path
) -> None:
    with Client(
        gpu_session["address"], cache=False, trusted_keys=[gpu_session["public_key"]], allow_unsigned=False
    ) as client:
        stored_before = set(client.admin.list_plans())  # what another test of the session stored (run in any order)
    first = _run(
        _env(gpu_session, tmp_path / "cache-1", PLANCACHE_HEDGE="0"), tmp_path, "first"
    )  # the service alone (test_gpu_hedge.py races)
    sources = {g["name"]: g["source"] for g in first["graphs"]}
    assert first["local"] == 0 and set(sources.values()) <= SERVED, first["graphs"]
    # The SDPA graph (frontend uids 1..4) is no example's: this run compiled it, unless test_gpu_hedge.py's runs of
    # this program (GPU run 43 ran it first) stored it already: then it is that plan, a hit.
    sdpa = next(g for g in first["graphs"] if g["name"] == "sdpa")
    assert sources["sdpa"] in ("compiled", "provisional", "joined") or (
        sources["sdpa"] == "hit" and sdpa["key"] in stored_before
    ), (sources, sdpa["key"], sorted(stored_before))
    assert not _fallback_lines(first["stderr"]), first["stderr"]
    # Wait for the autotuned plans, so that the next process's answer is a plain hit.
    with Client(
        gpu_session["address"], cache=False, trusted_keys=[gpu_session["public_key"]], allow_unsigned=False
    ) as client:
        for g in first["graphs"]:
            client.compile(GraphSpec.from_json(g["spec"]), gpu_session["target"], tuned_only=True)
    second = _run(_env(gpu_session, tmp_path / "cache-2"), tmp_path, "second")
    assert {g["name"]: g["source"] for g in second["graphs"]} == {"sdpa": "hit", "serializable_mm": "hit"}, second[
        "graphs"
    ]
    third = _run(_env(gpu_session, tmp_path / "cache-2"), tmp_path, "third")
    assert {g["source"] for g in third["graphs"]} == {"cache"}, third["graphs"]  # the disk cache: no call to the server
    assert [g["key"] for g in third["graphs"]] == [g["key"] for g in second["graphs"]]


def test_with_the_server_down_the_program_builds_locally_and_says_so_once(
    gpu_session: dict[str, Any], tmp_path: Path
) -> None:
    result = _run(
        _env(gpu_session, tmp_path / "cache", PLANCACHE_SERVER=f"127.0.0.1:{free_port()}"), tmp_path, "server-down"
    )
    assert result["served"] == 0 and result["local"] == 2, result
    assert all(g["source"] == "local" and g["reason"].startswith("Unavailable") for g in result["graphs"]), result[
        "graphs"
    ]
    lines = _fallback_lines(result["stderr"])
    assert len(lines) == 1 and "Unavailable" in lines[0], lines


def test_without_a_server_the_program_builds_locally_and_says_so_once(tmp_path: Path) -> None:
    result = _run(child_env(PLANCACHE_CACHE_DIR=str(tmp_path / "cache")), tmp_path, "no-server")
    assert result["local"] == 2 and all("no plancache server configured" in g["reason"] for g in result["graphs"]), (
        result["graphs"]
    )
    assert len(_fallback_lines(result["stderr"])) == 1, result["stderr"]


def test_a_plan_signed_by_a_key_the_client_does_not_trust_is_never_used(
    gpu_session: dict[str, Any], tmp_path: Path
) -> None:
    _, stranger = generate_keypair(tmp_path / "stranger")
    env = _env(gpu_session, tmp_path / "cache", PLANCACHE_TRUSTED_KEYS=str(stranger))
    result = _run(env, tmp_path, "untrusted")
    assert result["served"] == 0 and all(g["reason"].startswith("UntrustedPlan") for g in result["graphs"]), result[
        "graphs"
    ]
    assert len(_fallback_lines(result["stderr"])) == 1, result["stderr"]

"""Warming on the H200 (issue 23): the exact target warmed from the generic
one's history of the example specs, then a fresh node prefetches every
example for the exact target: every one stored (a hit), executed, matching
torch.

Heuristic plans only (autotune off) keep it short: warming builds what the
source's options say, and the node asks with the same options.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from examples.generate import EXAMPLES
from plancache import Client, CompileOptions, Manifest, Target
from plancache.graphspec.canonical import spec_hash
from plancache.keys.plankey import make_key
from tests.gpu.test_gpu_examples import _UNSUPPORTED as UNSUPPORTED
from tests.support.processes import REPO, child_env

pytestmark = pytest.mark.gpu
UNTUNED = CompileOptions(autotune=False)
TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def warmed(gpu_session: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    exact = Target.parse(gpu_session["target"])
    generic = exact.generic()
    names = sorted(n for n, c in gpu_session["cases"].items() if "key" in c)  # the examples cuDNN builds here
    specs = [EXAMPLES[n]() for n in names]
    address, public_key = gpu_session["address"], gpu_session["public_key"]
    started = time.perf_counter()
    with Client(
        address, cache=False, trusted_keys=[public_key], allow_unsigned=False, timeout=300, hedge=False
    ) as client:
        built = client.prefetch(Manifest.from_specs(specs, generic, UNTUNED), compile_missing=True)
        assert not built.errors, built.errors
        history = client.prefetch(
            Manifest.from_specs(specs, generic, UNTUNED)
        )  # the generic target's history: one hit each
        assert history.fetched == len(names)
        deadline = time.monotonic() + 30
        while True:  # the gateway counts hits about once a second
            planned = _cli("warm", "--target", exact.id, "--from", generic.id, "--server", address, "--json")
            assert planned.returncode == 0, planned.stderr
            (status,) = json.loads(planned.stdout)
            if status["source_hits_24h"] >= len(names) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        deadline = time.monotonic() + 300
        while (now := client.admin.warm_status(exact)[0]).state != "done" or now.in_flight:
            assert time.monotonic() < deadline, now
            time.sleep(0.25)
    warm_s = time.perf_counter() - started
    cases = [{"name": n, "key": make_key(spec_hash(s), exact, UNTUNED)} for n, s in zip(names, specs, strict=True)]
    scratch = tmp_path_factory.mktemp("warm")
    (scratch / "cases.json").write_text(json.dumps(cases))
    node = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.gpu.client_check",
            "--server",
            address,
            "--cases",
            str(scratch / "cases.json"),
            "--out",
            str(scratch / "results.json"),
            "--prefetch-only",
        ],
        env=child_env(
            PLANCACHE_TRUSTED_KEYS=str(public_key),
            PLANCACHE_ALLOW_UNSIGNED="0",
            PLANCACHE_CACHE_DIR=str(scratch / "cache"),
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert node.returncode == 0, node.stderr[-3000:]
    results = {r["name"]: r for r in json.loads((scratch / "results.json").read_text())}
    record = {"names": names, "status": now, "results": results, "warm_s": warm_s, "planned": status}
    out = gpu_session["out"]
    (Path(out) / "gpu_warming.json").write_text(json.dumps({**record, "status": now.__dict__}, indent=1, default=str))
    return record


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plancache.cli", *args],
        env=child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_exact_target_is_warmed_from_the_generic_targets_history(warmed: dict[str, Any]) -> None:
    status = warmed["status"]
    assert status.source.endswith(Target.parse(status.target_id).generic().id)
    assert status.failed == 0, status.failures
    assert status.total == len(warmed["names"]) and status.built + status.skipped == status.total
    assert status.coverage == pytest.approx(1.0)


@pytest.mark.parametrize(
    "case", sorted(set(EXAMPLES) - set(UNSUPPORTED))
)  # what cuDNN 9.19 builds on sm_90 (test_gpu_examples says why)
def test_a_fresh_node_prefetches_every_warmed_plan_as_stored_and_it_matches_torch(
    warmed: dict[str, Any], case: str
) -> None:
    assert case in warmed["results"], f"{case} was not warmed (the session built no plan of it)"
    result = warmed["results"][case]
    assert "error" not in result, result.get("traceback", result.get("error"))
    assert result["source"] in ("stored", "hit") and not result["provisional"], result
    for name, check in result["outputs"].items():
        assert check["nan_in_output"] == 0, f"{name}: unwritten elements"
        assert check["rel_err"] < check.get("tolerance", TOLERANCE), f"{name}: relative error {check['rel_err']:.2e}"

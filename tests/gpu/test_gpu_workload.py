"""A workload's start-up with nothing to configure, on the GPU (issue 41):
a first process of a workload runs its graphs; a second fresh process of the
same workload, with no manifest written by anyone, has its plans streamed
and deserialized before its graphs ask, runs them, and gets the same
results as torch; through Client.compile, plancache.functional and the
drop-in. bench/startup.py --study workload times it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import REPO, child_env

pytestmark = pytest.mark.gpu

PROGRAM = """
import json, sys, time
import torch
import plancache, plancache.functional as pf
from plancache import Client
torch.manual_seed(0)
address, workload = sys.argv[1], sys.argv[2]
pf.configure(Client(address, cache=False, hedge=False), workload=workload)
x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
ws = [torch.randn(256 + 64 * i, 256, device="cuda", dtype=torch.bfloat16) / 16 for i in range(4)]
started = time.perf_counter()
errors = []
for w in ws:
    ours = pf.linear(x, w)
    want = torch.nn.functional.linear(x, w)
    errors.append(((ours.float() - want.float()).abs().max() / want.float().abs().max()).item())
torch.cuda.synchronize()
took = time.perf_counter() - started
stats = plancache.workload_stats()
sources = sorted({g.plan.source for g in pf.geometries() if g.plan is not None})
print(json.dumps({"errors": errors, "seconds": took, "sources": sources,
                  "workload": {k: getattr(stats, k) for k in ("workload", "state", "listed", "prefetched", "used")}}))
"""


def _process(gpu_session: dict[str, Any], workload: str, tmp: Path) -> dict[str, Any]:
    env = child_env(
        PLANCACHE_TRUSTED_KEYS=str(gpu_session["public_key"]),
        PLANCACHE_WORKLOAD_PREFETCH="1",
        PLANCACHE_HEDGE="0",
        PLANCACHE_CACHE_DIR=str(tmp / uuid.uuid4().hex),
    )
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, gpu_session["address"], workload],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_second_process_of_a_workload_runs_streamed_plans_with_torchs_results(
    gpu_session: dict[str, Any], tmp_path: Path
) -> None:
    workload = f"gpu-test-{uuid.uuid4().hex[:8]}"
    first = _process(gpu_session, workload, tmp_path)
    assert first["workload"]["listed"] == 0  # nothing recorded yet: every graph asked the service
    assert max(first["errors"]) < 2e-2, first
    second = _process(gpu_session, workload, tmp_path)
    stats = second["workload"]
    # configure() started the stream before the first graph: every one of the four plans was taken from it
    assert stats["listed"] == 4 and stats["prefetched"] == 4 and stats["used"] == 4, second
    assert max(second["errors"]) < 2e-2, second

"""The README's client example, as written, against a real GPU server after the README's trust step
(issue 40: it used to fail on its first call with UntrustedPlan)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plancache.trust.public_keys import fingerprint, load_public_key
from tests.support.processes import REPO, child_env

pytestmark = pytest.mark.gpu

CHECK = """
torch.cuda.synchronize()
want = (a_t.float() @ b_t.float()).half()
err = (c_t.float() - want.float()).abs().max().item() / want.float().abs().max().item()
print("SOURCE", plan.source, "ERROR", err)
assert err < 1e-2, err
"""


def _readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("### A spec") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_readme_example_runs_as_written_after_the_trust_step(gpu_session: dict[str, Any], tmp_path: Path) -> None:
    address = gpu_session["address"]
    # A newcomer: no key anywhere, and unsigned plans refused as by default (the suite's autouse fixture
    # accepts them for tests of other things: inherited, it let the example run before the trust step, run 27).
    env = child_env(PLANCACHE_CONFIG_DIR=str(tmp_path / "config"), PLANCACHE_ALLOW_UNSIGNED="0")
    program = _readme_example().replace("127.0.0.1:50051", address) + CHECK

    before = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=False)
    # Before the step no service plan runs: the node, which can build here, runs its own build of the graph
    # (the hedge: never worse than without plancache) and the log names the step; a node that could not build
    # would be refused, naming it too.
    assert "plancache trust" in before.stderr, before.stderr[-2000:]
    if before.returncode == 0:
        assert "SOURCE local" in before.stdout, before.stdout

    # The README's step on a plain channel: the fingerprint from the server's log, --expect.
    fp = fingerprint(load_public_key(gpu_session["public_key"]))
    trust = [sys.executable, "-m", "plancache.cli", "trust", address, "--expect", fp]
    pinned = subprocess.run(trust, env=env, capture_output=True, text=True, check=False)
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr

    after = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=False)
    assert after.returncode == 0, after.stderr[-3000:]
    assert "SOURCE" in after.stdout

"""A caller's shell cannot change what the suite tests (tests.support.hermetic).

Every PLANCACHE_* variable a plancache program reads is set to a hostile
value, and a part of the suite that starts servers, workers and clients
(in-process and as processes, signed and not) runs in that environment and
still passes. The values are hostile for real: the same programs, reading
them, fail (checked first).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plancache import Client, InvalidRequest, PlanCacheError
from plancache.trust.signing import TrustPolicy
from plancache_server.settings import SERVER, WORKER, options, parser
from tests.support.hermetic import is_product_variable, without_product_variables

REPO = Path(__file__).resolve().parents[2]

# What a client, the stand-in compiler and the harness read, beside the server's and worker's settings.
CLIENT_AND_STANDIN = {
    "PLANCACHE_TRUSTED_KEYS": "/nonexistent/stranger.pub.pem",
    "PLANCACHE_ALLOW_UNSIGNED": "0",
    "PLANCACHE_TOKEN": "hostile-token-nobody-knows",
    "PLANCACHE_SERVER": "127.0.0.1:1",
    "PLANCACHE_CACHE_DIR": "/nonexistent/cache",
    "PLANCACHE_CONFIG_DIR": "/nonexistent/config",
    "PLANCACHE_NO_WARMUP": "0",
    "PLANCACHE_STANDIN_BUILD_SECONDS": "120",
    "PLANCACHE_STANDIN_TUNE_SECONDS": "120",
    "PLANCACHE_STANDIN_BUILD_LOG": "/nonexistent/builds.jsonl",
}
# A few settings with values that parse but harm; every other one gets a value that does not parse.
HARMFUL_SETTINGS = {
    "PLANCACHE_SERVER_TRUSTED_KEYS": "/nonexistent/stranger.pub.pem",
    "PLANCACHE_REDIS_URL": "redis://127.0.0.1:1/0",
    "PLANCACHE_COMPILER": "nonexistent.module:factory",
    "PLANCACHE_UNSIGNED": "1",
    "PLANCACHE_COMPILE_TIMEOUT": "0.001",
    "PLANCACHE_MAX_WAITERS": "0",
}
# Parts of the suite that start what a shell could reach: in-process stacks
# with clients (signing, untrusted builds), and real processes.
SELECTION = [
    "tests/integration/test_signing.py",
    "tests/integration/test_untrusted_builds.py",
    "tests/integration/test_processes.py::test_server_started_workers_sign_with_a_generated_key",
    "tests/integration/test_processes.py::test_server_worker_cli_and_restart",
    "tests/integration/test_fleet.py",
    "tests/integration/test_trust_channels.py",
]


def hostile_environment() -> dict[str, str]:
    env = dict(CLIENT_AND_STANDIN)
    for _, option in options():
        env.setdefault(f"PLANCACHE_{option.env}", "hostile-value")
    env.update(HARMFUL_SETTINGS)
    return env


def test_the_hostile_values_are_hostile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read by the programs themselves, the environment breaks them."""
    for name, value in hostile_environment().items():
        monkeypatch.setenv(name, value)
    for program in (SERVER, WORKER):
        with pytest.raises(SystemExit):  # a value that does not parse
            parser(program).parse_args([])
    with pytest.raises(InvalidRequest):  # the clients' trusted key does not exist
        TrustPolicy.create()
    with pytest.raises(PlanCacheError), Client(os.environ["PLANCACHE_SERVER"], cache=False, timeout=1) as client:
        client.admin.stats()


def test_every_setting_has_a_hostile_value() -> None:
    env = hostile_environment()
    names = {f"PLANCACHE_{o.env}" for _, o in options()}
    assert names <= env.keys() and all(is_product_variable(n) for n in env)


@pytest.mark.slow
def test_the_suite_passes_in_a_hostile_shell() -> None:
    env = {**without_product_variables(os.environ), **hostile_environment()}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *SELECTION],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 15, tail
    assert not re.search(r"\d+ (failed|error)", proc.stdout), tail
    assert "removed from the environment (tests.support.hermetic): PLANCACHE_" in proc.stdout, tail

"""What a caller's shell may not change in the test suite.

Every `PLANCACHE_*` variable is the product's: a server, worker or client
reads it. A developer's profile, a container image or a CI job may set some
(`PLANCACHE_TRUSTED_KEYS` for the clients of a host, say), and a suite that
let them through would test that shell, not the code. So the suite removes
them all when it starts (tests/conftest.py), and the processes it starts get
an environment without them, plus only what a test sets on purpose.

The harness's own knobs are `PLANCACHE_TEST_*` and are kept:
PLANCACHE_TEST_REDIS_SERVER_BIN (the redis-server the fixtures start),
PLANCACHE_TEST_GPU_OUT (where the GPU session writes its records),
PLANCACHE_TEST_ARTIFACTS (screenshots), PLANCACHE_TEST_CHROMIUM.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

PRODUCT_PREFIX = "PLANCACHE_"
HARNESS_PREFIX = "PLANCACHE_TEST_"

_scrubbed = False


def is_product_variable(name: str) -> bool:
    return name.startswith(PRODUCT_PREFIX) and not name.startswith(HARNESS_PREFIX)


def without_product_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not is_product_variable(k)}


def scrub(env: MutableMapping[str, str]) -> list[str]:
    """Remove every product variable from `env` (this process's environment,
    once, at the suite's start); returns the names removed."""
    global _scrubbed
    removed = sorted(k for k in env if is_product_variable(k))
    for name in removed:
        del env[name]
    if env is os.environ:
        _scrubbed = True
    return removed


def inherited_environment() -> dict[str, str]:
    """The base of a child process's environment. Inside the suite, this
    process's own (scrubbed at start: any PLANCACHE_* left in it was set by
    a fixture, such as the per-test cache folder); elsewhere (a benchmark
    run from a shell) the shell's, without the product's variables."""
    return dict(os.environ) if _scrubbed else without_product_variables(os.environ)


def redis_server_bin() -> str:
    return os.environ.get("PLANCACHE_TEST_REDIS_SERVER_BIN") or "redis-server"

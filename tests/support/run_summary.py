"""What a run could not run, said once: the GPU tests left out, the skips by reason.

GPU-only tests on a machine without a GPU are left out of the run and said once.

Without a CUDA GPU (and torch and the cuDNN frontend) the tests marked `gpu`
cannot run. Skipping each of them printed ~535 `s` and dozens of SKIPPED
lines, which read as breakage; instead they are deselected at collection and
the run ends with one line saying how many were not run and where they run:

    535 GPU tests not run (no GPU here: no CUDA GPU is visible); run `pytest -m gpu` on a GPU machine
    (scripts/gpu-check.sh)

A run that asks for them (`-m gpu`, as scripts/gpu-check.sh does, or
`pytest tests/gpu`: nothing but them collected) keeps them: on a GPU they run, elsewhere tests/gpu/conftest.py skips them with
the reason. Under pytest-xdist each worker collects (and deselects) on its
own and hands its count to the controller, which prints the line.

The other skips (a tmpfs that cannot be mounted, a redis-server without
TLS, ...) are listed once per reason, with how many and where, instead of
one SKIPPED line per test location; a skipped test is never counted as
passed (pytest's own counts say "skipped").

Registered by tests/conftest.py; `-p tests.support.run_summary` loads it alone.
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict
from typing import Any

import pytest

# A harness knob (kept by tests.support.hermetic): a GPU machine's run as a CPU machine runs it.
NO_GPU_ENV = "PLANCACHE_TEST_NO_GPU"
SUMMARY_KEY = "plancache_gpu_tests_not_run"
_COUNT = pytest.StashKey[int]()
_REASON = pytest.StashKey[str]()


@functools.cache
def gpu_missing_reason() -> str | None:
    """Why the GPU tests cannot run here (None: they can). Imports torch only when the frontend is present."""
    if os.environ.get(NO_GPU_ENV) == "1":
        return f"{NO_GPU_ENV}=1"
    try:
        import cudnn  # noqa: F401
    except ImportError:
        return "the cuDNN frontend is not installed"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return None


def asks_for_gpu_tests(config: pytest.Config) -> bool:
    """The run names the marker (`-m gpu`, `-m "gpu and not slow"`): keep what it asked for."""
    return "gpu" in (config.getoption("markexpr", "") or "")


def summary_line(count: int, reason: str) -> str:
    return (
        f"{count} GPU tests not run (no GPU here: {reason}); "
        "run `pytest -m gpu` on a GPU machine (scripts/gpu-check.sh)"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu or len(gpu) == len(items) or asks_for_gpu_tests(config):
        return  # none here, or only those were asked for (`pytest tests/gpu`): tests/gpu/conftest.py skips them
    reason = gpu_missing_reason()
    if reason is None:
        return
    kept = [item for item in items if item.get_closest_marker("gpu") is None]
    config.hook.pytest_deselected(items=gpu)
    items[:] = kept
    config.stash[_COUNT] = len(gpu)
    config.stash[_REASON] = reason
    workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints the line
        workeroutput[SUMMARY_KEY] = [len(gpu), reason]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: every worker collected the same items, so any worker's count is the count."""
    reported = getattr(node, "workeroutput", {}).get(SUMMARY_KEY)
    if reported:
        node.config.stash[_COUNT] = int(reported[0])
        node.config.stash[_REASON] = str(reported[1])


def skip_lines(reports: list[Any], root: str) -> list[str]:
    """One line per reason: how many tests it skipped and where (the first file, and how many more)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for report in reports:
        path, _, reason = report.longrepr
        by_reason[str(reason).removeprefix("Skipped: ")].append(os.path.relpath(str(path), root))
    lines = []
    for reason, paths in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        files = sorted(set(paths))
        where = files[0] + (f" and {len(files) - 1} more files" if len(files) > 1 else "")
        lines.append(f"{len(paths):5d} skipped: {reason} ({where})")
    return lines


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is not None:
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if isinstance(getattr(r, "longrepr", None), tuple)]
    if skipped and "s" in terminalreporter.reportchars:
        terminalreporter.reportchars = terminalreporter.reportchars.replace("s", "")  # instead of a line per place
        terminalreporter.write_sep("-", f"{len(skipped)} skipped: what this machine cannot run, by reason")
        for line in skip_lines(skipped, str(config.rootpath)):
            terminalreporter.write_line(line)
    count = config.stash.get(_COUNT, 0)
    if count:
        terminalreporter.write_line(summary_line(count, config.stash.get(_REASON, "no GPU")), yellow=True)

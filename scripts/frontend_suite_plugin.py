"""The recorder of scripts/frontend_suite.py, in the processes it starts.

As a pytest plugin (`-p frontend_suite_plugin`, scripts/ on PYTHONPATH) it
appends one JSON line per event to $FRONTEND_SUITE_EVENTS: each test's
start and reports (so a run killed at its time limit, or one that the
frontend's conftest ends with os._exit, still says how far it got; the
junit XML only exists when pytest ends on its own), collection errors, and
with FRONTEND_SUITE_GRAPHS=1 the graphs plancache.cudnn built during each
test. It also keeps the first N parametrized cases of each test function
($FRONTEND_SUITE_CAPS, {"file glob": N}): test_mhas_v2 has thousands.

As a program (`python frontend_suite_plugin.py PROGRAM.py EVENTS [NODEID]`) it runs
a converted sample as __main__ and records its graphs the same way, as
tests/gpu/programs/run_program.py does.

Graphs are taken by count: plancache.cudnn counts every graph it builds
(served or local) and keeps the latest 256 in graphs(), so the ones new
since the last look are the last (count now - count then) of that list.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

EVENTS_ENV = "FRONTEND_SUITE_EVENTS"
GRAPHS_ENV = "FRONTEND_SUITE_GRAPHS"
CAPS_ENV = "FRONTEND_SUITE_CAPS"
BETWEEN_TESTS = "(between tests)"  # graphs built at collection, by session fixtures, after the last test


def graph_record(built: Any) -> dict[str, Any]:
    """One plancache.cudnn.Built as JSON: how it was built and what it holds."""
    plan = built.plan
    types = getattr(built, "node_types", ())  # Built.node_types is being added to the shim; absent before
    return {
        "name": built.name,
        "source": built.source,
        "provisional": bool(plan.provisional) if plan is not None else None,
        "reason": built.reason,
        "key": plan.key if plan is not None else None,
        "node_types": [t if isinstance(t, str) else str(getattr(t, "name", t)) for t in types],
        # Built locally: whether the frontend's own build of it succeeded (False: the frontend cannot build it either).
        "local_built": getattr(built, "local_built", None),
    }


class Recorder:
    def __init__(self, events: Path, graphs: bool) -> None:
        self.events = events
        self.graphs = graphs
        self.seen = 0  # graphs the shim had built when last looked

    def write(self, event: dict[str, Any]) -> None:
        with self.events.open("a") as f:
            f.write(json.dumps(event, default=str) + "\n")

    def take_graphs(self) -> tuple[list[dict[str, Any]], int]:
        """The graphs built since the last call, and how many of them fell out of the shim's list."""
        if not self.graphs:
            return [], 0
        try:
            import plancache.cudnn as shim
        except (
            Exception
        ) as e:  # the tests fail to import it too, and say so: the recorder stops, it does not end the run
            self.graphs = False
            self.write({"e": "recorder_error", "message": f"import plancache.cudnn: {type(e).__name__}: {e}"})
            return [], 0
        stats = shim.stats()
        new, self.seen = stats.served + stats.local - self.seen, stats.served + stats.local
        if new <= 0:
            return [], 0
        recent = shim.graphs()
        listed = recent[-new:]
        return [graph_record(b) for b in listed], new - len(listed)

    def flush_graphs(self, nodeid: str) -> None:
        graphs, lost = self.take_graphs()
        if graphs or lost:
            self.write({"e": "graphs", "nodeid": nodeid, "graphs": graphs, "lost": lost})


def _short(text: str, limit: int = 400) -> str:
    """The telling line of a failure: pytest's `E   ...` line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    line = errors[0] if errors else (lines[-1] if lines else "")
    return line[:limit]


def report_message(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")[:400]
    return _short(report.longreprtext) if longrepr is not None else ""


def caps_from_env() -> dict[str, int]:
    raw = os.environ.get(CAPS_ENV, "")
    return {str(k): int(v) for k, v in json.loads(raw).items()} if raw else {}


def cap_for(nodeid: str, caps: dict[str, int]) -> int:
    """The cap of the file of `nodeid` (its first matching glob, "*" last); 0: none."""
    file = Path(nodeid.split("::", 1)[0]).name
    for pattern, cap in caps.items():
        if pattern != "*" and fnmatch.fnmatch(file, pattern):
            return cap
    return caps.get("*", 0)


def capped(nodeids: list[str], caps: dict[str, int]) -> list[bool]:
    """Which of `nodeids` to keep: the first N cases of each test function."""
    seen: dict[str, int] = {}
    keep = []
    for nodeid in nodeids:
        function = nodeid.split("[", 1)[0]
        seen[function] = seen.get(function, 0) + 1
        cap = cap_for(nodeid, caps)
        keep.append(cap <= 0 or seen[function] <= cap)
    return keep


_recorder: Recorder | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _recorder
    events = os.environ.get(EVENTS_ENV)
    if events:
        _recorder = Recorder(Path(events), os.environ.get(GRAPHS_ENV) == "1")


@pytest.hookimpl(trylast=True)  # after -m / -k deselected: the cap counts the cases that would run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    caps = caps_from_env()
    if not caps:
        return
    keep = capped([item.nodeid for item in items], caps)
    dropped = [item for item, k in zip(items, keep, strict=True) if not k]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item, k in zip(items, keep, strict=True) if k]
        if _recorder is not None:
            _recorder.write({"e": "capped", "count": len(dropped), "caps": caps})


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _recorder is not None and report.failed:
        _recorder.write({"e": "collect_error", "nodeid": report.nodeid, "message": report_message(report)})


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _recorder is not None:
        _recorder.flush_graphs(BETWEEN_TESTS)
        _recorder.write({"e": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _recorder is None:
        return
    event: dict[str, Any] = {
        "e": "report",
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "duration": round(report.duration, 3),
    }
    if report.outcome != "passed" or hasattr(report, "wasxfail"):
        event["message"] = report_message(report)
    if hasattr(report, "wasxfail"):
        event["wasxfail"] = str(report.wasxfail)
    _recorder.write(event)
    if report.when == "teardown":
        _recorder.flush_graphs(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _recorder is None:
        return
    _recorder.flush_graphs(BETWEEN_TESTS)
    _recorder.write({"e": "session_end", "exitstatus": int(exitstatus)})


def run_program(program: Path, events: Path, nodeid: str) -> None:
    """`program` as __main__ (as `python program.py` would run it), then its graphs to `events`."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("plancache").setLevel(logging.INFO)  # a fallback's one line shows in the log
    recorder = Recorder(events, graphs=True)
    sys.argv = [str(program)]
    sys.path[0] = str(program.resolve().parent)
    try:
        runpy.run_path(str(program), run_name="__main__")
    finally:
        recorder.flush_graphs(nodeid)


if __name__ == "__main__":
    run_program(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else Path(sys.argv[1]).name)

"""A workload's name (plancache.transport.workload): one setting, and a
default derived from the program that is the same on every node whatever
the checkout's path; and what a process tells its record."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from plancache.keys.workload_names import NAME
from plancache.transport import workload
from plancache.transport.workload import WorkloadStart, clean_name, default_name, workload_name


def _main(monkeypatch: pytest.MonkeyPatch, spec_name: str | None, file: str | None) -> None:
    module = types.ModuleType("__main__")
    if spec_name is not None:
        module.__spec__ = types.SimpleNamespace(name=spec_name)  # type: ignore[assignment]
    else:
        module.__spec__ = None
    if file is not None:
        module.__file__ = file
    monkeypatch.setitem(sys.modules, "__main__", module)


def test_a_module_run_with_dash_m_is_named_by_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    _main(monkeypatch, "team.train", "/home/alice/repo/team/train.py")
    assert default_name() == "team.train"


def test_a_script_is_named_by_its_folder_and_stem_not_its_absolute_path(monkeypatch: pytest.MonkeyPatch) -> None:
    _main(monkeypatch, None, "/home/alice/checkout/jobs/train.py")
    alice = default_name()
    _main(monkeypatch, None, "/workspace/other/jobs/train.py")
    assert alice == default_name() == "jobs/train"


def test_an_interactive_interpreter_is_python(monkeypatch: pytest.MonkeyPatch) -> None:
    _main(monkeypatch, None, None)
    assert default_name() == "python"


def test_the_setting_wins_and_names_are_cleaned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(workload.WORKLOAD_ENV, "my job; rm -rf")
    assert workload_name() == "my_job__rm_-rf"
    assert workload_name("explicit") == "explicit"
    assert len(clean_name("x" * 300)) == 128
    assert NAME.fullmatch(workload_name())


class _Connection:
    timeout = 1.0


def _start(report: bool = True) -> WorkloadStart:
    return WorkloadStart(
        _Connection(),  # type: ignore[arg-type]
        lambda manifest, target: None,  # type: ignore[arg-type,return-value]
        name="job",
        prefetch=lambda: False,
        report=report,
        timeout=1.0,
    )


def test_first_uses_are_reported_once_in_order_and_wasted_once_at_the_end() -> None:
    start = _start()
    for key in ("k1", "k2", "k1", "k3"):
        start.used(key, "target-a")
    start.used("other", "target-b")  # another target's plan: not this record's
    first = start.take_report(final=False)
    assert first is not None and first.target_id == "target-a"
    assert [(u.plan_key, u.order) for u in first.uses] == [("k1", 0), ("k2", 1), ("k3", 2)]
    assert start.take_report(final=False) is None  # nothing new
    start.stats.prefetched, start.stats.used = 5, 2
    last = start.take_report(final=True)
    assert last is not None and (last.prefetched, last.used, last.wasted) == (5, 2, 3)
    assert start.take_report(final=True) is None  # wasted is said once


def test_without_reports_nothing_is_told() -> None:
    start = _start(report=False)
    start.used("k1", "target-a")
    assert start.take_report(final=True) is None


def test_first_uses_while_the_stream_runs_wake_the_reports_thread_when_it_ends() -> None:
    """Starting the reports' thread waits until it runs, and while a node's stream deserializes its plans
    that wait was on the program's first uses (GPU run 34): a use during the stream is queued, and the
    thread is woken once, when the stream ends."""
    from types import SimpleNamespace

    from plancache.keys.query import PlanQuery
    from plancache.v1 import plancache_pb2 as pb
    from tests.support.frontdoor_standins import TARGET
    from tests.support.specs import matmul_spec

    key = PlanQuery.of(matmul_spec(), TARGET).key
    release = threading.Event()

    class Pending:
        def wait(self, timeout: float | None) -> object:
            assert release.wait(10)
            return SimpleNamespace(plans={0: object()}, errors={}, stopped=0)

    class Connection:
        timeout = 1.0
        stub = SimpleNamespace(GetWorkload="GetWorkload")

        def call(self, method: object, request: object, timeout: float) -> pb.GetWorkloadResponse:
            return pb.GetWorkloadResponse(plan_keys=[key], complete=True)

    start = WorkloadStart(
        Connection(),  # type: ignore[arg-type]
        lambda manifest, target, load, held: Pending(),  # type: ignore[arg-type,return-value]
        name="job",
        prefetch=lambda: True,
        report=True,
        timeout=1.0,
    )
    wakes: list[int] = []
    start.wake = lambda: wakes.append(1)
    assert start.begin(TARGET)
    assert start._listed.wait(5)
    start.used(key, TARGET.id)  # the program's first use, while the stream runs
    assert wakes == [] and start.stats_now().state == "streaming"
    release.set()
    deadline = time.monotonic() + 5
    while start.stats_now().state != "done" and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert start.stats_now().state == "done" and wakes == [1]
    report = start.take_report(final=False)
    assert report is not None and [u.plan_key for u in report.uses] == [key]
    start.used("another-key", TARGET.id)  # after the stream: at once, as before
    assert wakes == [1, 1]

"""The hedged miss's rules without a server (plancache.transport.hedge): who
wins a race, what is counted and reported, what is raised when both sides
fail; the setting's parsing; the reports' batching and bounds. The race
against a real server is tests/integration/test_hedge.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from plancache.errors import CompileFailed, TargetUnavailable, Unavailable
from plancache.transport import hedge
from plancache.transport.reports import Reports
from plancache.v1 import plancache_pb2 as pb


class Side:
    """The service's side of a race, as run_race reads it: answered (or failed) at a given time."""

    def __init__(
        self, plan: Any = None, error: Any = None, answered_at: float | None = None, building: bool = True
    ) -> None:
        self.plan, self.error, self.answered_at, self.building, self.path = (
            plan,
            error,
            answered_at,
            building,
            "compile",
        )
        self.cancelled = False
        self.hurried = False

    def done(self) -> bool:
        return self.answered_at is not None

    def wait(self, timeout: float | None) -> bool:
        return self.done()

    def cancel(self) -> None:
        self.cancelled = True

    def hurry(self) -> None:
        self.hurried = True


@pytest.fixture(autouse=True)
def fresh_counts() -> None:
    hedge.reset_race_stats()


def race(side: Side, build: Any) -> tuple[hedge.Raced[Any], list[tuple[str, bool]]]:
    reported: list[tuple[str, bool]] = []
    raced = hedge.run_race(side, build, None, lambda key, local: reported.append((key, local)), "k")  # type: ignore[arg-type]
    return raced, reported


def test_the_nodes_build_first_runs_and_the_service_takes_over_later() -> None:
    side = Side()  # not answered yet
    raced, reported = race(side, lambda: "local plan")
    assert raced.local == "local plan" and raced.race is side and raced.plan is None
    assert raced.key == "k"  # the plan the service builds, named to the front door (plancache.cudnn's graphs())
    assert reported == [("k", True)] and hedge.race_stats()["compile"].local_won == 1


def test_the_services_plan_first_runs_even_though_the_node_built_too() -> None:
    side = Side(plan="service plan", answered_at=time.monotonic())
    raced, reported = race(side, lambda: "local plan")
    assert raced.plan == "service plan" and raced.local is None and reported == [("k", False)]
    assert hedge.race_stats()["compile"].service_won == 1


def test_a_service_answer_after_the_build_returned_does_not_win() -> None:
    side = Side()

    def build() -> str:
        return "local plan"

    raced, _ = race(side, build)
    side.plan, side.answered_at = "service plan", time.monotonic()  # came later: taken over at a safe point, not now
    assert raced.local == "local plan"


def test_a_failed_service_leaves_the_local_plan_and_is_not_reported() -> None:
    side = Side(error=TargetUnavailable("no worker"), answered_at=time.monotonic(), building=False)
    raced, reported = race(side, lambda: "local plan")
    assert raced.local == "local plan" and reported == [] and hedge.race_stats()["compile"].service_failed == 1


def test_a_failed_local_build_waits_for_the_service() -> None:
    side = Side(plan="service plan", answered_at=time.monotonic() + 60)  # answers after the build failed

    def build() -> str:
        raise CompileFailed("not here")

    raced, reported = race(side, build)
    assert (
        raced.plan == "service plan" and reported == [("k", False)] and hedge.race_stats()["compile"].local_failed == 1
    )
    assert side.hurried  # the node now waits for the plan: it says so (the service stops letting it wait)


def test_both_failing_raise_the_services_error_naming_the_nodes() -> None:
    side = Side(error=Unavailable("server down"), answered_at=time.monotonic(), building=False)

    def build() -> str:
        raise CompileFailed("cuDNN refuses it here")

    with pytest.raises(Unavailable) as raised:
        race(side, build)
    assert (
        raised.value.message == "server down (and this node's own build failed: CompileFailed: cuDNN refuses it here)"
    )
    assert isinstance(raised.value.__cause__, CompileFailed) and side.cancelled


@pytest.mark.parametrize(
    ("value", "on"),
    [(None, True), ("1", True), ("yes", True), ("0", False), ("off", False), (" False ", False), ("no", False)],
)
def test_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch, value: str | None, on: bool) -> None:
    if value is None:
        monkeypatch.delenv(hedge.HEDGE_ENV, raising=False)
    else:
        monkeypatch.setenv(hedge.HEDGE_ENV, value)
    assert hedge.hedge_default() is on


@pytest.mark.parametrize(("value", "seconds"), [("0.25", 0.25), ("-1", 0.0), ("soon", hedge.HEDGE_AFTER_S)])
def test_the_bound_on_the_first_answer(monkeypatch: pytest.MonkeyPatch, value: str, seconds: float) -> None:
    monkeypatch.setenv(hedge.HEDGE_AFTER_ENV, value)
    assert hedge.hedge_after_s() == seconds


def test_reports_go_in_batches_and_a_failing_send_costs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[pb.ReportFirstUsesRequest] = []
    reports = Reports(sent.append)
    monkeypatch.setattr(reports, "INTERVAL_S", 3600.0)  # flushed by hand here
    for i in range(600):
        reports.add(f"key-{i}", i % 2 == 0)
    reports.flush(counts=False)
    assert [len(r.uses) for r in sent] == [256, 256, 88] and sent[0].uses[0] == pb.FirstUse(
        plan_key="key-0", local=True
    )

    def failing(request: pb.ReportFirstUsesRequest) -> None:
        raise Unavailable("server down")

    broken = Reports(failing)
    broken.add("k", True)
    broken.close()  # no exception: the report is lost, nothing else


def test_reports_waiting_are_bounded_and_off_sends_nothing() -> None:
    sent: list[pb.ReportFirstUsesRequest] = []
    reports = Reports(sent.append)
    reports._stopped.set()  # no background flush: everything stays queued
    for i in range(Reports.MAX_QUEUED + 100):
        reports.add(f"key-{i}", True)
    reports.flush(counts=False)
    assert sum(len(r.uses) for r in sent) == Reports.MAX_QUEUED
    off: list[pb.ReportFirstUsesRequest] = []
    silent = Reports(off.append, enabled=False)
    silent.add("k", True)
    silent.close()
    assert off == []


def test_what_is_left_is_sent_when_the_process_exits() -> None:
    import subprocess
    import sys

    program = (
        "from plancache.transport.reports import Reports\n"
        "reports = Reports(lambda request: print('sent', len(request.uses), flush=True))\n"
        "reports.INTERVAL_S = 3600.0\n"
        "reports.add('k1', True); reports.add('k2', False)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "sent 2"

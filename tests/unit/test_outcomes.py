"""What a process counts of its graphs and tells the service: the reason
class of every failure, the node type a graph is counted under, the
reports' batching, rate limit and give-back, and the server's folding of
whatever a node sends into fixed label sets."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from plancache.errors import (
    CompileFailed,
    CompileTimeout,
    IntegrityError,
    NotStored,
    PermissionDenied,
    ResourceExhausted,
    SpecError,
    TargetUnavailable,
    Unavailable,
    UntrustedPlan,
)
from plancache.frontdoors.service import NotConfigured
from plancache.transport import outcomes, reports
from plancache.transport.hedge import counts, reset_race_stats
from plancache.transport.outcomes import Outcome, OutcomeKey
from plancache.transport.reports import Reports
from plancache.v1 import plancache_pb2 as pb
from plancache.wire import outcome_labels
from plancache_server.store import fleet

T = "sm_90/cudnn-91900/fe-1.32.0"


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    outcomes.reset_outcome_stats()
    outcomes.TALLY.take()
    reset_race_stats()
    reports.take_races()
    yield
    outcomes.reset_outcome_stats()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (TargetUnavailable("no worker"), "no_worker"),
        (Unavailable("down"), "unavailable"),
        (NotConfigured("none"), "no_server"),
        (NotStored("building"), "not_stored"),
        (CompileTimeout("slow"), "timeout"),
        (ResourceExhausted("busy"), "refused_for_now"),
        (PermissionDenied("read token"), "not_permitted"),
        (UntrustedPlan("bad signature"), "untrusted_plan"),
        (IntegrityError("sha"), "untrusted_plan"),
        (CompileFailed("cuDNN"), "compile_failed"),
        (SpecError("no form"), "no_spec_form"),
        (ValueError("?"), "other"),
    ],
)
def test_every_failure_has_a_reason_class(error: Exception, reason: str) -> None:
    assert outcomes.reason_of(error) == reason and reason in outcome_labels.REASONS


def test_a_graph_counts_under_its_first_non_pointwise_node_type() -> None:
    assert outcome_labels.anchor_node_type(["POINTWISE:ADD", "MATMUL", "POINTWISE:RELU_FWD"]) == "MATMUL"
    assert (
        outcome_labels.anchor_node_type(["POINTWISE:ADD"]) == "POINTWISE" and outcome_labels.anchor_node_type([]) == ""
    )
    assert (
        outcome_labels.anchor_of_ops(["matmul", "pointwise"]) == "MATMUL"
        and outcome_labels.anchor_of_ops(["sdpa"]) == "SDPA"
    )
    assert {"MATMUL", "SDPA", "CONV_FPROP", "POINTWISE"} <= outcome_labels.node_types()


def test_the_tally_counts_totals_and_hands_each_count_to_one_report() -> None:
    outcomes.record("cudnn", T, Outcome.SERVED, "MATMUL", reason="ignored for a served graph")
    outcomes.record("cudnn", T, Outcome.LOCAL, "SDPA", reason="no_worker", spec_hash="ab" * 32)  # no opt-in: no hash
    outcomes.record("cudnn", T, Outcome.LOCAL, "SDPA", reason="no_worker")
    served, local = (
        OutcomeKey("cudnn", T, Outcome.SERVED, "", "MATMUL"),
        OutcomeKey("cudnn", T, Outcome.LOCAL, "no_worker", "SDPA"),
    )
    assert outcomes.outcome_stats() == {served: 1, local: 2}
    assert outcomes.TALLY.take() == {served: 1, local: 2} and outcomes.TALLY.take() == {}
    outcomes.TALLY.give_back({local: 2})
    assert outcomes.TALLY.take() == {local: 2} and outcomes.outcome_stats() == {served: 1, local: 2}


def test_counts_go_in_one_report_and_come_back_when_the_server_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[pb.ReportFirstUsesRequest] = []
    down = [True]

    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    def send(request: pb.ReportFirstUsesRequest) -> None:
        if down[0]:
            raise Refused()
        sent.append(request)

    client_reports = Reports(send)
    monkeypatch.setattr(client_reports, "INTERVAL_S", 3600.0)
    for _ in range(3):
        outcomes.record("compile", T, Outcome.DISK_CACHE, "MATMUL")
    counts("compile").local_won += 2
    client_reports.flush()
    assert sent == []  # refused: nothing lost, all of it waits for the next report
    down[0] = False
    client_reports.flush()
    [request] = sent
    assert [(o.outcome, o.count, o.target_id, o.path, o.node_type) for o in request.outcomes] == [
        (pb.GRAPH_OUTCOME_DISK_CACHE, 3, T, "compile", "MATMUL")
    ]
    assert [(r.path, r.result, r.count) for r in request.races] == [("compile", pb.RACE_RESULT_LOCAL_WON, 2)]
    client_reports.flush()
    assert len(sent) == 1  # nothing new: no empty report


def test_counts_are_sent_at_most_every_interval_and_not_at_all_when_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(reports.INTERVAL_ENV, "0.6")
    sent: list[pb.ReportFirstUsesRequest] = []
    client_reports = Reports(sent.append)
    monkeypatch.setattr(client_reports, "INTERVAL_S", 0.05)
    started = time.monotonic()
    outcomes.record("cudnn", T, Outcome.SERVED, "MATMUL")  # wakes the reporter's thread
    deadline = time.monotonic() + 10
    while not sent:
        assert time.monotonic() < deadline, "no report within 10 s"
        time.sleep(0.02)
    assert time.monotonic() - started >= 0.5  # not before the counts' interval
    outcomes.record("cudnn", T, Outcome.SERVED, "MATMUL")
    time.sleep(0.2)
    assert len(sent) == 1  # the next one waits for the interval again
    client_reports.close()
    assert sum(o.count for r in sent for o in r.outcomes) == 2
    silent: list[pb.ReportFirstUsesRequest] = []
    off = Reports(silent.append, enabled=False)
    outcomes.record("cudnn", T, Outcome.SERVED, "MATMUL")
    off.close()
    assert silent == [] and outcomes.TALLY.take() != {}  # counted, not sent


def test_the_server_folds_what_it_does_not_know_into_other() -> None:
    hostile = pb.OutcomeCount(
        target_id=T, path="evil", outcome=pb.GRAPH_OUTCOME_LOCAL, reason="x" * 300, node_type="NOT_A_NODE", count=2**31
    )
    found = fleet.labels(hostile)
    assert found == fleet.Labels("other", "local", "other", "other") and fleet.count_of(hostile) == fleet.MAX_COUNT
    served = fleet.labels(
        pb.OutcomeCount(path="cudnn", outcome=pb.GRAPH_OUTCOME_SERVED, reason="no_worker", node_type="SDPA", count=1)
    )
    assert served == fleet.Labels("cudnn", "served", "", "SDPA")  # a served graph has no reason
    assert fleet.labels(pb.OutcomeCount(path="cudnn", count=5)) is None  # no outcome: nothing counted
    assert (
        fleet.race_field(pb.RaceCount(path="cudnn", result=pb.RACE_RESULT_SERVICE_WON, count=1)) == "cudnn|service_won"
    )
    assert fleet.race_field(pb.RaceCount(path="cudnn", count=1)) is None
    assert fleet.local_spec_member(T, found, "not a hash") is None
    assert fleet.local_spec_member(T, found, "ab" * 32) == f"{T}|other|other|{'ab' * 32}"


def test_coverage_reads_back_what_was_counted_most_frequent_reason_first() -> None:
    values = {
        "served|cudnn||MATMUL": 6,
        "disk_cache|compile||MATMUL": 2,
        "local|cudnn|no_worker|SDPA": 3,
        "local|functional|not_asked|MATMUL": 1,
        "local|cudnn|no_worker|MATMUL": 1,
        "junk": 99,
    }
    found = fleet.coverage(values)
    assert (found.served, found.disk_cache, found.local, found.graphs, found.share) == (6, 2, 5, 13, 8 / 13)
    assert [(r.reason, r.node_type, r.graphs) for r in found.local_by_reason] == [
        ("no_worker", "SDPA", 3),
        ("no_worker", "MATMUL", 1),
        ("not_asked", "MATMUL", 1),
    ]
    assert [(r.reason, r.graphs) for r in found.top_reasons(5)] == [("no_worker", 4), ("not_asked", 1)]
    assert fleet.coverage({}).share is None

"""Fleet coverage end to end: several node processes run a frontend program
through plancache.cudnn against a real server with a stand-in worker (some
graphs served, some from a disk cache, some built locally for several
reasons); what the status page, its JSON and /metrics show equals the sum
of the nodes' own `plancache.cudnn.stats()`. The page with those numbers
is then laid out by headless Chromium at 1440 px (no cut column) and at a
phone's 390 px (no page wider than the screen; wide tables scroll inside
their section with their first column in view), screenshots kept in
build/test-artifacts/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from plancache import Client
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.outcome_labels import REASONS
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.browser import artifacts_dir, layout, rendered_dom, screenshot_html
from tests.support.processes import REPO, child_env, server_process, wait_for_workers
from tests.support.standin import STANDIN_TARGET as TARGET

pytestmark = pytest.mark.slow

pytest.importorskip(
    "cudnn", reason="the nodes run plancache.cudnn: needs the cuDNN frontend's Python IR (nvidia-cudnn-frontend)"
)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _node(address: str, scenario: str, cache_dir: Path | None = None) -> dict[str, Any]:
    """One node process, run to its end; its own stats() (what it printed)."""
    args = [sys.executable, "-m", "tests.support.fleet_node", address, scenario] + (
        [str(cache_dir)] if cache_dir else []
    )
    done = subprocess.run(
        args,
        env=child_env(PLANCACHE_REPORT_INTERVAL_S="0.5"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    stats: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return stats


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server with a stand-in worker after three nodes ran: what each said of itself."""
    tmp = tmp_path_factory.mktemp("fleet")
    redis_server = EmbeddedRedis(tmp / "redis", persist=False).start()
    address, http_port = f"127.0.0.1:{free_port()}", free_port()
    try:
        with server_process(
            address,
            redis_server.url,
            tmp / "server.log",
            "--gpus",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--unsigned",
            "--metrics-port",
            str(http_port),
        ) as server:
            wait_for_workers(address, proc=server)
            cache = tmp / "node-cache"
            nodes = [_node(address, "first", cache), _node(address, "cached", cache), _node(address, "down")]
            url = f"http://127.0.0.1:{http_port}"
            expected = sum(n["served"] + n["local"] for n in nodes)
            deadline = time.monotonic() + 30
            while (json.loads(_get(url + "/status.json"))["fleet"]["total"]["graphs"]) < expected:
                assert time.monotonic() < deadline, (
                    f"the nodes' reports did not arrive: {json.loads(_get(url + '/status.json'))['fleet']['total']}"
                )
                time.sleep(0.3)
            yield {"url": url, "address": address, "nodes": nodes}
    finally:
        redis_server.stop()


def test_the_status_json_is_the_sum_of_the_nodes_own_stats(fleet: dict[str, Any]) -> None:
    nodes = fleet["nodes"]
    served, local = sum(n["served"] for n in nodes), sum(n["local"] for n in nodes)
    assert (served, local) == (6, 4)  # the scenarios: 2 + 2 + 2 served; 2 (refused, driven) + 1 + 1 local
    report = json.loads(_get(fleet["url"] + "/status.json"))
    total = report["fleet"]["total"]
    assert (total["from_service"], total["local"], total["graphs"]) == (served, local, served + local)
    assert total["disk_cache"] == sum(n["sources"].count("cache") for n in nodes) == 2
    assert total["share"] == pytest.approx(served / (served + local))
    # Why, the most frequent reason first, each under the graph's node type.
    by_reason = {(r["reason"], r["node_type"]): r["graphs"] for r in total["local_by_reason"]}
    assert by_reason == {
        ("compile_failed", "MATMUL"): 1,
        ("program_drives", "MATMUL"): 1,
        ("no_worker", "MATMUL"): 1,
        ("unavailable", "MATMUL"): 1,
    }
    assert all(r["meaning"] == REASONS[r["reason"]] for r in total["local_by_reason"])
    # Per target: the stand-in's, and the one no worker builds (its graph counted with the other targets).
    targets = {t["target_id"]: t["fleet"]["total"] for t in report["targets"]}
    assert (targets[TARGET.id]["from_service"], targets[TARGET.id]["local"]) == (served, local - 1)
    assert targets["(other targets)"]["local_by_reason"][0]["reason"] == "no_worker"


def test_metrics_count_the_same_graphs_by_outcome_reason_and_node_type(fleet: dict[str, Any]) -> None:
    text = _get(fleet["url"] + "/metrics")
    samples = {}
    for line in text.splitlines():
        found = re.match(r"plancache_fleet_graphs_total\{(.*)\} (\S+)$", line)
        if found:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
            samples[(labels["target"], labels["outcome"], labels["reason"], labels["node_type"])] = float(
                found.group(2)
            )
    by_outcome: dict[str, float] = {}
    for (_, outcome, _, _), value in samples.items():
        by_outcome[outcome] = by_outcome.get(outcome, 0) + value
    nodes = fleet["nodes"]
    assert by_outcome == {"served": 4, "disk_cache": 2, "local": sum(n["local"] for n in nodes)}
    assert samples[("(other targets)", "local", "no_worker", "MATMUL")] == 1
    assert samples[(TARGET.id, "local", "compile_failed", "MATMUL")] == 1


def test_a_hostile_report_adds_no_label_and_an_oversized_one_is_refused(fleet: dict[str, Any]) -> None:
    """Labels a node invents fold into "other"; counts are capped; more entries than a report takes are refused."""
    with Client(fleet["address"], cache=False, report=False) as client:
        stub = client._stub
        hostile = pb.OutcomeCount(
            target_id="sm_99/made-up",
            path="../../etc",
            outcome=pb.GRAPH_OUTCOME_LOCAL,
            reason="DROP TABLE",
            node_type="X" * 200,
            count=7,
        )
        answer = stub.ReportFirstUses(pb.ReportFirstUsesRequest(outcomes=[hostile, pb.OutcomeCount(count=3)]))
        assert answer.outcomes_counted == 1  # the entry without an outcome counts nothing
        small = pb.OutcomeCount(outcome=pb.GRAPH_OUTCOME_SERVED, count=1)
        with pytest.raises(Exception, match="at most 512 outcomes"):
            stub.ReportFirstUses(pb.ReportFirstUsesRequest(outcomes=[small] * 513))
    text = _get(fleet["url"] + "/metrics")
    assert (
        'plancache_fleet_graphs_total{node_type="other",outcome="local",path="other",reason="other",target="(other targets)"} 7.0'
        in text
    )
    # The hostile values themselves ("etc" alone is a substring of honest names: prefetched, fetch)
    assert "DROP TABLE" not in text and "made-up" not in text and "../../etc" not in text


def test_the_status_page_shows_the_fleet_coverage_and_why(fleet: dict[str, Any]) -> None:
    dom = rendered_dom(fleet["url"] + "/")
    nodes = fleet["nodes"]
    graphs = sum(n["served"] + n["local"] for n in nodes) + 7  # with the hostile report's 7, when it ran first
    found = re.search(r'data-fleet-graphs="([\d.]+)" data-fleet-from-service="([\d.]+)"', dom)
    assert found and float(found.group(2)) == sum(n["served"] for n in nodes)
    assert float(found.group(1)) in (graphs, graphs - 7)
    reasons = re.findall(r'<tr data-reason="([^"]+)" data-node-type="([^"]+)" data-graphs="([\d.]+)"', dom)
    assert {(r, t) for r, t, _ in reasons} >= {
        ("compile_failed", "MATMUL"),
        ("program_drives", "MATMUL"),
        ("no_worker", "MATMUL"),
        ("unavailable", "MATMUL"),
    }
    counts = [float(g) for _, _, g in reasons]
    assert counts == sorted(counts, reverse=True)  # most first
    row = re.search(
        rf'<tr data-fleet-target="{re.escape(TARGET.id)}"[^>]*data-from-service="([\d.]+)" data-local="([\d.]+)"', dom
    )
    assert row and (float(row.group(1)), float(row.group(2))) == (
        sum(n["served"] for n in nodes),
        sum(n["local"] for n in nodes) - 1,
    )


def test_the_page_fits_1440_px_with_no_cut_column(fleet: dict[str, Any]) -> None:
    page = _get(fleet["url"] + "/")
    measured = layout(page, 1440)
    assert measured["viewport"] == 1440 and measured["page_width"] <= 1440
    tables = measured["tables"]
    assert isinstance(tables, list) and len(tables) >= 6
    cut = [t for t in tables if t["width"] > t["room"] + 1]
    assert not cut, f"tables wider than their section at 1440 px: {cut}"
    screenshot_html(page, artifacts_dir() / "status-page-1440.png", 1440)


def test_the_page_is_usable_on_a_390_px_phone(fleet: dict[str, Any]) -> None:
    page = _get(fleet["url"] + "/")
    measured = layout(page, 390)
    assert measured["viewport"] == 390
    assert measured["page_width"] <= 390, "the page itself scrolls sideways on a phone"
    sections = measured["sections"]
    assert isinstance(sections, list) and all(s["left"] >= 0 and s["right"] <= 390 for s in sections), sections
    tables = measured["tables"]
    assert isinstance(tables, list)
    for table in tables:  # a table wider than the phone scrolls inside its section, what its rows are kept in view
        if table["width"] > table["room"] + 1:
            assert table["overflow"] == "auto" and table["first_column"] == "sticky", table
    fleet_table = next(t for t in tables if t["section"] == "fleet")
    assert fleet_table["columns"] == 7
    assert isinstance(measured["smallest_font"], float | int) and measured["smallest_font"] >= 11
    shot = screenshot_html(page, artifacts_dir() / "status-page-390.png", 390)
    from matplotlib import image

    assert image.imread(str(shot)).shape[1] == 390

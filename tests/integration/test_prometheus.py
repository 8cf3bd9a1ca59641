"""The Grafana dashboard's queries and the alert and recording rules,
evaluated by a real Prometheus (Debian's prometheus package; `make
setup-test` installs it) scraping a live server and its stand-in worker
under known traffic.

What each query must return is computed here from the raw samples
Prometheus holds at the same evaluation time, with Prometheus's documented
rate extrapolation (extrapolated_rate below), and the raw samples
themselves are checked against the traffic the test made: so a query that
selects the wrong series, aggregates over the wrong labels or divides the
wrong things fails, and so does a metric that counts the wrong thing.
The alerts' timings are `promtool test rules` (tests/unit/test_prometheus_rules.py);
here, each alert's expression selects exactly the series its condition
holds for, and the alerts whose condition holds are pending."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from plancache import Client, Target, TargetUnavailable
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.processes import REPO, child_env, free_port_pair, server_process, wait_for_workers
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET

pytestmark = pytest.mark.slow

# A target listed (--targets) but with no worker: its lookups are refused, its queue only grows.
QUEUED = Target("sm_80", 91900, "1.32.0", "Queue GPU", 108)
RULES = REPO / "docker" / "prometheus-rules.yml"
DASHBOARD = REPO / "docker" / "grafana" / "dashboards" / "plancache.json"
Labels = frozenset[tuple[str, str]]


class Prometheus:
    """A Prometheus process scraping the given targets every second, with plancache's rules."""

    def __init__(self, folder: Path, gateway: int, worker: int) -> None:
        binary = shutil.which("prometheus")
        assert binary, "no prometheus: `make setup-test` (scripts/install-os-package.sh) installs Debian's prometheus"
        self.port = free_port()
        config = {
            # Rules evaluate at another period than scrapes, so that their phase against the scrapes varies:
            # an evaluation made while a scrape was being taken saw less than a query made later at its
            # timestamp does (test_every_recording_rule_returns_its_expected_value picks the ones that didn't).
            "global": {"scrape_interval": "1s", "evaluation_interval": "1100ms"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "plancache",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{gateway}"], "labels": {"role": "gateway"}},
                        {"targets": [f"127.0.0.1:{worker}"], "labels": {"role": "worker"}},
                    ],
                }
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._log = open(folder / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, (folder / "prometheus.log").read_text()[
                -3000:
            ]
            time.sleep(0.2)

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=20) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float) -> dict[Labels, float]:
        data = self.api("query", query=expr, time=f"{at:.3f}")
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return {frozenset(r["metric"].items()): float(r["value"][1]) for r in data["result"]}

    def samples(self, selector: str, window: str, at: float) -> dict[Labels, list[tuple[float, float]]]:
        data = self.api("query", query=f"{selector}[{window}]", time=f"{at:.3f}")
        return {frozenset(r["metric"].items()): [(float(t), float(v)) for t, v in r["values"]] for r in data["result"]}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


# ---- what a query must return, from the raw samples ----------------------------------------------

SECONDS = {"5m": 300.0, "15m": 900.0, "1h": 3600.0}


def extrapolated_rate(points: list[tuple[float, float]], start: float, end: float) -> float | None:
    """rate() as Prometheus 2.x computes it (promql/functions.go, extrapolatedRate):
    the increase (counter resets corrected), extrapolated to the range's edges
    by at most half a scrape interval (or to where the counter was zero), per second of the range."""
    if len(points) < 2:
        return None
    increase = points[-1][1] - points[0][1] + sum(a for (_, a), (_, b) in itertools.pairwise(points) if b < a)
    sampled = points[-1][0] - points[0][0]
    average = sampled / (len(points) - 1)
    to_start, to_end = points[0][0] - start, end - points[-1][0]
    if increase > 0 and points[0][1] >= 0:
        to_start = min(to_start, sampled * (points[0][1] / increase))
    threshold = average * 1.1
    extrapolated = (
        sampled + (to_start if to_start < threshold else average / 2) + (to_end if to_end < threshold else average / 2)
    )
    return increase * (extrapolated / sampled) / (end - start)


class Expected:
    """The raw samples at one evaluation time, and PromQL's aggregations of them."""

    def __init__(self, prometheus: Prometheus, at: float) -> None:
        self._prometheus, self.at = prometheus, at

    def rates(
        self, metric: str, window: str, keep: Callable[[dict[str, str]], bool] = lambda labels: True
    ) -> dict[Labels, float]:
        out = {}
        for labels, points in self._prometheus.samples(metric, window, self.at).items():
            found = extrapolated_rate(points, self.at - SECONDS[window], self.at)
            if found is not None and keep(dict(labels)):
                out[labels] = found
        return out

    def gauge(self, metric: str) -> dict[Labels, float]:
        return {labels: points[-1][1] for labels, points in self._prometheus.samples(metric, "30s", self.at).items()}


def sum_by(values: dict[Labels, float], *by: str) -> dict[Labels, float]:
    out: defaultdict[Labels, float] = defaultdict(float)
    for labels, value in values.items():
        out[frozenset((k, v) for k, v in labels if k in by)] += value
    return dict(out)


def divide(a: dict[Labels, float], b: dict[Labels, float]) -> dict[Labels, float]:
    return {labels: a.get(labels, 0.0) / b[labels] if b[labels] else math.nan for labels in b if labels in a}


def or_zero(a: dict[Labels, float], b: dict[Labels, float]) -> dict[Labels, float]:
    """`a or 0 * b`: a's series, and 0 for b's that a lacks."""
    return {**{labels: 0.0 for labels in b}, **a}


def quantile(q: float, buckets: dict[Labels, float], *by: str) -> dict[Labels, float]:
    """histogram_quantile(q, sum by (le, *by) (...)): linear within the bucket, as Prometheus does."""
    groups: defaultdict[Labels, list[tuple[float, float]]] = defaultdict(list)
    for labels, value in buckets.items():
        named = dict(labels)
        groups[frozenset((k, v) for k, v in labels if k in by)].append((float(named["le"]), value))
    out = {}
    for labels, pairs in groups.items():
        pairs.sort()
        total = pairs[-1][1]
        if total <= 0:
            out[labels] = math.nan
            continue
        rank = q * total
        index = next(i for i, (_, count) in enumerate(pairs) if count >= rank)
        if index == len(pairs) - 1:
            out[labels] = pairs[-2][0]
            continue
        lower, below = (pairs[index - 1][0], pairs[index - 1][1]) if index > 0 else (0.0, 0.0)
        upper, count = pairs[index]
        out[labels] = lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper
    return out


def _same(got: dict[Labels, float], want: dict[Labels, float], what: str) -> None:
    assert set(got) == set(want), (
        f"{what}: series {sorted(str(dict(k)) for k in got)} != {sorted(str(dict(k)) for k in want)}"
    )
    for labels, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[labels]), (what, dict(labels))
        else:
            assert got[labels] == pytest.approx(value, rel=1e-6, abs=1e-12), (what, dict(labels), got[labels], value)


def _target(target_id: str, **more: str) -> Labels:
    return frozenset({"target": target_id, **more}.items())


# ---- the live system ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("prometheus")
    redis_server = EmbeddedRedis(tmp / "redis", persist=False).start()
    address, metrics = f"127.0.0.1:{free_port()}", free_port_pair()
    env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS="0.05")
    prometheus: Prometheus | None = None
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
            str(metrics),
            "--targets",
            QUEUED.id,
            env=env,
        ) as server:
            wait_for_workers(address, proc=server)
            store = redis.Redis.from_url(redis_server.url)
            with Client(address, cache=False, hedge=False, report=False, timeout=10, allow_unsigned=True) as client:
                # Warm-up: every series exists before Prometheus's first scrape, in the proportions of the
                # traffic to come, so that rate() extrapolates every series of a ratio alike (exact ratios).
                _traffic(client, store, hits=3, misses=1, refused=1, queued=3, offset=0)
                prometheus = Prometheus(tmp, metrics, metrics + 1)
                # Both processes scraped, the worker too (its builds counter): a worker first scraped after the
                # builds below would show no increase (CI once, the suite loaded).
                _wait(
                    lambda: all(
                        any(len(points) >= 3 for points in prometheus.samples(series, "1m", time.time()).values())
                        for series in ('plancache_lookups_total{result="hit"}', "plancache_builds_total")
                    )
                )
                builds_before = sum(_scraped_counts(metrics + 1, "plancache_builds_total").values())  # the worker's
                _traffic(
                    client, store, hits=6, misses=2, refused=20, queued=5, offset=100
                )  # the traffic the queries must see
                final = _scraped_counts(metrics)
                fleet_final = _scraped_counts(metrics, "plancache_fleet_graphs_total")
                # The worker counts a build as it records the job, just after storing the plan a caller gets.
                _wait(lambda: sum(_scraped_counts(metrics + 1, "plancache_builds_total").values()) == builds_before + 2)
                builds_final = _scraped_counts(metrics + 1, "plancache_builds_total")
                _wait(
                    lambda: (
                        _latest(prometheus, "plancache_lookups_total") == final
                        and _latest(prometheus, "plancache_fleet_graphs_total") == fleet_final
                        and _latest(prometheus, "plancache_builds_total") == builds_final
                    ),
                    lambda: f"{_latest(prometheus, 'plancache_lookups_total')} != {final}",
                )
                time.sleep(2.5)  # the rules evaluated on the final samples
                yield {
                    "prometheus": prometheus,
                    "at": round(time.time(), 3),
                    "server": server,
                }  # Prometheus's resolution: milliseconds
    finally:
        if prometheus is not None:
            prometheus.stop()
        redis_server.stop()


def _traffic(
    client: Client, store: redis.Redis, *, hits: int, misses: int, refused: int, queued: int, offset: int
) -> None:
    """Lookups of the stand-in's target (misses built, then hits), lookups of the listed target
    without a worker (refused), jobs waiting on its queue, and one node's report: 6 graphs served,
    4 built locally (3 with no worker, 1 left to torch), and its races."""
    for i in range(misses):
        client.compile(matmul_spec(m=64 + 16 * (offset + i)), TARGET)
    for _ in range(hits):
        client.compile(matmul_spec(m=64 + 16 * offset), TARGET)
    for i in range(refused):
        with pytest.raises(TargetUnavailable):
            client.compile(matmul_spec(m=64 + 16 * i), QUEUED)
    for i in range(queued):
        store.xadd(keys.job_stream(QUEUED), {"job": f"waiting-{offset}-{i}"})
    outcomes = [
        pb.OutcomeCount(
            target_id=TARGET.id, path="cudnn", outcome=pb.GRAPH_OUTCOME_SERVED, node_type="MATMUL", count=4
        ),
        pb.OutcomeCount(
            target_id=TARGET.id, path="compile", outcome=pb.GRAPH_OUTCOME_DISK_CACHE, node_type="SDPA", count=2
        ),
        pb.OutcomeCount(
            target_id=TARGET.id,
            path="cudnn",
            outcome=pb.GRAPH_OUTCOME_LOCAL,
            reason="no_worker",
            node_type="SDPA",
            count=3,
        ),
        pb.OutcomeCount(
            target_id=TARGET.id,
            path="functional",
            outcome=pb.GRAPH_OUTCOME_LOCAL,
            reason="not_asked",
            node_type="MATMUL",
            count=1,
        ),
    ]
    races = [
        pb.RaceCount(path="cudnn", result=pb.RACE_RESULT_LOCAL_WON, count=2),
        pb.RaceCount(path="cudnn", result=pb.RACE_RESULT_SERVICE_WON, count=1),
    ]
    assert client._stub.ReportFirstUses(pb.ReportFirstUsesRequest(outcomes=outcomes, races=races)).outcomes_counted == 6


def _scraped_counts(port: int, metric: str = "plancache_lookups_total") -> dict[Labels, float]:
    """A metric's samples on the gateway's /metrics now (name and labels, without Prometheus's job and instance)."""
    import re

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        found = re.match(rf"({metric})\{{(.*)\}} (\S+)$", line)
        if found:
            labels = {
                k: v for k, v in re.findall(r'(\w+)="([^"]*)"', found.group(2)) if v
            }  # Prometheus drops empty labels
            out[frozenset({"__name__": found.group(1), **labels}.items())] = float(found.group(3))
    return out


def _latest(prometheus: Prometheus, metric: str) -> dict[Labels, float]:
    return {
        frozenset((k, v) for k, v in labels if k not in ("job", "instance", "role")): value
        for labels, value in prometheus.query(metric, time.time()).items()
    }


def _wait(condition: Callable[[], bool], why: Callable[[], str] = lambda: "", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"Prometheus did not get there in time: {why()}"
        time.sleep(0.5)


# ---- the tests -----------------------------------------------------------------------------------------


def test_the_raw_samples_hold_the_traffic_the_test_made(live: dict[str, Any]) -> None:
    prometheus, at = live["prometheus"], live["at"]

    def increase(metric: str, **labels: str) -> float:
        found = [
            p for found, p in prometheus.samples(metric, "5m", at).items() if labels.items() <= dict(found).items()
        ]
        return sum(p[-1][1] - p[0][1] for p in found)

    assert (
        increase("plancache_lookups_total", target=TARGET.id, result="hit"),
        increase("plancache_lookups_total", target=TARGET.id, result="miss"),
    ) == (6, 2)
    assert increase("plancache_lookups_total", target=QUEUED.id, result="miss") == 20
    assert increase("plancache_builds_total") == 2
    assert (
        increase("plancache_fleet_graphs_total", outcome="local") == 4
        and increase("plancache_fleet_graphs_total") == 10
    )
    assert increase("plancache_fleet_races_total", result="local_won") == 2
    waiting = {dict(k)["target"]: v for k, v in prometheus.query("plancache_jobs_waiting", at).items()}
    assert waiting == {TARGET.id: 0, TARGET.generic().id: 0, QUEUED.id: 8}
    # Each process (the gateway, its worker) says what it runs, once.
    info = prometheus.query("plancache_build_info", at)
    assert len(info) == 2 and set(info.values()) == {1.0}
    assert {dict(k)["version"] for k in info} == {importlib.metadata.version("plancache-server")}


def _dashboard_expectations(expected: Expected) -> dict[str, dict[Labels, float]]:
    e = expected
    lookups = e.rates("plancache_lookups_total", "5m")
    fleet_1h, fleet_5m = e.rates("plancache_fleet_graphs_total", "1h"), e.rates("plancache_fleet_graphs_total", "5m")
    served_1h = {k: v for k, v in fleet_1h.items() if dict(k)["outcome"] != "local"}
    local_1h = {k: v for k, v in fleet_1h.items() if dict(k)["outcome"] == "local"}
    by_reason = sum_by(local_1h, "reason", "node_type")
    top = dict(sorted(by_reason.items(), key=lambda item: -item[1])[:10])
    return {
        '(sum by (target) (rate(plancache_lookups_total{result="hit"}[5m])) or 0 * sum by (target) (rate(plancache_lookups_total[5m]))) / sum by (target) (rate(plancache_lookups_total[5m]))': divide(
            or_zero(
                sum_by({k: v for k, v in lookups.items() if dict(k)["result"] == "hit"}, "target"),
                sum_by(lookups, "target"),
            ),
            sum_by(lookups, "target"),
        ),
        "sum by (method, code) (rate(plancache_requests_total[5m]))": sum_by(
            e.rates("plancache_requests_total", "5m"), "method", "code"
        ),
        "histogram_quantile(0.99, sum by (le, method) (rate(plancache_request_duration_seconds_bucket[5m])))": quantile(
            0.99, sum_by(e.rates("plancache_request_duration_seconds_bucket", "5m"), "le", "method"), "method"
        ),
        "plancache_jobs_waiting": e.gauge("plancache_jobs_waiting"),
        "plancache_jobs_running": e.gauge("plancache_jobs_running"),
        "plancache_live_workers": e.gauge("plancache_live_workers"),
        "sum(plancache_worker_busy)": sum_by(e.gauge("plancache_worker_busy")),
        "histogram_quantile(0.5, sum by (le) (rate(plancache_build_duration_seconds_bucket[15m])))": quantile(
            0.5, sum_by(e.rates("plancache_build_duration_seconds_bucket", "15m"), "le")
        ),
        "histogram_quantile(0.99, sum by (le) (rate(plancache_build_duration_seconds_bucket[15m])))": quantile(
            0.99, sum_by(e.rates("plancache_build_duration_seconds_bucket", "15m"), "le")
        ),
        "sum by (outcome) (rate(plancache_builds_total[15m]))": sum_by(
            e.rates("plancache_builds_total", "15m"), "outcome"
        ),
        '(sum by (target) (rate(plancache_fleet_graphs_total{outcome!="local"}[1h])) or 0 * sum by (target) (rate(plancache_fleet_graphs_total[1h]))) / sum by (target) (rate(plancache_fleet_graphs_total[1h]))': divide(
            or_zero(sum_by(served_1h, "target"), sum_by(fleet_1h, "target")), sum_by(fleet_1h, "target")
        ),
        'topk(10, sum by (reason, node_type) (rate(plancache_fleet_graphs_total{outcome="local"}[1h])))': top,
        "sum by (outcome) (rate(plancache_fleet_graphs_total[5m]))": sum_by(fleet_5m, "outcome"),
        "sum by (result) (rate(plancache_fleet_races_total[5m]))": sum_by(
            e.rates("plancache_fleet_races_total", "5m"), "result"
        ),
        "sum by (version, plancache, python, cudnn_frontend, cudnn, torch) (plancache_build_info)": sum_by(
            e.gauge("plancache_build_info"), "version", "plancache", "python", "cudnn_frontend", "cudnn", "torch"
        ),
    }


def test_every_dashboard_query_returns_its_expected_value(live: dict[str, Any]) -> None:
    prometheus, at = live["prometheus"], live["at"]
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expected = _dashboard_expectations(Expected(prometheus, at))
    assert sorted(queries) == sorted(expected), "a dashboard query without an expectation here (or the reverse)"
    for expr in queries:
        got = {
            frozenset((k, v) for k, v in labels if k not in ("job", "instance", "role", "__name__")): value
            for labels, value in prometheus.query(expr, at).items()
        }
        want = {
            frozenset((k, v) for k, v in labels if k not in ("job", "instance", "role", "__name__")): value
            for labels, value in expected[expr].items()
        }
        _same(got, want, expr)
    # What the numbers say, in words: 6 hits of 8 lookups; the listed target's 20 lookups all refused (0 %, not absent);
    # 6 of 10 graphs from the service.
    hit_rate = {dict(k)["target"]: v for k, v in prometheus.query(queries[0], at).items()}
    assert hit_rate[TARGET.id] == pytest.approx(0.75) and hit_rate[QUEUED.id] == 0
    coverage = {
        dict(k)["target"]: v
        for k, v in prometheus.query(next(q for q in queries if 'outcome!="local"' in q), at).items()
    }
    assert coverage == {TARGET.id: pytest.approx(0.6)}


# A scrape's samples carry the time it started and are appended when it ends; an evaluation whose
# timestamp falls in between did not see them, and a later query at that timestamp does. Allowance for
# appending after the scrape's measured duration:
APPEND_ALLOWANCE_S = 0.25
# How long a rule's check waits for an evaluation that saw every scrape.
EVALUATIONS_WAIT_S = 15.0


def _saw_every_scrape(scrapes: dict[Labels, list[tuple[float, float]]], evaluated_at: float) -> bool:
    """Whether every target's last scrape before `evaluated_at` had been appended by then."""
    for points in scrapes.values():
        before = [(started, took) for started, took in points if started <= evaluated_at]
        if before and before[-1][0] + before[-1][1] + APPEND_ALLOWANCE_S >= evaluated_at:
            return False
    return True


def test_every_recording_rule_returns_its_expected_value(live: dict[str, Any]) -> None:
    prometheus = live["prometheus"]
    e_at = live["at"]
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r]
    for rule in rules:
        # A live system only seconds old has a few evaluations, all of whose phases may fall in scrapes
        # (CI once: 5 evaluations, every one during the gateway's or the worker's): later ones, bounded.
        end, deadline = e_at, time.monotonic() + EVALUATIONS_WAIT_S
        while True:
            scrapes = prometheus.samples("scrape_duration_seconds", "40s", end)
            recorded = prometheus.samples(rule["record"], "20s", end)
            assert recorded, f"{rule['record']}: never recorded"
            evaluations = sorted({t for points in recorded.values() for t, _ in points}, reverse=True)
            stamp = next((t for t in evaluations if _saw_every_scrape(scrapes, t)), None)
            if stamp is not None or time.monotonic() > deadline:
                break
            time.sleep(1.1)  # one more evaluation (every 1.1 s, a phase the scrapes' 1 s moves on)
            end = round(time.time(), 3)
        assert stamp is not None, f"{rule['record']}: every evaluation up to {end} overlapped a scrape: {scrapes}"
        got = {
            frozenset((k, v) for k, v in labels if k != "__name__"): value
            for labels, points in recorded.items()
            for t, value in points
            if t == stamp
        }
        want = prometheus.query(rule["expr"], stamp)
        _same(got, want, rule["record"])
    at = live["at"]
    by_reason = {
        (dict(k)["reason"], dict(k)["node_type"]): v
        for k, v in prometheus.query("plancache:fleet_local_graphs:rate1h", at).items()
    }
    assert set(by_reason) == {("no_worker", "SDPA"), ("not_asked", "MATMUL")} and by_reason[
        ("no_worker", "SDPA")
    ] == pytest.approx(3 * by_reason[("not_asked", "MATMUL")])
    # The recorded ratios are the traffic's (its series all extrapolated alike: see the warm-up).
    assert {dict(k)["target"]: v for k, v in prometheus.query("plancache:hit_rate:ratio_rate5m", at).items()}[
        TARGET.id
    ] == pytest.approx(0.75)
    assert {dict(k)["target"]: v for k, v in prometheus.query("plancache:fleet_coverage:ratio_rate1h", at).items()} == {
        TARGET.id: pytest.approx(0.6)
    }


def test_every_alert_selects_what_its_condition_holds_for(live: dict[str, Any]) -> None:
    prometheus, at = live["prometheus"], live["at"]
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    firing_on = {
        name: {dict(k).get("target") for k in prometheus.query(rule["expr"], at)} for name, rule in rules.items()
    }
    assert firing_on == {
        "PlancacheHitRateLow": {QUEUED.id},  # 20 lookups, none found (the stand-in's target: 75 %)
        "PlancacheQueueGrowing": {QUEUED.id},  # 8 builds wait, 5 more than a few seconds ago
        "PlancacheNoLiveWorker": {QUEUED.id},  # lookups, no worker (the stand-in's target has one)
        "PlancacheUntrustedBuilds": set(),  # no untrusted build happened
        "PlancacheFleetCoverageLow": {TARGET.id},  # 6 of 10 graphs from the service
    }
    alerts = {
        (a["labels"]["alertname"], a["labels"].get("target")): a["state"] for a in prometheus.api("alerts")["alerts"]
    }
    assert alerts == {
        ("PlancacheHitRateLow", QUEUED.id): "pending",
        ("PlancacheQueueGrowing", QUEUED.id): "pending",
        ("PlancacheNoLiveWorker", QUEUED.id): "pending",
        ("PlancacheFleetCoverageLow", TARGET.id): "pending",
    }

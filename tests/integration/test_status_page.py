"""The status page of a real `plancache-server` process, read as JSON and as
rendered by headless Chromium, with a screenshot left in build/test-artifacts/
(PLANCACHE_TEST_ARTIFACTS) for people to look at."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import redis
from matplotlib import image

from plancache import Client, CompileFailed, Target
from plancache.transport.results import WindowCounts
from plancache.v1 import plancache_pb2 as pb
from plancache_server.settings import Settings
from plancache_server.store import keys
from plancache_server.store.build_records import RECENT_FAILURES_KEPT, BuildRecorder
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from plancache_server.store.jobs import Job
from plancache_server.web.status import status_of
from plancache_server.worker.worker_queue import WorkerQueue
from tests.conftest import Stack
from tests.support.browser import artifacts_dir, rendered_dom, screenshot
from tests.support.frontend import ThreadedFrontEnd
from tests.support.processes import child_env, server_process, wait_for_workers
from tests.support.specs import matmul_spec
from tests.support.standin import REJECTED_NAME
from tests.support.standin import STANDIN_TARGET as TARGET

pytestmark = pytest.mark.slow

BUILD_SECONDS = 0.25  # each stand-in build; every hit saves this much


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class _Elements(HTMLParser):
    """Elements of a rendered DOM with their attributes and text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.texts.append(data)

    def with_attr(self, name: str, value: str | None = None) -> list[dict[str, str]]:
        return [a for _, a in self.elements if name in a and (value is None or a[name] == value)]


def _row(dom: str, attr: str, value: str) -> str:
    """The text of the table row whose `attr` is `value`."""
    start = dom.index(f'{attr}="{value}"')
    return dom[start : dom.index("</tr>", start)]


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server with a stand-in worker after some traffic: hot and cold plans,
    and one graph the "cuDNN" of the stand-in rejects."""
    tmp = tmp_path_factory.mktemp("status")
    redis_server = EmbeddedRedis(tmp / "redis", persist=False).start()
    address, http_port = f"127.0.0.1:{free_port()}", free_port()
    env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS=str(BUILD_SECONDS))
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
            env=env,
        ) as server:
            wait_for_workers(address, proc=server)
            hot, warm = matmul_spec(m=128), matmul_spec(m=64)
            with Client(address, cache=False, allow_unsigned=True) as client:  # an --unsigned server
                hot_key = client.compile(hot, TARGET).key
                for _ in range(6):
                    client.compile(hot, TARGET)
                warm_key = client.compile(warm, TARGET).key
                client.compile(warm, TARGET)
                with pytest.raises(CompileFailed):
                    client.compile(matmul_spec(name=REJECTED_NAME), TARGET)
            yield {"url": f"http://127.0.0.1:{http_port}", "address": address, "hot": hot_key, "warm": warm_key}
    finally:
        redis_server.stop()


def test_status_json_counts_what_was_asked(busy_server: dict[str, Any]) -> None:
    status, body = _get(busy_server["url"] + "/status.json")
    assert status == 200, body
    report = json.loads(body)
    [target] = [t for t in report["targets"] if t["target_id"] == TARGET.id]
    total = target["windows"]["total"]
    # 7 + 2 + 1 compiles: 3 misses (each built, one rejected), 7 hits.
    assert (total["hits"], total["misses"], total["compiles"], total["failures"]) == (7, 3, 3, 1)
    assert target["hit_rate"]["5m"] == pytest.approx(0.7)
    assert target["live_workers"] == 1 and target["jobs_waiting"] == 0 and target["jobs_running"] == 0
    assert sum(b["values"].get("hits", 0) + b["values"].get("misses", 0) for b in target["history"]) == 10
    assert len(target["history"]) == 60

    top = [(e["plan_key"], e["hits"]) for e in report["top_by_hits"]]
    assert top == [(busy_server["hot"], 6), (busy_server["warm"], 1)]
    for entry in report["top_by_seconds_saved"]:
        assert entry["stored"] and entry["build_seconds"] == pytest.approx(BUILD_SECONDS, abs=0.05)
        assert entry["build_seconds_saved"] == pytest.approx(entry["hits"] * entry["build_seconds"])
    [failure] = report["recent_failures"]
    assert failure["target_id"] == TARGET.id and failure["rejected"] and "standin-reject" in failure["reason"]

    assert _get(busy_server["url"] + "/status.json?range=24h")[0] == 200
    assert len(json.loads(_get(busy_server["url"] + "/status.json?range=24h")[1])["targets"][0]["history"]) == 24
    assert _get(busy_server["url"] + "/status.json?range=7d")[0] == 400
    assert _get(busy_server["url"] + "/nothing")[0] == 404
    assert "plancache_requests_total" in _get(busy_server["url"] + "/metrics")[1]


def test_status_page_in_headless_chromium(busy_server: dict[str, Any]) -> None:
    url = busy_server["url"] + "/"
    dom = rendered_dom(url)
    page = _Elements()
    page.feed(dom)

    # Targets: workers, queues, hit rates, counts.
    assert ">70.0 %<" in _row(dom, "data-target", TARGET.id)
    counts = _row(dom, "data-counts-target", TARGET.id)
    assert ">7<" in counts and ">3<" in counts
    # Hit rate over time: one SVG per target, its buckets holding every lookup.
    assert [a["data-target"] for tag, a in page.elements if tag == "figure"] == [TARGET.id]
    buckets = page.with_attr("data-lookups")
    assert len(buckets) == 60 and sum(float(b["data-lookups"]) for b in buckets) == 10
    assert any(b["data-hit-rate"] for b in buckets)
    assert any(tag == "circle" for tag, _ in page.elements)
    # Top entries: the hot plan first in both tables, then the warm one.
    ranked = [a["data-plan-key"] for a in page.with_attr("data-plan-key")]
    assert ranked[:2] == [busy_server["hot"], busy_server["warm"]]
    assert ranked[2:4] == [busy_server["hot"], busy_server["warm"]]
    # Recent failures, with cuDNN's reason.
    assert "rejected by cuDNN" in dom and "standin-reject" in _row(dom, "data-plan-key", ranked[4])

    shot = screenshot(url, artifacts_dir() / "status-page.png")
    pixels = image.imread(str(shot))
    assert pixels.shape[0] >= 1500 and pixels.shape[1] >= 1200
    colours = {tuple(p) for p in pixels[::7, ::7].reshape(-1, pixels.shape[2]).round(2).tolist()}
    assert len(colours) > 20, "the screenshot is (nearly) blank"


def test_invalidated_plans_leave_the_top_entries(busy_server: dict[str, Any]) -> None:
    with Client(busy_server["address"], cache=False, allow_unsigned=True) as client:
        assert client.admin.invalidate(key=busy_server["hot"]) == 1
    report = json.loads(_get(busy_server["url"] + "/status.json")[1])
    assert [e["plan_key"] for e in report["top_by_hits"]] == [busy_server["warm"]]


def test_worker_http_port_serves_metrics_only(tmp_path: Path) -> None:
    """A worker has no status page: its port answers /metrics, / is 404."""
    from plancache_server.web.http import WebServer

    server = WebServer(free_port(), status=None, host="127.0.0.1").start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert _get(base + "/metrics")[0] == 200
        assert _get(base + "/")[0] == 404
        assert _get(base + "/healthz") == (200, "ok\n")
    finally:
        server.stop()


@pytest.fixture
def gateway(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Any:
    front = ThreadedFrontEnd(Settings(listen="127.0.0.1:0", redis_url=redis_server.url), redis_server.url)
    yield front
    front.stop()


def test_queue_depth_counts_waiting_and_running_builds(redis_client: redis.Redis, gateway: ThreadedFrontEnd) -> None:
    """What the page shows as queued / building for a target, from its stream."""
    queue, workers = gateway.front.queue, WorkerQueue(redis_client)
    workers.join([TARGET])
    workers.heartbeat("w1", [TARGET], ttl_s=30)
    for i in range(3):
        gateway.run(
            queue.enqueue(
                TARGET,
                Job(job_id=f"job{i}", plan_key=f"{'0' * 63}{i}/{TARGET.id}/opt-{'0' * 16}", query=pb.PlanQuery()),
            )
        )
    assert gateway.run(queue.depth(TARGET)) == (3, 0)
    [delivery] = workers.read("w1", [TARGET], block_ms=100)
    assert gateway.run(queue.depth(TARGET)) == (2, 1)
    [row] = gateway.run(status_of(gateway.front).report()).targets
    assert (row.target_id, row.live_workers, row.jobs_waiting, row.jobs_running) == (TARGET.id, 1, 2, 1)
    workers.ack(delivery)  # a finished job leaves the stream: its length is the queue's depth
    assert gateway.run(queue.depth(TARGET)) == (2, 0) and redis_client.xlen(keys.job_stream(TARGET)) == 2
    assert gateway.run(queue.depth(Target("sm_80", 91900, "1.32.0"))) == (0, 0)  # no stream at all


def test_recent_failures_are_capped_newest_first_and_survive_bad_records(
    redis_client: redis.Redis, gateway: ThreadedFrontEnd
) -> None:
    recorder = BuildRecorder(redis_client, lease_s=60)
    plan_keys = [f"{i:064x}/{TARGET.id}/opt-{'0' * 16}" for i in range(RECENT_FAILURES_KEPT + 5)]
    for i, plan_key in enumerate(plan_keys):
        recorder.finish(plan_key, f"job{i}", "w1", error=f"reason {i}", rejected=i % 2 == 0)
    redis_client.lpush(keys.RECENT_FAILURES, b"not json")
    failures = gateway.run(gateway.front.builds.recent_failures(RECENT_FAILURES_KEPT + 10))
    assert len(failures) == RECENT_FAILURES_KEPT  # the oldest 5 trimmed; the malformed record skipped
    assert [f.reason for f in failures[:2]] == [f"reason {len(plan_keys) - 1}", f"reason {len(plan_keys) - 2}"]
    assert failures[0].target_id == TARGET.id and failures[0].rejected


def test_page_answers_503_with_the_reason_while_redis_is_down() -> None:
    """During a Redis outage the page says so (and /metrics still answers)."""
    from plancache_server.web.http import WebServer

    # A port this test holds bound and never listens on: refused for the whole test. A port found free and let
    # go could be taken by another test process's server meanwhile (a loaded suite: "Connection closed by server").
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    unreachable = f"redis://127.0.0.1:{held.getsockname()[1]}/0"
    front = ThreadedFrontEnd(Settings(listen="127.0.0.1:0", redis_url=unreachable), unreachable)
    server = WebServer(free_port(), status=status_of(front.front), host="127.0.0.1", loop=front.loop).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for path in ("/", "/status.json"):
            status, body = _get(base + path)
            assert status == 503 and "status unavailable" in body and "connecting to 127.0.0.1" in body
        assert _get(base + "/metrics")[0] == 200
    finally:
        server.stop()
        front.stop()
        held.close()


@pytest.mark.parametrize(
    ("listen", "host"),
    [("127.0.0.1:50051", "127.0.0.1"), ("0.0.0.0:1", "0.0.0.0"), ("[::1]:50051", "::1"), ("localhost:7", "localhost")],
)
def test_the_metrics_port_binds_the_grpc_listen_host_by_default(listen: str, host: str) -> None:
    from plancache_server.web.http import listen_host

    assert listen_host(listen) == host


def test_the_metrics_port_listens_only_where_it_is_told() -> None:
    from plancache_server.web.http import serve

    server = serve(free_port(), host="127.0.0.1")
    assert server is not None
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.stop()


def test_refusals_are_counted_apart_from_failed_builds(gpuless_stack: Stack) -> None:
    from plancache import TargetUnavailable

    with gpuless_stack.client() as c:
        for _ in range(2):
            with pytest.raises(TargetUnavailable):
                c.compile(matmul_spec(), TARGET)
        deadline = time.monotonic() + 10
        while sum(t.windows["total"].refused for t in c.admin.stats()) < 2:
            assert time.monotonic() < deadline, [t.windows["total"] for t in c.admin.stats()]
            time.sleep(0.2)
        assert all(t.windows["total"].failures == 0 for t in c.admin.stats()), "a refusal is not a failed build"


def test_lookups_by_key_count_under_the_plans_op_family(stack: Stack) -> None:
    with stack.client() as c:
        plan = c.compile(matmul_spec(batch=3), TARGET)
        for _ in range(3):
            c.get(plan.key)  # by key: no spec, the plan's recorded family counts it
        deadline = time.monotonic() + 10
        while c.admin.family_stats().get("matmul", {}).get("total", WindowCounts()).hits < 3:
            assert time.monotonic() < deadline, c.admin.family_stats()
            time.sleep(0.2)

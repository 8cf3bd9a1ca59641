"""Prometheus metrics of one server or worker process (served by web.py on `--metrics-port`).

Front ends count requests by method and status code with their latency,
plan lookups (hit or miss) per target, and report on each scrape the job
queue of every known target (builds waiting, builds under way) and its live
workers. Workers count builds by outcome and time them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from plancache.errors import PlanCacheError
from plancache.target import Target
from plancache_server.directory import WorkerDirectory
from plancache_server.jobs import JobQueue

log = logging.getLogger(__name__)

REQUESTS = Counter("plancache_requests", "gRPC calls answered, by method and status code", ["method", "code"])
REQUEST_SECONDS = Histogram(
    "plancache_request_seconds", "gRPC call latency", ["method"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)  # fmt: skip
LOOKUPS = Counter("plancache_lookups", "plan lookups by target and result (hit, miss)", ["target", "result"])
PLANS_REFUSED = Counter(
    "plancache_plans_refused", "stored plans a front end refused to serve, by reason (integrity: blob or metadata damaged; signature)", ["reason"]
)
UNTRUSTED_BUILDS = Counter(
    "plancache_untrusted_builds", "builds whose plan this front end refused to serve (signed by a key it does not trust, or damaged), by target", ["target"]
)
BUILDS = Counter("plancache_builds", "builds finished by this worker, by target and outcome", ["target", "outcome"])
BUILD_SECONDS = Histogram("plancache_build_seconds", "build + autotune time of one plan", ["target"], buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 60, 120, 300, 900))
BUSY = Gauge("plancache_worker_busy", "1 while this worker is building (a piece of a build in its pool, or timing)")
BUILD_PROCESSES = Gauge("plancache_worker_build_processes", "processes (or threads) this worker builds plans in, side by side")

# Label children, looked up once: prometheus_client's labels() formats and
# locks on every call, a measurable share of a hit's cost.
_children: dict[tuple[object, tuple[str, ...]], Any] = {}


def child(metric: Counter | Histogram, *labels: str) -> Any:
    """metric.labels(*labels), cached (label sets are bounded by design)."""
    key = (metric, labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


class QueueCollector(Collector):
    """Queue depth and live workers per target, read from Redis at scrape time
    (on the front end's event loop; the scrape thread waits for it)."""

    def __init__(self, queue: JobQueue, directory: WorkerDirectory, loop: asyncio.AbstractEventLoop) -> None:
        self._queue = queue
        self._directory = directory
        self._loop = loop

    async def _read(self) -> list[tuple[str, int, int, int]]:
        await self._directory.refresh()
        rows = []
        for target_id, workers in sorted(self._directory.live.items()):
            queued, taken = await self._queue.depth(Target.parse(target_id))
            rows.append((target_id, queued, taken, len(workers)))
        return rows

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without values. With describe(), registering does not
        call collect(): collect() waits on the event loop, and registering
        runs on its thread (it stalled every start-up for collect's 10 s timeout)."""
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("plancache_jobs_waiting", "builds queued and not yet taken by a worker", labels=["target"]),
            GaugeMetricFamily("plancache_jobs_running", "builds taken by a worker and not finished", labels=["target"]),
            GaugeMetricFamily("plancache_live_workers", "workers with a live heartbeat", labels=["target"]),
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting, running, workers = self._families()
        try:
            for target_id, queued, taken, live in asyncio.run_coroutine_threadsafe(self._read(), self._loop).result(timeout=10):
                waiting.add_metric([target_id], float(queued))
                running.add_metric([target_id], float(taken))
                workers.add_metric([target_id], float(live))
        except (PlanCacheError, TimeoutError) as e:
            log.debug("queue metrics unavailable: %s", e)
        yield from (waiting, running, workers)


def report_queues(queue: JobQueue, directory: WorkerDirectory, loop: asyncio.AbstractEventLoop) -> None:
    """Front ends add the queues of every target to their /metrics."""
    REGISTRY.register(QueueCollector(queue, directory, loop))


class StoreCollector(Collector):
    """The plan store per target, read from Redis at scrape time (one HGETALL)."""

    def __init__(self, usage: Callable[[], dict[str, Any]]) -> None:
        self._usage = usage

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stored = GaugeMetricFamily("plancache_store_bytes", "bytes of the plans stored (blob, metadata, signature)", labels=["target"])
        plans = GaugeMetricFamily("plancache_store_plans", "plans stored", labels=["target"])
        evicted = CounterMetricFamily("plancache_store_evicted", "plans deleted to keep the store under --store-max-mb", labels=["target"])
        expired = CounterMetricFamily("plancache_store_expired", "plans deleted after --retention-days unused", labels=["target"])
        try:
            for target_id, usage in sorted(self._usage().items()):
                stored.add_metric([target_id], float(usage.stored_bytes))
                plans.add_metric([target_id], float(usage.stored_plans))
                evicted.add_metric([target_id], float(usage.evicted))
                expired.add_metric([target_id], float(usage.expired))
        except PlanCacheError as e:
            log.debug("store metrics unavailable: %s", e)
        yield from (stored, plans, evicted, expired)


class WarmCollector(Collector):
    """Warming per target, read from Redis at scrape time (plancache_server.warming)."""

    def __init__(self, status: Callable[[], list[Any]]) -> None:
        self._status = status

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("plancache_warm_coverage", "share of the warming source's last-24 h hits whose plan is stored for the target", labels=["target"]),
            GaugeMetricFamily("plancache_warm_remaining", "specs of the target's warming plan not yet built, skipped or failed", labels=["target"]),
            GaugeMetricFamily("plancache_warm_failed", "specs of the target's warming plan that failed", labels=["target"]),
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        coverage, remaining, failed = self._families()
        try:
            for status in self._status():
                coverage.add_metric([status.target_id], status.coverage)
                remaining.add_metric([status.target_id], float(status.remaining))
                failed.add_metric([status.target_id], float(status.failed))
        except PlanCacheError as e:
            log.debug("warming metrics unavailable: %s", e)
        yield from (coverage, remaining, failed)


def report_warming(status: Callable[[], list[Any]]) -> None:
    """Front ends add warming's coverage per target to their /metrics."""
    REGISTRY.register(WarmCollector(status))


def report_store(usage: Callable[[], dict[str, Any]]) -> None:
    """Front ends add the store's size per target to their /metrics."""
    REGISTRY.register(StoreCollector(usage))

"""Prometheus metrics of one server or worker process (`--metrics-port`).

Front ends count requests by method and status code with their latency,
plan lookups (hit or miss) per target, and report on each scrape the job
queue of every known target (builds waiting, builds under way) and its live
workers. Workers count builds by outcome and time them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import redis
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from plancache.errors import PlanCacheError
from plancache.target import Target
from plancache_server import keys
from plancache_server.jobs import JobQueue

log = logging.getLogger(__name__)

REQUESTS = Counter("plancache_requests", "gRPC calls answered, by method and status code", ["method", "code"])
REQUEST_SECONDS = Histogram(
    "plancache_request_seconds", "gRPC call latency", ["method"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)  # fmt: skip
LOOKUPS = Counter("plancache_lookups", "plan lookups by target and result (hit, miss)", ["target", "result"])
BUILDS = Counter("plancache_builds", "builds finished by this worker, by target and outcome", ["target", "outcome"])
BUILD_SECONDS = Histogram("plancache_build_seconds", "build + autotune time of one plan", ["target"], buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 60, 120, 300, 900))
BUSY = Gauge("plancache_worker_busy", "1 while this worker is building")


class QueueCollector(Collector):
    """Queue depth and live workers per target, read from Redis at scrape time."""

    def __init__(self, client: redis.Redis, queue: JobQueue) -> None:
        self._redis = client
        self._queue = queue

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = GaugeMetricFamily("plancache_jobs_waiting", "builds queued and not yet taken by a worker", labels=["target"])
        running = GaugeMetricFamily("plancache_jobs_running", "builds taken by a worker and not finished", labels=["target"])
        workers = GaugeMetricFamily("plancache_live_workers", "workers with a live heartbeat", labels=["target"])
        try:
            for target_id in self._queue.known_targets():
                stream = keys.job_stream(Target.parse(target_id))
                groups = self._redis.xinfo_groups(stream) if self._redis.exists(stream) else []
                group = next((g for g in groups if g["name"] in (keys.JOB_GROUP, keys.JOB_GROUP.encode())), None)  # type: ignore[union-attr]
                waiting.add_metric([target_id], float((group or {}).get("lag") or 0))
                running.add_metric([target_id], float((group or {}).get("pending") or 0))
                workers.add_metric([target_id], float(self._queue.live_workers(Target.parse(target_id))))
        except (PlanCacheError, redis.RedisError) as e:
            log.debug("queue metrics unavailable: %s", e)
        yield from (waiting, running, workers)


def serve(port: int, client: redis.Redis | None = None, queue: JobQueue | None = None) -> None:
    """Expose /metrics on `port` (0: off); front ends also report the queues."""
    if not port:
        return
    if client is not None and queue is not None:
        REGISTRY.register(QueueCollector(client, queue))
    start_http_server(port)
    log.info("Prometheus metrics on :%d/metrics", port)

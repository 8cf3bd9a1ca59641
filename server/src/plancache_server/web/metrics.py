"""Metrics read from Redis at scrape time (served by plancache_server.web.http
on `--metrics-port`): the job queue of every known target (builds waiting,
builds under way) and its live workers, the store's size per target,
warming's coverage. The process's own counters are plancache_server.telemetry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from plancache.errors import PlanCacheError
from plancache.keys.target import Target
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.jobs import JobQueue

log = logging.getLogger(__name__)


class QueueCollector(Collector):
    """Queue depth and live workers per target, read from Redis at scrape time
    (on the gateway's event loop; the scrape thread waits for it)."""

    def __init__(self, queue: JobQueue, directory: WorkerDirectory, loop: asyncio.AbstractEventLoop) -> None:
        self._queue = queue
        self._directory = directory
        self._loop = loop

    async def _read(self) -> list[tuple[str, int, int, int]]:
        """Every known target, those without a live worker too (0, not absent:
        an alert on a target with traffic and no worker needs the 0)."""
        await self._directory.refresh()
        rows = []
        for target_id in sorted(self._directory.known | set(self._directory.live)):
            queued, taken = await self._queue.depth(Target.parse(target_id))
            rows.append((target_id, queued, taken, len(self._directory.live.get(target_id, ()))))
        return rows

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without values. With describe(), registering does not
        call collect(): collect() waits on the event loop, and registering
        runs on its thread (it stalled every start-up for collect's 10 s timeout)."""
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "plancache_jobs_waiting", "builds queued and not yet taken by a worker", labels=["target"]
            ),
            GaugeMetricFamily("plancache_jobs_running", "builds taken by a worker and not finished", labels=["target"]),
            GaugeMetricFamily("plancache_live_workers", "workers with a live heartbeat", labels=["target"]),
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting, running, workers = self._families()
        try:
            for target_id, queued, taken, live in asyncio.run_coroutine_threadsafe(self._read(), self._loop).result(
                timeout=10
            ):
                waiting.add_metric([target_id], float(queued))
                running.add_metric([target_id], float(taken))
                workers.add_metric([target_id], float(live))
        except (PlanCacheError, TimeoutError) as e:
            log.debug("queue metrics unavailable: %s", e)
        yield from (waiting, running, workers)


def report_queues(queue: JobQueue, directory: WorkerDirectory, loop: asyncio.AbstractEventLoop) -> None:
    """Gateways add the queues of every target to their /metrics."""
    REGISTRY.register(QueueCollector(queue, directory, loop))


class StoreCollector(Collector):
    """The plan store per target, read from Redis at scrape time (one HGETALL)."""

    def __init__(self, usage: Callable[[], dict[str, Any]]) -> None:
        self._usage = usage

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stored = GaugeMetricFamily(
            "plancache_store_bytes", "bytes of the plans stored (blob, metadata, signature)", labels=["target"]
        )
        plans = GaugeMetricFamily("plancache_store_plans", "plans stored", labels=["target"])
        evicted = CounterMetricFamily(
            "plancache_store_evicted_total", "plans deleted to keep the store under --store-max-mb", labels=["target"]
        )
        expired = CounterMetricFamily(
            "plancache_store_expired_total", "plans deleted after --retention-days unused", labels=["target"]
        )
        abandoned = CounterMetricFamily(
            "plancache_jobs_abandoned_total",
            "callers' builds dropped unbuilt: every caller had gone when a worker took the job",
            labels=["target"],
        )
        try:
            for target_id, usage in sorted(self._usage().items()):
                abandoned.add_metric([target_id], float(usage.abandoned))
                stored.add_metric([target_id], float(usage.stored_bytes))
                plans.add_metric([target_id], float(usage.stored_plans))
                evicted.add_metric([target_id], float(usage.evicted))
                expired.add_metric([target_id], float(usage.expired))
        except PlanCacheError as e:
            log.debug("store metrics unavailable: %s", e)
        yield from (stored, plans, evicted, expired, abandoned)


class WarmCollector(Collector):
    """Warming per target, read from Redis at scrape time (plancache_server.store.warming)."""

    def __init__(self, status: Callable[[], list[Any]]) -> None:
        self._status = status

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "plancache_warm_coverage_ratio",
                "share of the warming source's last-24 h hits whose plan is stored for the target",
                labels=["target"],
            ),
            GaugeMetricFamily(
                "plancache_warm_remaining",
                "specs of the target's warming plan not yet built, skipped or failed",
                labels=["target"],
            ),
            GaugeMetricFamily(
                "plancache_warm_failed", "specs of the target's warming plan that failed", labels=["target"]
            ),
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
    """Gateways add warming's coverage per target to their /metrics."""
    REGISTRY.register(WarmCollector(status))


def report_store(usage: Callable[[], dict[str, Any]]) -> None:
    """Gateways add the store's size per target to their /metrics."""
    REGISTRY.register(StoreCollector(usage))


class MemoryCacheCollector(Collector):
    """The gateway's memory cache of verified plans (plancache_server.gateway.memory_cache):
    what it holds against --memory-cache-mb, read at scrape time (two ints; no lock needed)."""

    def __init__(self, held: Callable[[], tuple[int, int]]) -> None:
        self._held = held

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counted, plans = self._held()
        yield GaugeMetricFamily(
            "plancache_gateway_memory_cache_bytes",
            "bytes the gateway's plan cache counts against --memory-cache-mb (a plan's blob and its kept encodings)",
            value=float(counted),
        )
        yield GaugeMetricFamily(
            "plancache_gateway_memory_cache_plans", "plans in the gateway's memory cache", value=float(plans)
        )


def report_memory_cache(held: Callable[[], tuple[int, int]]) -> None:
    """Gateways with a memory cache add what it holds to their /metrics (memory sizing, leak hunting)."""
    REGISTRY.register(MemoryCacheCollector(held))


class LoopCollector(Collector):
    """The gateway's event loop: how busy (plancache_server.gateway.loop_load) and what pacing callers' turns
    to their shares cost them (plancache_server.gateway.shares.FairTurns), read at scrape time."""

    def __init__(self, read: Callable[[], tuple[float, float]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        share, paced = self._read()
        yield GaugeMetricFamily(
            "plancache_gateway_loop_busy_ratio",
            "share of the time the event loop's thread was runnable (on a CPU or waiting for one; smoothed over "
            "~100 ms; past --busy-loop-share callers' turns are paced)",
            value=share,
        )
        yield CounterMetricFamily(
            "plancache_gateway_paced_seconds",
            "seconds callers' steps waited for their share of a busy loop",
            value=paced,
        )


def report_loop(read: Callable[[], tuple[float, float]]) -> None:
    """Gateways add their event loop's load and pacing to their /metrics."""
    REGISTRY.register(LoopCollector(read))


# Workloads /metrics lists (the most recently reported): a bound on its series, whatever names nodes send.
WORKLOADS_LISTED = 50


class WorkloadCollector(Collector):
    """Workloads' start-up records (plancache_server.store.workloads), the
    WORKLOADS_LISTED most recently reported, read from Redis at scrape time on
    the gateway's event loop."""

    def __init__(self, summaries: Callable[[int], Any], loop: asyncio.AbstractEventLoop) -> None:
        self._summaries = summaries
        self._loop = loop

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families()

    def _families(
        self,
    ) -> tuple[GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily, CounterMetricFamily, CounterMetricFamily]:
        labels = ["target", "workload"]
        return (
            GaugeMetricFamily("plancache_workload_plans", "plans in a workload's start-up record", labels=labels),
            CounterMetricFamily(
                "plancache_workload_processes", "processes of a workload that read its start-up record", labels=labels
            ),
            CounterMetricFamily(
                "plancache_workload_prefetch_plans",
                "plans processes of a workload prefetched at start-up, by outcome (prefetched, used, wasted)",
                labels=[*labels, "outcome"],
            ),
            CounterMetricFamily(
                "plancache_workload_streams_stopped",
                "processes of a workload whose start-up stream brought none of their first graphs and stopped "
                "(another program under the same name, or a stale record)",
                labels=labels,
            ),
            CounterMetricFamily(
                "plancache_workload_stream_verdicts",
                "processes of a workload that said at their end whether their start-up stream served them (served) "
                "or not (mixed: stopped, or a quarter of the record unused); a record whose last verdicts all say "
                "served is deserialized by new processes before their graphs ask",
                labels=[*labels, "verdict"],
            ),
        )

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        plans, processes, prefetch, stopped, verdicts = self._families()
        try:
            found = asyncio.run_coroutine_threadsafe(self._summaries(WORKLOADS_LISTED), self._loop).result(timeout=10)
            for summary in found:
                labels = [summary.target_id, summary.name]
                plans.add_metric(labels, float(summary.plans))
                processes.add_metric(labels, float(summary.counts.get("processes", 0)))
                for outcome in ("prefetched", "used", "wasted"):
                    prefetch.add_metric([*labels, outcome], float(summary.counts.get(outcome, 0)))
                stopped.add_metric(labels, float(summary.counts.get("stopped", 0)))
                for verdict in ("served", "mixed"):
                    verdicts.add_metric([*labels, verdict], float(summary.counts.get(verdict, 0)))
        except (PlanCacheError, TimeoutError) as e:
            log.debug("workload metrics unavailable: %s", e)
        yield from (plans, processes, prefetch, stopped, verdicts)


def report_workloads(summaries: Callable[[int], Any], loop: asyncio.AbstractEventLoop) -> None:
    """Gateways add workloads' start-up records to their /metrics."""
    REGISTRY.register(WorkloadCollector(summaries, loop))

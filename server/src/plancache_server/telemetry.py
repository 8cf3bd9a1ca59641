"""The process's Prometheus counters and gauges, defined once (any layer
counts; plancache_server.web serves them with its scrape-time collectors).

Gateways count requests by method and status code with their latency,
plan lookups (hit or miss) per target, refused plans and untrusted builds,
and what nodes report of their graphs and races; workers count builds by
outcome and time them. Every process says what it runs in
plancache_build_info (1, its labels the versions).

Names follow Prometheus' conventions: a counter's name ends in _total, a
histogram is named for what it times and ends in its unit (_seconds), a
gauge of a share ends in _ratio, of a size in _bytes.
"""

from __future__ import annotations

import platform
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from plancache.versions import NOT_INSTALLED, distribution_version, stack_versions

REQUESTS = Counter("plancache_requests_total", "gRPC calls answered, by method and status code", ["method", "code"])
REQUEST_SECONDS = Histogram(
    "plancache_request_duration_seconds",
    "seconds from a gRPC call's arrival to its answer, by method",
    ["method"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
CALLER_REFUSALS = Counter(
    "plancache_caller_refusals_total",
    "calls and Prefetch refs refused because their caller held all it may (by bound: streams, refs, waiters, builds;"
    " loop: its turns on a busy event loop booked past the horizon)",
    ["bound"],
)
LOOKUPS = Counter("plancache_lookups_total", "plan lookups by target and result (hit, miss)", ["target", "result"])
FAMILY_MEMBERS = Counter(
    "plancache_family_members_total",
    "graph family members asked for and not stored, by outcome: queued, over_budget (past the workload's "
    "--family-budget), cancelled (CancelFamily, not built yet)",
    ["outcome"],
)
PLANS_REFUSED = Counter(
    "plancache_plans_refused_total",
    "stored plans a gateway refused to serve, by reason (integrity: blob or metadata damaged; signature)",
    ["reason"],
)
UNTRUSTED_BUILDS = Counter(
    "plancache_untrusted_builds_total",
    "builds whose plan this gateway refused to serve (signed by a key it does not trust, or damaged), by target",
    ["target"],
)
# What nodes reported of their own graphs (ReportFirstUses), as this gateway received it: summed over
# gateways, the fleet's. Labels are folded into fixed sets (plancache_server.store.fleet).
FLEET_GRAPHS = Counter(
    "plancache_fleet_graphs_total",
    "graphs nodes reported, by target, front door, outcome (served, disk_cache, local), reason class and node type",
    ["target", "path", "outcome", "reason", "node_type"],
)
FLEET_RACES = Counter(
    "plancache_fleet_races_total", "hedged misses nodes reported, by front door and result", ["path", "result"]
)
BUILDS = Counter(
    "plancache_builds_total", "builds finished by this worker, by target and outcome", ["target", "outcome"]
)
UNREPLICATED = Counter(
    "plancache_unreplicated_plans_total",
    "plans this worker stored and announced before --store-replicas replicas held them (past "
    "--store-replicas-wait-ms, or the plan's slot moved meanwhile): a failover now could lose them",
)
BUILD_SECONDS = Histogram(
    "plancache_build_duration_seconds",
    "seconds from a worker taking a build job to its end (heuristic plan, candidates, autotuning; "
    "failed builds too), by target",
    ["target"],
    buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 60, 120, 300, 900),
)
BUSY = Gauge("plancache_worker_busy", "1 while this worker is building (a piece of a build in its pool, or timing)")
YIELDING = Gauge(
    "plancache_worker_yielding",
    "builds this worker holds back while callers that build them themselves (hedged misses) keep asking "
    "(--hedged-quiet; each at most --hedged-hold-max)",
)
BUILD_PROCESSES = Gauge(
    "plancache_worker_build_processes", "processes (or threads) this worker builds plans in, side by side"
)

BUILD_INFO = Gauge(
    "plancache_build_info",
    "1; the labels say what this process runs: plancache-server's version, Python's, the plancache client "
    "library's and the GPU stack's as installed (none: not installed)",
    ["version", "python", "plancache", "cudnn_frontend", "cudnn", "torch"],
)


def _report_build_info() -> None:
    stack = {k: ("none" if v == NOT_INSTALLED else v) for k, v in stack_versions().items()}
    BUILD_INFO.labels(
        distribution_version("plancache-server"),
        platform.python_version(),
        distribution_version("plancache"),
        stack["cudnn_frontend"],
        stack["cudnn"],
        stack["torch"],
    ).set(1)


_report_build_info()

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

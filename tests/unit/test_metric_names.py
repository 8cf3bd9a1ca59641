"""Every metric plancache exports follows Prometheus' naming conventions: the plancache_ prefix, counters
ending in _total, histograms named for what they time and ending in their unit, ratios in _ratio; and
plancache_build_info says, as 1, what the process runs."""

from __future__ import annotations

import asyncio
import importlib.metadata
import platform
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric

from plancache.versions import stack_versions
from plancache_server import telemetry
from plancache_server.web.metrics import QueueCollector, StoreCollector, WarmCollector


def _families() -> Iterator[Metric]:
    registry = CollectorRegistry()
    for metric in (getattr(telemetry, n) for n in dir(telemetry)):
        if hasattr(metric, "_name") and hasattr(metric, "collect") and metric in REGISTRY._collector_to_names:
            registry.register(metric)
    yield from registry.collect()
    loop = asyncio.new_event_loop()
    try:
        yield from QueueCollector(None, None, loop).describe()  # type: ignore[arg-type]
    finally:
        loop.close()
    yield from StoreCollector(dict).collect()
    yield from WarmCollector(list).collect()


FAMILIES = {f.name: f for f in _families()}


def test_every_metric_is_seen() -> None:
    assert len(FAMILIES) >= 20
    assert {"plancache_requests", "plancache_request_duration_seconds", "plancache_build_info"} <= set(FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_name_follows_the_conventions(name: str) -> None:
    family = FAMILIES[name]
    assert name.startswith("plancache_") and name == name.lower()
    if family.type == "counter":
        assert not name.endswith("_total")  # the family's name; its sample is <name>_total
        assert all(s.name in (f"{name}_total", f"{name}_created") for s in family.samples)
    elif family.type == "histogram":
        assert name.endswith(("_duration_seconds", "_bytes")), "a histogram names what it times, in its unit"
    else:
        assert not name.endswith("_total"), "_total is a counter's"
        assert not name.endswith(("_seconds", "_bytes")) or family.type == "gauge"
    if "share" in family.documentation or "ratio" in family.documentation:
        assert name.endswith("_ratio"), "a share is a _ratio"


def test_build_info_is_one_labelled_with_the_versions() -> None:
    (sample,) = FAMILIES["plancache_build_info"].samples
    stack = stack_versions()
    assert sample.value == 1.0
    assert sample.labels == {
        "version": importlib.metadata.version("plancache-server"),
        "plancache": importlib.metadata.version("plancache"),
        "python": platform.python_version(),
        "cudnn_frontend": stack["cudnn_frontend"].replace("not installed", "none"),
        "cudnn": stack["cudnn"].replace("not installed", "none"),
        "torch": stack["torch"].replace("not installed", "none"),
    }

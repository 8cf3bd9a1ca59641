"""Fabricated status reports for the status page's tests: one with every section filled, whose every text
that reaches the page from outside (target ids, plan keys, worker names, failure reasons, engine names, spec
hashes, op families, warming sources, reasons reported by nodes) can be made hostile."""

from __future__ import annotations

from plancache_server.store.build_records import FailedBuild
from plancache_server.store.fleet import Coverage, LocalBuilds, LocalSpec
from plancache_server.store.lifecycle import TargetUsage
from plancache_server.store.stats import Bucket
from plancache_server.store.warm_progress import WarmStatus
from plancache_server.web.status import GraphFamilyStatus, StatusReport, TargetStatus, TopEntry
from tests.support.standin import STANDIN_TARGET as TARGET

NOW = 1_795_000_000.0
KEY = f"{'ab' * 32}/{TARGET.id}/opt-{'0' * 16}"
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def _windows(hits: float, misses: float, **more: float) -> dict[str, dict[str, float]]:
    lookups = {"hits": hits, "misses": misses}
    return {"5m": lookups, "1h": lookups, "24h": {}, "total": {**lookups, **more}}


def full_report(text: str = "x", range_: str = "1h") -> StatusReport:
    """Every section of the page filled; `text` goes into every string that came from a caller, a worker or
    a node (HOSTILE to check escaping). Plan keys that embed `text` are not plan keys: they are shown as
    they are, as the page shows whatever Redis holds."""
    odd_key = f"{text}/{KEY}"
    reasons = [LocalBuilds(f"{text}-reason", f"{text}-node", 6, f"{text}-means"), LocalBuilds("no_server", "", 2, "")]
    fleet = Coverage(served=30, disk_cache=10, local=8, local_by_reason=reasons)
    history = [Bucket(NOW - 60 * (5 - i), v) for i, v in enumerate([{"hits": 1, "misses": 1}, {}, {"hits": 3}])]
    targets = [
        TargetStatus(
            TARGET.id,
            live_workers=2,
            jobs_waiting=5,
            jobs_running=1,
            windows=_windows(
                90,
                10,
                compiles=4,
                joined=2,
                first_uses_local=1,
                untrusted_builds=1,
                build_seconds_saved=7200,
                bytes_served=3 * 2**20,
            ),
            history=history,
            stored=TargetUsage(stored_bytes=3 * 2**20, stored_plans=40, evicted=7, expired=2),
            fleet={"total": fleet, "5m": fleet},
        ),
        TargetStatus(
            f"{text}-target",
            live_workers=0,
            jobs_waiting=0,
            jobs_running=0,
            windows=_windows(1, 9, refused=4),
            history=[Bucket(NOW - 60, {"misses": 2})],
        ),
        TargetStatus("sm_80/cudnn-91900/fe-1.32.0", 1, 0, 0, _windows(0, 0), []),
    ]
    top = [
        TopEntry(KEY, TARGET.id, 12_345, 7_200.0, True, 2.5, 3 * 2**20, f"{text}-engine"),
        TopEntry(odd_key, f"{text}-target", 2, 5.0, False, 0.0, 0, ""),
    ]
    failures = [
        FailedBuild(at=NOW - 5, plan_key=KEY, worker=f"{text}-worker", reason=f"{text}-reason", rejected=True),
        FailedBuild(at=NOW - 9, plan_key=KEY, worker="w1", reason="worker lost", rejected=False),
    ]
    warming = [
        WarmStatus(
            TARGET.id, f"{text}-source", "running", 10, 4, 1, 1, 2, 100.0, 40.0, failures=[(KEY, f"{text}-why")]
        ),
        WarmStatus("sm_80/cudnn-91900/fe-1.32.0", "sm_90/cudnn-91900/fe-1.32.0", "done", 3, 3),
    ]
    return StatusReport(
        generated_at=NOW,
        range=range_,
        targets=targets,
        families={
            f"{text}-family": _windows(3, 1, compiles=1, failures=1, build_seconds_saved=4),
            "matmul": _windows(1, 0),
        },
        top_by_hits=top,
        top_by_seconds_saved=top[:1],
        recent_failures=failures,
        retire_eligible={f"{text}-old": NOW - 100 * 86400, "sm_75/cudnn-1/fe-1.0.0": None},
        retire_after_days=90,
        warming=warming,
        fleet={"total": fleet, "5m": fleet, "1h": Coverage()},
        fleet_races={f"{text}-door": {"service_won": 3, "local_won": 1}},
        local_specs=[LocalSpec(TARGET.id, f"{text}-reason", f"{text}-node", f"{text}{'f' * 64}", 3)],
        lost_to_repair=[KEY, odd_key],
        graph_families=[
            GraphFamilyStatus(
                f"family-{text}", TARGET.id, f"{text}-workload", 512, 300, 12, 9 * 2**20, False, NOW - 60
            ),
            GraphFamilyStatus("family-cancelled", TARGET.id, "", 64, 0, 0, 0, True, NOW - 3600),
        ],
    )


def empty_report(range_: str = "24h") -> StatusReport:
    return StatusReport(NOW, range_, [], {}, [], [], [])

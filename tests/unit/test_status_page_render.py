"""The status page's HTML, from fabricated reports: what reaches the page
from callers and workers is escaped, empty states say so, the chart breaks
its line where nothing was asked."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from plancache_server.store.build_records import FailedBuild
from plancache_server.store.stats import Bucket
from plancache_server.web.status import StatusReport, TargetStatus, TopEntry
from plancache_server.web.status_page import render
from tests.support.standin import STANDIN_TARGET as TARGET

NOW = 1_795_000_000.0
KEY = f"{'ab' * 32}/{TARGET.id}/opt-{'0' * 16}"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []  # as a browser shows them (character references resolved)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.texts.append(data)


def _parse(page: str) -> _Tags:
    tags = _Tags()
    tags.feed(page)
    return tags


def _report(
    history: list[Bucket],
    failures: list[FailedBuild] = (),  # type: ignore[assignment]
    top: list[TopEntry] = (),  # type: ignore[assignment]
) -> StatusReport:
    windows = {
        "5m": {"hits": 3, "misses": 1},
        "1h": {"hits": 3, "misses": 1},
        "24h": {},
        "total": {"hits": 3, "misses": 1, "bytes_served": 3 * 2**20},
    }
    target = TargetStatus(
        TARGET.id,
        live_workers=2,
        jobs_waiting=5,
        jobs_running=1,
        windows=windows,  # type: ignore[arg-type]
        history=history,
    )
    return StatusReport(
        NOW,
        "1h",
        [target],
        {"matmul": windows},  # type: ignore[arg-type]
        list(top),
        list(top),
        list(failures),
    )


def test_text_from_callers_and_workers_is_escaped() -> None:
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    failure = FailedBuild(at=NOW, plan_key=KEY, worker='w"><b>1', reason=hostile, rejected=False)
    entry = TopEntry(KEY, TARGET.id, 3, 1.5, True, 0.5, 75_000, plan_name="<i>eng</i>")
    page = render(_report([], [failure], [entry]))
    tags = {tag for tag, _ in _parse(page).tags}
    assert "script" not in tags and "img" not in tags and "b" not in tags and "i" not in tags
    assert hostile in _parse(page).texts  # shown as the text it is
    assert "build failed" in page and "rejected by cuDNN" not in page


def test_empty_report_says_nothing_happened_yet() -> None:
    page = render(StatusReport(NOW, "24h", [], {}, [], [], []))
    for text in ("no target yet", "no hit yet", "no failed build recorded", "nothing asked yet"):
        assert text in page
    assert re.search(r'class="current"[^>]*>24 h<', page) or re.search(r"class=current>24 h<", page)


def test_chart_has_a_bucket_per_minute_and_breaks_where_nothing_was_asked() -> None:
    values = [{"hits": 1, "misses": 1}, {"hits": 2}, {}, {"hits": 1, "misses": 3}, {"misses": 2}]
    history = [Bucket(NOW - 60 * (len(values) - i), v) for i, v in enumerate(values)]  # type: ignore[misc]
    tags = _parse(render(_report(history))).tags
    buckets = [a for tag, a in tags if tag == "g" and "data-lookups" in a]
    assert [float(b["data-lookups"]) for b in buckets] == [2, 2, 0, 4, 2]
    assert [b["data-hit-rate"] for b in buckets] == ["0.5000", "1.0000", "", "0.2500", "0.0000"]
    assert sum(tag == "circle" for tag, _ in tags) == 4
    lines = [a["points"].split() for tag, a in tags if tag == "polyline"]
    assert [len(points) for points in lines] == [2, 2]  # one segment each side of the empty minute


def test_numbers_are_formatted_for_people() -> None:
    entry = TopEntry(KEY, TARGET.id, 12_345, 7_200.0, True, 2.5, 3 * 2**20, "eng")
    gone = TopEntry(KEY.replace("ab", "cd"), TARGET.id, 2, 5.0, False, 0.0, 0, "")
    page = render(_report([], top=[entry, gone]))
    assert ">12,345<" in page and ">2.0 h<" in page and ">3.0 MiB<" in page and ">2.50 s<" in page
    assert ">75.0 %<" in page  # 3 hits of 4 lookups
    assert "no longer stored" in page


def test_a_target_without_workers_says_why_everything_misses() -> None:
    windows = {"5m": {"misses": 4, "refused": 4}, "1h": {}, "24h": {}, "total": {"misses": 4, "refused": 4}}
    served = TargetStatus(
        TARGET.id,
        live_workers=1,
        jobs_waiting=0,
        jobs_running=0,
        windows=windows,  # type: ignore[arg-type]
        history=[],
    )
    orphan = TargetStatus(
        "sm_80/cudnn-91900/fe-1.32.0", live_workers=0, jobs_waiting=0, jobs_running=0, windows=windows, history=[]
    )  # type: ignore[arg-type]
    page = render(StatusReport(NOW, "1h", [served, orphan], {}, [], [], []))
    hints = [attrs for tag, attrs in _parse(page).tags if attrs.get("data-hint") == "no-worker"]
    assert len(hints) == 1, "only the target without a live worker gets the hint"
    assert "every missing plan is refused (TargetUnavailable); 4 compile(s) refused so far" in page
    assert re.search(r"<th[^>]*>refused</th>", page)


def test_the_store_per_target_is_shown() -> None:
    from plancache_server.store.lifecycle import TargetUsage

    target = TargetStatus(
        TARGET.id,
        1,
        0,
        0,
        {"total": {}},
        [],
        TargetUsage(stored_bytes=3 * 2**20, stored_plans=40, evicted=7, expired=2),
    )  # type: ignore[arg-type]
    page = render(StatusReport(NOW, "1h", [target], {}, [], [], []))
    assert re.search(r"<th[^>]*>stored</th>", page) and " in 40<" in page and ">7 / 2<" in page


def test_retired_eligible_targets_are_listed_with_the_command() -> None:
    page = render(
        StatusReport(
            NOW,
            "1h",
            [],
            {},
            [],
            [],
            [],
            {"sm_80/cudnn-91900/fe-1.32.0": NOW - 100 * 86400, "sm_75/cudnn-1/fe-1.0.0": None},
            90,
        )
    )
    assert "Retired-eligible targets (no worker for 90 days" in page
    assert "plancache retire --target sm_80/cudnn-91900/fe-1.32.0" in page and "never (or before this version)" in page
    assert "none: every target" in render(StatusReport(NOW, "1h", [], {}, [], [], []))

"""The status page with every section filled (a fabricated report, the signing keys among them), as
headless Chromium lays it out: no table cut at 1440 px, nothing wider than a 390 px phone but tables that
scroll inside their section with their first column kept in view. Screenshots go to build/test-artifacts/."""

from __future__ import annotations

import pytest

from plancache_server.web.status_page import render
from tests.support.browser import artifacts_dir, layout, screenshot_html
from tests.support.status_reports import full_report

pytestmark = pytest.mark.slow

KEYS = [
    {
        "key_id": "plan-signing-2026-01",
        "fingerprint": "SHA256:n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg",
        "state": "active",
    },
    {
        "key_id": "plan-signing-2025-06",
        "fingerprint": "SHA256:YDA64iuZiGG847KPM+7BvnWKITyGyTwHbb6fVYwRx1I",
        "state": "retired",
    },
]


@pytest.fixture(scope="module")
def page() -> str:
    return render(full_report("a-long-worker-name-of-a-node"), signing_keys=KEYS)


def test_every_section_fits_1440_px_with_no_cut_column(page: str) -> None:
    measured = layout(page, 1440)
    assert measured["viewport"] == 1440 and measured["page_width"] <= 1440
    tables = measured["tables"]
    assert isinstance(tables, list) and "signing-keys" in {t["section"] for t in tables}
    cut = [t for t in tables if t["width"] > t["room"] + 1]
    assert not cut, f"tables wider than their section at 1440 px: {cut}"
    screenshot_html(page, artifacts_dir() / "status-page-full-1440.png", 1440)


def test_every_section_is_usable_on_a_390_px_phone(page: str) -> None:
    measured = layout(page, 390)
    assert measured["page_width"] <= 390, "the page itself scrolls sideways on a phone"
    sections = measured["sections"]
    assert isinstance(sections, list) and all(s["left"] >= 0 and s["right"] <= 390 for s in sections), sections
    tables = measured["tables"]
    assert isinstance(tables, list)
    for table in tables:
        if table["width"] > table["room"] + 1:
            assert table["overflow"] == "auto" and table["first_column"] == "sticky", table
    keys = next(t for t in tables if t["section"] == "signing-keys")
    assert keys["width"] <= keys["room"] + 1, "a fingerprint wraps rather than widening its table"
    screenshot_html(page, artifacts_dir() / "status-page-full-390.png", 390)

"""The status page: one self-contained HTML document (inline CSS and SVG, no
script, no external asset) so it renders behind any firewall, in any
browser, and in a headless screenshot. It fits a 1440 px window with no
column cut, and a phone's 390 px: tables wider than the screen scroll
inside their section with the first column (what a row is) kept in view,
charts shrink to the width.

The page is written in jinja2 templates (web/templates: the page, a file
per group of sections, the shared cells in macros.html.j2, the style sheet
in status.css), with autoescape on: everything that came from a caller, a
worker or a node (plan keys, target ids, worker names, failure reasons,
spec keys in Redis that anyone who can write to it chose) is escaped by
the engine, never by hand. Numbers are formatted by status_format's
filters, the charts' geometry computed in status_chart.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from plancache_server.store.fleet import Coverage
from plancache_server.store.stats import WINDOWS, Counter
from plancache_server.web import status_chart
from plancache_server.web.status import RANGES, StatusReport, hit_rate
from plancache_server.web.status_format import FILTERS, WINDOW_LABELS, window_headers

REFRESH_S = 10


@functools.cache
def environment() -> jinja2.Environment:
    return make_environment(jinja2.PackageLoader("plancache_server.web", "templates"))


def make_environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    """Every template loaded now, once: a running gateway renders the templates of the code it runs. (With
    jinja's default, each render looked at the files again and took a changed one: templates installed over a
    running gateway, newer than its Python, failed every render of the page: a soak, 2026-12-05.)"""
    env = jinja2.Environment(
        loader=loader,
        autoescape=True,  # every template, whatever its name: the page shows what others wrote
        undefined=jinja2.StrictUndefined,  # a misspelt name fails the render (and a test), not blank cells
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
        cache_size=-1,  # never evicted: a template loaded later would be read from the files of that day
    )
    env.filters.update(FILTERS)
    env.globals.update(
        Counter=Counter,
        windows=WINDOWS,
        window_headers=window_headers(),
        window_labels=WINDOW_LABELS,
        no_coverage=Coverage(),
        chart=status_chart.chart,
        chart_width=status_chart.WIDTH,
        chart_height=status_chart.HEIGHT,
        pad_left=status_chart.PAD_LEFT,
        pad_top=status_chart.PAD_TOP,
    )
    for name in env.list_templates():
        env.get_template(name)
    return env


def render(report: StatusReport, signing_keys: Sequence[Mapping[str, Any] | object] | None = None) -> str:
    """The page for `report`. `signing_keys`: the gateway's keys as the status JSON lists them
    ({"key_id", "fingerprint", "state"}, or objects with those attributes); by default the report's own
    `signing_keys` where it has them; the section is left out without any."""
    if signing_keys is None:
        signing_keys = getattr(report, "signing_keys", None) or []
    charted = [t for t in report.targets if hit_rate(t.windows.get("total", {})) is not None]
    return (
        environment()
        .get_template("status.html.j2")
        .render(
            report=report,
            ranges=list(RANGES),
            unit=RANGES[report.range][0],
            refresh_s=REFRESH_S,
            charted=charted,
            quiet=[t for t in report.targets if t not in charted],
            signing_keys=list(signing_keys),
        )
    )

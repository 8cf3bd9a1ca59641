"""The status page: one self-contained HTML document (inline CSS and SVG, no
script, no external asset) so it renders behind any firewall, in any
browser, and in a headless screenshot. It fits a 1440 px window with no
column cut, and a phone's 390 px: tables wider than the screen scroll
inside their section with the first column (what a row is) kept in view,
charts shrink to the width.

The page and its sections are here; the fleet coverage section is in
status_fleet, the hit-rate charts in status_chart, the pieces they share
(escaping, number formats, tables) in status_html, the style sheet in
status_style. Everything that came from a caller or a worker is
HTML-escaped in status_html.esc and nowhere else.
"""

from __future__ import annotations

from plancache_server.store.build_records import FailedBuild
from plancache_server.store.fleet import Coverage
from plancache_server.store.stats import WINDOWS, Counter
from plancache_server.web.status import RANGES, StatusReport, TargetStatus, TopEntry, Windows, first_uses
from plancache_server.web.status_chart import history
from plancache_server.web.status_fleet import fleet
from plancache_server.web.status_html import (
    WINDOW_LABELS,
    byte_size,
    count,
    coverage_cell,
    duration,
    esc,
    html_table,
    rate_cell,
    short_key,
    target_cell,
    totals,
    utc,
    window_headers,
)
from plancache_server.web.status_style import CSS as _CSS

REFRESH_S = 10


def _targets(report: StatusReport) -> str:
    """Two tables, so that neither is wider than a 1440 px window: what each
    target's callers get (workers, queues, hit rates, coverage), then its counts."""
    headers = [
        ("target", False),
        ("live workers", True),
        ("queued", True),
        ("building", True),
        *window_headers(),
        ("graphs the fleet built that ran the service's plan", True),
        ("first uses served by the service", True),
    ]
    rows = [
        f'<tr data-target="{esc(t.target_id)}">{target_cell(t.target_id, _hint(t))}'
        f'<td class="num">{t.live_workers}</td><td class="num">{t.jobs_waiting}</td>'
        f'<td class="num">{t.jobs_running}</td>'
        + "".join(rate_cell(t.windows.get(w, {})) for w in WINDOWS)
        + coverage_cell(t.fleet.get("total", Coverage()))
        + _first_uses_cell(totals(t.windows))
        + "</tr>"
        for t in report.targets
    ]
    table = html_table(headers, rows, "no target yet: no worker has connected and nothing was asked", len(headers))
    return (
        f'<section id="targets"><h2>Targets: workers, queues and hit rates</h2>{table}</section>'
        '<section id="target-counts"><h2>Targets: lookups, builds and the store (since the counters began)</h2>'
        f"{_target_counts(report)}</section>"
    )


def _target_counts(report: StatusReport) -> str:
    headers = [
        ("target", False),
        ("hits", True),
        ("misses", True),
        ("compiles", True),
        ("joined", True),
        ("failures", True),
        ("refused", True),
        ("untrusted builds", True),
        ("served", True),
        ("build time saved", True),
        ("stored", True),
        ("evicted / expired", True),
    ]
    counted = (
        Counter.HITS,
        Counter.MISSES,
        Counter.COMPILES,
        Counter.JOINED,
        Counter.FAILURES,
        Counter.REFUSED,
        Counter.UNTRUSTED,
    )
    rows = []
    for t in report.targets:
        total = totals(t.windows)
        rows.append(
            f'<tr data-counts-target="{esc(t.target_id)}">{target_cell(t.target_id)}'
            + "".join(f'<td class="num">{count(total.get(c.value, 0))}</td>' for c in counted)
            + f'<td class="num">{byte_size(total.get(Counter.BYTES_SERVED.value, 0))}</td>'
            f'<td class="num">{duration(total.get(Counter.SECONDS_SAVED.value, 0))}</td>'
            f'<td class="num">{byte_size(t.stored.stored_bytes)} in {count(t.stored.stored_plans)}</td>'
            f'<td class="num">{count(t.stored.evicted)} / {count(t.stored.expired)}</td></tr>'
        )
    return html_table(headers, rows, "nothing asked yet", len(headers))


def _first_uses_cell(total: dict[str, float]) -> str:
    served, waited = first_uses(total)
    if not waited:
        return '<td class="num">–</td>'
    title = (
        f"{count(served)} of {count(waited)} first uses ran the service's plan; "
        "the rest ran the node's own build (hedged misses it won)"
    )
    return (
        f'<td class="num" data-first-uses="{served / waited:.4f}" title="{esc(title)}">{served / waited:.0%} '
        f"<small>({count(served)} of {count(waited)})</small></td>"
    )


def _hint(t: TargetStatus) -> str:
    """Why this target misses or fails, where the numbers alone do not say."""
    return _untrusted_hint(t) + _no_worker_hint(t)


def _untrusted_hint(t: TargetStatus) -> str:
    untrusted = totals(t.windows).get(Counter.UNTRUSTED.value, 0)
    if not untrusted:
        return ""
    text = (
        f"{count(untrusted)} build(s) stored a plan this gateway refuses to serve "
        "(UntrustedBuild: signed by a key it does not trust); "
        "their callers were failed. Give the workers a --signing-key the gateway trusts, "
        "or add their public key to its --trusted-keys."
    )
    return f'<div class="hint" data-hint="untrusted-builds">{esc(text)}</div>'


def _no_worker_hint(t: TargetStatus) -> str:
    refused = totals(t.windows).get(Counter.REFUSED.value, 0)
    if t.live_workers:
        return ""
    text = "no live worker builds this target: every missing plan is refused (TargetUnavailable)"
    if refused:
        text += f"; {count(refused)} compile(s) refused so far"
    text += ". Start a plancache-worker on a GPU of this kind, or prefetch from a server that has one."
    return f'<div class="hint" data-hint="no-worker">{esc(text)}</div>'


def _top(section_id: str, title: str, entries: list[TopEntry]) -> str:
    headers = [
        ("#", True),
        ("plan (spec…/options)", False),
        ("target", False),
        ("hits", True),
        ("build time saved", True),
        ("build + autotune", True),
        ("size", True),
        ("engine", False),
    ]
    rows = [
        f'<tr data-plan-key="{esc(e.plan_key)}"><td class="num">{rank}</td><td>{short_key(e.plan_key)}</td>'
        f"{target_cell(e.target_id)}"
        f'<td class="num">{count(e.hits)}</td><td class="num">{duration(e.build_seconds_saved)}</td>'
        + (
            f'<td class="num">{duration(e.build_seconds)}</td><td class="num">{byte_size(e.blob_size)}</td>'
            f'<td><code class="engine">{esc(e.plan_name)}</code></td>'
            if e.stored
            else '<td class="muted" colspan="3">no longer stored</td>'
        )
        + "</tr>"
        for rank, e in enumerate(entries, 1)
    ]
    return (
        f'<section id="{section_id}"><h2>{esc(title)}</h2>{html_table(headers, rows, "no hit yet", len(headers))}'
        "</section>"
    )


def _retirable(report: StatusReport) -> str:
    headers = [("target", False), ("last advertised by a worker", False), ("to retire", False)]
    rows = [
        f'<tr data-retirable="{esc(target)}">{target_cell(target)}'
        f"<td>{esc(utc(seen) if seen else 'never (or before this version)')}</td>"
        f"<td><code>plancache retire --target {esc(target)}</code></td></tr>"
        for target, seen in sorted(report.retire_eligible.items())
    ]
    table = html_table(headers, rows, "none: every target with stored plans has had a worker recently", len(headers))
    title = f"Retired-eligible targets (no worker for {report.retire_after_days:g} days; their plans still stored)"
    return f'<section id="retirable"><h2>{esc(title)}</h2>{table}</section>'


def _failures(failures: list[FailedBuild]) -> str:
    headers = [
        ("when", False),
        ("target", False),
        ("plan", False),
        ("worker", False),
        ("kind", False),
        ("reason", False),
    ]
    rows = [
        f'<tr data-plan-key="{esc(f.plan_key)}"><td>{esc(utc(f.at))}</td>{target_cell(f.target_id)}'
        f"<td>{short_key(f.plan_key)}</td>"
        f"<td><code>{esc(f.worker)}</code></td>"
        + (
            '<td><span class="tag rejected">rejected by cuDNN</span></td>'
            if f.rejected
            else '<td><span class="tag failed">build failed</span></td>'
        )
        + f'<td class="reason">{esc(f.reason)}</td></tr>'
        for f in failures
    ]
    table = html_table(headers, rows, "no failed build recorded", len(headers))
    return f'<section id="failures"><h2>Recent failed builds (newest first)</h2>{table}</section>'


def _lost_to_repair(report: StatusReport) -> str:
    """Shown only after a repair of the private store lost plans, until each is rebuilt."""
    if not report.lost_to_repair:
        return ""
    rows = [
        f'<tr data-plan-key="{esc(k)}"><td>{short_key(k)}</td><td><code>{esc(k)}</code></td></tr>'
        for k in report.lost_to_repair
    ]
    table = html_table([("plan (spec…/options)", False), ("plan key", False)], rows, "", 2)
    title = (
        f"Plans lost to a repair of the store ({len(report.lost_to_repair)}; "
        "each is rebuilt on its next request and then leaves this list)"
    )
    return f'<section id="lost-to-repair"><h2>{esc(title)}</h2>{table}</section>'


def _warming(report: StatusReport) -> str:
    headers = [
        ("target", False),
        ("from", False),
        ("state", False),
        ("built", True),
        ("skipped", True),
        ("failed", True),
        ("in flight", True),
        ("to do", True),
        ("of the source's 24 h hits covered", True),
        ("latest failure", False),
    ]
    rows = [
        f'<tr data-warm-target="{esc(w.target_id)}">{target_cell(w.target_id)}<td>{esc(w.source)}</td>'
        f"<td>{esc(w.state)}</td>"
        f'<td class="num">{w.built}</td><td class="num">{w.skipped}</td><td class="num">{w.failed}</td>'
        f'<td class="num">{w.in_flight}</td>'
        f'<td class="num">{w.remaining}</td><td class="num">{w.coverage:.0%}</td>'
        f'<td class="reason">{esc(w.failures[0][1] if w.failures else "")}</td></tr>'
        for w in report.warming
    ]
    table = html_table(
        headers,
        rows,
        "no warming plan: `plancache warm --target T --from S`, or a worker of a new target warms it when idle",
        len(headers),
    )
    return f'<section id="warming"><h2>Warming: plans built before the fleet asks</h2>{table}</section>'


def _families(report: StatusReport) -> str:
    headers = [
        ("op family", False),
        *window_headers(),
        ("hits", True),
        ("misses", True),
        ("compiles", True),
        ("failures", True),
        ("build time saved", True),
    ]
    rows = []
    for family, windows in sorted(report.families.items()):
        rows.append(_family_row(family, windows))
    table = html_table(headers, rows, "nothing asked yet", len(headers))
    return f'<section id="families"><h2>Op families</h2>{table}</section>'


def _family_row(family: str, windows: Windows) -> str:
    total = totals(windows)
    return (
        f'<tr data-family="{esc(family)}"><td>{esc(family)}</td>'
        + "".join(rate_cell(windows.get(w, {})) for w in WINDOWS)
        + "".join(
            f'<td class="num">{count(total.get(c.value, 0))}</td>'
            for c in (Counter.HITS, Counter.MISSES, Counter.COMPILES, Counter.FAILURES)
        )
        + f'<td class="num">{duration(total.get(Counter.SECONDS_SAVED.value, 0))}</td></tr>'
    )


def render(report: StatusReport) -> str:
    ranges = " ".join(
        f'<a href="?range={r}"{" class=current" if r == report.range else ""}>{esc(WINDOW_LABELS.get(r, r))}</a>'
        for r in RANGES
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>plancache status</title><style>{_CSS}</style></head><body>"
        f'<header><h1>plancache status</h1><span class="meta">{esc(utc(report.generated_at))} · '
        f"refreshes every {REFRESH_S} s · "
        f'charts: {ranges} · <a href="status.json?range={esc(report.range)}">JSON</a> · '
        '<a href="metrics">Prometheus metrics</a></span></header><main>'
        + _targets(report)
        + fleet(report)
        + history(report)
        + _top("top-hits", "Top plans by hits", report.top_by_hits)
        + _top("top-saved", "Top plans by build time saved (build + autotune time × hits)", report.top_by_seconds_saved)
        + _warming(report)
        + _failures(report.recent_failures)
        + _lost_to_repair(report)
        + _retirable(report)
        + _families(report)
        + "</main></body></html>"
    )

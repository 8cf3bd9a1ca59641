"""The status page: one self-contained HTML document (inline CSS and SVG, no
script, no external asset) so it renders behind any firewall, in any
browser, and in a headless screenshot. It fits a 1440 px window with no
column cut, and a phone's 390 px: tables wider than the screen scroll
inside their section with the first column (what a row is) kept in view,
charts shrink to the width.

Everything that came from a caller or a worker (plan keys, target ids,
failure reasons) is HTML-escaped here, in `_e`, and nowhere else.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence

from plancache_server.store.build_records import FailedBuild
from plancache_server.store.fleet import Coverage
from plancache_server.store.stats import WINDOWS, Counter
from plancache_server.web.status import RANGES, StatusReport, TargetStatus, TopEntry, Windows, first_uses, hit_rate
from plancache_server.web.status_style import CSS as _CSS

REFRESH_S = 10
_WINDOW_LABELS = {"5m": "5 min", "1h": "1 h", "24h": "24 h", "total": "total"}
_WINDOWS_SHORT = {"5m": "5 minutes", "1h": "hour", "24h": "24 hours"}
_CHART_W, _CHART_H, _PAD_L, _PAD_B, _PAD_T = 760, 170, 44, 22, 8


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _utc(unix_s: float, fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    return time.strftime(fmt, time.gmtime(unix_s))


def _percent(rate: float | None) -> str:
    return "–" if rate is None else f"{rate * 100:.1f} %"


def _rate_cell(values: dict[str, float]) -> str:
    rate = hit_rate(values)
    css = "" if rate is None else " rate-good" if rate >= 0.9 else " rate-poor" if rate < 0.5 else ""
    return f'<td class="num{css}">{_percent(rate)}</td>'


def _count(value: float) -> str:
    return f"{round(value):,}"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:,.2f} s" if seconds < 10 else f"{seconds:,.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


def _table(headers: Sequence[tuple[str, bool]], rows: Iterable[str], empty: str, width: int) -> str:
    head = "".join(f'<th class="num">{_e(h)}</th>' if numeric else f"<th>{_e(h)}</th>" for h, numeric in headers)
    body = "".join(rows) or f'<tr><td class="empty" colspan="{width}">{_e(empty)}</td></tr>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _window_headers() -> list[tuple[str, bool]]:
    return [(f"hit rate {_WINDOW_LABELS[w]}", True) for w in WINDOWS]


def _totals(windows: Windows) -> dict[str, float]:
    return windows.get("total", {})


def _target_cell(target_id: str, extra: str = "") -> str:
    return f'<td><code class="target">{_e(target_id)}</code>{extra}</td>'


def _targets(report: StatusReport) -> str:
    """Two tables, so that neither is wider than a 1440 px window: what each
    target's callers get (workers, queues, hit rates, coverage), then its counts."""
    headers = [
        ("target", False),
        ("live workers", True),
        ("queued", True),
        ("building", True),
        *_window_headers(),
        ("graphs the fleet built that ran the service's plan", True),
        ("first uses served by the service", True),
    ]
    rows = [
        f'<tr data-target="{_e(t.target_id)}">{_target_cell(t.target_id, _hint(t))}'
        f'<td class="num">{t.live_workers}</td><td class="num">{t.jobs_waiting}</td><td class="num">{t.jobs_running}</td>'
        + "".join(_rate_cell(t.windows.get(w, {})) for w in WINDOWS)
        + _coverage_cell(t.fleet.get("total", Coverage()))
        + _first_uses_cell(_totals(t.windows))
        + "</tr>"
        for t in report.targets
    ]
    table = _table(headers, rows, "no target yet: no worker has connected and nothing was asked", len(headers))
    counts = [
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
    count_rows = []
    for t in report.targets:
        total = _totals(t.windows)
        count_rows.append(
            f'<tr data-counts-target="{_e(t.target_id)}">{_target_cell(t.target_id)}'
            + "".join(
                f'<td class="num">{_count(total.get(c.value, 0))}</td>'
                for c in (
                    Counter.HITS,
                    Counter.MISSES,
                    Counter.COMPILES,
                    Counter.JOINED,
                    Counter.FAILURES,
                    Counter.REFUSED,
                    Counter.UNTRUSTED,
                )
            )
            + f'<td class="num">{_bytes(total.get(Counter.BYTES_SERVED.value, 0))}</td>'
            f'<td class="num">{_duration(total.get(Counter.SECONDS_SAVED.value, 0))}</td>'
            f'<td class="num">{_bytes(t.stored.stored_bytes)} in {_count(t.stored.stored_plans)}</td>'
            f'<td class="num">{_count(t.stored.evicted)} / {_count(t.stored.expired)}</td></tr>'
        )
    count_table = _table(counts, count_rows, "nothing asked yet", len(counts))
    return (
        f'<section id="targets"><h2>Targets: workers, queues and hit rates</h2>{table}</section>'
        f'<section id="target-counts"><h2>Targets: lookups, builds and the store (since the counters began)</h2>{count_table}</section>'
    )


def _coverage_cell(found: Coverage) -> str:
    share = found.share
    if share is None:
        return '<td class="num muted">no report</td>'
    css = " rate-good" if share >= 0.9 else " rate-poor" if share < 0.5 else ""
    title = f"{_count(found.from_service)} of {_count(found.graphs)} graphs nodes reported ran the service's plan; {_count(found.local)} were built locally"
    return (
        f'<td class="num{css}" data-coverage="{share:.4f}" title="{_e(title)}">{_percent(share)} '
        f"<small>({_count(found.from_service)} of {_count(found.graphs)})</small></td>"
    )


def _fleet(report: StatusReport) -> str:
    """Fleet coverage: what nodes reported of their graphs, per target and
    fleet-wide, and why graphs were built locally, the most frequent first
    (what an operator should fix or ask for)."""
    total = report.fleet.get("total", Coverage())
    if total.graphs:
        summary = (
            f'<p class="summary" data-fleet-graphs="{total.graphs:g}" data-fleet-from-service="{total.from_service:g}">'
            f"<strong>{_percent(total.share)}</strong> of the {_count(total.graphs)} graphs the fleet's nodes built ran the service's plan "
            f"({_count(total.served)} fetched, {_count(total.disk_cache)} from their disk caches); {_count(total.local)} were built locally."
            + "".join(
                f" Last {_WINDOWS_SHORT[w]}: {_percent(report.fleet[w].share)}."
                for w in ("5m", "1h", "24h")
                if w in report.fleet and report.fleet[w].graphs
            )
            + "</p>"
        )
    else:
        summary = '<p class="summary empty">no node has reported yet (clients report in the background unless PLANCACHE_REPORT=0)</p>'
    headers = [
        ("target", False),
        ("graphs built", True),
        ("ran the service's plan", True),
        ("from disk caches", True),
        ("built locally", True),
        ("coverage", True),
        ("top reasons for local builds", False),
    ]
    rows = []
    for t in report.targets:
        found = t.fleet.get("total", Coverage())
        if not found.graphs:
            continue
        reasons = ", ".join(f"{_e(r.reason)} {_count(r.graphs)}" for r in found.top_reasons(3)) or "–"
        rows.append(
            f'<tr data-fleet-target="{_e(t.target_id)}" data-graphs="{found.graphs:g}" data-from-service="{found.from_service:g}" data-local="{found.local:g}">'
            f'{_target_cell(t.target_id)}<td class="num">{_count(found.graphs)}</td><td class="num">{_count(found.from_service)}</td>'
            f'<td class="num">{_count(found.disk_cache)}</td><td class="num">{_count(found.local)}</td>{_coverage_cell(found)}<td>{reasons}</td></tr>'
        )
    per_target = _table(headers, rows, "no report yet", len(headers))
    why_headers = [
        ("reason", False),
        ("node type", False),
        ("graphs built locally", True),
        ("share of local builds", True),
        ("what it means", False),
    ]
    why_rows = [
        f'<tr data-reason="{_e(r.reason)}" data-node-type="{_e(r.node_type)}" data-graphs="{r.graphs:g}"><td><code>{_e(r.reason)}</code></td>'
        f'<td><code>{_e(r.node_type)}</code></td><td class="num">{_count(r.graphs)}</td>'
        f'<td class="num">{_percent(r.graphs / total.local if total.local else None)}</td><td class="hint">{_e(r.meaning)}</td></tr>'
        for r in total.local_by_reason[:20]
    ]
    why = _table(why_headers, why_rows, "no graph built locally", len(why_headers))
    return (
        '<section id="fleet"><h2>Fleet coverage: graphs served by the service against graphs the fleet built</h2>'
        f'{summary}{per_target}<h2 style="margin-top:14px">Why nodes built graphs locally, most first (all targets)</h2>{why}'
        f"{_races(report)}{_local_specs(report)}</section>"
    )


def _races(report: StatusReport) -> str:
    if not report.fleet_races:
        return ""
    results = ("service_won", "local_won", "service_failed", "local_failed", "replaced")
    headers = [("front door", False), *((r.replace("_", " "), True) for r in results)]
    rows = [
        f'<tr data-races="{_e(path)}"><td>{_e(path)}</td>'
        + "".join(f'<td class="num">{_count(counts.get(r, 0))}</td>' for r in results)
        + "</tr>"
        for path, counts in report.fleet_races.items()
    ]
    return f'<h2 style="margin-top:14px">Hedged misses nodes reported</h2>{_table(headers, rows, "", len(headers))}'


def _local_specs(report: StatusReport) -> str:
    if not report.local_specs:
        return ""
    headers = [
        ("spec hash", False),
        ("target", False),
        ("reason", False),
        ("node type", False),
        ("graphs built locally", True),
    ]
    rows = [
        f'<tr data-local-spec="{_e(s.spec_hash)}"><td><code title="{_e(s.spec_hash)}">{_e(s.spec_hash[:16])}…</code></td>{_target_cell(s.target_id)}'
        f'<td><code>{_e(s.reason)}</code></td><td><code>{_e(s.node_type)}</code></td><td class="num">{_count(s.graphs)}</td></tr>'
        for s in report.local_specs
    ]
    title = "Graphs built locally most, by spec hash (nodes whose operators set PLANCACHE_REPORT_SPECS=1)"
    return f'<h2 style="margin-top:14px">{_e(title)}</h2>{_table(headers, rows, "", len(headers))}'


def _first_uses_cell(total: dict[str, float]) -> str:
    served, waited = first_uses(total)
    if not waited:
        return '<td class="num">–</td>'
    title = f"{_count(served)} of {_count(waited)} first uses ran the service's plan; the rest ran the node's own build (hedged misses it won)"
    return f'<td class="num" data-first-uses="{served / waited:.4f}" title="{_e(title)}">{served / waited:.0%} <small>({_count(served)} of {_count(waited)})</small></td>'


def _hint(t: TargetStatus) -> str:
    """Why this target misses or fails, where the numbers alone do not say."""
    return _untrusted_hint(t) + _no_worker_hint(t)


def _untrusted_hint(t: TargetStatus) -> str:
    untrusted = _totals(t.windows).get(Counter.UNTRUSTED.value, 0)
    if not untrusted:
        return ""
    text = (
        f"{_count(untrusted)} build(s) stored a plan this gateway refuses to serve (UntrustedBuild: signed by a key it does not trust); "
        "their callers were failed. Give the workers a --signing-key the gateway trusts, or add their public key to its --trusted-keys."
    )
    return f'<div class="hint" data-hint="untrusted-builds">{_e(text)}</div>'


def _no_worker_hint(t: TargetStatus) -> str:
    refused = _totals(t.windows).get(Counter.REFUSED.value, 0)
    if t.live_workers:
        return ""
    text = "no live worker builds this target: every missing plan is refused (TargetUnavailable)"
    if refused:
        text += f"; {_count(refused)} compile(s) refused so far"
    text += ". Start a plancache-worker on a GPU of this kind, or prefetch from a server that has one."
    return f'<div class="hint" data-hint="no-worker">{_e(text)}</div>'


def _chart(target: TargetStatus, unit: str) -> str:
    """Lookups per bucket as bars, hit rate as a line (broken where nothing was asked)."""
    buckets = target.history
    n = max(len(buckets), 1)
    plot_w, plot_h = _CHART_W - _PAD_L - 8, _CHART_H - _PAD_B - _PAD_T
    step = plot_w / n
    lookups = [b.values.get(Counter.HITS.value, 0) + b.values.get(Counter.MISSES.value, 0) for b in buckets]
    most = max(lookups, default=0) or 1
    parts = [
        f'<svg class="chart" viewBox="0 0 {_CHART_W} {_CHART_H}" width="{_CHART_W}" height="{_CHART_H}" role="img" aria-label="hit rate of {_e(target.target_id)}">'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = _PAD_T + plot_h * (1 - frac)
        parts.append(
            f'<line class="gridline" x1="{_PAD_L}" x2="{_CHART_W - 8}" y1="{y:.1f}" y2="{y:.1f}"/><text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{frac * 100:.0f} %</text>'
        )
    segments: list[list[str]] = [[]]
    fmt = "%H:%M" if unit == "m" else "%d %b %H:00"
    for i, (bucket, count) in enumerate(zip(buckets, lookups, strict=True)):
        x = _PAD_L + i * step
        bar_h = plot_h * count / most
        rate = hit_rate(bucket.values)
        label = f"{_utc(bucket.start, fmt)} UTC: " + (
            f"{_percent(rate)} of {_count(count)} lookups" if rate is not None else "no lookups"
        )
        parts.append(
            f'<g class="bucket" data-start="{bucket.start:.0f}" data-lookups="{count:g}" data-hit-rate="{"" if rate is None else f"{rate:.4f}"}"><title>{_e(label)}</title>'
            f'<rect class="lookups" x="{x + step * 0.1:.1f}" y="{_PAD_T + plot_h - bar_h:.1f}" width="{step * 0.8:.1f}" height="{bar_h:.1f}"/></g>'
        )
        if rate is None:
            segments.append([])
            continue
        cx, cy = f"{x + step / 2:.1f}", f"{_PAD_T + plot_h * (1 - rate):.1f}"
        segments[-1].append(f"{cx},{cy}")
        parts.append(f'<circle class="point" cx="{cx}" cy="{cy}" r="2.2"/>')
    parts += [f'<polyline class="rate" points="{" ".join(s)}"/>' for s in segments if len(s) > 1]
    if buckets:
        for i, anchor in ((0, "start"), (len(buckets) // 2, "middle"), (len(buckets) - 1, "end")):
            x = _PAD_L + i * step + (step if anchor == "end" else step / 2 if anchor == "middle" else 0)
            parts.append(
                f'<text x="{x:.1f}" y="{_CHART_H - 6}" text-anchor="{anchor}">{_e(_utc(buckets[i].start, fmt))}</text>'
            )
    parts.append(
        f'<text x="{_CHART_W - 8}" y="{_PAD_T + 10}" text-anchor="end">max {_count(most if any(lookups) else 0)} lookups / {"minute" if unit == "m" else "hour"}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _history(report: StatusReport) -> str:
    unit, _ = RANGES[report.range]
    title = "the last hour, per minute" if unit == "m" else "the last 24 hours, per hour"
    legend = '<div class="legend"><span class="swatch" style="background:var(--accent)"></span>hit rate<span class="swatch" style="background:var(--bar)"></span>lookups (hits + misses)</div>'
    asked = [t for t in report.targets if hit_rate(_totals(t.windows)) is not None]
    figures = "".join(
        f'<figure data-target="{_e(t.target_id)}"><figcaption><code>{_e(t.target_id)}</code></figcaption>{_chart(t, unit)}</figure>'
        for t in asked
    )
    quiet = ", ".join(f"<code>{_e(t.target_id)}</code>" for t in report.targets if t not in asked)
    note = f'<p class="muted">No lookup yet for {quiet}.</p>' if quiet else ""
    return f'<section id="hit-rate"><h2>Hit rate over {title} (UTC)</h2>{legend}<div class="grid">{figures}</div>{note}</section>'


def _short_key(plan_key: str) -> str:
    spec, _, rest = plan_key.partition("/")
    return f'<code title="{_e(plan_key)}">{_e(spec[:12])}…/{_e(rest.rsplit("/", 1)[-1])}</code>'


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
        f'<tr data-plan-key="{_e(e.plan_key)}"><td class="num">{rank}</td><td>{_short_key(e.plan_key)}</td>'
        f"{_target_cell(e.target_id)}"
        f'<td class="num">{_count(e.hits)}</td><td class="num">{_duration(e.build_seconds_saved)}</td>'
        + (
            f'<td class="num">{_duration(e.build_seconds)}</td><td class="num">{_bytes(e.blob_size)}</td><td><code class="engine">{_e(e.plan_name)}</code></td>'
            if e.stored
            else '<td class="muted" colspan="3">no longer stored</td>'
        )
        + "</tr>"
        for rank, e in enumerate(entries, 1)
    ]
    return (
        f'<section id="{section_id}"><h2>{_e(title)}</h2>{_table(headers, rows, "no hit yet", len(headers))}</section>'
    )


def _retirable(report: StatusReport) -> str:
    headers = [("target", False), ("last advertised by a worker", False), ("to retire", False)]
    rows = [
        f'<tr data-retirable="{_e(target)}">{_target_cell(target)}<td>{_e(_utc(seen) if seen else "never (or before this version)")}</td>'
        f"<td><code>plancache retire --target {_e(target)}</code></td></tr>"
        for target, seen in sorted(report.retire_eligible.items())
    ]
    table = _table(headers, rows, "none: every target with stored plans has had a worker recently", len(headers))
    title = f"Retired-eligible targets (no worker for {report.retire_after_days:g} days; their plans still stored)"
    return f'<section id="retirable"><h2>{_e(title)}</h2>{table}</section>'


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
        f'<tr data-plan-key="{_e(f.plan_key)}"><td>{_e(_utc(f.at))}</td>{_target_cell(f.target_id)}<td>{_short_key(f.plan_key)}</td>'
        f"<td><code>{_e(f.worker)}</code></td>"
        + (
            '<td><span class="tag rejected">rejected by cuDNN</span></td>'
            if f.rejected
            else '<td><span class="tag failed">build failed</span></td>'
        )
        + f'<td class="reason">{_e(f.reason)}</td></tr>'
        for f in failures
    ]
    table = _table(headers, rows, "no failed build recorded", len(headers))
    return f'<section id="failures"><h2>Recent failed builds (newest first)</h2>{table}</section>'


def _lost_to_repair(report: StatusReport) -> str:
    """Shown only after a repair of the private store lost plans, until each is rebuilt."""
    if not report.lost_to_repair:
        return ""
    rows = [
        f'<tr data-plan-key="{_e(k)}"><td>{_short_key(k)}</td><td><code>{_e(k)}</code></td></tr>'
        for k in report.lost_to_repair
    ]
    table = _table([("plan (spec…/options)", False), ("plan key", False)], rows, "", 2)
    title = f"Plans lost to a repair of the store ({len(report.lost_to_repair)}; each is rebuilt on its next request and then leaves this list)"
    return f'<section id="lost-to-repair"><h2>{_e(title)}</h2>{table}</section>'


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
        f'<tr data-warm-target="{_e(w.target_id)}">{_target_cell(w.target_id)}<td>{_e(w.source)}</td><td>{_e(w.state)}</td>'
        f'<td class="num">{w.built}</td><td class="num">{w.skipped}</td><td class="num">{w.failed}</td><td class="num">{w.in_flight}</td>'
        f'<td class="num">{w.remaining}</td><td class="num">{w.coverage:.0%}</td>'
        f'<td class="reason">{_e(w.failures[0][1] if w.failures else "")}</td></tr>'
        for w in report.warming
    ]
    table = _table(
        headers,
        rows,
        "no warming plan: `plancache warm --target T --from S`, or a worker of a new target warms it when idle",
        len(headers),
    )
    return f'<section id="warming"><h2>Warming: plans built before the fleet asks</h2>{table}</section>'


def _families(report: StatusReport) -> str:
    headers = [
        ("op family", False),
        *_window_headers(),
        ("hits", True),
        ("misses", True),
        ("compiles", True),
        ("failures", True),
        ("build time saved", True),
    ]
    rows = []
    for family, windows in sorted(report.families.items()):
        total = _totals(windows)
        rows.append(
            f'<tr data-family="{_e(family)}"><td>{_e(family)}</td>'
            + "".join(_rate_cell(windows.get(w, {})) for w in WINDOWS)
            + "".join(
                f'<td class="num">{_count(total.get(c.value, 0))}</td>'
                for c in (Counter.HITS, Counter.MISSES, Counter.COMPILES, Counter.FAILURES)
            )
            + f'<td class="num">{_duration(total.get(Counter.SECONDS_SAVED.value, 0))}</td></tr>'
        )
    return f'<section id="families"><h2>Op families</h2>{_table(headers, rows, "nothing asked yet", len(headers))}</section>'


def render(report: StatusReport) -> str:
    ranges = " ".join(
        f'<a href="?range={r}"{" class=current" if r == report.range else ""}>{_e(_WINDOW_LABELS.get(r, r))}</a>'
        for r in RANGES
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_S}"><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>plancache status</title><style>{_CSS}</style></head><body>"
        f'<header><h1>plancache status</h1><span class="meta">{_e(_utc(report.generated_at))} · refreshes every {REFRESH_S} s · '
        f'charts: {ranges} · <a href="status.json?range={_e(report.range)}">JSON</a> · <a href="metrics">Prometheus metrics</a></span></header><main>'
        + _targets(report)
        + _fleet(report)
        + _history(report)
        + _top("top-hits", "Top plans by hits", report.top_by_hits)
        + _top("top-saved", "Top plans by build time saved (build + autotune time × hits)", report.top_by_seconds_saved)
        + _warming(report)
        + _failures(report.recent_failures)
        + _lost_to_repair(report)
        + _retirable(report)
        + _families(report)
        + "</main></body></html>"
    )

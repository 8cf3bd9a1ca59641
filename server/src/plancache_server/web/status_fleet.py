"""The status page's fleet coverage section: what nodes reported of the graphs they built, and why they built
some themselves."""

from __future__ import annotations

from plancache_server.store.fleet import Coverage
from plancache_server.web.status import StatusReport
from plancache_server.web.status_html import count, coverage_cell, esc, html_table, percent, target_cell

_WINDOWS_SHORT = {"5m": "5 minutes", "1h": "hour", "24h": "24 hours"}


def fleet(report: StatusReport) -> str:
    """Fleet coverage: what nodes reported of their graphs, per target and
    fleet-wide, and why graphs were built locally, the most frequent first
    (what an operator should fix or ask for)."""
    total = report.fleet.get("total", Coverage())
    if total.graphs:
        summary = (
            f'<p class="summary" data-fleet-graphs="{total.graphs:g}" '
            f'data-fleet-from-service="{total.from_service:g}">'
            f"<strong>{percent(total.share)}</strong> of the {count(total.graphs)} graphs the fleet's nodes built "
            f"ran the service's plan ({count(total.served)} fetched, {count(total.disk_cache)} from their disk "
            f"caches); {count(total.local)} were built locally."
            + "".join(
                f" Last {_WINDOWS_SHORT[w]}: {percent(report.fleet[w].share)}."
                for w in ("5m", "1h", "24h")
                if w in report.fleet and report.fleet[w].graphs
            )
            + "</p>"
        )
    else:
        summary = (
            '<p class="summary empty">no node has reported yet '
            "(clients report in the background unless PLANCACHE_REPORT=0)</p>"
        )
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
        reasons = ", ".join(f"{esc(r.reason)} {count(r.graphs)}" for r in found.top_reasons(3)) or "–"
        rows.append(
            f'<tr data-fleet-target="{esc(t.target_id)}" data-graphs="{found.graphs:g}" '
            f'data-from-service="{found.from_service:g}" data-local="{found.local:g}">'
            f'{target_cell(t.target_id)}<td class="num">{count(found.graphs)}</td>'
            f'<td class="num">{count(found.from_service)}</td>'
            f'<td class="num">{count(found.disk_cache)}</td><td class="num">{count(found.local)}</td>'
            f"{coverage_cell(found)}<td>{reasons}</td></tr>"
        )
    per_target = html_table(headers, rows, "no report yet", len(headers))
    why_headers = [
        ("reason", False),
        ("node type", False),
        ("graphs built locally", True),
        ("share of local builds", True),
        ("what it means", False),
    ]
    why_rows = [
        f'<tr data-reason="{esc(r.reason)}" data-node-type="{esc(r.node_type)}" data-graphs="{r.graphs:g}">'
        f"<td><code>{esc(r.reason)}</code></td>"
        f'<td><code>{esc(r.node_type)}</code></td><td class="num">{count(r.graphs)}</td>'
        f'<td class="num">{percent(r.graphs / total.local if total.local else None)}</td>'
        f'<td class="hint">{esc(r.meaning)}</td></tr>'
        for r in total.local_by_reason[:20]
    ]
    why = html_table(why_headers, why_rows, "no graph built locally", len(why_headers))
    return (
        '<section id="fleet"><h2>Fleet coverage: graphs served by the service against graphs the fleet built</h2>'
        f"{summary}{per_target}"
        f'<h2 style="margin-top:14px">Why nodes built graphs locally, most first (all targets)</h2>{why}'
        f"{_races(report)}{_local_specs(report)}</section>"
    )


def _races(report: StatusReport) -> str:
    if not report.fleet_races:
        return ""
    results = ("service_won", "local_won", "service_failed", "local_failed", "replaced")
    headers = [("front door", False), *((r.replace("_", " "), True) for r in results)]
    rows = [
        f'<tr data-races="{esc(path)}"><td>{esc(path)}</td>'
        + "".join(f'<td class="num">{count(counts.get(r, 0))}</td>' for r in results)
        + "</tr>"
        for path, counts in report.fleet_races.items()
    ]
    return f'<h2 style="margin-top:14px">Hedged misses nodes reported</h2>{html_table(headers, rows, "", len(headers))}'


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
        f'<tr data-local-spec="{esc(s.spec_hash)}">'
        f'<td><code title="{esc(s.spec_hash)}">{esc(s.spec_hash[:16])}…</code></td>{target_cell(s.target_id)}'
        f"<td><code>{esc(s.reason)}</code></td><td><code>{esc(s.node_type)}</code></td>"
        f'<td class="num">{count(s.graphs)}</td></tr>'
        for s in report.local_specs
    ]
    title = "Graphs built locally most, by spec hash (nodes whose operators set PLANCACHE_REPORT_SPECS=1)"
    return f'<h2 style="margin-top:14px">{esc(title)}</h2>{html_table(headers, rows, "", len(headers))}'

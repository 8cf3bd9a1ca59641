"""The status page's HTML pieces: escaping, how numbers read, tables, and the cells several sections share.

Everything that came from a caller or a worker (plan keys, target ids,
failure reasons) is HTML-escaped here, in `esc`, and nowhere else.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence

from plancache.errors import InvalidRequest
from plancache.keys.plankey import parse_key
from plancache_server.store.fleet import Coverage
from plancache_server.store.stats import WINDOWS
from plancache_server.web.status import Windows, hit_rate

WINDOW_LABELS = {"5m": "5 min", "1h": "1 h", "24h": "24 h", "total": "total"}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def utc(unix_s: float, fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    return time.strftime(fmt, time.gmtime(unix_s))


def percent(rate: float | None) -> str:
    return "–" if rate is None else f"{rate * 100:.1f} %"


def rate_cell(values: dict[str, float]) -> str:
    rate = hit_rate(values)
    css = "" if rate is None else " rate-good" if rate >= 0.9 else " rate-poor" if rate < 0.5 else ""
    return f'<td class="num{css}">{percent(rate)}</td>'


def count(value: float) -> str:
    return f"{round(value):,}"


def byte_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:,.2f} s" if seconds < 10 else f"{seconds:,.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


def html_table(headers: Sequence[tuple[str, bool]], rows: Iterable[str], empty: str, width: int) -> str:
    head = "".join(f'<th class="num">{esc(h)}</th>' if numeric else f"<th>{esc(h)}</th>" for h, numeric in headers)
    body = "".join(rows) or f'<tr><td class="empty" colspan="{width}">{esc(empty)}</td></tr>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def window_headers() -> list[tuple[str, bool]]:
    return [(f"hit rate {WINDOW_LABELS[w]}", True) for w in WINDOWS]


def totals(windows: Windows) -> dict[str, float]:
    return windows.get("total", {})


def target_cell(target_id: str, extra: str = "") -> str:
    return f'<td><code class="target">{esc(target_id)}</code>{extra}</td>'


def short_key(plan_key: str) -> str:
    """A plan key as its spec hash's start and its options (the whole key on hover)."""
    try:
        parsed = parse_key(plan_key)
    except InvalidRequest:  # shown as it is: the page names what Redis holds, whatever it holds
        return f'<code title="{esc(plan_key)}">{esc(plan_key[:40])}</code>'
    return f'<code title="{esc(plan_key)}">{esc(parsed.spec_hash[:12])}…/{esc(parsed.options_id)}</code>'


def coverage_cell(found: Coverage) -> str:
    share = found.share
    if share is None:
        return '<td class="num muted">no report</td>'
    css = " rate-good" if share >= 0.9 else " rate-poor" if share < 0.5 else ""
    title = (
        f"{count(found.from_service)} of {count(found.graphs)} graphs nodes reported ran the service's plan; "
        f"{count(found.local)} were built locally"
    )
    return (
        f'<td class="num{css}" data-coverage="{share:.4f}" title="{esc(title)}">{percent(share)} '
        f"<small>({count(found.from_service)} of {count(found.graphs)})</small></td>"
    )

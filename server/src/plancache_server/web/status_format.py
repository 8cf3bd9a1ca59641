"""How numbers, times and plan keys read on the status page: the filters its templates use (status_page
registers them). Nothing here writes HTML: the templates do, and autoescape escapes what these return."""

from __future__ import annotations

import time

from plancache.errors import InvalidRequest
from plancache.keys.plankey import parse_key
from plancache_server.store.stats import WINDOWS
from plancache_server.web.status import first_uses, hit_rate

WINDOW_LABELS = {"5m": "5 min", "1h": "1 h", "24h": "24 h", "total": "total"}


def utc(unix_s: float, fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    return time.strftime(fmt, time.gmtime(unix_s))


def percent(rate: float | None) -> str:
    return "–" if rate is None else f"{rate * 100:.1f} %"


def rate_class(rate: float | None) -> str:
    """The CSS class of a hit rate or a coverage share: good from 90 %, poor under 50 %."""
    return "" if rate is None else "rate-good" if rate >= 0.9 else "rate-poor" if rate < 0.5 else ""


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


def key_parts(plan_key: str) -> tuple[str, str] | None:
    """A plan key as its spec hash's start and its options id; None for what is no plan key (shown as it is:
    the page names what Redis holds, whatever it holds)."""
    try:
        parsed = parse_key(plan_key)
    except InvalidRequest:
        return None
    return parsed.spec_hash[:12], parsed.options_id


def window_headers() -> list[tuple[str, bool]]:
    return [(f"hit rate {WINDOW_LABELS[w]}", True) for w in WINDOWS]


FILTERS = {
    "utc": utc,
    "percent": percent,
    "rate_class": rate_class,
    "number": count,
    "byte_size": byte_size,
    "duration": duration,
    "key_parts": key_parts,
    "hit_rate": hit_rate,
    "first_uses": first_uses,
}

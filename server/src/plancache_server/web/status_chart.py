"""The status page's hit-rate section: per target, lookups per minute or hour as bars and the hit rate as a line,
drawn in inline SVG."""

from __future__ import annotations

from plancache_server.store.stats import Counter
from plancache_server.web.status import RANGES, StatusReport, TargetStatus, hit_rate
from plancache_server.web.status_html import count, esc, percent, totals, utc

_CHART_W, _CHART_H, _PAD_L, _PAD_B, _PAD_T = 760, 170, 44, 22, 8


def history(report: StatusReport) -> str:
    unit, _ = RANGES[report.range]
    title = "the last hour, per minute" if unit == "m" else "the last 24 hours, per hour"
    legend = (
        '<div class="legend"><span class="swatch" style="background:var(--accent)"></span>hit rate'
        '<span class="swatch" style="background:var(--bar)"></span>lookups (hits + misses)</div>'
    )
    asked = [t for t in report.targets if hit_rate(totals(t.windows)) is not None]
    figures = "".join(
        f'<figure data-target="{esc(t.target_id)}"><figcaption><code>{esc(t.target_id)}</code></figcaption>'
        f"{_chart(t, unit)}</figure>"
        for t in asked
    )
    quiet = ", ".join(f"<code>{esc(t.target_id)}</code>" for t in report.targets if t not in asked)
    note = f'<p class="muted">No lookup yet for {quiet}.</p>' if quiet else ""
    return (
        f'<section id="hit-rate"><h2>Hit rate over {title} (UTC)</h2>{legend}<div class="grid">{figures}</div>'
        f"{note}</section>"
    )


def _chart(target: TargetStatus, unit: str) -> str:
    """Lookups per bucket as bars, hit rate as a line (broken where nothing was asked)."""
    buckets = target.history
    n = max(len(buckets), 1)
    plot_w, plot_h = _CHART_W - _PAD_L - 8, _CHART_H - _PAD_B - _PAD_T
    step = plot_w / n
    lookups = [b.values.get(Counter.HITS.value, 0) + b.values.get(Counter.MISSES.value, 0) for b in buckets]
    most = max(lookups, default=0) or 1
    parts = [
        f'<svg class="chart" viewBox="0 0 {_CHART_W} {_CHART_H}" width="{_CHART_W}" height="{_CHART_H}" '
        f'role="img" aria-label="hit rate of {esc(target.target_id)}">'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = _PAD_T + plot_h * (1 - frac)
        parts.append(
            f'<line class="gridline" x1="{_PAD_L}" x2="{_CHART_W - 8}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{frac * 100:.0f} %</text>'
        )
    segments: list[list[str]] = [[]]
    fmt = "%H:%M" if unit == "m" else "%d %b %H:00"
    for i, (bucket, asked) in enumerate(zip(buckets, lookups, strict=True)):
        x = _PAD_L + i * step
        bar_h = plot_h * asked / most
        rate = hit_rate(bucket.values)
        label = f"{utc(bucket.start, fmt)} UTC: " + (
            f"{percent(rate)} of {count(asked)} lookups" if rate is not None else "no lookups"
        )
        shown_rate = "" if rate is None else f"{rate:.4f}"
        parts.append(
            f'<g class="bucket" data-start="{bucket.start:.0f}" data-lookups="{asked:g}" '
            f'data-hit-rate="{shown_rate}"><title>{esc(label)}</title>'
            f'<rect class="lookups" x="{x + step * 0.1:.1f}" y="{_PAD_T + plot_h - bar_h:.1f}" '
            f'width="{step * 0.8:.1f}" height="{bar_h:.1f}"/></g>'
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
                f'<text x="{x:.1f}" y="{_CHART_H - 6}" text-anchor="{anchor}">{esc(utc(buckets[i].start, fmt))}</text>'
            )
    per = "minute" if unit == "m" else "hour"
    parts.append(
        f'<text x="{_CHART_W - 8}" y="{_PAD_T + 10}" text-anchor="end">'
        f"max {count(most if any(lookups) else 0)} lookups / {per}</text>"
    )
    parts.append("</svg>")
    return "".join(parts)

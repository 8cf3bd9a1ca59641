"""The geometry of the status page's hit-rate charts: per target, lookups per minute or hour as bars and the
hit rate as a line (broken where nothing was asked), in SVG coordinates that templates/chart.html.j2 draws.
Coordinates are written as the page shows them (one decimal)."""

from __future__ import annotations

from dataclasses import dataclass

from plancache_server.store.stats import Counter
from plancache_server.web.status import TargetStatus, hit_rate
from plancache_server.web.status_format import count, percent, utc

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP = 760, 170, 44, 22, 8


@dataclass(frozen=True)
class Bar:
    start: str  # the bucket's start, unix seconds
    lookups: str
    hit_rate: str  # "" where nothing was asked
    label: str  # its tooltip
    x: str
    y: str
    width: str
    height: str
    point: tuple[str, str] | None  # the hit rate's (x, y) on the line; None where nothing was asked


@dataclass(frozen=True)
class Chart:
    target_id: str
    gridlines: list[tuple[str, str, str]]  # (y of the line, y of its label, label)
    bars: list[Bar]
    lines: list[str]  # the hit rate's polylines: one per run of buckets with lookups
    ticks: list[tuple[str, str, str]]  # (x, text-anchor, time) under the plot
    most: str  # the y axis' top, "max N lookups / minute"


def chart(target: TargetStatus, unit: str) -> Chart:
    buckets = target.history
    n = max(len(buckets), 1)
    plot_w, plot_h = WIDTH - PAD_LEFT - 8, HEIGHT - PAD_BOTTOM - PAD_TOP
    step = plot_w / n
    lookups = [b.values.get(Counter.HITS.value, 0) + b.values.get(Counter.MISSES.value, 0) for b in buckets]
    most = max(lookups, default=0) or 1
    gridlines = []
    for frac in (0.0, 0.5, 1.0):
        y = PAD_TOP + plot_h * (1 - frac)
        gridlines.append((f"{y:.1f}", f"{y + 4:.1f}", f"{frac * 100:.0f} %"))
    fmt = "%H:%M" if unit == "m" else "%d %b %H:00"
    bars: list[Bar] = []
    segments: list[list[str]] = [[]]
    for i, (bucket, asked) in enumerate(zip(buckets, lookups, strict=True)):
        x = PAD_LEFT + i * step
        bar_h = plot_h * asked / most
        rate = hit_rate(bucket.values)
        label = f"{utc(bucket.start, fmt)} UTC: " + (
            f"{percent(rate)} of {count(asked)} lookups" if rate is not None else "no lookups"
        )
        point = None if rate is None else (f"{x + step / 2:.1f}", f"{PAD_TOP + plot_h * (1 - rate):.1f}")
        bars.append(
            Bar(
                f"{bucket.start:.0f}",
                f"{asked:g}",
                "" if rate is None else f"{rate:.4f}",
                label,
                f"{x + step * 0.1:.1f}",
                f"{PAD_TOP + plot_h - bar_h:.1f}",
                f"{step * 0.8:.1f}",
                f"{bar_h:.1f}",
                point,
            )
        )
        if point is None:
            segments.append([])
        else:
            segments[-1].append(",".join(point))
    ticks = []
    if buckets:
        for i, anchor in ((0, "start"), (len(buckets) // 2, "middle"), (len(buckets) - 1, "end")):
            x = PAD_LEFT + i * step + (step if anchor == "end" else step / 2 if anchor == "middle" else 0)
            ticks.append((f"{x:.1f}", anchor, utc(buckets[i].start, fmt)))
    per = "minute" if unit == "m" else "hour"
    return Chart(
        target.target_id,
        gridlines,
        bars,
        [" ".join(s) for s in segments if len(s) > 1],
        ticks,
        f"max {count(most if any(lookups) else 0)} lookups / {per}",
    )

"""Shared by the benchmarks: summaries, the printed table, JSON and PNG output."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and range of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Microseconds per call of `fn`, over `calls` calls back to back (a host-cost benchmark's unit)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def figure(nplots: int) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2 if nplots > 1 else 1
    rows = math.ceil(nplots / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[nplots:]:
        ax.set_visible(False)
    return fig, flat[:nplots]


def bar_chart(path: Path, values: dict[str, float], colors: Sequence[str], label: str, ylabel: str, title: str) -> None:
    """One bar per named value, each labelled (`label` formats it), saved to `path`."""
    fig, (ax,) = figure(1)
    ax.bar(list(values), list(values.values()), color=list(colors))
    for i, value in enumerate(values.values()):
        ax.text(i, value, label.format(value), ha="center", va="bottom")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    save(fig, path)


def save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def paired_rounds_main(
    run: Callable[[int, int, int], dict[str, Any]], report: Callable[[dict[str, Any], Path], None], out: Path
) -> None:
    """The command line of a benchmark of the hit path in paired rounds (bench/hedge_hits.py, bench/report_hits.py):
    --out, --rounds, --calls per round and mode, --plans stored."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--plans", type=int, default=8)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report(run(args.rounds, args.calls, args.plans), args.out)


def paired_panel(
    ax: Any, per_mode: dict[str, dict[str, Any]], label: Callable[[float], str], ylabel: str, title: str
) -> None:
    """One plot of a paired-rounds benchmark: each mode's per-round values as dots, their median as a bar."""
    for i, (mode, v) in enumerate(per_mode.items()):
        ax.scatter([i] * len(v["rounds"]), v["rounds"], s=12)
        ax.bar(i, v["median"], alpha=0.4, label=f"{mode}: {label(v['median'])}")
    ax.set_xticks(range(len(per_mode)), list(per_mode))
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.set_title(title)


def arm_child(script: str, name: str, source: str, arguments: list[str], extra_path: Sequence[str] = ()) -> Any:
    """Run `script --child *arguments` in a fresh process whose client is the arm's source tree (`source`, a
    client/src: first on PYTHONPATH, then `extra_path`, then the caller's own entries: a GPU host's carried
    wheels, server/src); its last line of output, as JSON. Refuses a child that ran another client."""
    import os
    import subprocess
    import sys

    kept = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    path = os.pathsep.join([str(Path(source).resolve()), *extra_path, *kept])
    done = subprocess.run(
        [sys.executable, script, "--child", *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"arm {name}: {done.stderr[-2000:]}")
    found = json.loads(done.stdout.splitlines()[-1])
    if not found["client"].startswith(str(Path(source).resolve())):
        raise RuntimeError(f"arm {name} ran the client at {found['client']}, not {source}")
    return found

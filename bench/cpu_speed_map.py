"""How fast each CPU of this machine runs the same pure-Python work, in interleaved rounds.

GPU run 44 (an H100 host lent by the hour): the same node program's CPU-bound start took 1.0 s in some runs and
1.6-1.75 s in others, and switched speed within a run (one run's first three graphs at the faster pace, the rest
at the slower). Whether that is a property of some CPUs (a CPU whose core another tenant keeps busy) or of time
decides how a start-up benchmark can compare two processes there: pinned to a fast CPU, or many more pairs.

    python3 bench/cpu_speed_map.py --rounds 3 --out bench/results/runNN_cpu_speed_map

This process pins itself to each CPU in turn (every CPU it may run on), times a fixed loop of dict and list
work (what a frontend's Python build does), `--rounds` times over all CPUs; writes OUT.json and OUT.png: per CPU
each round's ms, and its median over the machine's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import figure, save, table, write_json


def work(items: int) -> float:
    """Seconds for a fixed mix of the dicts, lists and small objects a Python build makes."""
    started = time.perf_counter()
    rows = []
    for i in range(items):
        row = {"tile": (i % 7, i % 11), "stages": [i, i + 1, i + 2], "name": f"cfg{i}"}
        if row["tile"][0] > 2:
            rows.append(row)
    sum(len(r["name"]) for r in rows)
    return time.perf_counter() - started


def pace_ms(items: int = 20_000, probes: int = 3) -> float:
    """This process's pace now: the median ms of `probes` runs of work(items) (~11 ms each on GPU run 44's H100s
    at their faster pace). bench/startup_node.py records it before and after each node's clock."""
    return round(statistics.median(work(items) for _ in range(probes)) * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, default=60_000, help="loop size: ~50 ms a CPU on a fast core")
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.png are written")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    ms: dict[int, list[float]] = {cpu: [] for cpu in cpus}
    for _ in range(args.rounds):
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            work(args.items // 10)  # settle on the CPU
            ms[cpu].append(round(work(args.items) * 1000, 2))
    os.sched_setaffinity(0, set(cpus))
    median = statistics.median(v for values in ms.values() for v in values)
    rows = [[cpu, *values, statistics.median(values) / median] for cpu, values in ms.items()]
    print(table(["cpu", *(f"round {i + 1} ms" for i in range(args.rounds)), "median / machine's"], rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out.with_suffix(".json"), {"items": args.items, "ms": ms, "machine_median_ms": median})
    fig, (ax,) = figure(1)
    for cpu, values in ms.items():
        ax.scatter([cpu] * len(values), values, color="tab:blue", s=14)
    ax.axhline(median, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("CPU")
    ax.set_ylabel("ms for the same loop")
    ax.set_title("the same pure-Python work pinned to each CPU (dots: rounds; dashed: the machine's median)")
    save(fig, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()

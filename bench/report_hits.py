"""What reporting costs a hit, on the CPU (issue 32): `client.compile(spec)`
of stored plans with the client's outcome counting and background reports
on (as shipped: every graph counted, the counts sent every
PLANCACHE_REPORT_INTERVAL_S, here 1 s so reports go out during the
measurement) and off (no counting, no report: the hit path before issue
32), interleaved round by round in one process against one server (a real
plancache-server process, its Redis, a stand-in worker that stored the
plans first). Two hit paths: the server's (no disk cache: one unary
Compile) and the node's disk cache (no call at all: where a counter is the
largest share of a hit).

Per round, path and mode: `--calls` compiles, each of one of `--plans`
stored plans (75 KB, as a real SDPA plan); median of the per-call
latencies. The two modes run back to back in each round (the order
alternating): the figure is the median over `--rounds` of the rounds'
ratios (on / off).

    python3 bench/report_hits.py --out DIR     # DIR/report_hits.json, DIR/report_hits.png
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ["PLANCACHE_REPORT_INTERVAL_S"] = "1"  # before the client reads it: reports go out while it is measured

from bench.hedge_hits import stored_plans
from bench.report import figure, paired_panel, paired_rounds_main, save, table, write_json
from plancache import Client
from plancache.transport import client as client_module
from plancache.transport import outcomes
from plancache.trust.disk_cache import DiskCache
from tests.support.processes import REPO
from tests.support.standin import STANDIN_TARGET

MODES = ("reporting off", "reporting on")
PATHS = ("server hit", "disk cache hit")
TARGET_RATIO = 1.05  # on / off, p50: "the hit path no slower" within the noise of one machine


def run(rounds: int, calls: int, plans: int) -> dict[str, Any]:
    counting = client_module._count
    per_round: dict[str, dict[str, list[float]]] = {p: {m: [] for m in MODES} for p in PATHS}
    try:
        with stored_plans("plancache-report-hits-", plans) as (address, tmp, specs):
            clients = {
                (path, mode): Client(
                    address,
                    cache=DiskCache(tmp / f"cache-{mode[10:]}") if path == "disk cache hit" else False,
                    hedge=False,
                    allow_unsigned=True,
                    report=mode == "reporting on",
                )
                for path in PATHS
                for mode in MODES
            }

            def use(mode: str) -> None:
                client_module._count = counting if mode == "reporting on" else (lambda plan, target_id, node_type: None)  # type: ignore[assignment]

            for (
                _,
                mode,
            ), c in clients.items():  # warm every path (channels, the server's resolved-query memo, the disk caches)
                use(mode)
                for _ in range(3):
                    for spec in specs:
                        c.compile(spec, STANDIN_TARGET)
            for r in range(rounds):
                for path in PATHS:
                    for mode in MODES if r % 2 == 0 else reversed(MODES):
                        use(mode)
                        latencies = []
                        for i in range(calls):
                            started = time.perf_counter()
                            clients[(path, mode)].compile(specs[i % plans], STANDIN_TARGET)
                            latencies.append(time.perf_counter() - started)
                        per_round[path][mode].append(statistics.median(latencies) * 1e6)
            use("reporting on")
            for c in clients.values():
                c.close()
    finally:
        client_module._count = counting  # type: ignore[assignment]
    counted = sum(n for key, n in outcomes.outcome_stats().items() if key.path == "compile")
    ratios = {
        p: statistics.median(on / off for on, off in zip(v["reporting on"], v["reporting off"], strict=True))
        for p, v in per_round.items()
    }
    return {
        "machine": {"python": platform.python_version(), "cpus": len(os.sched_getaffinity(0))},
        "config": {"rounds": rounds, "calls": calls, "plans": plans, "report_interval_s": 1.0},
        "p50_us": {
            p: {
                m: {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v} for m, v in modes.items()
            }
            for p, modes in per_round.items()
        },
        "on_over_off": ratios,
        "graphs_counted_on": counted,
        "target": TARGET_RATIO,
        "met": all(r <= TARGET_RATIO for r in ratios.values()),
    }


def report(result: dict[str, Any], out: Path) -> None:
    write_json(out / "report_hits.json", result)
    rows = [[p, m, v["median"], v["min"], v["max"]] for p, modes in result["p50_us"].items() for m, v in modes.items()]
    print(table(["hit path", "mode", "p50 µs (median of rounds)", "min", "max"], rows))
    print(
        "reporting on / off: "
        + ", ".join(f"{p} {r:.3f}" for p, r in result["on_over_off"].items())
        + f" (target ≤ {TARGET_RATIO})"
    )
    fig, axes = figure(len(PATHS))
    for a, (path, modes) in zip(axes, result["p50_us"].items(), strict=True):
        paired_panel(
            a,
            modes,
            lambda us: f"{us:.1f} µs",
            "compile() p50 µs per round",
            f"{path}: on / off = {result['on_over_off'][path]:.3f}",
        )
    save(fig, out / "report_hits.png")


def main() -> None:
    paired_rounds_main(run, report, REPO / "bench" / "results")


if __name__ == "__main__":
    main()

"""The arms of a hedged-miss diagnosis side by side (scripts/gpu-dropin-hedge.sh: one bench/startup.py
--study hedge-paired result per arm), from their JSON: each pair's ratio (a hedged first node over the local
run just before it), their median per path and arm, and per graph the node's own build inside the hedged
runs against the local runs' (what the service's work beside the node costs its builds).

    python3 bench/hedge_arms.py --arm shared=A.json --arm paused=B.json ... --out bench/results/run41_hedge_arms

Writes OUT.json and OUT.png (the pairs' ratios per arm and path, the 1.05x target drawn).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import figure, save

# Each hedged path and the local run it is paired with (bench/startup.py PAIRED and PAIRED_BY_NAME).
PAIRS = {
    "first-compile+hedge": "local-heuristic",
    "first-compile+eager+hedge": "local-heuristic",
    "first-dropin+hedge": "local-program",
    "first-dropin+eager+hedge": "local-program",
    "first-dropin+quiet+hedge": "local-program",
    "first-dropin+no-stream+hedge": "local-program",
    "first-compile-4proc+hedge": "local-heuristic-4proc",
    "first-functional+hedge": "local-functional",
    "first-functional-train+hedge": "local-functional-train",
    "first-lazy+hedge": "local-heuristic",  # plus the lazy node's sleeps (bench/startup.py's local-lazy)
}
TARGET = 1.05  # issue 41: every hedged first-node path at most this times its local equivalent


def clocked(runs: list[dict[str, Any]], jit: str = "warm") -> list[dict[str, Any]]:
    """The runs of JIT cache state `jit` ("warm", or "cold": an empty one), every function below reads only
    those; each row of processes that went together timed by their own clocks (the last to stop): rows
    written before GPU run 46 took the node's end from a wall-clock stamp made after each process's post-clock
    work (bench/startup_node.py's pace loop, from GPU run 45 on: 110-220 ms more in every such row: each hedged
    first node, the local 4-process node). The recorded total is kept as `total_s_recorded`."""
    out = []
    for run in runs:
        if run.get("jit") != jit:
            continue
        own = [p.get("total_s") for p in run.get("per_process") or ()]
        if "total_s" in run and own and all(t is not None for t in own):
            out.append({**run, "total_s": max(own), "total_s_recorded": run["total_s"]})
        else:
            out.append(run)
    return out


def _slept_s(run: dict[str, Any]) -> float:
    """The sleeps a lazy hedged node's clock includes (bench/startup.py's local-lazy adds them to the local run)."""
    return run.get("lazy_s", 0.0) * run.get("graphs", 13) if run["path"].startswith("first-lazy") else 0.0


def _pairs(runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(hedged path, its run, the run of its local equivalent just before it), runs that ended."""
    last: dict[str, dict[str, Any]] = {}
    for r in runs:
        if "error" in r or "total_s" not in r:
            continue
        path = r["path"]
        if path in PAIRS.values():
            last[path] = r
        elif path in PAIRS and PAIRS[path] in last:
            yield path, r, last.pop(PAIRS[path])


def _ratio(hedged: dict[str, Any], local: dict[str, Any]) -> float:
    return float(hedged["total_s"]) / (local["total_s"] + _slept_s(hedged))


def pair_ratios(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per hedged path: each of its runs over the run of its local equivalent just before it."""
    out: dict[str, list[float]] = {}
    for path, hedged, local in _pairs(runs):
        out.setdefault(path, []).append(_ratio(hedged, local))
    return out


def _builds_ms(run: dict[str, Any]) -> list[float]:
    """The node's own builds past its first two graphs (the frontend's first uses), ms: a hedged run's from its
    phases (BENCH_MISS_PHASES, one record per process), a local run's as the gaps between its graphs becoming
    runnable (one process only: the gaps of processes that ran together say nothing of a build)."""
    phases = run.get("phases") or {}
    builds = [
        b
        for each in (phases if isinstance(phases, list) else [phases])
        for b in ((each or {}).get("local_build") or (each or {}).get("race_build") or {}).get("each_ms", [])[2:]
    ]
    if builds:
        return builds
    if run["path"] in PAIRS.values() and run.get("runnable_s") and run.get("processes", 1) == 1:
        times = [0.0, *run["runnable_s"]]
        return [1000 * (b - a) for a, b in list(itertools.pairwise(times))[2:]]
    return []


def build_ms(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per hedged path: the median of the node's own builds past its first two graphs, in the hedged runs, and the
    local runs' for the same graphs (_builds_ms)."""
    out: dict[str, list[float]] = {}
    for r in runs:
        if "error" not in r:
            out.setdefault(r["path"], []).extend(_builds_ms(r))
    return {path: statistics.median(values) for path, values in out.items() if values}


def _graph_pace_ms(run: dict[str, Any]) -> float | None:
    """The median gap between a one-process run's graphs becoming runnable, past its first two (its builds, each
    graph's first execute and, hedged, plancache's own ~1 ms; a lazy node's sleep taken out), or None."""
    if not run.get("runnable_s") or run.get("processes", 1) != 1:
        return None
    times = [0.0, *run["runnable_s"]]
    slept = run.get("lazy_s", 0.0) if run["path"].startswith("first-lazy") else 0.0
    gaps = [1000 * (b - a - slept) for a, b in list(itertools.pairwise(times))[2:]]
    return statistics.median(gaps) if gaps else None


PACE_TOLERANCE = 0.10  # a run's pace before and after its clock, and a pair's two runs, at most this apart


def _steady_pace(run: dict[str, Any]) -> float | None:
    """The run's pace (bench/startup_node.py's `pace_ms`: a fixed loop's ms before and after its clock) when it
    held across the clock, else None (a run without the record, or one whose host changed pace meanwhile)."""
    pace = run.get("pace_ms")
    if not isinstance(pace, list) or len(pace) != 2 or min(pace) <= 0:
        return None
    before, after = pace
    return (before + after) / 2 if abs(before - after) <= PACE_TOLERANCE * min(before, after) else None


def _pairs_at_one_pace(
    runs: list[dict[str, Any]], pace_of: Callable[[dict[str, Any]], float | None]
) -> dict[str, list[float]]:
    """pair_ratios of the pairs whose two runs have a pace (`pace_of`) within PACE_TOLERANCE of each other."""
    out: dict[str, list[float]] = {}
    for path, hedged, local in _pairs(runs):
        kept = out.setdefault(path, [])
        pace, local_pace = pace_of(hedged), pace_of(local)
        if (
            pace is not None
            and local_pace is not None
            and abs(pace - local_pace) <= PACE_TOLERANCE * min(pace, local_pace)
        ):
            kept.append(_ratio(hedged, local))
    return out


def paced_pairs(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """pair_ratios of the pairs whose two runs ran at one pace: each steady across its clock and the two within
    PACE_TOLERANCE of each other (GPU run 44's hosts switched between two paces ~1.6x apart). A flip inside a
    clock that ends where it began is not seen: the per-graph figures are for that."""
    return _pairs_at_one_pace(runs, _steady_pace)


def build_paced_pairs(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """pair_ratios of the pairs whose two runs built at one pace: the median gaps between their graphs becoming
    runnable (_graph_pace_ms, the frontend's build of the same graphs on both sides) within PACE_TOLERANCE of each
    other. The host's slow mode (every build ~1.4x, GPU runs 44-47) shows in the builds themselves, where the pace
    loop around the clock (paced_pairs) moved within most runs (run 47: no pair kept). Pairs of several processes
    or without per-graph times (4 processes, the functional step) are not judged."""
    return _pairs_at_one_pace(runs, _graph_pace_ms)


def best_of(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per hedged path: its fastest run over the fastest run of its local equivalent. GPU run 44's
    H100 host ran the same program's CPU-bound start at two speeds ~1.6x apart, switching between runs and within
    one, so a pair's two runs can be at different speeds; each side's fastest run is at the host's faster one."""
    fastest: dict[str, dict[str, Any]] = {}
    for r in runs:
        if "error" in r or "total_s" not in r:
            continue
        if r["path"] not in fastest or r["total_s"] < fastest[r["path"]]["total_s"]:
            fastest[r["path"]] = r
    return {
        path: _ratio(fastest[path], fastest[local])
        for path, local in PAIRS.items()
        if path in fastest and local in fastest
    }


def graphwise_fastest(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per hedged path (one process): the sum over its graphs of each graph's fastest time to runnable across its
    runs, over the same sum for its local equivalent. The host's speed switches within a run too (GPU run 44: one
    run's first three graphs at the faster speed, the rest at the slower), so each graph's fastest of a few runs
    is at the faster speed where a whole run's may not be."""
    fastest: dict[str, list[float]] = {}
    for r in runs:
        times = r.get("runnable_s")
        if "error" in r or not times or r["path"].startswith(("first-lazy", "first-compile-4")):
            continue
        gaps = [b - a for a, b in itertools.pairwise([0.0, *times])]
        found = fastest.setdefault(r["path"], gaps)
        fastest[r["path"]] = [min(a, b) for a, b in zip(found, gaps, strict=False)]
    return {
        path: sum(fastest[path]) / sum(fastest[local])
        for path, local in PAIRS.items()
        if path in fastest and local in fastest and len(fastest[path]) == len(fastest[local])
    }


def own_ms(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per hedged path: what plancache's front door added to each graph over the node's own build inside it, read in
    the node's process (BENCH_MISS_PHASES): `compile` minus `local_build` (Client.compile), `dropin_build` minus
    `race_build` (plancache.cudnn's build step). Within one graph of one process, so the host's speed changing
    between runs does not blur it. Medians past the first two graphs, the first two, and the drop-in's capture."""
    per_path: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        if "error" in r:
            continue
        phases = r.get("phases") or {}
        for record in phases if isinstance(phases, list) else [phases]:
            each = record or {}
            outer = (each.get("dropin_build") or each.get("compile") or {}).get("each_ms", [])
            inner = (each.get("race_build") or each.get("local_build") or {}).get("each_ms", [])
            if not outer or len(outer) != len(inner):
                continue
            added = [a - b for a, b in zip(outer, inner, strict=True)]
            found = per_path.setdefault(r["path"], {"past_two": [], "first_two": [], "capture": [], "touch": []})
            found["past_two"].extend(added[2:])
            found["first_two"].extend(added[:2])
            found["capture"].extend((each.get("dropin_capture") or {}).get("each_ms", [])[2:])
            found["touch"].extend((each.get("touch") or {}).get("each_ms", []))
    return {
        path: {
            "median_ms_past_two": round(statistics.median(found["past_two"]), 3) if found["past_two"] else None,
            "first_two_ms": [round(v, 2) for v in found["first_two"]],
            "capture_median_ms_past_two": round(statistics.median(found["capture"]), 3) if found["capture"] else None,
            "touch_ms": [round(v, 2) for v in found["touch"]],
        }
        for path, found in per_path.items()
    }


def beside(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per path, each run's total and what ran beside its node (bench/startup.py's `beside`, GPU run 42 on): the
    node's threads other than its main one (CPU s), the service's processes' CPU s, the machine's busy CPU s and
    the GPU's utilization while the node ran."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if "error" in r or "beside" not in r:
            continue
        threads = r.get("thread_cpu_s") or {}
        out.setdefault(r["path"], []).append(
            {
                "total_s": r.get("total_s"),
                "node_cpu_s": r.get("cpu_s"),
                "node_main_thread_cpu_s": threads.get("MainThread"),
                "node_other_threads_cpu_s": round(sum(v for k, v in threads.items() if k != "MainThread"), 3),
                "node_top_other_threads": dict(list((k, v) for k, v in threads.items() if k != "MainThread")[:4]),
                **r["beside"],
            }
        )
    return out


def collector(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per path (local runs too), each run's total and its garbage collector's pauses over the node's clock
    (bench/startup_node.py's `gc`): full collections, their ms and when they began, all pauses' ms. A full
    collection walks every object the process tracks (torch's included): one more of them on one side of a
    pair is tens of ms of the gap."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if "error" in r or not isinstance(r.get("gc"), dict):
            continue
        found = r["gc"]
        out.setdefault(r["path"], []).append(
            {
                "total_s": r.get("total_s"),
                "full_collections": found["collections"][2],
                "full_ms": found["pause_ms"][2],
                "full_at_s": found["full_at_s"],
                "all_pauses_ms": round(sum(found["pause_ms"]), 2),
                "tracked_at_start": found["tracked_at_start"],
            }
        )
    return out


def _kept_line(arm: dict[str, Any], kept: str) -> str:
    """One filter's kept pairs per path: their median and how many of the arm's pairs they are."""
    return ", ".join(
        f"{p.removesuffix('+hedge')} {statistics.median(v):.2f}x (n={len(v)} of {len(arm['pairs'].get(p, []))})"
        if v
        else f"{p.removesuffix('+hedge')} - (n=0)"
        for p, v in arm[kept].items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", required=True, help="NAME=startup.json (in the order to draw)")
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.png are written")
    parser.add_argument("--jit", choices=("warm", "cold"), default="warm", help="the JIT cache state's runs to read")
    args = parser.parse_args()
    arms: dict[str, Any] = {}
    for arm in args.arm:
        name, _, file = arm.partition("=")
        data = json.loads(Path(file).read_text())
        data["runs"] = clocked(data["runs"], args.jit)
        ratios = pair_ratios(data["runs"])
        arms[name] = {
            "file": file,
            "pairs": ratios,
            "median": {path: statistics.median(values) for path, values in ratios.items()},
            "build_ms_median_past_two": build_ms(data["runs"]),
            "beside": beside(data["runs"]),
            "gc": collector(data["runs"]),
            "paced_pairs": paced_pairs(data["runs"]),
            "build_paced_pairs": build_paced_pairs(data["runs"]),
            "best_of": best_of(data["runs"]),
            "graphwise_fastest": graphwise_fastest(data["runs"]),
            "own_ms": own_ms(data["runs"]),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({"target": TARGET, "jit": args.jit, "arms": arms}, indent=1) + "\n"
    )
    fig, (ax,) = figure(1)
    labels, positions = [], 0
    for name, arm in arms.items():
        for path, values in arm["pairs"].items():
            ax.scatter([positions] * len(values), values, color="tab:blue", s=18)
            ax.scatter([positions], [statistics.median(values)], color="tab:red", marker="_", s=300)
            labels.append(f"{name}\n{path.removesuffix('+hedge')}")
            positions += 1
    ax.axhline(TARGET, color="gray", linestyle="--", linewidth=1)
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("hedged first node / local run just before")
    ax.set_title("hedged first nodes by arm (dots: pairs, bar: median; dashed: 1.05x)")
    save(fig, args.out.with_suffix(".png"))
    for name, arm in arms.items():
        medians = ", ".join(
            f"{p.removesuffix('+hedge')} {v:.2f}x (n={len(arm['pairs'][p])})" for p, v in arm["median"].items()
        )
        print(f"{name:10s} {medians}")
        print(f"{'':10s} pairs at one pace: {_kept_line(arm, 'paced_pairs')}")
        print(f"{'':10s} pairs whose builds ran at one pace: {_kept_line(arm, 'build_paced_pairs')}")
        print(
            f"{'':10s} best of each side: "
            + ", ".join(f"{p.removesuffix('+hedge')} {v:.2f}x" for p, v in arm["best_of"].items())
        )
        print(
            f"{'':10s} each graph's fastest, summed: "
            + ", ".join(f"{p.removesuffix('+hedge')} {v:.2f}x" for p, v in arm["graphwise_fastest"].items())
        )
        for path, own in arm["own_ms"].items():
            print(
                f"{'':10s} {path.removesuffix('+hedge')}: plancache's own ms a graph past two {own['median_ms_past_two']}, "
                f"first two {own['first_two_ms'][:2]}, capture {own['capture_median_ms_past_two']}"
            )


if __name__ == "__main__":
    main()

"""What the drop-in spends on a program's graph before its build step, on the CPU (issue 41, items 1 and 2).

`plancache.cudnn` asks the service for a program's graph by its spec, and proves the spec first: the
frontend's IR is read into a spec (`GraphSpec.from_pygraph`, then its normal form), the frontend graph
plancache's workers would build is made from that spec, and both are compared field by field as cuDNN
would receive them (plancache.cudnn._capture). Then the spec is keyed. All of it is Python on the
program's thread, once per graph, on a hit (a stored start) and on a miss alike; GPU run 39 put
plancache's whole part of a stored start at ~2.5 ms a graph over the floor (the frontend's own
deserialize). The frontend's IR needs no GPU, so it is measured here on the benchmark's 13 start-up
graphs (bench/startup_graphs.py, made as the local program makes them: plancache.frontend_graph.build_pygraph).

Per graph, interleaved rounds of --calls calls each, µs per call, medians over the rounds:

  read      GraphSpec.from_pygraph + normalize: the program's IR as a spec
  rebuild   build_pygraph(spec): the graph a worker would build (made, never built)
  compare   differences(program's graph, rebuilt)
  capture   the three together (plancache.cudnn._capture.capture, as shipped)
  key       PlanQuery of the normalized spec: its canonical JSON hashed (what the drop-in asks by)

and, in --fresh fresh processes (after `import plancache.cudnn`, as a program starts), the first and second
graphs' capture and key, once each: what a process's first graphs pay that later ones do not (lazy imports,
first-use caches), as the drop-in's first two graphs were the excess of GPU run 42's hedged first nodes.

    python3 bench/capture_cost.py --out DIR [--tag T]     # DIR/capture_cost[_T].{json,png}
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, per_call_us, save, table, write_json  # noqa: E402

PIECES = ("read", "rebuild", "compare", "capture", "key")


def run(rounds: int, calls: int) -> dict[str, Any]:
    import cudnn

    from bench.startup_graphs import startup_graphs
    from plancache.cudnn._capture import capture
    from plancache.frontend_graph import build_pygraph, differences
    from plancache.graphspec.graph import GraphSpec
    from plancache.graphspec.validation import normalize
    from plancache.keys.query import PlanQuery
    from tests.support.frontdoor_standins import TARGET

    graphs = {spec.name: build_pygraph(normalize(spec), cudnn) for spec in startup_graphs()}
    specs = {name: capture(g, cudnn) for name, g in graphs.items()}
    rebuilt = {name: build_pygraph(specs[name], cudnn) for name in graphs}
    for name, g in graphs.items():
        assert not differences(g, rebuilt[name]), name  # the proof holds: what is timed is the path a hit takes
    pieces: dict[str, Callable[[str], Any]] = {
        "read": lambda n: normalize(GraphSpec.from_pygraph(graphs[n])),
        "rebuild": lambda n: build_pygraph(specs[n], cudnn),
        "compare": lambda n: differences(graphs[n], rebuilt[n]),
        "capture": lambda n: capture(graphs[n], cudnn),
        "key": lambda n: PlanQuery.normalized(specs[n], TARGET, None).key,
    }
    per_round: dict[str, dict[str, list[float]]] = {p: {n: [] for n in graphs} for p in PIECES}
    for _ in range(rounds):
        for name in graphs:
            for piece, fn in pieces.items():
                per_round[piece][name].append(per_call_us(lambda fn=fn, name=name: fn(name), calls))
    medians = {p: {n: statistics.median(v) for n, v in per.items()} for p, per in per_round.items()}
    return {
        "commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "python": sys.version.split()[0],
        "frontend": getattr(cudnn, "__version__", "?"),
        "rounds": rounds,
        "calls": calls,
        "graphs": list(graphs),
        "median_us": medians,
        "mean_over_graphs_us": {p: statistics.mean(medians[p].values()) for p in PIECES},
    }


def first_graphs() -> dict[str, float]:
    """In this (fresh) process: the first two graphs' capture and key, ms."""
    import cudnn

    import plancache.cudnn  # noqa: F401 - what a program imports before its first graph
    from bench.startup_graphs import startup_graphs
    from plancache.cudnn._capture import capture
    from plancache.frontend_graph import build_pygraph
    from plancache.graphspec.validation import normalize
    from plancache.keys.query import PlanQuery
    from tests.support.frontdoor_standins import TARGET

    found: dict[str, float] = {}
    for index, spec in enumerate(startup_graphs()[:2]):
        graph = build_pygraph(normalize(spec), cudnn)
        begun = time.perf_counter()
        captured = capture(graph, cudnn)
        captured_at = time.perf_counter()
        PlanQuery.normalized(captured, TARGET).key  # noqa: B018 - the key is what is timed
        found[f"graph{index + 1}_capture_ms"] = (captured_at - begun) * 1000
        found[f"graph{index + 1}_key_ms"] = (time.perf_counter() - captured_at) * 1000
    return found


def fresh(processes: int) -> dict[str, Any]:
    """first_graphs() in `processes` fresh processes, their medians."""
    import json

    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, __file__, "--first-graphs"], capture_output=True, text=True, check=True
            ).stdout.splitlines()[-1]
        )
        for _ in range(processes)
    ]
    return {"processes": processes, "median_ms": {k: statistics.median(r[k] for r in runs) for k in runs[0]}}


def report(results: dict[str, Any], out: Path, tag: str) -> None:
    suffix = f"_{tag}" if tag else ""
    write_json(out / f"capture_cost{suffix}.json", results)
    rows = [[n, *(f"{results['median_us'][p][n]:.1f}" for p in PIECES)] for n in results["graphs"]]
    rows.append(["mean", *(f"{results['mean_over_graphs_us'][p]:.1f}" for p in PIECES)])
    print(table(["graph (µs per call)", *PIECES], rows))
    fig, (ax,) = figure(1)
    names = results["graphs"]
    width = 0.8 / len(PIECES)
    for i, piece in enumerate(PIECES):
        ax.bar(
            [x + i * width for x in range(len(names))],
            [results["median_us"][piece][n] for n in names],
            width,
            label=f"{piece}: {results['mean_over_graphs_us'][piece]:.0f} µs mean",
        )
    ax.set_xticks([x + 0.4 for x in range(len(names))], names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("µs per graph (median of rounds)")
    ax.set_title(f"the drop-in's capture and key per graph, CPU, {results['commit']}")
    ax.legend(fontsize=7)
    save(fig, out / f"capture_cost{suffix}.png")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--fresh", type=int, default=7, help="fresh processes timing their first two graphs")
    parser.add_argument("--tag", default="")
    parser.add_argument("--first-graphs", action="store_true", help=argparse.SUPPRESS)  # one fresh process's part
    args = parser.parse_args()
    if args.first_graphs:
        import json

        print(json.dumps(first_graphs()))
        return
    results = run(args.rounds, args.calls)
    results["fresh"] = fresh(args.fresh)
    print(results["fresh"])
    report(results, args.out, args.tag)


if __name__ == "__main__":
    main()

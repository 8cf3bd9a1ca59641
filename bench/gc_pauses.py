"""What the garbage collector costs a Python-heavy first node, on the CPU (issue 41: the drop-in's first graphs).

A first node's graphs are planned by Python (the cuDNN frontend 1.32's Python engines, GPU run 40's profile) in a
process that imported torch: some 180,000 objects the cyclic collector tracks, every one of them walked by each
full (generation 2) collection. A stand-in for that planning here, in fresh processes: the 13 start-up graphs'
frontend IR made (plancache.frontend_graph.build_pygraph) six times over, with transient objects as planning makes
them and a few kept (the graphs and what they hold). Per process: its time, the collector's pauses in it, the full
collections among them, and the objects tracked when it began. Modes, interleaved --rounds times:

  plain     torch, the frontend and plancache's graph builder imported (the local program's process)
  client    the same with plancache.cudnn imported and a plancache Client made (the drop-in's process)
  frozen    the client's process with what its imports made frozen out of collections (gc.freeze())

No GPU: the frontend's IR only. What this says about a GPU node is only that its collector can cost as much as
the planning itself; whether one side of GPU run 42's pairs paid more of it is what each start-up node's `gc`
record (bench/startup_node.py) and the `gcfreeze` arm of scripts/gpu-dropin-hedge.sh measure.

    python3 bench/gc_pauses.py --out DIR [--rounds N]      # DIR/gc_pauses.{json,png}
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402

MODES = ("plain", "client", "frozen")
REPEATS = 6  # times the 13 graphs are made: ~a first node's planning on this machine
TRANSIENT = 3000  # transient objects per graph (planning's own), 200 of them kept with the graph


def one_process(mode: str) -> dict[str, Any]:
    """In this (fresh) process: the stand-in planning under `mode`."""
    import cudnn
    import torch  # noqa: F401 - what a node imports

    from bench.startup_graphs import startup_graphs
    from plancache.frontend_graph import build_pygraph
    from plancache.graphspec.validation import normalize

    if mode in ("client", "frozen"):
        import plancache.cudnn  # noqa: F401
        from plancache import Client

        client = Client("127.0.0.1:1", cache=False)  # a channel, never connected
    if mode == "frozen":
        gc.collect()
        gc.freeze()
    tracked = len(gc.get_objects())
    specs = [normalize(s) for s in startup_graphs()]
    paused, full, began = [0.0], [0], [0.0]

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
            return
        paused[0] += time.perf_counter() - began[0]
        full[0] += info["generation"] == 2

    gc.callbacks.append(watch)
    kept = []
    start = time.perf_counter()
    for _ in range(REPEATS):
        for spec in specs:
            graph = build_pygraph(spec, cudnn)
            transient = [{"i": i, "v": [i] * 8} for i in range(TRANSIENT)]
            kept.append((graph, transient[:200]))
    elapsed = time.perf_counter() - start
    gc.callbacks.remove(watch)
    if mode != "plain":
        client.close()
    return {"s": elapsed, "gc_pause_s": paused[0], "full_collections": full[0], "tracked": tracked}


def run(rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, "--one", mode], capture_output=True, text=True, check=True
            ).stdout.splitlines()[-1]
            runs[mode].append(json.loads(out))
    median = {
        m: {k: statistics.median(r[k] for r in rs) for k in ("s", "gc_pause_s", "full_collections", "tracked")}
        for m, rs in runs.items()
    }
    return {
        "commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "python": sys.version.split()[0],
        "rounds": rounds,
        "repeats": REPEATS,
        "transient_per_graph": TRANSIENT,
        "median": median,
        "runs": runs,
    }


def _row(mode: str, v: dict[str, float]) -> list[str]:
    share = f"{v['gc_pause_s'] / v['s']:.0%}"
    return [
        mode,
        f"{v['s']:.3f}",
        f"{v['gc_pause_s']:.3f}",
        share,
        f"{v['full_collections']:.0f}",
        f"{v['tracked']:.0f}",
    ]


def report(results: dict[str, Any], out: Path) -> None:
    write_json(out / "gc_pauses.json", results)
    med = results["median"]
    print(
        table(
            ["process", "planning s", "collector's pauses s", "share", "full collections", "objects tracked"],
            [_row(mode, v) for mode, v in med.items()],
        )
    )
    fig, (ax,) = figure(1)
    for i, mode in enumerate(MODES):
        values = results["runs"][mode]
        ax.scatter([i] * len(values), [r["s"] for r in values], color="tab:blue", s=14)
        ax.scatter([i + 0.15] * len(values), [r["gc_pause_s"] for r in values], color="tab:red", s=14)
        ax.bar(i, med[mode]["s"], alpha=0.3, color="tab:blue", width=0.5)
    ax.set_xticks(range(len(MODES)), MODES)
    ax.set_ylabel("seconds (blue: the planning; red: the collector's pauses in it)")
    ax.set_title(f"a Python-heavy first node's collector, CPU, {results['commit']}")
    save(fig, out / "gc_pauses.png")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # one fresh process's part
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_process(args.one)))
        return
    report(run(args.rounds), args.out)


if __name__ == "__main__":
    main()

"""What importing plancache adds to a fresh process (issue 41: never slower than without plancache).

The start-up benchmark (bench/startup.py) imports plancache on both sides of a pair before its clock starts, and the
first-step ones start their clocks after the imports, so their ratios leave out what a program pays to load
plancache at all. This measures that alone: fresh processes in
turn, a baseline (`import torch, cudnn`: what a cuDNN frontend program loads anyway) and the same with one of
plancache's front doors added (`import torch, cudnn, plancache.cudnn`, `plancache.functional`, `plancache.torch`);
the whole process's wall time from its start to its exit, and the door's own import as the process times it. Pairs
alternate which side goes first; the ratio is taken pair by pair, medians reported.

Bytecode as installed: a `pip install` writes every module's bytecode once; where this environment says not to
write any (PYTHONDONTWRITEBYTECODE, as on the development machine), the children write theirs under a private
PYTHONPYCACHEPREFIX after one warm-up run of each command, so that neither side compiles sources in its pairs.

    python3 bench/import_cost.py [--pairs 10] [--out bench/results]   # DIR/import_cost.{json,png}
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402

BASELINE = ("torch", "cudnn")
DOORS = ("plancache.cudnn", "plancache.functional", "plancache.torch")
# The child: the baseline's imports, then the door's, timed; prints the door's import seconds.
CHILD = (
    "import importlib, sys, time\n"
    "for name in sys.argv[1].split(','):\n"
    "    importlib.import_module(name)\n"
    "begun = time.perf_counter()\n"
    "for name in filter(None, sys.argv[2].split(',')):\n"
    "    importlib.import_module(name)\n"
    "print(time.perf_counter() - begun)\n"
)


def child_environment() -> dict[str, str]:
    """This environment, with bytecode written (under a private prefix where this one writes none)."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "client" / "src"), str(REPO / "server" / "src"), environment.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    if environment.pop("PYTHONDONTWRITEBYTECODE", ""):
        environment.setdefault("PYTHONPYCACHEPREFIX", tempfile.mkdtemp(prefix="plancache-pyc-"))
    return environment


def one_run(baseline: tuple[str, ...], added: tuple[str, ...], environment: dict[str, str]) -> dict[str, float]:
    """One fresh process: its wall seconds (start to exit) and the added modules' import seconds."""
    begun = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(baseline), ",".join(added)],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
        timeout=600,
    )
    wall = time.perf_counter() - begun
    if done.returncode != 0:
        raise RuntimeError(f"import {', '.join(baseline + added)} failed: {done.stderr[-2000:]}")
    return {"wall_s": wall, "import_s": float(done.stdout.split()[-1])}


def measure(pairs: int, baseline: tuple[str, ...], doors: tuple[str, ...]) -> dict[str, Any]:
    environment = child_environment()
    for added in ((), *((door,) for door in doors)):
        one_run(baseline, added, environment)  # warm-up: bytecode written, the OS's file cache filled
    rows = []
    for door in doors:
        runs: dict[str, list[dict[str, float]]] = {"baseline": [], "door": []}
        for index in range(pairs):
            order = (("baseline", ()), ("door", (door,)))
            for side, added in order if index % 2 == 0 else reversed(order):
                runs[side].append(one_run(baseline, added, environment))
        ratios = [d["wall_s"] / b["wall_s"] for d, b in zip(runs["door"], runs["baseline"], strict=True)]
        added_s = [d["wall_s"] - b["wall_s"] for d, b in zip(runs["door"], runs["baseline"], strict=True)]
        rows.append(
            {
                "door": door,
                "baseline_wall_s": statistics.median(r["wall_s"] for r in runs["baseline"]),
                "door_wall_s": statistics.median(r["wall_s"] for r in runs["door"]),
                "wall_ratio": statistics.median(ratios),
                "wall_added_s": statistics.median(added_s),
                "door_import_s": statistics.median(r["import_s"] for r in runs["door"]),
                "ratios": ratios,
                "runs": runs,
            }
        )
    return {
        "baseline": list(baseline),
        "pairs": pairs,
        "python": sys.version.split()[0],
        "bytecode": "written under PYTHONPYCACHEPREFIX" if "PYTHONPYCACHEPREFIX" in environment else "as this Python",
        "rows": rows,
    }


def report(results: dict[str, Any], out: Path, tag: str = "") -> None:
    suffix = f"_{tag}" if tag else ""
    write_json(out / f"import_cost{suffix}.json", results)
    rows = results["rows"]
    print(
        table(
            ["import added to `import " + ", ".join(results["baseline"]) + "`", "ratio", "added ms", "its import ms"],
            [[r["door"], r["wall_ratio"], r["wall_added_s"] * 1000, r["door_import_s"] * 1000] for r in rows],
        )
    )
    fig, (ax,) = figure(1)
    names = [r["door"] for r in rows]
    ax.bar(names, [r["door_import_s"] * 1000 for r in rows], label="its import, timed in the process (median)")
    ax.scatter(names, [r["wall_added_s"] * 1000 for r in rows], color="black", zorder=3, label="whole process, added")
    ax.set_ylabel("ms a fresh process pays")
    ax.set_title(f"What loading plancache adds to `import {', '.join(results['baseline'])}`", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, out / f"import_cost{suffix}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--baseline", default=",".join(BASELINE), help="modules both sides import, in order")
    parser.add_argument("--door", action="append", default=[], help="a module added on one side (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    baseline = tuple(filter(None, args.baseline.split(",")))
    report(measure(args.pairs, baseline, tuple(args.door) or DOORS), args.out, args.tag)


if __name__ == "__main__":
    main()

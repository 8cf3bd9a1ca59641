"""What a served model adds to each call of its compiled program before any kernel: dynamo's guards (issue 42:
GPU run 53 read served ResNet-50 inference compiled 1.06-1.14x torch's with every traced call torch's own).

A compiled program checks its guards at every call. Served layers add guards of their own: with an instance
forward per layer (a functools.partial) dynamo guarded each layer's partial, its arguments and what the served
route read; with a served class per layer kind (plancache.torch._serve.ServedConv2d, ...) one class's forward.
This compiles a ResNet-50-sized stack (53 blocks of a 3x3 convolution, batch norm and ReLU, then a linear) on tiny
CPU tensors, torch's model and `plancache.torch.serve` of a copy, each through an entry function of its own, with
a backend that runs nothing (it returns a fixed tensor): what is timed per call is dynamo's frame and guard work.
On the CPU every routed call is left to torch (the routes serve CUDA tensors), as on GPU run 53 every traced call
went to torch in its race: both programs' graphs are the same. Arms are client source trees (`--arm NAME=PATH`,
PATH a client/src), run in alternating fresh processes; per process, medians of interleaved rounds.

    python3 bench/compiled_guards.py --arm before=/tmp/before/client/src --arm after=client/src --out bench/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))  # after a child's PYTHONPATH: the arm's client comes first

from bench.report import arm_child  # noqa: E402


def _child(rounds: int, calls: int) -> dict[str, Any]:
    import copy

    import torch
    from torch import nn

    import plancache.torch as pt

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers: list[nn.Module] = []
    for _ in range(53):
        layers += [nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(8 * 4 * 4, 10)).eval()
    served = pt.serve(copy.deepcopy(model))
    x, fixed = torch.randn(1, 8, 4, 4), torch.zeros(1, 10)

    def nothing(gm: Any, inputs: Any) -> Any:
        return lambda *args: (fixed,)

    def own_entry() -> Any:
        def entry(net: Any, x: Any) -> Any:
            return net(x)

        return entry

    torch._dynamo.reset()
    programs = {"torch": (torch.compile(own_entry(), backend=nothing), model)}
    programs["served"] = (torch.compile(own_entry(), backend=nothing), served)
    samples: dict[str, list[float]] = {name: [] for name in programs}
    with torch.no_grad():
        for fn, net in programs.values():
            fn(net, x)
        for _ in range(rounds):
            for name, (fn, net) in programs.items():
                start = time.perf_counter()
                for _ in range(calls):
                    fn(net, x)
                samples[name].append((time.perf_counter() - start) / calls * 1e6)
    import plancache

    return {
        "client": str(Path(plancache.__file__).resolve().parent),
        "us": {name: statistics.median(v) for name, v in samples.items()},
    }


def run(arms: dict[str, str], processes: int, rounds: int, calls: int) -> dict[str, Any]:
    per_arm: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for _ in range(processes):
        for name, source in arms.items():
            found = arm_child(__file__, name, source, ["--rounds", str(rounds), "--calls", str(calls)])
            per_arm[name].append(found["us"])
            us = found["us"]
            print(f"{name}: torch {us['torch']:.1f} µs a call, served {us['served']:.1f}")
    return {
        "arms": arms,
        "processes": processes,
        "rounds": rounds,
        "calls": calls,
        "python": sys.version.split()[0],
        "per_process_us": per_arm,
        "served_over_torch": {
            name: statistics.median(p["served"] / p["torch"] for p in runs) for name, runs in per_arm.items()
        },
        "served_minus_torch_us": {
            name: statistics.median(p["served"] - p["torch"] for p in runs) for name, runs in per_arm.items()
        },
    }


def report(results: dict[str, Any], out: Path) -> None:
    from bench.report import figure, save, table, write_json

    write_json(out / "compiled_guards.json", results)
    names = list(results["arms"])
    rows = [[n, results["served_over_torch"][n], results["served_minus_torch_us"][n]] for n in names]
    print(table(["arm", "served / torch (a compiled call)", "served - torch µs"], rows))
    fig, (ax,) = figure(1)
    ax.bar(names, [results["served_over_torch"][n] for n in names])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("served / torch, µs a compiled call (medians)")
    ax.set_title("dynamo's frame and guard work a call, 53-block stack, CPU", fontsize=9)
    save(fig, out / "compiled_guards.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", default=[], help="NAME=PATH of a client/src (repeatable)")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.rounds, args.calls)))
        return
    arms = dict(arm.split("=", 1) for arm in args.arm) or {"now": str(REPO / "client" / "src")}
    report(run(arms, args.processes, args.rounds, args.calls), args.out)


if __name__ == "__main__":
    main()

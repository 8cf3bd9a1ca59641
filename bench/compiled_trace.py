"""What a served model adds to its compiled program's cold start before any kernel: dynamo tracing the served layers'
Python (issue 42: GPU run 53 read a compiled GPT-2 with every plan stored 1.22x torch's first step, run 54 1.11x).

Under torch.compile dynamo traces each served layer's forward, bytecode by bytecode: the route's checks, the
record of a call left to torch, the read of the call's geometry (torch._dynamo.comptime) and its race (a
constant of the trace). Each traced call site pays it, once a compile. This traces a GPT-style stack (12 blocks of
two layer norms and four linears: 72 served layer calls) on tiny CPU tensors, torch's model and
`plancache.torch.serve` of a copy, with a backend that compiles nothing, again and again in one process
(`torch._dynamo.reset()` before each, the two alternating), and reports the trace's seconds. The routes are opened
to CPU tensors and the race is a stand-in that says torch's function is faster (the GPU runs' verdict for every
traced call of these models; the race itself needs a GPU and is timed there, `trace_races` in
bench/torch_models_startup.py): what is timed is tracing alone. Arms are client source trees (`--arm NAME=PATH`,
PATH a client/src), run in alternating fresh processes; per process, medians of the traces after the first.

    python3 bench/compiled_trace.py --arm before=/tmp/before/client/src --arm after=client/src --out bench/results
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

BLOCKS = 12


def _child(traces: int) -> dict[str, Any]:
    import copy

    import torch
    from torch import nn

    import plancache.torch as pt
    from plancache.torch import _mode

    torch.manual_seed(0)
    torch.set_num_threads(1)
    # STAND-IN routes and race: CPU tensors routed as CUDA ones would be, every traced call's race torch's.
    _mode.ROUTED_DEVICES.add("cpu")
    _mode.RACED_DEVICES.add("cpu")
    _mode.SERVED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
    _mode._race_traced_call = lambda *args: "torch's function is faster here (the benchmark's stand-in race)"

    class Block(nn.Module):
        def __init__(self, hidden: int = 64) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x: Any) -> Any:
            y = self.qkv(self.ln1(x))
            x = x + self.out(y[..., : x.shape[-1]])
            return x + self.down(torch.relu(self.up(self.ln2(x))))

    model = nn.Sequential(*[Block() for _ in range(BLOCKS)]).eval()
    served = pt.serve(copy.deepcopy(model))
    x = torch.randn(2, 16, 64)

    def nothing(gm: Any, inputs: Any) -> Any:
        return gm.forward

    seconds: dict[str, list[float]] = {"torch": [], "served": []}
    with torch.no_grad():
        for index in range(traces):
            order = [("torch", model), ("served", served)]
            for name, net in order if index % 2 == 0 else reversed(order):
                torch._dynamo.reset()
                started = time.perf_counter()
                torch.compile(net, backend=nothing, fullgraph=True)(x)
                seconds[name].append(time.perf_counter() - started)
    import plancache

    return {
        "client": str(Path(plancache.__file__).resolve().parent),
        "s": {name: statistics.median(v[1:]) for name, v in seconds.items()},  # the first: imports, caches
        "served_layer_calls": 6 * BLOCKS,
    }


def run(arms: dict[str, str], processes: int, traces: int) -> dict[str, Any]:
    per_arm: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    calls = 0
    for _ in range(processes):
        for name, source in arms.items():
            found = arm_child(__file__, name, source, ["--traces", str(traces)])
            per_arm[name].append(found["s"])
            calls = found["served_layer_calls"]
            s = found["s"]
            print(f"{name}: torch's trace {s['torch']:.3f} s, served {s['served']:.3f} s")
    return {
        "arms": arms,
        "processes": processes,
        "traces": traces,
        "served_layer_calls": calls,
        "python": sys.version.split()[0],
        "per_process_s": per_arm,
        "served_minus_torch_s": {
            name: statistics.median(p["served"] - p["torch"] for p in runs) for name, runs in per_arm.items()
        },
        "served_over_torch": {
            name: statistics.median(p["served"] / p["torch"] for p in runs) for name, runs in per_arm.items()
        },
    }


def report(results: dict[str, Any], out: Path) -> None:
    from bench.report import figure, save, table, write_json

    write_json(out / "compiled_trace.json", results)
    names = list(results["arms"])
    calls = results["served_layer_calls"] or 1
    rows = [
        [
            n,
            results["served_over_torch"][n],
            results["served_minus_torch_s"][n],
            results["served_minus_torch_s"][n] / calls * 1000,
        ]
        for n in names
    ]
    print(table(["arm", "served / torch (a trace)", "served - torch s", "ms a served layer call"], rows))
    fig, (ax,) = figure(1)
    ax.bar(names, [results["served_minus_torch_s"][n] for n in names])
    ax.set_ylabel("served - torch, s a trace (medians)")
    ax.set_title(f"dynamo tracing a {calls}-layer-call GPT-style stack served, CPU", fontsize=9)
    save(fig, out / "compiled_trace.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", default=[], help="NAME=PATH of a client/src (repeatable)")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--traces", type=int, default=7, help="traces of each model a process (the first not counted)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.traces)))
        return
    arms = dict(arm.split("=", 1) for arm in args.arm) or {"now": str(REPO / "client" / "src")}
    report(run(arms, args.processes, args.traces), args.out)


if __name__ == "__main__":
    main()

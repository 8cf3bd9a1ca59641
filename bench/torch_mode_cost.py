"""What plancache.torch costs the host, per call, on the CPU (issue 42, item 3).

The GPU's side of a routed call is the plan's (GPU runs measure it); what
the host pays for the route is Python, measured here on tiny CPU tensors
(so the kernel's own time is small), paired and interleaved:

- a torch call the mode does not route (torch.add, a tensor's mul, F.gelu),
  with and without the mode entered: what every other call of a model pays
  for a TorchFunctionMode;
- a call the mode routes but leaves to torch (F.layer_norm on a CPU tensor:
  the reason counted): the route's checks;
- an operator's own call (torch.ops.plancache.layer_norm, whose CPU
  implementation is torch's function) against torch's function: what a
  compiled program pays per operator call outside a CUDA graph (the
  dispatcher and the Python implementation).

Each: --rounds rounds of --calls calls, after a warm-up; µs per call,
median over rounds.

    python3 bench/torch_mode_cost.py --out DIR     # DIR/torch_mode_cost.{json,png}
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    import plancache.torch as pt

    torch.set_num_threads(1)
    x, w, b = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any], str]] = {
        "torch.add (not routed)": (lambda: torch.add(x, x), lambda: torch.add(x, x), "mode"),
        "tensor * tensor (not routed)": (lambda: x * x, lambda: x * x, "mode"),
        "F.gelu (not routed)": (lambda: F.gelu(x), lambda: F.gelu(x), "mode"),
        "F.layer_norm (routed, left to torch: CPU)": (
            lambda: F.layer_norm(x, [16], w, b),
            lambda: F.layer_norm(x, [16], w, b),
            "mode",
        ),
        "operator plancache::layer_norm vs F.layer_norm": (
            lambda: torch.ops.plancache.layer_norm(x, [16], w, b, 1e-5),
            lambda: F.layer_norm(x, [16], w, b, 1e-5),
            "operator",
        ),
        "operator plancache::linear vs F.linear": (
            lambda: torch.ops.plancache.linear(x, w.view(1, 16).expand(8, 16).contiguous(), None, None),
            lambda: F.linear(x, w.view(1, 16).expand(8, 16).contiguous()),
            "operator",
        ),
    }
    rows = []
    for name, (ours, theirs, kind) in cases.items():
        samples: dict[str, list[float]] = {"plancache": [], "torch": []}
        for _ in range(args.rounds):
            with pt.mode() if kind == "mode" else contextlib.nullcontext():
                per_call_us(ours, args.calls // 10)  # warm-up
                samples["plancache"].append(per_call_us(ours, args.calls))
            per_call_us(theirs, args.calls // 10)
            samples["torch"].append(per_call_us(theirs, args.calls))
        plancache_us, torch_us = statistics.median(samples["plancache"]), statistics.median(samples["torch"])
        rows.append(
            {
                "case": name,
                "what": "under the mode" if kind == "mode" else "the operator",
                "plancache_us": plancache_us,
                "torch_us": torch_us,
                "added_us": plancache_us - torch_us,
                "samples": samples,
            }
        )
    result = {"args": vars(args) | {"out": str(args.out)}, "torch": torch.__version__, "rows": rows}
    write_json(args.out / "torch_mode_cost.json", result)
    print(
        table(
            ["case", "plancache µs", "torch µs", "added µs"],
            [[r["case"], r["plancache_us"], r["torch_us"], r["added_us"]] for r in rows],
        )
    )
    fig, (ax,) = figure(1)
    ax.barh(range(len(rows)), [r["added_us"] for r in rows])
    ax.set_yticks(range(len(rows)), [r["case"] for r in rows], fontsize=7)
    ax.set_xlabel("µs added per call (median of rounds), CPU")
    ax.set_title("plancache.torch's host cost per call")
    save(fig, args.out / "torch_mode_cost.png")


if __name__ == "__main__":
    main()

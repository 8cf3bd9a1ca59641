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
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, per_call_us, save, table, write_json  # noqa: E402


def compiled_costs(rounds: int, calls: int) -> list[dict[str, Any]]:
    """A compiled function of 8 linear + layer_norm pairs (16 plancache operators, CPU routes on: their CPU
    implementation is torch's function): torch alone, `torch.compile` called inside `with mode():` (the mode
    sees every call the compiled program makes), and plancache.torch.compile (the mode entered inside the
    compiled function). µs per call, medians of `rounds` interleaved rounds."""
    import torch
    import torch.nn.functional as F

    import plancache.torch as pt
    from plancache.torch import _mode

    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(8)])
    x = torch.randn(2, 16)

    def model(x: Any) -> Any:
        for layer in layers:
            x = F.layer_norm(layer(x), [16])
        return x

    devices, _mode.ROUTED_DEVICES = _mode.ROUTED_DEVICES, {*_mode.ROUTED_DEVICES, "cpu"}
    served, _mode.SERVED_DTYPES = _mode.SERVED_DTYPES, (*_mode.SERVED_DTYPES, torch.float32)
    try:
        with torch.no_grad():
            variants: dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]] = {
                "torch alone": (torch.compile(model, fullgraph=True), contextlib.nullcontext),
                "torch.compile inside `with mode():`": (torch.compile(model, fullgraph=True), pt.mode),
                "plancache.torch.compile": (pt.compile(model, fullgraph=True), contextlib.nullcontext),
            }
            samples: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(rounds):
                for name, (fn, context) in variants.items():
                    with context():
                        per_call_us(lambda fn=fn: fn(x), calls // 10)
                        samples[name].append(per_call_us(lambda fn=fn: fn(x), calls))
    finally:
        _mode.ROUTED_DEVICES, _mode.SERVED_DTYPES = devices, served
    base = statistics.median(samples["torch alone"])
    return [
        {
            "case": name,
            "us": statistics.median(values),
            "per_operator_over_torch_us": (statistics.median(values) - base) / 16,
            "samples": values,
        }
        for name, values in samples.items()
    ]


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
    compiled = compiled_costs(args.rounds, max(200, args.calls // 10))
    result = {
        "args": vars(args) | {"out": str(args.out)},
        "torch": torch.__version__,
        "rows": rows,
        "compiled": compiled,
    }
    write_json(args.out / "torch_mode_cost.json", result)
    print(
        table(
            ["case", "plancache µs", "torch µs", "added µs"],
            [[r["case"], r["plancache_us"], r["torch_us"], r["added_us"]] for r in rows],
        )
    )
    print(
        table(
            ["compiled (16 operators a call)", "µs per call", "µs per operator over torch"],
            [[r["case"], r["us"], r["per_operator_over_torch_us"]] for r in compiled],
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

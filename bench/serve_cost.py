"""What intercepting an unchanged model costs the host: the mode against serve(), on the CPU (issue 42, item 3).

GPU run 50 found an eager GPT-2 step 1.47x torch's under `plancache.torch.mode()` with most of its routed
calls running torch's own function after their races: the rest is the mode's own host time, which every torch
call of the step pays (a TorchFunctionMode is Python). `plancache.torch.serve(model)` routes the model's layers
instead and leaves every other call alone. This measures both on a GPT-2-shaped stack of blocks (pre-norm
attention and a GELU MLP written as GPT-2's are: views, permutes, adds, a tanh GELU; nn.Linear and
nn.LayerNorm layers) with tiny float32 CPU tensors: every routed call is left to torch (float32), as a
geometry torch's function won its race is, so what differs is only how the calls were intercepted. Forward
passes without autograd, µs per step, medians of interleaved rounds:

- torch alone;
- under `with plancache.torch.mode():` (every torch call of the step seen by the mode);
- `serve(model)` (the layers' forwards only).

    python3 bench/serve_cost.py --out DIR      # DIR/serve_cost.{json,png}
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, per_call_us, save, table, write_json  # noqa: E402


def gpt2_stack(torch: Any, blocks: int, hidden: int, heads: int) -> Any:
    """GPT-2's block as transformers writes it (its Conv1D layers as nn.Linear), `blocks` of them."""
    nn, functional = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.c_attn, self.c_proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.c_fc, self.c_out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x: Any) -> Any:
            b, s, h = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
            q, k, v = (t.view(b, s, heads, h // heads).permute(0, 2, 1, 3) for t in (q, k, v))
            a = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(a.permute(0, 2, 1, 3).contiguous().view(b, s, h))
            m = self.c_fc(self.ln_2(x))
            m = 0.5 * m * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (m + 0.044715 * torch.pow(m, 3.0))))
            return x + self.c_out(m)

    return nn.Sequential(*(Block() for _ in range(blocks)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()

    import torch

    import plancache.torch as pt

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = gpt2_stack(torch, args.blocks, hidden=64, heads=4)
    served = pt.serve(copy.deepcopy(model))
    x = torch.randn(1, 16, 64)
    variants: dict[str, tuple[Any, Callable[[], Any]]] = {
        "torch alone": (model, contextlib.nullcontext),
        "under plancache.torch.mode()": (model, pt.mode),
        "plancache.torch.serve(model)": (served, contextlib.nullcontext),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, (net, context) in variants.items():
                with context():
                    per_call_us(lambda net=net: net(x), args.calls // 10)  # warm-up
                    samples[name].append(per_call_us(lambda net=net: net(x), args.calls))
    stats = pt.stats()
    base = statistics.median(samples["torch alone"])
    rows = [
        {
            "variant": name,
            "us_per_step": statistics.median(values),
            "over_torch": statistics.median(values) / base,
            "samples": values,
        }
        for name, values in samples.items()
    ]
    result = {
        "args": vars(args) | {"out": str(args.out)},
        "torch": torch.__version__,
        "rows": rows,
        "routed_calls_left_to_torch": {name: sum(s.left.values()) for name, s in stats.items()},
    }
    write_json(args.out / "serve_cost.json", result)
    print(
        table(
            ["variant", "µs per step", "over torch"], [[r["variant"], r["us_per_step"], r["over_torch"]] for r in rows]
        )
    )
    fig, (ax,) = figure(1)
    ax.bar(range(len(rows)), [r["over_torch"] for r in rows])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), [r["variant"] for r in rows], fontsize=7)
    ax.set_ylabel("host time per forward step / torch's (median of rounds)")
    ax.set_title(f"Intercepting a {args.blocks}-block GPT-2-shaped model (CPU, float32, every routed call torch's)")
    save(fig, args.out / "serve_cost.png")


if __name__ == "__main__":
    main()

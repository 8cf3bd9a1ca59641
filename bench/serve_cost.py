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

    python3 bench/serve_cost.py --out DIR                  # DIR/serve_cost.{json,png}
    python3 bench/serve_cost.py --out DIR --layer conv1d   # GPT-2's own layers: DIR/serve_cost_conv1d.{json,png}
    python3 bench/serve_cost.py --out DIR --path torch-won # after races torch won: DIR/serve_cost_torch_won.*
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


def transformers_conv1d(torch: Any) -> Any:
    """transformers.pytorch_utils.Conv1D as it is written there (GPT-2's linear layers: x @ weight + bias with a
    [in, out] weight, torch.addmm on a 2-D view), named as transformers' so that serve() recognises it: transformers
    is not installed on the development machine (the GPU benchmarks use the real one)."""

    class Conv1D(torch.nn.Module):
        def __init__(self, nf: int, nx: int) -> None:
            super().__init__()
            self.nf = nf
            self.weight = torch.nn.Parameter(torch.empty(nx, nf).normal_(std=0.02))
            self.bias = torch.nn.Parameter(torch.zeros(nf))

        def forward(self, x: Any) -> Any:
            size_out = x.size()[:-1] + (self.nf,)  # noqa: RUF005 (as transformers writes it)
            x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
            return x.view(size_out)

    Conv1D.__module__ = "transformers.pytorch_utils"
    return Conv1D


def gpt2_stack(torch: Any, blocks: int, hidden: int, heads: int, layer: str = "linear") -> Any:
    """GPT-2's block as transformers writes it, `blocks` of them; its linear layers nn.Linear, or (`layer="conv1d"`)
    transformers' Conv1D as GPT-2 has them."""
    nn, functional = torch.nn, torch.nn.functional
    conv1d = transformers_conv1d(torch)

    def dense(n_in: int, n_out: int) -> Any:
        return nn.Linear(n_in, n_out) if layer == "linear" else conv1d(n_out, n_in)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.c_attn, self.c_proj = dense(hidden, 3 * hidden), dense(hidden, hidden)
            self.c_fc, self.c_out = dense(hidden, 4 * hidden), dense(4 * hidden, hidden)

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


def torch_won_stand_in(torch: Any) -> None:
    """The GPU's eager path for geometries whose race torch won, with CPU float32 tensors standing in for CUDA
    ones: the routes take CPU tensors as eager CUDA calls (float32 served), and plancache.functional's first call
    of each linear or norm geometry leaves torch's entry in its table, as a race torch won does (the service, the
    plan and the race are the GPU's: bench/torch_models.py). Every later call of that geometry is what a served
    layer's call is on the GPU after its race: the decided geometry's path, then torch's function. Attention
    (the mode's only other routed call here) is torch's function behind the route each call."""
    import torch.nn.functional as F

    import plancache.functional as pf
    from plancache.functional import _norms
    from plancache.functional._geometry import hashable, weighted_key
    from plancache.functional._table import TABLE, TorchFaster
    from plancache.torch import _mode

    _mode._eager = lambda x: not torch.compiler.is_compiling()
    _mode.ROUTED_DEVICES = {"cuda", "cpu"}
    _mode.SERVED_DTYPES = (*_mode.SERVED_DTYPES, torch.float32)

    def grad(*tensors: Any) -> bool:
        return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)

    def torch_won(key: Any, function: str, run: Callable[[], Any]) -> Any:
        TABLE.put(key, TorchFaster(function, key, lambda *tensors: None, "stand-in: torch won the race"))
        return run()

    def linear(x: Any, w: Any, b: Any = None) -> Any:
        key = weighted_key("linear", x, w, b, None, grad(x, w, b))
        return torch_won(key, "linear", lambda: F.linear(x, w, b))

    def layer_norm(x: Any, shape: Any, w: Any = None, b: Any = None, eps: float = 1e-5) -> Any:
        key = _norms._norm_key("layer_norm", x, hashable(shape), eps, grad(x, w, b), w, b)
        return torch_won(key, "layer_norm", lambda: F.layer_norm(x, shape, w, b, eps))

    def attention(q: Any, k: Any, v: Any, mask: Any, dropout: float, causal: bool, scale: Any, gqa: bool) -> Any:
        return F.scaled_dot_product_attention(q, k, v, mask, dropout, causal, scale=scale, enable_gqa=gqa)

    pf.linear, pf.layer_norm, pf.scaled_dot_product_attention = linear, layer_norm, attention  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument(
        "--layer", choices=("linear", "conv1d"), default="linear", help="the blocks' linear layers' class"
    )
    parser.add_argument(
        "--path",
        choices=("left", "torch-won"),
        default="left",
        help="routed calls: float32, left to torch by the route's checks; or the GPU's path after races torch won",
    )
    args = parser.parse_args()

    import torch

    import plancache.torch as pt

    if args.path == "torch-won":
        torch_won_stand_in(torch)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = gpt2_stack(torch, args.blocks, hidden=64, heads=4, layer=args.layer)
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
        # serve()'s layers gone back to their own forward, torch having run their calls (plancache.torch._serve)
        "layers_returned": {name: s.returned for name, s in stats.items() if getattr(s, "returned", 0)},
    }
    name = "serve_cost" + ("" if args.layer == "linear" else f"_{args.layer}")
    name += "" if args.path == "left" else "_torch_won"
    write_json(args.out / f"{name}.json", result)
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
    layers = "nn.Linear" if args.layer == "linear" else "Conv1D"
    path = "routed calls torch's" if args.path == "left" else "the path after races torch won"
    ax.set_title(f"Intercepting a {args.blocks}-block GPT-2-shaped model, {layers} layers (CPU, float32, {path})")
    save(fig, args.out / f"{name}.png")


if __name__ == "__main__":
    main()

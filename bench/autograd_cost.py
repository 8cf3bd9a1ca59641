"""What a training operator's autograd costs the host, per call, on the CPU (issue 42, item 3): Python's
registration (torch.library.register_autograd: an autograd.Function per call) against the native extension's
C++ one (plancache.torch.native.install_gradients, from the same plancache.torch._ops.Gradient), against torch's
own function with its autograd.

Tiny CPU tensors, so the kernels' own time is small: each call is a forward and its backward, the operator's CPU
implementation being torch's own forward and backward (plancache.torch._torch_math), so what differs between the
operator's two arms is the autograd around them alone. --rounds interleaved rounds of --calls calls after a
warm-up, µs per call, medians over rounds. Builds the extension first (a C++ compiler and ninja).

    python3 bench/autograd_cost.py --out DIR     # DIR/autograd_cost.{json,png}
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, per_call_us, save, table, write_json  # noqa: E402


def cases(torch: Any) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Each: (the operator's forward, torch's function's forward); their first output is what a loss reads."""
    import torch.nn.functional as F

    ops = torch.ops.plancache

    def rand(*shape: int) -> Any:
        return torch.randn(*shape).requires_grad_()

    x, w, b = rand(4, 16), rand(16), rand(16)
    lw, lb = rand(8, 16), rand(8)
    q, k, v = rand(1, 2, 4, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)
    image, kernel = rand(1, 4, 6, 6), rand(4, 4, 3, 3)
    mean, var = torch.zeros(4), torch.ones(4)
    return {
        "layer_norm": (
            lambda: ops.layer_norm_train(x, [16], w, b, 1e-5)[0],
            lambda: F.layer_norm(x, [16], w, b, 1e-5),
        ),
        "rms_norm": (lambda: ops.rms_norm_train(x, [16], w, 1e-6)[0], lambda: F.rms_norm(x, [16], w, 1e-6)),
        "linear": (lambda: ops.linear_train(x, lw, lb, None)[0], lambda: F.linear(x, lw, lb)),
        "linear + gelu": (lambda: ops.linear_train(x, lw, lb, "gelu")[0], lambda: F.gelu(F.linear(x, lw, lb))),
        "sdpa": (
            lambda: ops.sdpa_train(q, k, v, None, True, None, False)[0],
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        ),
        "conv2d": (
            lambda: ops.conv2d_train(image, kernel, None, [1, 1], [1, 1], [1, 1], 1, False),
            lambda: F.conv2d(image, kernel, None, 1, 1),
        ),
        "batch_norm": (
            lambda: ops.batch_norm_train(image, w[:4], b[:4], mean, var, 0.1, 1e-5)[0],
            lambda: F.batch_norm(image, mean.clone(), var.clone(), w[:4], b[:4], True, 0.1, 1e-5),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    import torch

    from plancache.torch import _ops
    from plancache.torch import native as _native

    os.environ.setdefault(_native.NATIVE_DIR_ENV, os.path.join(tempfile.gettempdir(), "plancache-native-bench"))
    module = _native.build()
    torch.set_num_threads(1)

    def step(forward: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            out = forward()
            out.backward(torch.ones_like(out))

        return run

    arms = ("python autograd", "C++ autograd", "torch")
    rows = []
    for name, (operator, theirs) in cases(torch).items():
        samples: dict[str, list[float]] = {arm: [] for arm in arms}
        for _ in range(args.rounds):
            for arm in arms:
                fn = step(theirs if arm == "torch" else operator)
                if arm == "C++ autograd":
                    _native.install_gradients(module, _ops.OPERATORS)
                try:
                    per_call_us(fn, args.calls // 10)  # warm-up
                    samples[arm].append(per_call_us(fn, args.calls))
                finally:
                    module.remove_autograd()
        medians = {arm: statistics.median(samples[arm]) for arm in arms}
        rows.append(
            {
                "case": name,
                **{f"{arm}_us": medians[arm] for arm in arms},
                "python_over_torch": medians["python autograd"] / medians["torch"],
                "cpp_over_torch": medians["C++ autograd"] / medians["torch"],
                "samples": samples,
            }
        )
    write_json(
        args.out / "autograd_cost.json",
        {"args": vars(args) | {"out": str(args.out)}, "torch": torch.__version__, "rows": rows},
    )
    print(
        table(
            ["forward + backward", "Python autograd µs", "C++ autograd µs", "torch µs", "Python/torch", "C++/torch"],
            [
                [
                    r["case"],
                    r["python autograd_us"],
                    r["C++ autograd_us"],
                    r["torch_us"],
                    r["python_over_torch"],
                    r["cpp_over_torch"],
                ]
                for r in rows
            ],
        )
    )
    fig, (ax,) = figure(1)
    width = 0.27
    for i, arm in enumerate(arms):
        ax.barh([j + (i - 1) * width for j in range(len(rows))], [r[f"{arm}_us"] for r in rows], width, label=arm)
    ax.set_yticks(range(len(rows)), [r["case"] for r in rows], fontsize=7)
    ax.set_xlabel("µs per forward + backward (median of rounds), CPU")
    ax.set_title("A training operator's autograd: Python's registration, C++'s, torch's function")
    ax.legend(fontsize=7)
    save(fig, args.out / "autograd_cost.png")


if __name__ == "__main__":
    main()

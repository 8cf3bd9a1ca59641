"""plancache's operators' host cost per call on the GPU, with the native kernels and without (issue 42, item 3).

Fresh processes in turn, `PLANCACHE_NATIVE=1` then `=0` (--pairs pairs): the native kernels
(plancache.torch.native) against the operators' Python implementations called by the dispatcher, as
before them. Each process configures plancache.functional with the worker's compiler in-process
(bench.gpu_exec.InProcessClient, a STAND-IN for the client: the plans a node would fetch) and times, on
small bfloat16 CUDA tensors (each kernel a few µs, so the calls are host-bound), torch's function against
plancache's operator, --rounds interleaved rounds of --calls calls, wall µs per call (synchronised at the
end of each round), medians:

  layer_norm, linear, sdpa      inference (no grad): F.<function> against torch.ops.plancache.<operator>
  linear_train, layer_norm_train, sdpa_train
                                a forward and backward through autograd: F.<function> against the training
                                operator (its autograd the extension's C++ registration with the kernels on,
                                Python's torch.library registration without)
  block_train                   an eager training step's forward and backward of an unchanged transformer
                                block (LayerNorm, attention, GELU MLP; hidden 256) under plancache.torch.mode()
                                against the same block without it
  compiled                      a function of 8 (linear, layer_norm) pairs, inference: torch.compile
                                (fullgraph) of torch's functions against plancache.torch.compile of the same

Ratios are plancache / torch within a process (the anchor that moves with the machine); the native
kernels' effect is the ratio with them against the ratio without, pair by pair.

    python3 bench/native_cost.py --out DIR     # DIR/native_cost.{json,png}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402

CASES = ("layer_norm", "linear", "sdpa", "linear_train", "layer_norm_train", "sdpa_train", "block_train", "compiled")
TRAINING = {"linear_train", "layer_norm_train", "sdpa_train", "block_train"}


def _timed_us(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) * 1e6 / calls


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    import plancache.functional as pf
    import plancache.torch as pt
    from bench.gpu_exec import InProcessClient
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    compiler = CudnnCompiler(0)
    pf.configure(InProcessClient(compiler), target=compiler.target)  # type: ignore[arg-type]
    pf.set_race_torch(False)  # the served plans are measured: none handed to torch's function
    ops = torch.ops.plancache
    torch.manual_seed(0)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x, w, b = torch.randn(64, 256, **bf16), torch.randn(256, 256, **bf16), torch.randn(256, **bf16)
    nw, nb = torch.randn(256, **bf16), torch.randn(256, **bf16)
    q, k, v = (torch.randn(1, 4, 64, 64, **bf16) for _ in range(3))
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    grad = torch.randn(64, 256, **bf16)

    def torch_train() -> None:
        F.linear(xg, wg, bg).backward(grad)

    def plancache_train() -> None:
        ops.linear_train(xg, wg, bg, None)[0].backward(grad)

    nwg, nbg = nw.clone().requires_grad_(), nb.clone().requires_grad_()
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    attention_grad = torch.randn_like(q)
    from tests.gpu.test_gpu_torch import block as block_class  # test_gpu_native's eager and compiled block

    torch.manual_seed(0)
    block = block_class(torch, hidden=256, heads=4)().to(**bf16)
    tokens = torch.randn(4, 128, 256, **bf16)

    def block_step(model_call: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            block.zero_grad(set_to_none=True)
            model_call().float().square().mean().backward()

        return run

    def block_under_mode() -> Any:
        with pt.mode():
            return block(tokens)

    def layers(h: Any) -> Any:
        for _ in range(8):
            h = F.layer_norm(F.linear(h, w, b), (256,), nw, nb)
        return h

    compiled_torch = torch.compile(layers, fullgraph=True)
    compiled_plancache = pt.compile(layers, fullgraph=True)
    pairs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "layer_norm": (lambda: F.layer_norm(x, (256,), nw, nb), lambda: ops.layer_norm(x, [256], nw, nb, 1e-5)),
        "linear": (lambda: F.linear(x, w, b), lambda: ops.linear(x, w, b, None)),
        "sdpa": (
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda: ops.sdpa(q, k, v, None, True, None, False),
        ),
        "linear_train": (torch_train, plancache_train),
        "layer_norm_train": (
            lambda: F.layer_norm(xg, (256,), nwg, nbg).backward(grad),
            lambda: ops.layer_norm_train(xg, [256], nwg, nbg, 1e-5)[0].backward(grad),
        ),
        "sdpa_train": (
            lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(attention_grad),
            lambda: ops.sdpa_train(qg, kg, vg, None, True, None, False)[0].backward(attention_grad),
        ),
        "block_train": (block_step(lambda: block(tokens)), block_step(block_under_mode)),
        "compiled": (lambda: compiled_torch(x), lambda: compiled_plancache(x)),
    }
    sync = torch.cuda.synchronize
    first_call_s: dict[str, float] = {}
    for name, (theirs, ours) in pairs.items():
        with torch.no_grad() if name not in TRAINING else torch.enable_grad():
            started = time.perf_counter()
            ours()
            sync()
            first_call_s[name] = time.perf_counter() - started
            for _ in range(200):  # warm-up: plans built, the native kernels' calls kept, compiled programs traced
                theirs()
                ours()
            sync()
    samples: dict[str, dict[str, list[float]]] = {n: {"torch": [], "plancache": []} for n in pairs}
    for _ in range(args.rounds):
        for name, (theirs, ours) in pairs.items():
            calls = args.calls // 10 if name in ("compiled", "block_train") else args.calls
            with torch.no_grad() if name not in TRAINING else torch.enable_grad():
                samples[name]["torch"].append(_timed_us(theirs, calls, sync))
                samples[name]["plancache"].append(_timed_us(ours, calls, sync))
    out: dict[str, Any] = {"native": pt.native_state(), "first_call_s": first_call_s, "cases": {}}
    for name, s in samples.items():
        t, p = statistics.median(s["torch"]), statistics.median(s["plancache"])
        out["cases"][name] = {"torch_us": t, "plancache_us": p, "ratio": p / t, "samples": s}
    served = pf.stats()
    out["served"] = {name: {"cudnn": st.cudnn, "torch": st.torch} for name, st in served.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="")
    parser.add_argument(
        "--from-runs", type=Path, help="summarize and plot a runs file (what a run cut short by its time limit wrote)"
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.from_runs is not None:
        report(json.loads(args.from_runs.read_text()), args)
        return
    runs: dict[str, list[dict[str, Any]]] = {"1": [], "0": []}
    for _ in range(args.pairs):
        for native in ("1", "0"):
            env = {**os.environ, "PLANCACHE_NATIVE": native}
            command = [sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--calls", str(args.calls)]
            done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                runs[native].append({"error": done.stderr[-3000:]})
                print(done.stderr[-3000:], file=sys.stderr)
                continue
            runs[native].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(native, json.dumps({n: c["ratio"] for n, c in runs[native][-1]["cases"].items()}), flush=True)
            write_json(args.out / f"native_cost{args.tag}_runs.json", runs)  # what a call cut short still returns
    report(runs, args)


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    """The medians over the runs of each arm (native kernels on: "1", off: "0"), as JSON, a table and a plot."""
    summary: dict[str, Any] = {}
    for name in CASES:
        per = {
            native: [r["cases"][name]["ratio"] for r in rs if "cases" in r and name in r["cases"]]
            for native, rs in runs.items()
        }
        us = {
            native: [r["cases"][name]["plancache_us"] for r in rs if "cases" in r and name in r["cases"]]
            for native, rs in runs.items()
        }
        torch_us = [r["cases"][name]["torch_us"] for rs in runs.values() for r in rs if "cases" in r]
        summary[name] = {
            "ratio_native": statistics.median(per["1"]) if per["1"] else None,
            "ratio_python": statistics.median(per["0"]) if per["0"] else None,
            "us_native": statistics.median(us["1"]) if us["1"] else None,
            "us_python": statistics.median(us["0"]) if us["0"] else None,
            "us_torch": statistics.median(torch_us) if torch_us else None,
        }
    name = f"native_cost{args.tag}"
    write_json(
        args.out / f"{name}.json",
        {
            "summary": summary,
            "runs": runs,
            "args": vars(args) | {"out": str(args.out), "from_runs": str(args.from_runs)},
        },
    )
    print(
        table(
            ["case", "torch µs", "native µs", "python µs", "native / torch", "python / torch"],
            [
                [n, s["us_torch"], s["us_native"], s["us_python"], s["ratio_native"], s["ratio_python"]]
                for n, s in summary.items()
            ],
        )
    )
    good = [n for n, s in summary.items() if s["ratio_native"] is not None and s["ratio_python"] is not None]
    if good:
        fig, (ax,) = figure(1)
        xs = range(len(good))
        ax.bar([i - 0.2 for i in xs], [summary[n]["ratio_python"] for n in good], width=0.4, label="Python operators")
        ax.bar([i + 0.2 for i in xs], [summary[n]["ratio_native"] for n in good], width=0.4, label="native kernels")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(xs), good, rotation=30, fontsize=7)
        ax.set_ylabel("plancache / torch, µs per call (median of pairs)")
        ax.legend()
        save(fig, args.out / f"{name}.png")


if __name__ == "__main__":
    main()

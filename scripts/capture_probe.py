"""Which part of a training step captured as a CUDA graph reads memory it
should not (GPU run 22: bench/training.py's whole-step capture ended in an
illegal memory access). Each case runs in its own process (a CUDA error is
sticky), plans built in that process as bench/training.py builds them:

    python3 scripts/capture_probe.py --out DIR      # DIR/capture_probe.json, one line per case

A case: what is captured (the transformer block, or one function of it, at
bench/training.py's sizes), with plancache.functional or torch, with or
without the optimizer step in the graph; then replayed 3 times and
synchronized.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARTS = ("block", "block-nobias", "linear-gelu-bias", "linear-gelu", "linear-bias", "sdpa", "rms_norm")


def _loss(part: str, p: dict[str, Any], x: Any, ops: Any) -> Any:
    from bench.training import BLOCK, transformer_loss

    if part == "block":
        return transformer_loss(p, {}, x, ops)
    if part == "block-nobias":
        return transformer_loss({**p, "b_up": None, "b_down": None}, {}, x, ops)
    b, s, h = x.shape
    if part.startswith("linear"):
        bias = p["b_up"] if part.endswith("bias") else None
        return ops.linear(x, p["w_up"], bias, activation="gelu" if "gelu" in part else None).float().pow(2).mean()
    if part == "sdpa":
        q, k, v = ops.linear(x, p["wqkv"]).view(b, s, 3, BLOCK.heads, h // BLOCK.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return ops.scaled_dot_product_attention(q, k, v, is_causal=True).float().pow(2).mean()
    return ops.rms_norm(x, (h,), p["norm1"], BLOCK.eps).float().pow(2).mean()


def case(part: str, which: str, optimizer: bool, on_warmup_stream: bool = False) -> dict[str, Any]:
    import torch

    import plancache.functional as pf
    from bench.gpu_exec import InProcessClient
    from bench.training import torch_ops, transformer
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    compiler = CudnnCompiler(0)
    pf.configure(InProcessClient(compiler), target=compiler.target)  # type: ignore[arg-type]
    ops = pf if which == "functional" else torch_ops()
    params, _, x = transformer(torch.Generator(device="cuda").manual_seed(0))
    params = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=1e-4, capturable=True)

    def step() -> Any:
        loss = _loss(part, params, x, ops)
        loss.backward()
        if optimizer:
            opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(
        graph, stream=side if on_warmup_stream else None
    ):  # the warm-up's own stream, or torch's capture stream
        loss = step()
    torch.cuda.synchronize()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
    return {"loss": float(loss.detach()), "stats": {n: [s.cudnn, s.torch] for n, s in pf.stats().items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--case", nargs=4, metavar=("PART", "WHICH", "OPTIMIZER", "STREAM"), help=argparse.SUPPRESS)
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    parser.add_argument(
        "--streams",
        nargs="*",
        default=["capture"],
        choices=("capture", "warmup"),
        help="capture on torch's capture stream, or on the warm-up's",
    )
    args = parser.parse_args()
    if args.case:
        part, which, optimizer, stream = args.case
        print(json.dumps(case(part, which, optimizer == "1", stream == "warmup")))
        return 0
    results = []
    cases = [
        (part, which, optimizer, stream)
        for stream in args.streams
        for part in args.parts
        for which in (("functional", "torch") if part == "block" else ("functional",))
        for optimizer in (("1", "0") if part == "block" else ("0",))
    ]
    for part, which, optimizer, stream in cases:
        began = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--case", part, which, optimizer, stream],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        error = next((line for line in reversed(proc.stderr.splitlines()) if "Error" in line), "")
        row = {
            "part": part,
            "which": which,
            "optimizer": optimizer == "1",
            "stream": stream,
            "ok": proc.returncode == 0,
            "seconds": round(time.perf_counter() - began, 1),
            "result": last if proc.returncode == 0 else "",
            "error": error[:300],
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "capture_probe.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

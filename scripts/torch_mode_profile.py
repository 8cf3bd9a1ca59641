"""Where an eager step under plancache.torch.mode() spends its host time (issue 42, item 3): cProfile of
--steps training steps of an unchanged model (bench/torch_models.py's), plans built in-process, after warm-up;
the same steps of torch alone for comparison. Prints the top functions by own time and by cumulative time.
--compile-mode compile: the same under torch.compile(fullgraph=True) (the compiled program calling plancache's
operators).

    python3 scripts/torch_mode_profile.py --model gpt2-256 [--steps 10] [--compile-mode compile]   # on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-256")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--compile-mode", default="eager", choices=("eager", "compile", "reduce-overhead"))
    args = parser.parse_args()
    import torch

    import plancache.functional as pf
    import plancache.torch as pt
    from bench.gpu_exec import InProcessClient
    from bench.torch_models import workloads
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    compiler = CudnnCompiler(0)
    pf.configure(InProcessClient(compiler), target=compiler.target)  # type: ignore[arg-type]
    seq = int(args.model.split("-")[1]) if "-" in args.model else 256
    work = workloads("cuda", [seq], small=False)[args.model]
    torch.manual_seed(0)
    batch = work.batch()
    for variant, context in (("torch", contextlib.nullcontext), ("plancache", pt.mode)):
        torch._dynamo.reset()
        model = work.make()
        run = work.runner(model, args.compile_mode)
        with context():
            for _ in range(3):
                run(batch)
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        with context():
            for _ in range(args.steps):
                run(batch)
        profile.disable()
        host_s = time.perf_counter() - started
        torch.cuda.synchronize()
        wall_s = time.perf_counter() - started
        print(
            f"==== {variant} ({args.compile_mode}): {args.steps} steps, host {host_s * 1e3:.1f} ms (profiled), wall {wall_s * 1e3:.1f} ms"
        )
        for key in ("tottime", "cumtime"):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(key).print_stats(args.top)
            print(text.getvalue()[-14000:])
    print("stats", {name: (s.routed, s.cudnn, s.torch) for name, s in pt.stats().items()})


if __name__ == "__main__":
    main()

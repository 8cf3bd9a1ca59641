"""Does a process whose native kernels kept calls exit cleanly? (GPU run 49 found the frontend's nanobind
module reporting every plan object the kept calls held as leaked at exit.) Serves a few operator calls with
the native kernels on, prints their state and exits; the caller reads stderr for "leaked".

    PLANCACHE_NATIVE=1 python3 scripts/native_exit_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch

    import plancache.functional as pf
    import plancache.torch as pt
    from bench.gpu_exec import InProcessClient
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    compiler = CudnnCompiler(0)
    pf.configure(InProcessClient(compiler), target=compiler.target)  # type: ignore[arg-type]
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x, w, b = torch.randn(64, 256, **bf16), torch.randn(256, 256, **bf16), torch.randn(256, **bf16)
    for _ in range(5):
        out = torch.ops.plancache.linear(x, w, b, None)
        torch.ops.plancache.layer_norm(out, [256], b, b, 1e-5)
    torch.cuda.synchronize()
    print("native:", pt.native_state(), "served:", {n: s.cudnn for n, s in pf.stats().items()}, flush=True)


if __name__ == "__main__":
    main()

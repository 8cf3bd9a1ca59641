"""Where a tensor kept from cudagraph trees' private pool was allocated (GPU run 30: every model under
torch.compile(mode="reduce-overhead") with plancache.torch.mode() failed "Detected 1 tensor(s) in the
cudagraph pool not tracked as outputs"). Runs one small block with history recording on and prints
the allocation stacks of what was kept.

    python3 scripts/cudagraph_probe.py   # on a GPU machine, the carried wheels installed
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch
    import torch._inductor.config as inductor_config

    import plancache.functional as pf
    import plancache.torch as pt
    from bench.gpu_exec import InProcessClient
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    inductor_config.triton.cudagraph_trees_history_recording = True
    compiler = CudnnCompiler(0)
    pf.configure(InProcessClient(compiler), target=compiler.target)  # type: ignore[arg-type]
    torch.manual_seed(0)
    cases = {
        "linear": torch.nn.Linear(256, 512).cuda().half(),
        "conv": torch.nn.Conv2d(64, 64, 3, padding=1).cuda().half().to(memory_format=torch.channels_last),
    }
    inputs = {
        "linear": torch.randn(64, 256, device="cuda", dtype=torch.half),
        "conv": torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last),
    }
    for name, module in cases.items():
        torch._dynamo.reset()
        compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
        try:
            with torch.no_grad(), pt.mode():
                for _ in range(4):
                    out = compiled(inputs[name])
            torch.cuda.synchronize()
            print(f"{name}: ok", out.shape, flush=True)
        except Exception:
            print(f"{name}: FAILED", flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main()

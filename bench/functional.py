"""plancache.functional on one GPU (issue 24): what a call costs the host,
and the example's decode step.

Plans are built in this process by plancache's own compiler (the worker's,
heuristic plan: which plan runs does not change what a call costs on the
host) behind a stand-in for the client, so no server is needed; the
functions then run exactly as they do against a server's plans.

1. Host µs per call, after the geometry's first call, for each function
   against the raw frontend execute of the same plan (its deserialized
   graph, a pack made once, the output allocated beforehand: `raw`), the
   same plus allocating the output as a function must (`raw+alloc`), and
   torch's own call on the same tensors (`torch`; for the paged decode,
   torch has no function: pages gathered, then SDPA); `functional-public`:
   the function with its plan run through the frontend's public ordered
   execute (as before plancache.run.raw_execute), `pointers`: the same pack
   through the raw-pointer form alone (plancache.run.raw_execute's floor).
   Sizes of a decode
   step, where the host is the bound. Timed as bench/gpu_exec.py times:
   the first 32 of N back-to-back calls from an idle GPU, `--rounds` rounds
   interleaved, medians. Target: function / raw <= 1.2.
2. The decoder step of examples/decoder_step.py (4 layers, batch 8, bf16):
   GPU ms per step, plancache.functional eager, the same step captured once
   as a CUDA graph and replayed (plans run on the stream being captured),
   torch eager, and torch's step captured likewise.

    python3 bench/functional.py --out DIR       # DIR/functional.json, DIR/functional.png
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_exec import InProcessClient, time_path  # noqa: E402
from bench.report import figure, save, table, write_json  # noqa: E402

PATHS = ("functional", "functional-public", "raw", "pointers", "raw+alloc", "torch")
TARGET_OVER_RAW = 1.2


def cases() -> dict[str, Callable[[], tuple[Callable[[], Any], Callable[[], Any], str]]]:
    """name -> () -> (the plancache.functional call, torch's call, its function name)."""
    import torch
    import torch.nn.functional as F

    import plancache.functional as pf
    from examples.decoder_step import torch_ops

    def r(*shape: int, dtype: Any = torch.bfloat16) -> Any:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    def linear() -> Any:
        x, w, b = r(8, 1024), r(3072, 1024) / 32, r(3072)
        return (lambda: pf.linear(x, w, b, activation="gelu")), (lambda: F.gelu(F.linear(x, w, b))), "linear"

    def matmul() -> Any:
        a, b = r(16, 128, 64, dtype=torch.float16), r(16, 64, 128, dtype=torch.float16)
        return (lambda: pf.matmul(a, b)), (lambda: torch.matmul(a, b)), "matmul"

    def conv2d() -> Any:
        x = r(8, 64, 28, 28, dtype=torch.float16).to(memory_format=torch.channels_last)
        w = (r(64, 64, 3, 3, dtype=torch.float16) / 24).to(memory_format=torch.channels_last)
        b = r(64, dtype=torch.float16)
        return (
            (lambda: pf.conv2d(x, w, b, padding=1, relu=True)),
            (lambda: F.relu(F.conv2d(x, w, b, padding=1))),
            "conv2d",
        )

    def layer_norm() -> Any:
        x, w, b = r(8, 1024), r(1024), r(1024)
        return (lambda: pf.layer_norm(x, (1024,), w, b)), (lambda: F.layer_norm(x, (1024,), w, b)), "layer_norm"

    def rms_norm() -> Any:
        x, w = r(8, 1024), r(1024)
        return (lambda: pf.rms_norm(x, (1024,), w, eps=1e-5)), (lambda: F.rms_norm(x, (1024,), w, eps=1e-5)), "rms_norm"

    def sdpa() -> Any:
        q, k, v = r(8, 16, 128, 64), r(8, 16, 128, 64), r(8, 16, 128, 64)
        return (
            (lambda: pf.scaled_dot_product_attention(q, k, v, is_causal=True)),
            (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
            "scaled_dot_product_attention",
        )

    def paged() -> Any:
        q, kc, vc = r(8, 16, 1, 64), r(128, 4, 64, 64), r(128, 4, 64, 64)
        table_ = torch.randperm(128, device="cuda", dtype=torch.int32).view(8, 16)
        lengths = torch.linspace(1, 1024, 8, device="cuda").round().to(torch.int32)
        eager = torch_ops().paged_decode_attention
        return (
            (lambda: pf.paged_decode_attention(q, kc, vc, table_, lengths)),
            (lambda: eager(q, kc, vc, table_, lengths)),
            "paged_decode_attention",
        )

    return {
        "linear+bias+gelu bf16 8x1024->3072": linear,
        "matmul fp16 16x128x64x128": matmul,
        "conv2d+bias+relu fp16 NHWC 8x64x28x28": conv2d,
        "layer_norm bf16 8x1024": layer_norm,
        "rms_norm bf16 8x1024": rms_norm,
        "sdpa causal bf16 b8 h16 s128 d64": sdpa,
        "paged decode bf16 b8 h16/4 d64, 1k tokens": paged,
    }


def raw_paths(function: str, call: Callable[[], Any]) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
    """The frontend's own execute of the plan the function's last call ran,
    on the tensors that call packed: (raw, raw+alloc, pointers)."""
    import cudnn
    import torch

    from plancache.functional import _table
    from plancache.functional._tensor_ops import TorchOps
    from plancache.run.execution import handle_state
    from plancache.run.raw_execute import RawExecute

    served = next(
        e
        for _, e in reversed(_table.TABLE.entries())
        if isinstance(e, _table.Served) and e.request.function == function
    )
    state = handle_state()
    graph = cudnn.pygraph()
    graph.deserialize(state.handle, served.plan.blob)
    seen: dict[int, Any] = {}
    execute = graph.execute

    def spy(
        pack: Any, *args: Any, tensor_uids: Any = None, **kwargs: Any
    ) -> None:  # the buffers of one real call (either form)
        seen.update(zip(tensor_uids, pack, strict=True) if tensor_uids is not None else pack)

    for launcher in served._launchers.values():
        launcher._execute, original, launcher._raw, raw_form = spy, launcher._execute, None, launcher._raw
        call()
        launcher._execute, launcher._raw = original, raw_form
    pack = dict(seen)
    request = served.request
    workspace = torch.empty(max(1, served.plan.metadata.workspace_size), device="cuda", dtype=torch.uint8)
    out = request.outputs[0]
    alloc = TorchOps().allocator(out.shape, out.stride, out.dtype, 0)
    state.use(torch.cuda.current_stream().cuda_stream)

    def raw() -> None:
        execute(pack, workspace, handle=state.handle)

    def raw_alloc() -> None:
        with_out = dict(pack)
        with_out[out.uid] = alloc()
        execute(with_out, workspace, handle=state.handle)

    uids = tuple(pack)
    buffers = tuple(pack.values())
    execute(buffers, workspace, handle=state.handle, tensor_uids=uids)  # the public call first, as a launcher does
    by_pointers = RawExecute.of(graph, uids, state.handle)

    def pointers() -> None:
        if by_pointers is None:
            raise RuntimeError("the frontend's raw-pointer execute is not available for this plan")
        by_pointers(buffers, workspace)

    return raw, raw_alloc, pointers


class PublicExecute:
    """Within it, `function`'s served entries run their plans through the
    frontend's public ordered execute (their raw form set aside)."""

    def __init__(self, function: str) -> None:
        from plancache.functional import _table

        self.launchers = [
            launcher
            for _, e in _table.TABLE.entries()
            if isinstance(e, _table.Served) and e.request.function == function
            for launcher in e._launchers.values()
        ]
        self.saved: list[Any] = []

    def __enter__(self) -> None:
        self.saved = [launcher._raw for launcher in self.launchers]
        for launcher in self.launchers:
            launcher._raw = None

    def __exit__(self, *exc: object) -> None:
        for launcher, raw_form in zip(self.launchers, self.saved, strict=True):
            launcher._raw = raw_form


def host_costs(rounds: int) -> list[dict[str, Any]]:
    import torch

    import plancache.functional as pf

    rows = []
    for name, make in cases().items():
        ours, theirs, function = make()
        try:
            ours()  # the first call: the plan
            if pf.stats()[function].cudnn == 0:
                raise RuntimeError(f"torch ran it: {pf.stats()[function].reasons}")
            raw, raw_alloc, pointers = raw_paths(function, ours)
        except Exception as e:  # a case cuDNN does not serve here is reported, not the run's end
            rows.append({"case": name, "error": f"{type(e).__name__}: {e}"})
            print(name, "failed:", rows[-1]["error"][:500], flush=True)
            continue
        paths = {
            "functional": ours,
            "functional-public": ours,
            "raw": raw,
            "pointers": pointers,
            "raw+alloc": raw_alloc,
            "torch": theirs,
        }
        try:
            for fn in paths.values():
                for _ in range(3):
                    fn()
        except Exception as e:
            rows.append({"case": name, "error": f"{type(e).__name__}: {e}"})
            print(name, "failed:", rows[-1]["error"][:500], flush=True)
            continue
        _, gpu_us = time_path(raw, 10)
        count = max(20, min(2000, int(20_000 / max(gpu_us, 1.0))))
        samples: dict[str, list[float]] = {p: [] for p in PATHS}
        for _ in range(rounds):
            for p in PATHS:
                if p == "functional-public":
                    with PublicExecute(function):
                        samples[p].append(time_path(paths[p], count)[0])
                else:
                    samples[p].append(time_path(paths[p], count)[0])
        torch.cuda.synchronize()
        host = {p: statistics.median(v) for p, v in samples.items()}
        rows.append(
            {
                "case": name,
                "function": function,
                "host_us": host,
                "samples": samples,
                "calls_per_sample": count,
                "gpu_us_raw": gpu_us,
                "over_raw": host["functional"] / host["raw"],
                "over_raw_alloc": host["functional"] / host["raw+alloc"],
                "public_over_raw": host["functional-public"] / host["raw"],
                "pointers_over_raw": host["pointers"] / host["raw"],
                "over_torch": host["functional"] / host["torch"],
            }
        )
        print(name, {p: round(v, 2) for p, v in host.items()}, flush=True)
    return rows


def gpu_ms(fn: Callable[[], Any], steps: int, rounds: int) -> tuple[float, float]:
    """(GPU ms per step: events around `steps` steps, median of rounds; host ms to issue one)."""
    import torch

    gpu, host = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        for _ in range(steps):
            fn()
        host.append((time.perf_counter() - began) / steps * 1e3)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) / steps)
    return statistics.median(gpu), statistics.median(host)


def captured(step: Callable[[], Any]) -> Callable[[], Any]:
    """One step recorded as a CUDA graph on a side stream, after two eager
    steps there (first runs load kernels; the stream's workspace is sized)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        step()
    return graph.replay


def decode_step_times(rounds: int) -> dict[str, Any]:
    import torch

    import plancache.functional as pf
    from examples.decoder_step import Config, build, compare, decode_step, functional_ops, torch_ops

    model, cache, x = build(Config(), torch.bfloat16, torch.device("cuda"))
    result: dict[str, Any] = {"config": dataclasses.asdict(Config()), "dtype": "bfloat16"}
    with torch.inference_mode():
        check = compare(model, cache, x)
        result["rel_err_vs_torch"], result["calls"] = (
            check["rel_err"],
            {k: dataclasses.asdict(v) for k, v in pf.stats().items()},
        )
        caches = {"functional": cache.clone(), "torch": cache.clone()}
        steps = {
            "functional eager": lambda: decode_step(model, caches["functional"], x, functional_ops()),
            "torch eager": lambda: decode_step(model, caches["torch"], x, torch_ops()),
        }
        for name, base in (("functional captured", "functional eager"), ("torch captured", "torch eager")):
            try:
                steps[name] = captured(steps[base])
            except Exception as e:  # "where possible": a plan that cannot be captured is reported
                result[f"{name} error"] = f"{type(e).__name__}: {e}"
                print(name, "failed:", result[f"{name} error"][:500], flush=True)
        for fn in steps.values():
            fn()
        times: dict[str, list[tuple[float, float]]] = {n: [] for n in steps}
        for _ in range(rounds):  # interleaved
            for n, fn in steps.items():
                times[n].append(gpu_ms(fn, 20, 1))
    result["gpu_ms"] = {n: statistics.median(t[0] for t in v) for n, v in times.items()}
    result["host_ms"] = {n: statistics.median(t[1] for t in v) for n, v in times.items()}
    return result


def report(result: dict[str, Any], out: Path) -> None:
    rows, step = result["rows"], result["decode_step"]
    write_json(out / "functional.json", result)
    good = [r for r in rows if "host_us" in r]
    fig, (a, b) = figure(2)
    width = 0.13
    for i, p in enumerate(PATHS):
        a.bar([j + (i - 2.5) * width for j in range(len(good))], [r["host_us"][p] for r in good], width=width, label=p)
    a.set_xticks(range(len(good)), [r["case"] for r in good], rotation=60, fontsize=6, ha="right")
    (
        a.set_ylabel("host µs per call (median)"),
        a.set_title("plancache.functional: host cost per call"),
        a.legend(fontsize=7),
    )
    b.barh(list(step["gpu_ms"]), list(step["gpu_ms"].values()))
    (
        b.set_xlabel("GPU ms per decode step (median)"),
        b.set_title("examples/decoder_step.py: 4 layers, batch 8, bf16", fontsize=8),
    )
    save(fig, out / "functional.png")
    print(
        table(["decode step", "GPU ms", "host ms"], [[n, ms, step["host_ms"][n]] for n, ms in step["gpu_ms"].items()])
    )
    print(f"decode step rel err vs torch eager: {step['rel_err_vs_torch']:.2e}")
    print(
        table(
            [
                "function",
                "functional µs",
                "functional-public µs",
                "raw µs",
                "pointers µs",
                "raw+alloc µs",
                "torch µs",
                "/raw",
                "/raw+alloc",
                "/torch",
            ],
            [
                [r["case"], *(r["host_us"][p] for p in PATHS), r["over_raw"], r["over_raw_alloc"], r["over_torch"]]
                if "host_us" in r
                else [r["case"], r["error"][:60], *[""] * 8]
                for r in rows
            ],
        )
    )
    print(f"target: functional / raw <= {TARGET_OVER_RAW}; beyond it: {result['summary']['beyond_target'] or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import torch

    import plancache.functional as pf
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    started = time.perf_counter()
    torch.cuda.init()
    compiler = CudnnCompiler(0)
    client = InProcessClient(compiler)
    pf.configure(client, target=compiler.target)  # type: ignore[arg-type]
    pf.set_race_torch(False)  # the served plans are measured: none handed to torch's function
    rows = host_costs(args.rounds)
    step = decode_step_times(args.rounds)
    over = [r["over_raw"] for r in rows if "over_raw" in r]
    summary = {
        "over_raw_median": statistics.median(over) if over else math.nan,
        "over_raw_max": max(over, default=math.nan),
        "beyond_target": {r["case"]: round(r["over_raw"], 3) for r in rows if r.get("over_raw", 0) > TARGET_OVER_RAW},
        "plans_compiled": len(client.compiled),
        "seconds": time.perf_counter() - started,
    }
    report(
        {
            "rows": rows,
            "decode_step": step,
            "summary": summary,
            "device": torch.cuda.get_device_name(0),
            "targets": {"over_raw": TARGET_OVER_RAW},
        },
        args.out,
    )


if __name__ == "__main__":
    main()

"""plancache.functional's training path on one GPU (issue 30): training
steps, what each function costs the host and the GPU with and without
autograd, and (--startup) a fresh process's first training step.

Plans for parts 1 and 2 are built in this process by plancache's own
compiler (the worker's, heuristic plan) behind a stand-in for the client
(`InProcessClient`, as bench/functional.py), so no server is needed; the
functions then run exactly as they do against a server's plans.

1. Training steps, bf16, AdamW (capturable, the same for every variant):
   - transformer: a pre-norm block (RMSNorm, QKV linear without bias, causal
     SDPA over a BSHD view of it, output linear, residual; RMSNorm, linear
     up with a fused GELU, linear down, residual), batch 8, sequence 512,
     hidden 1024, 16 heads, MLP 4096; loss = output.float().pow(2).mean();
   - resnet: conv3x3, batch_norm (training), ReLU, conv3x3, batch_norm, the
     residual, ReLU; channels-last bf16 input 32x64x56x56, float32 batch
     norm parameters and statistics (ReLU and the add are torch's in both).
   Both written once, run with plancache.functional and with torch eager
   from the same parameters: the first step's loss, gradients (and running
   statistics) against torch's (max |ours - torch| / max |torch|); then GPU
   ms per step (CUDA events around 10 steps, median of `--rounds`
   interleaved rounds) for functional eager, torch eager, and each step
   captured whole as one CUDA graph (forward, backward and the optimizer
   step; warmed up on a side stream first, as torch's docs require).
2. Per function, at the training block's sizes: host µs per call after the
   geometry's first call, forward only without autograd and forward +
   backward with it (torch.autograd.grad), against torch's own call; GPU
   µs per call from a CUDA graph of 20 calls (the kernels alone, without
   the host's pace), against torch's. Without autograd, also the frontend's
   own execute of the same plan on the tensors the function packed: the
   mapping form `graph.execute({uid: tensor}, workspace, handle=)` (`raw`)
   and the ordered form `graph.execute(buffers, workspace, handle=,
   tensor_uids=)` that plancache.functional calls (`raw ordered`), each
   also with the outputs allocated as a function must (`+alloc`). Host time
   as bench/gpu_exec.py reads it: the first 32 of N back-to-back calls from
   an idle GPU; `--rounds` rounds interleaved, medians. Target: function /
   (raw + alloc) <= 1.2.
3. --startup: a real deployment (Redis, plancache-server, one GPU worker;
   the benchmark's signing key): a fresh process runs each model's first
   training step with nothing stored (plans built by the worker), the
   worker is stopped, then fresh processes run it with every plan stored
   (`Client(server, cache=False)`), fresh processes that first call
   `pf.prefetch()` with the manifest the first run wrote (right after their
   imports: the plans are fetched and loaded while the process makes its
   CUDA context, model and batch, as docs/functional.md shows), and torch's first
   step in a fresh process, `--startup-repeats` times interleaved. Each
   process's clock starts after its imports, the CUDA context and the
   model, optimizer and batch, and stops when its first step (forward,
   backward, AdamW) is done; the plancache nodes also say how much of it
   was fetching and deserializing plans, and whether the prefetch was over
   before the step began. "stored, workload record" (issue 41): the same with
   no manifest anyone wrote: the client (workload bench-training-<model>, as
   the first run's) streams the plans its workload's record lists from
   `pf.configure` on (plancache.transport.workload).

    python3 bench/training.py --out DIR [--startup]     # DIR/training.json, DIR/training.png

Imports neither torch nor cudnn at import: they are imported where needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_exec import InProcessClient, time_path  # noqa: E402
from bench.report import figure, save, table, write_json  # noqa: E402

INFERENCE_PATHS = ("functional", "raw", "raw+alloc", "raw ordered", "raw ordered+alloc", "torch")
GRAD_PATHS = ("functional", "torch")
STEP_VARIANTS = ("functional eager", "torch eager", "functional captured", "torch captured")
TARGET_OVER_RAW_ALLOC = 1.2
LR = 1e-4
GRAPH_CALLS = 20  # calls per CUDA graph when timing a function's GPU time
GRAPH_REPLAYS = 5
STEPS_PER_SAMPLE = 10


@dataclass(frozen=True)
class Block:
    batch: int = 8
    seq: int = 512
    hidden: int = 1024
    heads: int = 16
    mlp: int = 4096
    eps: float = 1e-5


@dataclass(frozen=True)
class ResBlock:
    batch: int = 32
    channels: int = 64
    size: int = 56
    momentum: float = 0.1
    eps: float = 1e-5


BLOCK, RES = Block(), ResBlock()


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:2000]


# ---- the models ------------------------------------------------------------------------


def transformer(generator: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    import torch

    c = BLOCK

    def randn(*shape: int, scale: float) -> Any:
        return (torch.randn(*shape, device="cuda", generator=generator) * scale).to(torch.bfloat16)

    params = {
        "norm1": 1 + randn(c.hidden, scale=0.1),
        "wqkv": randn(3 * c.hidden, c.hidden, scale=c.hidden**-0.5),
        "wo": randn(c.hidden, c.hidden, scale=c.hidden**-0.5),
        "norm2": 1 + randn(c.hidden, scale=0.1),
        "w_up": randn(c.mlp, c.hidden, scale=c.hidden**-0.5),
        "b_up": randn(c.mlp, scale=0.02),
        "w_down": randn(c.hidden, c.mlp, scale=c.mlp**-0.5),
        "b_down": randn(c.hidden, scale=0.02),
    }
    return params, {}, randn(c.batch, c.seq, c.hidden, scale=1.0)


def transformer_loss(p: dict[str, Any], buffers: dict[str, Any], x: Any, ops: Any) -> Any:
    b, s, h = x.shape
    y = ops.rms_norm(x, (h,), p["norm1"], BLOCK.eps)
    qkv = ops.linear(y, p["wqkv"])
    q, k, v = (
        qkv.view(b, s, 3, BLOCK.heads, h // BLOCK.heads).permute(2, 0, 3, 1, 4).unbind(0)
    )  # [b, heads, s, d] views (BSHD strides)
    attention = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + ops.linear(attention.transpose(1, 2).reshape(b, s, h), p["wo"])
    y = ops.rms_norm(x, (h,), p["norm2"], BLOCK.eps)
    x = x + ops.linear(ops.linear(y, p["w_up"], p["b_up"], activation="gelu"), p["w_down"], p["b_down"])
    return x.float().pow(2).mean()


def resnet(generator: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    import torch

    c = RES
    last = torch.channels_last

    def randn(*shape: int, scale: float, dtype: Any = torch.bfloat16) -> Any:
        return (torch.randn(*shape, device="cuda", generator=generator) * scale).to(dtype)

    fan_in = c.channels * 9
    params = {
        "w1": randn(c.channels, c.channels, 3, 3, scale=fan_in**-0.5).contiguous(memory_format=last),
        "g1": 1 + randn(c.channels, scale=0.1, dtype=torch.float32),
        "b1": randn(c.channels, scale=0.1, dtype=torch.float32),
        "w2": randn(c.channels, c.channels, 3, 3, scale=fan_in**-0.5).contiguous(memory_format=last),
        "g2": 1 + randn(c.channels, scale=0.1, dtype=torch.float32),
        "b2": randn(c.channels, scale=0.1, dtype=torch.float32),
    }
    buffers = {
        "mean1": torch.zeros(c.channels, device="cuda"),
        "var1": torch.ones(c.channels, device="cuda"),
        "mean2": torch.zeros(c.channels, device="cuda"),
        "var2": torch.ones(c.channels, device="cuda"),
    }
    return params, buffers, randn(c.batch, c.channels, c.size, c.size, scale=1.0).contiguous(memory_format=last)


def resnet_loss(p: dict[str, Any], buffers: dict[str, Any], x: Any, ops: Any) -> Any:
    import torch

    c = RES
    y = ops.conv2d(x, p["w1"], None, 1, 1)
    y = torch.relu(ops.batch_norm(y, buffers["mean1"], buffers["var1"], p["g1"], p["b1"], True, c.momentum, c.eps))
    y = ops.conv2d(y, p["w2"], None, 1, 1)
    y = ops.batch_norm(y, buffers["mean2"], buffers["var2"], p["g2"], p["b2"], True, c.momentum, c.eps)
    return torch.relu(y + x).float().pow(2).mean()


MODELS: dict[str, tuple[Callable[[Any], tuple[dict[str, Any], dict[str, Any], Any]], Callable[..., Any], Any]] = {
    "transformer": (transformer, transformer_loss, BLOCK),
    "resnet": (resnet, resnet_loss, RES),
}


def torch_ops() -> Any:
    """torch's functions under plancache.functional's names (linear with its fused activation)."""
    import torch

    f = torch.nn.functional

    def linear(x: Any, w: Any, bias: Any = None, *, activation: str | None = None) -> Any:
        y = f.linear(x, w, bias)
        return y if activation is None else getattr(f, activation)(y)

    return SimpleNamespace(
        rms_norm=f.rms_norm,
        layer_norm=f.layer_norm,
        linear=linear,
        scaled_dot_product_attention=f.scaled_dot_product_attention,
        conv2d=f.conv2d,
        batch_norm=f.batch_norm,
    )


class Trainer:
    """One copy of a model's parameters and buffers, its AdamW, and `step()`."""

    def __init__(
        self, params: dict[str, Any], buffers: dict[str, Any], x: Any, loss_fn: Callable[..., Any], ops: Any
    ) -> None:
        import torch

        self.params = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
        self.buffers = {name: b.clone() for name, b in buffers.items()}
        self.x, self.loss_fn, self.ops = x, loss_fn, ops
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=LR, capturable=True)
        self.loss: Any = None

    def forward_backward(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.params, self.buffers, self.x, self.ops)
        loss.backward()
        self.loss = loss

    def step(self) -> None:
        self.forward_backward()
        self.optimizer.step()


def rel_err(ours: Any, reference: Any) -> float:
    diff = (ours.float() - reference.float()).abs().max()
    return float(diff / reference.float().abs().max().clamp_min(1e-30))


class CapturedStep:
    """A whole training step (forward, backward, optimizer) as one CUDA graph,
    captured as torch's docs capture a whole network: warmed up on a side
    stream, grads set to None, then captured on torch's capture stream.

    It holds its Trainer: the graph replays the addresses of that trainer's
    parameters, gradients and optimizer state, which must outlive it. (GPU
    run 22's illegal memory access: `capture_step(Trainer(...))` returned
    only `graph.replay`, the trainer was freed, and the graph's replays
    wrote into memory the allocator had since handed to other tensors;
    holding the trainer, run 23 captured and replayed every variant.)"""

    def __init__(self, trainer: Trainer) -> None:
        import torch

        self.trainer = trainer
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                trainer.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        trainer.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            trainer.step()
        torch.cuda.synchronize()

    def __call__(self) -> None:
        self.graph.replay()


def gpu_ms(fn: Callable[[], Any], steps: int) -> tuple[float, float]:
    """(GPU ms per step: events around `steps` steps; host ms to issue one)."""
    import torch

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    began = time.perf_counter()
    for _ in range(steps):
        fn()
    host = (time.perf_counter() - began) / steps * 1e3
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps, host


def call_counts() -> dict[str, tuple[int, int]]:
    import plancache.functional as pf

    return {name: (s.cudnn, s.torch) for name, s in pf.stats().items()}


def counts_since(before: dict[str, tuple[int, int]]) -> dict[str, dict[str, Any]]:
    """Calls per function since `before` (plancache's plans, torch's fallbacks, and why)."""
    import plancache.functional as pf

    out = {}
    for name, s in pf.stats().items():
        cudnn, torch_ = before.get(name, (0, 0))
        if s.cudnn - cudnn or s.torch - torch_:
            out[name] = {
                "cudnn": s.cudnn - cudnn,
                "torch": s.torch - torch_,
                **({"reasons": dict(s.reasons)} if s.torch - torch_ else {}),
            }
    return out


def training_step(model: str, rounds: int, capture: bool = True) -> dict[str, Any]:
    """Part 1 for one model: the first step against torch's, then GPU ms per step of the four variants."""
    import torch

    import plancache.functional as pf

    build, loss_fn, config = MODELS[model]
    params, buffers, x = build(torch.Generator(device="cuda").manual_seed(0))
    result: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "dtype": "bfloat16",
        "optimizer": f"AdamW(lr={LR}, capturable=True)",
        "errors": {},
    }
    before = call_counts()
    # The first step from the same parameters: losses, gradients, buffers.
    try:
        first: dict[str, Any] = {}
        for name, ops in (("functional", pf), ("torch", torch_ops())):
            trainer = Trainer(params, buffers, x, loss_fn, ops)
            torch.cuda.synchronize()
            began = time.perf_counter()
            trainer.forward_backward()
            torch.cuda.synchronize()
            first[name] = (time.perf_counter() - began, trainer)
        ours, theirs = first["functional"][1], first["torch"][1]
        result["first_step_s"] = {
            name: f[0] for name, f in first.items()
        }  # functional: every plan built in this process
        result["loss"] = {"functional": float(ours.loss), "torch": float(theirs.loss)}
        result["loss_rel_err"] = abs(result["loss"]["functional"] - result["loss"]["torch"]) / max(
            abs(result["loss"]["torch"]), 1e-30
        )
        result["grad_rel_err"] = {n: rel_err(ours.params[n].grad, theirs.params[n].grad) for n in theirs.params}
        result["grad_rel_err_max"] = max(result["grad_rel_err"].values())
        if buffers:
            result["buffer_rel_err"] = {n: rel_err(ours.buffers[n], theirs.buffers[n]) for n in theirs.buffers}
        del first, ours, theirs
    except Exception as e:  # a step that fails is reported, not the run's end
        result["errors"]["first step"] = error_text(e)
        print(model, "first step failed:", result["errors"]["first step"][:500], flush=True)
    # GPU ms per step.
    steps: dict[str, Callable[[], Any]] = {}
    for variant, ops in (("functional", pf), ("torch", torch_ops())):
        try:
            eager = Trainer(params, buffers, x, loss_fn, ops)
            eager.step()
            steps[f"{variant} eager"] = eager.step
        except Exception as e:
            result["errors"][f"{variant} eager"] = error_text(e)
            print(model, variant, "eager failed:", result["errors"][f"{variant} eager"][:500], flush=True)
            continue
        if not capture:
            continue
        try:
            steps[f"{variant} captured"] = CapturedStep(Trainer(params, buffers, x, loss_fn, ops))
        except Exception as e:  # a step that cannot be captured is reported
            result["errors"][f"{variant} captured"] = error_text(e)
            print(model, variant, "capture failed:", result["errors"][f"{variant} captured"][:500], flush=True)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in STEP_VARIANTS if n in steps}
    try:
        for fn in steps.values():
            fn()
        for _ in range(rounds):  # interleaved
            for n, samples in times.items():
                samples.append(gpu_ms(steps[n], STEPS_PER_SAMPLE))
    except Exception as e:
        result["errors"]["timing"] = error_text(e)
    torch.cuda.synchronize()
    result["gpu_ms"] = {n: statistics.median(t[0] for t in v) for n, v in times.items() if v}
    result["host_ms"] = {n: statistics.median(t[1] for t in v) for n, v in times.items() if v}
    result["gpu_ms_samples"] = {n: [t[0] for t in v] for n, v in times.items()}
    g = result["gpu_ms"]
    result["functional_over_torch"] = {
        kind: g[f"functional {kind}"] / g[f"torch {kind}"]
        for kind in ("eager", "captured")
        if f"functional {kind}" in g and f"torch {kind}" in g
    }
    result["calls"] = counts_since(before)
    result["torch_fallbacks"] = {n: c for n, c in result["calls"].items() if c["torch"]}
    print(
        model,
        {n: round(v, 3) for n, v in result["gpu_ms"].items()},
        "loss rel err",
        result.get("loss_rel_err"),
        flush=True,
    )
    return result


# ---- part 2: per function --------------------------------------------------------------


@dataclass
class Case:
    function: str
    shape: str
    ours: Callable[..., Any]  # (*inputs) -> output, plancache.functional
    theirs: Callable[..., Any]  # torch's
    inputs: tuple[Any, ...]


def function_cases() -> dict[str, Callable[[], Case]]:
    """name -> () -> Case, at the training block's sizes."""
    import torch
    import torch.nn.functional as F

    import plancache.functional as pf

    bf16 = torch.bfloat16

    def r(*shape: int, scale: float = 1.0, dtype: Any = bf16, last: bool = False) -> Any:
        t = (torch.randn(*shape, device="cuda") * scale).to(dtype)
        return t.contiguous(memory_format=torch.channels_last) if last else t

    b, s, h, heads, mlp = BLOCK.batch, BLOCK.seq, BLOCK.hidden, BLOCK.heads, BLOCK.mlp
    n, c, size = RES.batch, RES.channels, RES.size

    def linear() -> Case:
        return Case(
            "linear",
            f"[{b},{s},{h}] -> {mlp}",
            lambda x, w, bias: pf.linear(x, w, bias, activation="gelu"),
            lambda x, w, bias: F.gelu(F.linear(x, w, bias)),
            (r(b, s, h), r(mlp, h, scale=h**-0.5), r(mlp, scale=0.02)),
        )

    def layer_norm() -> Case:
        return Case(
            "layer_norm",
            f"[{b},{s},{h}]",
            lambda x, w, bias: pf.layer_norm(x, (h,), w, bias, 1e-5),
            lambda x, w, bias: F.layer_norm(x, (h,), w, bias, 1e-5),
            (r(b, s, h), 1 + r(h, scale=0.1), r(h, scale=0.1)),
        )

    def rms_norm() -> Case:
        return Case(
            "rms_norm",
            f"[{b},{s},{h}]",
            lambda x, w: pf.rms_norm(x, (h,), w, 1e-5),
            lambda x, w: F.rms_norm(x, (h,), w, 1e-5),
            (r(b, s, h), 1 + r(h, scale=0.1)),
        )

    def sdpa() -> Case:
        d = h // heads
        return Case(
            "scaled_dot_product_attention",
            f"b{b} h{heads} s{s} d{d}",
            lambda q, k, v: pf.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            (r(b, heads, s, d), r(b, heads, s, d), r(b, heads, s, d)),
        )

    def conv2d() -> Case:
        return Case(
            "conv2d",
            f"NHWC {n}x{c}x{size}x{size} 3x3",
            lambda x, w, bias: pf.conv2d(x, w, bias, 1, 1, relu=True),
            lambda x, w, bias: F.relu(F.conv2d(x, w, bias, 1, 1)),
            (r(n, c, size, size, last=True), r(c, c, 3, 3, scale=(9 * c) ** -0.5, last=True), r(c, scale=0.02)),
        )

    def batch_norm() -> Case:
        ours_stats = (torch.zeros(c, device="cuda"), torch.ones(c, device="cuda"))
        their_stats = (torch.zeros(c, device="cuda"), torch.ones(c, device="cuda"))
        return Case(
            "batch_norm",
            f"NHWC {n}x{c}x{size}x{size}, fp32 params",
            lambda x, w, bias: pf.batch_norm(x, *ours_stats, w, bias, True, RES.momentum, RES.eps),
            lambda x, w, bias: F.batch_norm(x, *their_stats, w, bias, True, RES.momentum, RES.eps),
            (
                r(n, c, size, size, last=True),
                1 + r(c, scale=0.1, dtype=torch.float32),
                r(c, scale=0.1, dtype=torch.float32),
            ),
        )

    return {
        "linear+bias+gelu bf16": linear,
        "layer_norm bf16": layer_norm,
        "rms_norm bf16": rms_norm,
        "sdpa causal bf16": sdpa,
        "conv2d+bias+relu bf16": conv2d,
        "batch_norm training bf16": batch_norm,
    }


def served_entry(function: str) -> Any:
    """The most recently used Served (no autograd) entry of `function` in plancache.functional's table."""
    from plancache.functional import _table

    for _, entry in reversed(_table.TABLE.entries()):
        if type(entry) is _table.Served and entry.request.function == function:
            return entry
    raise RuntimeError(f"no served entry of {function} in the table")


def raw_paths(function: str, call: Callable[[], Any]) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The frontend's own execute of the plan the function's last call ran, on
    the buffers that call passed (its packed inputs, outputs and constants):
    raw (mapping), raw+alloc, raw ordered, raw ordered+alloc; and what it found
    (the form plancache.functional's launcher uses, any error of the ordered form)."""
    import cudnn
    import torch

    from plancache.functional._tensor_ops import TorchOps
    from plancache.run.execution import handle_state

    served = served_entry(function)
    uids: tuple[int, ...] = served._uids
    seen: dict[str, Any] = {}

    def spy(
        buffers: Any, workspace: Any, handle: Any = None, tensor_uids: Any = None
    ) -> None:  # the buffers of one real call
        seen["buffers"] = tuple(buffers) if tensor_uids is not None else tuple(buffers[u] for u in uids)

    launchers = list(served._launchers.values())
    info: dict[str, Any] = {"execute_form": sorted({launcher._mode or "first" for launcher in launchers})}
    for launcher in launchers:
        launcher._execute, original = spy, launcher._execute
        try:
            call()
        finally:
            launcher._execute = original
    if "buffers" not in seen:
        raise RuntimeError("the function's call did not reach its launcher")
    buffers: tuple[Any, ...] = seen["buffers"]
    request = served.request
    n_in, n_out = len(request.inputs), len(request.outputs)
    inputs, constants = buffers[:n_in], buffers[n_in + n_out :]
    out_uids = tuple(o.uid for o in request.outputs)
    device = torch.cuda.current_device()
    allocs = tuple(TorchOps().allocator(o.shape, o.stride, o.dtype, device) for o in request.outputs)
    state = handle_state()
    graph = cudnn.pygraph()
    graph.deserialize(state.handle, served.plan.blob)
    execute, handle = graph.execute, state.handle
    workspace = torch.empty(max(1, served.plan.metadata.workspace_size), device="cuda", dtype=torch.uint8)
    pack = dict(zip(uids, buffers, strict=True))
    state.use(torch.cuda.current_stream().cuda_stream)

    def raw() -> None:
        execute(pack, workspace, handle=handle)

    if n_out == 1:
        alloc, out_uid = allocs[0], out_uids[0]

        def raw_alloc() -> None:
            with_out = dict(pack)
            with_out[out_uid] = alloc()
            execute(with_out, workspace, handle=handle)

        def ordered_alloc() -> None:
            execute((*inputs, alloc(), *constants), workspace, handle=handle, tensor_uids=uids)

    else:

        def raw_alloc() -> None:
            with_out = dict(pack)
            for uid, make in zip(out_uids, allocs, strict=True):
                with_out[uid] = make()
            execute(with_out, workspace, handle=handle)

        def ordered_alloc() -> None:
            execute((*inputs, *(make() for make in allocs), *constants), workspace, handle=handle, tensor_uids=uids)

    def ordered() -> None:
        execute(buffers, workspace, handle=handle, tensor_uids=uids)

    paths = {"raw": raw, "raw+alloc": raw_alloc}
    try:
        ordered()
        paths |= {"raw ordered": ordered, "raw ordered+alloc": ordered_alloc}
    except Exception as e:  # a frontend without the ordered form
        info["ordered_error"] = error_text(e)
    return paths, info


def graph_us(fn: Callable[[], Any]) -> float:
    """GPU µs per call: GRAPH_CALLS calls captured as one CUDA graph (after a
    warm-up on its stream), replayed GRAPH_REPLAYS times between events."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(GRAPH_REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    us = float(start.elapsed_time(end)) * 1e3 / (GRAPH_REPLAYS * GRAPH_CALLS)
    del graph
    return us


def calls_for(fn: Callable[[], Any]) -> int:
    """Calls per sample: ~20 ms of the stream's work, at least the 32 whose host time is read."""
    _, stream_us = time_path(fn, 10)
    return max(32, min(2000, int(20_000 / max(stream_us, 1.0))))


def measure_function(name: str, case: Case, rounds: int) -> dict[str, Any]:
    import torch

    import plancache.functional as pf

    row: dict[str, Any] = {"case": name, "function": case.function, "shape": case.shape, "errors": {}}
    inputs = case.inputs
    ours_fn, theirs_fn = case.ours, case.theirs

    def ours() -> Any:
        return ours_fn(*inputs)

    def theirs() -> Any:
        return theirs_fn(*inputs)

    torch_calls = pf.stats().get(case.function, pf.FunctionStats()).torch
    out = ours()  # the first call: the plan
    if pf.stats()[case.function].torch != torch_calls:
        raise RuntimeError(f"torch ran it: {pf.stats()[case.function].reasons}")
    row["rel_err"] = rel_err(out, theirs())
    inference: dict[str, Callable[[], Any]] = {"functional": ours}
    try:
        raw, info = raw_paths(case.function, ours)
        inference |= raw
        row.update(info)
    except Exception as e:
        row["errors"]["raw"] = error_text(e)
    inference["torch"] = theirs
    # With autograd: torch.autograd.grad of the output against a fixed dY, every input a leaf that requires grad.
    leaves = tuple(t.detach().clone().requires_grad_(True) for t in inputs)
    dy = torch.randn_like(out)
    grad: dict[str, Callable[[], Any]] = {}
    try:
        backward_calls = pf.stats().get(f"{case.function}.backward", pf.FunctionStats()).cudnn

        def ours_grad() -> Any:
            return torch.autograd.grad(ours_fn(*leaves), leaves, dy)

        def theirs_grad() -> Any:
            return torch.autograd.grad(theirs_fn(*leaves), leaves, dy)

        got = ours_grad()  # the first call: the training forward's and backward's plans
        if pf.stats()[case.function].torch != torch_calls:
            raise RuntimeError(f"torch ran it with autograd: {pf.stats()[case.function].reasons}")
        if pf.stats().get(f"{case.function}.backward", pf.FunctionStats()).cudnn == backward_calls:
            raise RuntimeError("no served backward plan ran")
        row["grad_rel_err"] = max(rel_err(a, b) for a, b in zip(got, theirs_grad(), strict=True))
        grad = {"functional": ours_grad, "torch": theirs_grad}
    except Exception as e:
        row["errors"]["grad"] = error_text(e)
    for fn in (*inference.values(), *grad.values()):
        for _ in range(3):
            fn()
    count = calls_for(inference.get("raw", ours))
    count_grad = calls_for(grad["functional"]) if grad else 0
    row["calls_per_sample"] = {"inference": count, "grad": count_grad}
    samples: dict[str, dict[str, list[float]]] = {p: {"host": [], "stream": []} for p in inference}
    samples_grad: dict[str, dict[str, list[float]]] = {p: {"host": [], "stream": []} for p in grad}
    for _ in range(rounds):  # interleaved
        for p, fn in inference.items():
            host, stream = time_path(fn, count)
            samples[p]["host"].append(host)
            samples[p]["stream"].append(stream)
        for p, fn in grad.items():
            host, stream = time_path(fn, count_grad)
            samples_grad[p]["host"].append(host)
            samples_grad[p]["stream"].append(stream)
    torch.cuda.synchronize()
    row["samples"], row["samples_grad"] = samples, samples_grad
    row["host_us"] = {p: statistics.median(v["host"]) for p, v in samples.items()}
    row["stream_us"] = {p: statistics.median(v["stream"]) for p, v in samples.items()}
    row["host_us_grad"] = {p: statistics.median(v["host"]) for p, v in samples_grad.items()}
    row["stream_us_grad"] = {p: statistics.median(v["stream"]) for p, v in samples_grad.items()}
    h = row["host_us"]
    for key, floor in (
        ("over_raw", "raw"),
        ("over_raw_alloc", "raw+alloc"),
        ("over_ordered", "raw ordered"),
        ("over_ordered_alloc", "raw ordered+alloc"),
        ("over_torch", "torch"),
    ):
        if floor in h:
            row[key] = h["functional"] / h[floor]
    if grad:
        row["grad_over_torch"] = row["host_us_grad"]["functional"] / row["host_us_grad"]["torch"]
    # GPU time alone: the calls replayed from a CUDA graph.
    row["gpu_us"], row["gpu_us_grad"] = {}, {}
    for kind, paths, into in (
        ("inference", {"functional": ours, "torch": theirs}, row["gpu_us"]),
        ("grad", grad, row["gpu_us_grad"]),
    ):
        for p, fn in paths.items():
            try:
                into[p] = graph_us(fn)
            except Exception as e:
                row["errors"][f"gpu {kind} {p}"] = error_text(e)
    for key, gpu in (("gpu_over_torch", row["gpu_us"]), ("gpu_grad_over_torch", row["gpu_us_grad"])):
        if "functional" in gpu and "torch" in gpu:
            row[key] = gpu["functional"] / gpu["torch"]
    print(
        name,
        {p: round(v, 2) for p, v in h.items()},
        "grad",
        {p: round(v, 1) for p, v in row["host_us_grad"].items()},
        "gpu",
        {p: round(v, 1) for p, v in row["gpu_us"].items()},
        {p: round(v, 1) for p, v in row["gpu_us_grad"].items()},
        flush=True,
    )
    return row


def function_costs(rounds: int) -> list[dict[str, Any]]:
    rows = []
    for name, make in function_cases().items():
        try:
            rows.append(measure_function(name, make(), rounds))
        except Exception as e:  # a case cuDNN does not serve here is reported, not the run's end
            rows.append({"case": name, "error": error_text(e)})
            print(name, "failed:", rows[-1]["error"][:500], flush=True)
    return rows


# ---- part 3: start-up in fresh processes -----------------------------------------------


class PhaseClock:
    """Where a node's first step spends its time (part 3): seconds in the
    service's compile (fetch and verify: plancache.functional's first calls)
    and in deserializing plans, on the program's threads and on the
    prefetch's own thread."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            import threading

            label = f"{phase} (prefetch thread)" if threading.current_thread().name == "plancache-prefetch" else phase
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - began
                self.counts[label] = self.counts.get(label, 0) + 1

        setattr(owner, name, timed)


def node_main(path: str, model: str, server: str, manifest_in: Path | None, manifest_out: Path | None) -> None:
    """One fresh process's first training step (run by startup()): prints one JSON line.
    "functional-prefetch": `pf.prefetch(manifest_in)` right after the imports,
    so the plans are fetched and loaded while the process makes its CUDA
    context, model and batch (the documented start-up)."""
    began = time.perf_counter()
    import torch

    import plancache.functional as pf
    from plancache import Client
    from plancache.frontdoors.service import SERVICE
    from plancache.run.plan import Plan

    imports_s = time.perf_counter() - began
    clock = PhaseClock()
    pending = None
    if path.startswith("functional"):
        clock.wrap(SERVICE, "compile", "fetch")
        clock.wrap(Plan, "load", "deserialize")
        # One workload per model: the first run's uses are what "functional-workload" streams (issue 41).
        pf.configure(Client(server, cache=False, workload=f"bench-training-{model}"))
        if path == "functional-prefetch":
            assert manifest_in is not None
            pending = pf.prefetch(manifest_in)
    torch.cuda.init()
    build, loss_fn, _ = MODELS[model]
    params, buffers, x = build(torch.Generator(device="cuda").manual_seed(0))
    ops: Any = pf if path.startswith("functional") else torch_ops()
    trainer = Trainer(params, buffers, x, loss_fn, ops)
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - began - imports_s
    prefetch_done_before_step = pending is not None and pending.done()
    before = {k: v for k, v in clock.seconds.items()}
    started = time.perf_counter()
    trainer.step()
    torch.cuda.synchronize()
    first = time.perf_counter() - started
    in_step = {k: v - before.get(k, 0.0) for k, v in clock.seconds.items() if v - before.get(k, 0.0) > 0}
    started = time.perf_counter()
    trainer.step()
    torch.cuda.synchronize()
    second = time.perf_counter() - started
    result: dict[str, Any] = {
        "path": path,
        "model": model,
        "imports_s": imports_s,
        "setup_s": setup_s,
        "first_step_s": first,
        "second_step_s": second,
        "loss": float(trainer.loss),
    }
    if path.startswith("functional"):
        result["first_step_phases_s"] = in_step  # of first_step_s: fetching (with verification) and deserializing plans
        result["phase_counts"] = clock.counts
        sources: dict[str, int] = {}
        for g in pf.geometries():
            source = g.plan.source if g.plan is not None else "torch"
            sources[source] = sources.get(source, 0) + 1
        result["sources"] = sources  # the forward geometries' plans: "hit" when stored
        result["calls"] = {
            name: {"cudnn": s.cudnn, "torch": s.torch, **({"reasons": s.reasons} if s.reasons else {})}
            for name, s in pf.stats().items()
        }
    if path == "functional-workload":
        import dataclasses

        import plancache

        result["workload"] = dataclasses.asdict(plancache.workload_stats())
    if pending is not None:
        fetched = pending.wait(timeout=60)
        assert pending.finished_at is not None
        result["prefetch"] = {
            "plans": len(fetched.plans),
            "failed": fetched.failed,
            "seconds": pending.finished_at - pending.started_at,
            "done_before_step": prefetch_done_before_step,
        }
    if manifest_out is not None:
        pf.manifest().save(manifest_out)
    print(json.dumps(result), flush=True)


def startup(out: Path, models: list[str], repeats: int, time_limit: float, cold_jit: bool) -> dict[str, Any]:
    """Part 3 (module doc): its runs, their medians, and what was skipped for lack of time."""
    from bench import startup_deploy as deploy
    from plancache.trust.signing import generate_keypair
    from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
    from tests.support.processes import child_env, server_process, trusting_env, worker_process

    deadline = time.monotonic() + time_limit
    tmp = Path(tempfile.mkdtemp(prefix="plancache-training-"))
    private_key, public_key = generate_keypair(tmp / "keys")
    jit = {"CUDA_CACHE_DISABLE": "1"} if cold_jit else {}
    result: dict[str, Any] = {
        "config": {
            "models": models,
            "repeats": repeats,
            "time_limit_s": time_limit,
            "jit": "empty (CUDA_CACHE_DISABLE=1)" if cold_jit else "inherited",
        },
        "runs": [],
        "skipped": [],
    }

    def manifest(model: str) -> Path:
        return tmp / f"{model}-functions.json"

    def node(path: str, model: str, label: str, address: str, **extra_env: str) -> None:
        if time.monotonic() > deadline:
            result["skipped"].append(f"{label}/{model}")
            return
        env = {
            **trusting_env(public_key),
            **jit,
            "PLANCACHE_HEDGE": "0",
            "PLANCACHE_CACHE_DIR": tempfile.mkdtemp(prefix="disk-cache-", dir=tmp),
            # The workload's start-up record streams its plans only on the path that measures it.
            "PLANCACHE_WORKLOAD_PREFETCH": "1" if path == "functional-workload" else "0",
            **extra_env,
        }
        args = [sys.executable, str(Path(__file__).resolve()), "--node", path, "--model", model, "--server", address]
        if label.startswith("first"):
            args += ["--manifest-out", str(manifest(model))]  # what a first run writes, for the prefetching nodes
        if path == "functional-prefetch":
            args += ["--manifest-in", str(manifest(model))]
        started = time.monotonic()
        row: dict[str, Any] = {"label": label, "model": model}
        try:
            proc = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
            if proc.returncode != 0:
                row["error"] = proc.stderr[-2000:]
            else:
                row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        except Exception as e:
            row["error"] = error_text(e)
        row["wall_s"] = time.monotonic() - started
        result["runs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)})[:400], flush=True)

    redis = EmbeddedRedis(
        tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    try:
        address = f"127.0.0.1:{free_port()}"
        server_args = ("--gpus", "none", "--signing-key", str(private_key), "--data-dir", str(tmp / "server-data"))
        with server_process(address, redis.url, out / "training-server.log", *server_args, env=child_env()):
            log = out / "training-worker.log"
            with worker_process(
                redis.url, log, "--device", "0", "--signing-key", str(private_key), "--no-warm", env=child_env(**jit)
            ) as worker:
                deploy.wait_for_pool(log, worker, address)
                for model in models:
                    node("functional", model, "first (nothing stored)", address)
                worker.kill()  # it would tune what it built before it stopped: the stored plans are the heuristic ones
            for _ in range(repeats):
                for model in models:
                    node("functional", model, "stored", address)
                    node("functional-prefetch", model, "stored, prefetched", address)
                    node("functional-workload", model, "stored, workload record", address)
                    node(
                        "functional-workload",
                        model,
                        "stored, workload record, first use",
                        address,
                        PLANCACHE_WORKLOAD_DESERIALIZE="first-use",
                    )
                    node("torch", model, "torch", address)
    except Exception as e:
        result["error"] = error_text(e)
    finally:
        redis.stop()
    summary: dict[str, Any] = {}
    for model in models:
        medians = {}
        for label in (
            "first (nothing stored)",
            "stored",
            "stored, prefetched",
            "stored, workload record",
            "stored, workload record, first use",
            "torch",
        ):
            values = [
                r["first_step_s"]
                for r in result["runs"]
                if r["model"] == model and r["label"] == label and "first_step_s" in r
            ]
            if values:
                medians[label] = statistics.median(values)
        entry: dict[str, Any] = {"first_step_s": medians}
        if "stored" in medians and "torch" in medians:
            entry["stored_over_torch"] = medians["stored"] / medians["torch"]
            entry["stored_minus_torch_s"] = medians["stored"] - medians["torch"]
        if "stored, prefetched" in medians and "torch" in medians:
            entry["prefetched_over_torch"] = medians["stored, prefetched"] / medians["torch"]
        if "stored, workload record" in medians and "torch" in medians:
            # issue 41: no manifest written by anyone, target <= 0.6
            entry["workload_over_torch"] = medians["stored, workload record"] / medians["torch"]
        if "stored, workload record, first use" in medians and "torch" in medians:
            entry["workload_first_use_over_torch"] = medians["stored, workload record, first use"] / medians["torch"]
        if "first (nothing stored)" in medians and "torch" in medians:
            entry["first_over_torch"] = medians["first (nothing stored)"] / medians["torch"]
        summary[model] = entry
    result["summary"] = summary
    return result


# ---- the report --------------------------------------------------------------------------


def _f(value: Any) -> Any:
    return value if isinstance(value, float) else math.nan


def summarize(result: dict[str, Any], seconds: float, compiled: int) -> dict[str, Any]:
    rows = [r for r in result.get("functions", []) if "host_us" in r]
    summary: dict[str, Any] = {"plans_compiled": compiled, "seconds": seconds}
    for key in ("over_raw_alloc", "over_ordered_alloc"):
        values = [r[key] for r in rows if key in r]
        summary[f"{key}_median"] = statistics.median(values) if values else math.nan
        summary[f"{key}_max"] = max(values, default=math.nan)
        summary[f"beyond_target_{key}"] = {
            r["case"]: round(r[key], 3) for r in rows if r.get(key, 0) > TARGET_OVER_RAW_ALLOC
        }
    for model, step in result.get("steps", {}).items():
        summary[model] = {
            "functional_over_torch": step.get("functional_over_torch", {}),
            "loss_rel_err": step.get("loss_rel_err"),
            "grad_rel_err_max": step.get("grad_rel_err_max"),
            "errors": sorted(step.get("errors", {})),
        }
    return summary


def report(result: dict[str, Any], out: Path) -> None:
    write_json(out / "training.json", result)
    steps, rows = result.get("steps", {}), result.get("functions", [])
    good = [r for r in rows if "host_us" in r]
    print(
        table(
            ["model", "variant", "GPU ms/step", "host ms/step"],
            [
                [m, n, ms, s.get("host_ms", {}).get(n, math.nan)]
                for m, s in steps.items()
                for n, ms in s.get("gpu_ms", {}).items()
            ],
        )
    )
    for m, s in steps.items():
        print(
            f"{m}: loss rel err vs torch {_f(s.get('loss_rel_err')):.2e}, "
            f"worst gradient {_f(s.get('grad_rel_err_max')):.2e}; "
            f"functional/torch {s.get('functional_over_torch')}; errors: {s.get('errors') or 'none'}"
        )
    print(
        table(
            ["function", *(f"{p} µs" for p in INFERENCE_PATHS), "/raw+alloc", "/ordered+alloc", "/torch"],
            [
                [
                    r["case"],
                    *(r["host_us"].get(p, math.nan) for p in INFERENCE_PATHS),
                    _f(r.get("over_raw_alloc")),
                    _f(r.get("over_ordered_alloc")),
                    _f(r.get("over_torch")),
                ]
                if "host_us" in r
                else [r["case"], r.get("error", "")[:60], *[""] * 8]
                for r in rows
            ],
        )
    )
    print(
        table(
            [
                "function",
                "fwd+bwd host µs",
                "torch",
                "/torch",
                "GPU µs fwd",
                "torch",
                "GPU µs fwd+bwd",
                "torch",
                "rel err",
                "grad rel err",
            ],
            [
                [
                    r["case"],
                    _f(r["host_us_grad"].get("functional")),
                    _f(r["host_us_grad"].get("torch")),
                    _f(r.get("grad_over_torch")),
                    _f(r["gpu_us"].get("functional")),
                    _f(r["gpu_us"].get("torch")),
                    _f(r["gpu_us_grad"].get("functional")),
                    _f(r["gpu_us_grad"].get("torch")),
                    _f(r.get("rel_err")),
                    _f(r.get("grad_rel_err")),
                ]
                for r in good
            ],
        )
    )
    for r in good:
        if r.get("errors"):
            print(r["case"], "errors:", {k: v[:200] for k, v in r["errors"].items()})
    s = result.get("summary", {})
    print(
        f"target: functional / (raw+alloc) <= {TARGET_OVER_RAW_ALLOC}; "
        f"beyond it: {s.get('beyond_target_over_raw_alloc') or 'none'}; "
        f"against the ordered raw+alloc: {s.get('beyond_target_over_ordered_alloc') or 'none'}"
    )
    st = result.get("startup")
    if st:
        print(
            table(
                [
                    "model",
                    "first (nothing stored) s",
                    "stored s",
                    "stored, prefetched s",
                    "torch s",
                    "stored/torch",
                    "prefetched/torch",
                ],
                [
                    [
                        m,
                        _f(e["first_step_s"].get("first (nothing stored)")),
                        _f(e["first_step_s"].get("stored")),
                        _f(e["first_step_s"].get("stored, prefetched")),
                        _f(e["first_step_s"].get("torch")),
                        _f(e.get("stored_over_torch")),
                        _f(e.get("prefetched_over_torch")),
                    ]
                    for m, e in st.get("summary", {}).items()
                ],
            )
        )
    plot(result, out / "training.png")


def plot(result: dict[str, Any], path: Path) -> None:
    steps, rows = result.get("steps", {}), [r for r in result.get("functions", []) if "host_us" in r]
    fig, (a, b, c, d) = figure(4)
    labels = [f"{m}: {n}" for m, s in steps.items() for n in s.get("gpu_ms", {})]
    a.barh(labels, [ms for s in steps.values() for ms in s.get("gpu_ms", {}).values()])
    a.set_xlabel("GPU ms per training step (median)"), a.set_title("Training steps, bf16, AdamW", fontsize=9)
    a.tick_params(axis="y", labelsize=7)
    names = [r["case"] for r in rows]
    width = 0.8 / len(INFERENCE_PATHS)
    for i, p in enumerate(INFERENCE_PATHS):
        b.bar(
            [j + (i - len(INFERENCE_PATHS) / 2 + 0.5) * width for j in range(len(rows))],
            [r["host_us"].get(p, math.nan) for r in rows],
            width=width,
            label=p,
        )
    b.set_xticks(range(len(rows)), names, rotation=40, fontsize=6, ha="right")
    (
        b.set_ylabel("host µs per call (median)"),
        b.set_title("Without autograd: host cost per call", fontsize=9),
        b.legend(fontsize=6),
    )
    for i, p in enumerate(GRAD_PATHS):
        c.bar(
            [j + (i - 0.5) * 0.4 for j in range(len(rows))],
            [r["host_us_grad"].get(p, math.nan) for r in rows],
            width=0.4,
            label=p,
        )
    c.set_xticks(range(len(rows)), names, rotation=40, fontsize=6, ha="right")
    (
        c.set_ylabel("host µs per forward + backward"),
        c.set_title("With autograd: host cost per call", fontsize=9),
        c.legend(fontsize=6),
    )
    series = [
        ("functional fwd", "gpu_us", "functional"),
        ("torch fwd", "gpu_us", "torch"),
        ("functional fwd+bwd", "gpu_us_grad", "functional"),
        ("torch fwd+bwd", "gpu_us_grad", "torch"),
    ]
    for i, (label, key, p) in enumerate(series):
        d.bar(
            [j + (i - 1.5) * 0.2 for j in range(len(rows))],
            [r[key].get(p, math.nan) for r in rows],
            width=0.2,
            label=label,
        )
    d.set_xticks(range(len(rows)), names, rotation=40, fontsize=6, ha="right")
    (
        d.set_ylabel("GPU µs per call (CUDA graph replay)"),
        d.set_title("GPU time per call", fontsize=9),
        d.legend(fontsize=6),
    )
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description="plancache.functional's training path on one GPU (module doc)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--parts",
        nargs="*",
        choices=("steps", "functions"),
        default=["steps", "functions"],
        help="parts 1 and 2 to run (default both)",
    )
    parser.add_argument("--models", nargs="*", choices=tuple(MODELS), default=list(MODELS))
    parser.add_argument("--no-capture", action="store_true", help="part 1 without the CUDA-graph variants")
    parser.add_argument(
        "--autotune",
        action="store_true",
        help="autotuned plans (what the service serves once tuned), not cuDNN's heuristic first",
    )
    parser.add_argument(
        "--startup", action="store_true", help="part 3: first training step in fresh processes against a real server"
    )
    parser.add_argument("--startup-repeats", type=int, default=2)
    parser.add_argument(
        "--startup-time-limit",
        type=float,
        default=180.0,
        help="seconds for part 3; nodes past it are skipped and listed",
    )
    parser.add_argument(
        "--startup-cold-jit", action="store_true", help="part 3's worker and nodes with CUDA_CACHE_DISABLE=1"
    )
    parser.add_argument(
        "--node", choices=("functional", "functional-prefetch", "functional-workload", "torch"), help=argparse.SUPPRESS
    )  # a part-3 node process
    parser.add_argument("--manifest-in", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--manifest-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=tuple(MODELS), default="transformer", help=argparse.SUPPRESS)
    parser.add_argument("--server", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node:
        node_main(args.node, args.model, args.server, args.manifest_in, args.manifest_out)
        return
    import torch

    import plancache.functional as pf
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.cuda.init()
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "targets": {"over_raw_alloc": TARGET_OVER_RAW_ALLOC},
        "config": {
            "rounds": args.rounds,
            "autotune": args.autotune,
            "steps_per_sample": STEPS_PER_SAMPLE,
            "graph_calls": GRAPH_CALLS,
            "graph_replays": GRAPH_REPLAYS,
            "torch": torch.__version__,
        },
    }
    compiler = CudnnCompiler(0)
    client = InProcessClient(compiler, autotune=args.autotune)
    pf.configure(client, target=compiler.target)  # type: ignore[arg-type]
    if "steps" in args.parts:
        result["steps"] = {}
        for model in args.models:
            try:
                result["steps"][model] = training_step(model, args.rounds, not args.no_capture)
            except Exception as e:
                result["steps"][model] = {"errors": {"setup": error_text(e)}}
                print(model, "failed:", error_text(e)[:500], flush=True)
            write_json(args.out / "training.json", result)  # what is done so far, should a later part not end
    if "functions" in args.parts:
        result["functions"] = function_costs(args.rounds)
        write_json(args.out / "training.json", result)
    result["summary"] = summarize(result, time.perf_counter() - started, len(client.compiled))
    if args.startup:
        try:
            result["startup"] = startup(
                args.out, args.models, args.startup_repeats, args.startup_time_limit, args.startup_cold_jit
            )
        except Exception as e:
            result["startup"] = {"error": error_text(e)}
        result["summary"]["seconds"] = time.perf_counter() - started
    report(result, args.out)


if __name__ == "__main__":
    main()

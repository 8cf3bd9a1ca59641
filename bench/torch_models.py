"""Models nobody here wrote, unchanged, with and without `plancache.torch.mode()` (issue 42).

Models (torchvision and transformers, randomly initialised; installed on the GPU machine):
- resnet50_infer: torchvision's ResNet-50, inference, float16 channels-last, batch 32, 224x224;
- resnet50_train: the same, a training step (bfloat16 parameters, SGD);
- llama-<seq>: transformers' LlamaForCausalLM (hidden 1024, 8 layers, 16 heads, 4 key/value heads, MLP
  2816, vocabulary 32000), a training step (bfloat16, AdamW), batch 4, each sequence length of --seqs;
- gpt2-<seq>: transformers' GPT2LMHeadModel (hidden 1024, 8 layers, 16 heads, vocabulary 32000), the same.

Each in each of --modes (eager, compile: torch.compile(fullgraph=True), reduce-overhead: the same with
CUDA graphs), torch alone and under the mode (or, --plancache-by serve, with plancache.torch.serve(model):
its layers served, no mode), from the same parameters:
- the first step's loss (output, for inference) and every gradient, plancache against torch
  (max |ours - torch| / max |torch|);
- steady ms per step: CUDA events around --steps steps, --rounds rounds, torch's and plancache's
  interleaved (the machine is shared and noisy), medians;
- the first step of each in this process (compile included where compiled; plancache's plans built then);
- what the mode routed, what plancache's plans ran and what torch ran (plancache.torch.stats()).

Plans come from plancache's own compiler in this process (the worker's; heuristic plans unless
--autotune) behind bench.gpu_exec.InProcessClient, a STAND-IN for the client: no server is needed and
the functions run exactly as against a server's plans. Not measured here: a fresh process's first
step with every plan stored (bench/training.py --startup does it for its own models).

    python3 bench/torch_models.py --out DIR [--models ...] [--modes ...]   # DIR/torch_models.{json,png}

--device cpu runs the same code on the CPU (the mode routing CPU tensors; torch's own functions inside
the operators): a check that the benchmark runs, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402

MODES = ("eager", "compile", "reduce-overhead")
MODELS = ("resnet50_infer", "resnet50_train", "llama", "gpt2")


def rel_err(ours: Any, reference: Any) -> float:
    ours, reference = ours.detach().float(), reference.detach().float()
    return float((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


class Workload:
    """One model at one size: how to make it (seeded), its batch, and one step (a training step or a forward)."""

    def __init__(self, name: str, make: Callable[[], Any], batch: Callable[[], Any], train: bool, lr: float) -> None:
        self.name, self.make, self.batch, self.train, self.lr = name, make, batch, train, lr

    def runner(
        self, model: Any, compile_mode: str, compile_fn: Callable[..., Any] | None = None, tag: str = ""
    ) -> Callable[[Any], Any]:
        """One step of `model`; compiled (unless eager) by `compile_fn`, or by torch.compile through an entry
        function of its own (`tag` names it)."""
        import torch

        if compile_mode == "eager":
            forward = model
        elif compile_fn is None:
            forward = torch.compile(_own_entry(model, tag), fullgraph=True, mode=_mode_arg(compile_mode))
        else:
            forward = compile_fn(model, fullgraph=True, mode=_mode_arg(compile_mode))
        if not self.train:

            def infer(batch: Any) -> Any:
                with torch.no_grad():
                    return _output(forward(batch))

            return infer
        optimizer = (
            torch.optim.AdamW(model.parameters(), lr=self.lr, fused=model.parameters().__next__().is_cuda)
            if self.name.startswith(("llama", "gpt2"))
            else torch.optim.SGD(model.parameters(), lr=self.lr)
        )

        def step(batch: Any) -> Any:
            optimizer.zero_grad(set_to_none=True)
            loss = _loss(forward, batch)
            loss.backward()
            optimizer.step()
            return loss.detach()

        return step


def _own_entry(model: Any, tag: str) -> Callable[..., Any]:
    """`model`'s call through a function with a code object of its own. Dynamo keeps compiled code by code object,
    and torch.compile of a module compiles a wrapper every compiled module shares (torch 2.13: external_utils'
    `inner`): torch's and plancache's compiled variants were two cache entries of one code object, each call trying
    the other's guards first or after. An entry per variant keeps them apart, as a program with one compiled model
    is."""
    namespace = {"model": model}
    source = "def entry(*args, **kwargs):\n    return model(*args, **kwargs)\n"
    exec(compile(source, f"<bench/torch_models.py entry: {tag}>", "exec"), namespace)
    return namespace["entry"]  # type: ignore[no-any-return]


def _loss(forward: Callable[..., Any], batch: Any) -> Any:
    """A language model's next-token cross-entropy on its logits (computed here: transformers' own
    loss logs a warning, which torch.compile(fullgraph=True) cannot trace); an image model's mean square."""
    import torch

    if isinstance(batch, dict):
        ids = batch["input_ids"]
        logits = _output(forward(input_ids=ids))
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    return _output(forward(batch)).float().pow(2).mean()


def _mode_arg(compile_mode: str) -> str | None:
    return None if compile_mode == "compile" else compile_mode


def _output(out: Any) -> Any:
    return out.logits if hasattr(out, "logits") else out


def workloads(device: str, seqs: list[int], small: bool) -> dict[str, Workload]:
    import torch

    found: dict[str, Workload] = {}
    scale = 4 if small else 1  # --device cpu: small sizes, a check that the code runs

    def resnet(dtype: Any) -> Any:
        import torchvision

        model = torchvision.models.resnet50().to(device, dtype)
        return model.to(memory_format=torch.channels_last)

    def image(dtype: Any) -> Any:
        size = 224 // scale
        return torch.randn(32 // scale, 3, size, size, device=device).to(dtype).to(memory_format=torch.channels_last)

    found["resnet50_infer"] = Workload(
        "resnet50_infer", lambda: resnet(torch.float16).eval(), lambda: image(torch.float16), False, 0.0
    )
    found["resnet50_train"] = Workload(
        "resnet50_train", lambda: resnet(torch.bfloat16).train(), lambda: image(torch.bfloat16), True, 1e-3
    )
    for seq in seqs:
        seq_len = max(16, seq // scale)
        for family in ("llama", "gpt2"):
            name = f"{family}-{seq}"

            def make(family: str = family) -> Any:
                import transformers

                hidden, layers, heads = 1024 // scale, 8 // min(scale, 4), 16 // min(scale, 4)
                vocab = 32000 // scale
                if family == "llama":
                    config = transformers.LlamaConfig(
                        hidden_size=hidden,
                        intermediate_size=2816 // scale,
                        num_hidden_layers=layers,
                        num_attention_heads=heads,
                        num_key_value_heads=max(1, heads // 4),
                        vocab_size=vocab,
                        attn_implementation="sdpa",
                    )
                    model = transformers.LlamaForCausalLM(config)
                else:
                    config = transformers.GPT2Config(
                        n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=vocab, attn_implementation="sdpa"
                    )
                    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
                    model = transformers.GPT2LMHeadModel(config)
                return model.to(device, torch.bfloat16).train()

            def tokens(seq_len: int = seq_len, vocab: int = 32000 // scale) -> Any:
                return {"input_ids": torch.randint(0, vocab, (4, seq_len), device=device)}

            found[name] = Workload(name, make, tokens, True, 1e-4)
    return found


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def first_step_errors(work: Workload, device: str, pt: Any) -> dict[str, Any]:
    """The first step from the same parameters: plancache's loss (or output) and gradients against torch's (eager)."""
    import torch

    torch.manual_seed(0)
    base = work.make()
    batch = work.batch()
    results = []
    served_before = {name: st.cudnn for name, st in pt.stats().items()}
    for use in (False, True):
        model = copy.deepcopy(base)
        model.zero_grad(set_to_none=True)
        with pt.mode() if use else contextlib.nullcontext():
            if work.train:
                loss = _loss(model, batch)
                loss.backward()
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                results.append((loss.detach(), grads))
            else:
                with torch.no_grad():
                    results.append((_output(model(batch)), []))
    _sync(device)
    (ours, our_grads), (theirs, their_grads) = results[1], results[0]
    grads = [rel_err(g, r) for g, r in zip(our_grads, their_grads, strict=True)]
    # What plancache's plans ran in that step (an error of exactly 0 is only credible with these > 0).
    served = {name: st.cudnn - served_before.get(name, 0) for name, st in pt.stats().items()}
    return {
        "served_in_step": {name: n for name, n in served.items() if n},
        "loss_or_output_rel_err": rel_err(ours, theirs),
        "grad_rel_err_max": max(grads, default=math.nan),
        "grad_rel_err_median": statistics.median(grads) if grads else math.nan,
    }


def timed_ms(run: Callable[[Any], Any], batch: Any, steps: int, device: str) -> float:
    import torch

    if device != "cuda":
        start = time.perf_counter()
        for _ in range(steps):
            run(batch)
        return (time.perf_counter() - start) * 1e3 / steps
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(steps):
        run(batch)
    end.record()
    end.synchronize()
    return float(begin.elapsed_time(end)) / steps


def measure(work: Workload, compile_mode: str, args: argparse.Namespace, pt: Any, pf: Any) -> dict[str, Any]:
    import torch

    from plancache.functional._race import RACE, RACE_AFTER_S, TORCH_FASTER

    torch.manual_seed(0)
    base = work.make()
    batch = work.batch()
    row: dict[str, Any] = {"model": work.name, "mode": compile_mode, "plancache_by": args.plancache_by}
    if compile_mode != "eager" and args.plancache_by == "mode":
        row["plancache_compile"] = args.plancache_compile
    runners: dict[str, Callable[[Any], Any]] = {}
    torch._dynamo.reset()  # once: each variant's compiled code is its entry's own (_own_entry)
    for variant in ("torch", "plancache"):
        model = copy.deepcopy(base)
        context: Callable[[], Any] = contextlib.nullcontext
        if variant == "plancache" and args.plancache_by == "serve":  # the model's layers served, no mode
            run = work.runner(pt.serve(model), compile_mode, tag=variant)
        else:
            # plancache compiled: plancache.torch.compile (the mode inside the compiled function), or
            # `--plancache-compile around`: torch.compile run inside `with plancache.torch.mode():`.
            inside = variant == "plancache" and compile_mode != "eager" and args.plancache_compile == "inside"
            run = work.runner(model, compile_mode, pt.compile if inside else None, tag=variant)
            if variant == "plancache" and not inside:
                context = pt.mode
        start = time.perf_counter()
        with context():
            run(batch)
        _sync(args.device)
        row[f"first_step_s_{variant}"] = time.perf_counter() - start
        with context():
            # Warm-up: CUDA graphs record on their first runs; plancache's eager geometries race torch's functions
            # once RACE_AFTER_S has passed since their first calls (plancache.functional._race), not in the timing;
            # a served layer whose calls torch then runs goes back to its own forward RETURN_AFTER calls later.
            warm = 0
            while warm < 2 or time.perf_counter() - start < 2.0 * RACE_AFTER_S:
                run(batch)
                warm += 1
        _sync(args.device)
        if variant == "plancache" and args.plancache_by == "serve":
            from plancache.torch._serve import served

            # Layers still served as the timing starts (the others went back to their own forward, torch's).
            row["served_layers_when_timed"] = sum(served(m) for m in model.modules())
        runners[variant] = lambda b, run=run, context=context: _in(context, run, b)
    samples: dict[str, list[float]] = {"torch": [], "plancache": []}
    pf_before = pf.stats()
    for _ in range(args.rounds):
        for variant in ("torch", "plancache"):
            samples[variant].append(timed_ms(runners[variant], batch, args.steps, args.device))
    for variant, values in samples.items():
        row[f"ms_{variant}"] = statistics.median(values)
    row["rounds_ms"] = samples
    row["plancache_over_torch"] = row["ms_plancache"] / row["ms_torch"]
    row["routes"] = {
        name: {
            "routed": s.routed,
            "left": s.left,
            "left_compiled": list(s.left_compiled),
            "cudnn": s.cudnn,
            "torch": s.torch,
            "returned": s.returned,  # serve()'s layers gone back to their own forward (plancache.torch._serve)
        }
        for name, s in pt.stats().items()
    }
    row["served_while_timed"] = {
        name: s.cudnn - (pf_before[name].cudnn if name in pf_before else 0) for name, s in pf.stats().items()
    }
    row["native"] = pt.native_state()  # the operators' C++ kernels (PLANCACHE_NATIVE): on, and how many kept
    # The plan-against-torch races (PLANCACHE_RACE_TORCH): geometries raced, those torch's function won (run by
    # torch from then on), and every race's two times, whichever won ("won_by_plan": the plans kept).
    row["race"] = {
        "on": RACE.enabled,
        "raced": {name: s.raced for name, s in pf.stats().items() if s.raced},
        "torch_faster": {name: s.reasons[TORCH_FASTER] for name, s in pf.stats().items() if TORCH_FASTER in s.reasons},
        "verdicts": sorted(
            {f"{g.function}: {g.reason}" for g in pf.geometries() if g.reason and TORCH_FASTER in g.reason}
        )[:40],
        "won_by_plan": sorted({f"{g.function}: {g.race}" for g in pf.geometries() if g.plan is not None and g.race})[
            :60
        ],
    }
    return row


def _in(context: Callable[[], Any], run: Callable[[Any], Any], batch: Any) -> Any:
    with context():
        return run(batch)


def report(result: dict[str, Any], out: Path) -> None:
    write_json(out / "torch_models.json", result)
    rows = result["rows"]
    print(
        table(
            ["model", "mode", "torch ms", "plancache ms", "ratio", "first step torch s", "first step plancache s"],
            [
                [
                    r["model"],
                    r.get("mode", "") + (f" ({r['skipped']})" if "skipped" in r else ""),
                    r.get("ms_torch", math.nan),
                    r.get("ms_plancache", math.nan),
                    r.get("plancache_over_torch", math.nan),
                    r.get("first_step_s_torch", math.nan),
                    r.get("first_step_s_plancache", math.nan),
                ]
                for r in rows
            ],
        )
    )
    for name, errors in result["errors_vs_torch"].items():
        print(f"{name}: {errors}")
    good = [r for r in rows if "plancache_over_torch" in r]
    if not good:
        return
    fig, (ax,) = figure(1)
    labels = [f"{r['model']}\n{r['mode']}" for r in good]
    ax.bar(range(len(good)), [r["plancache_over_torch"] for r in good])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(good)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("plancache ms / torch ms per step (median)")
    by = "serve(model)" if any(r.get("plancache_by") == "serve" for r in rows) else "mode()"
    ax.set_title(f"Unchanged models with plancache.torch.{by} ({result['device_name']})")
    save(fig, out / "torch_models.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--plancache-compile",
        choices=("inside", "around"),
        default="inside",
        help="compiled plancache rows: plancache.torch.compile (inside) or torch.compile under the mode (around)",
    )
    parser.add_argument(
        "--plancache-by",
        choices=("mode", "serve"),
        default="mode",
        help="plancache rows: plancache.torch.mode() (every torch call seen) or plancache.torch.serve(model) (its layers)",
    )
    parser.add_argument("--seqs", default="256,1024")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--autotune", action="store_true")
    parser.add_argument("--time-limit", type=float, default=540.0, help="seconds: no new case starts after this")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()

    import torch

    import plancache.functional as pf
    import plancache.torch as pt

    if args.device == "cuda":
        from bench.gpu_exec import InProcessClient
        from plancache_server.worker.compiler.cudnn import CudnnCompiler

        compiler = CudnnCompiler(0)
        pf.configure(InProcessClient(compiler, autotune=args.autotune), target=compiler.target)  # type: ignore[arg-type]
        device_name = torch.cuda.get_device_name(0)
    else:
        from plancache.torch import _mode

        _mode.ROUTED_DEVICES.add("cpu")
        device_name = "CPU (a check that the benchmark runs)"
    started = time.monotonic()
    families = [m.strip() for m in args.models.split(",") if m.strip()]
    seqs = [int(s) for s in args.seqs.split(",") if s.strip()]
    available = workloads(args.device, seqs, small=args.device == "cpu")
    chosen = [w for name, w in available.items() if name in families or name.split("-")[0] in families]
    result: dict[str, Any] = {"device_name": device_name, "args": vars(args) | {"out": str(args.out)}, "rows": []}
    result["errors_vs_torch"] = {}
    for work in chosen:
        if time.monotonic() - started > args.time_limit:
            result["rows"].append({"model": work.name, "skipped": "time limit"})
            continue
        try:
            result["errors_vs_torch"][work.name] = first_step_errors(work, args.device, pt)
        except Exception as e:  # a model that does not run is reported, the others still measured
            result["errors_vs_torch"][work.name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        for compile_mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            if time.monotonic() - started > args.time_limit:
                result["rows"].append({"model": work.name, "mode": compile_mode, "skipped": "time limit"})
                continue
            pt.clear_stats()
            try:
                result["rows"].append(measure(work, compile_mode, args, pt, pf))
            except Exception as e:
                result["rows"].append(
                    {"model": work.name, "mode": compile_mode, "error": f"{type(e).__name__}: {e}"[:2000]}
                )
            print(result["rows"][-1], flush=True)
            write_json(args.out / "torch_models.json", result)  # what a call cut short by its limit still returns
    result["seconds"] = time.monotonic() - started
    report(result, args.out)


if __name__ == "__main__":
    main()

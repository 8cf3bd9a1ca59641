"""What cuDNN's dynamic shapes and kernel cache give on this GPU (issue 31's
facts, before the design relies on them). Per graph family (a decode MLP
linear over batch sizes, a causal prefill SDPA over lengths, paged decode
attention over batch sizes), built from plancache.functional's own specs
through plancache's frontend-graph builder:

- static build of each shape (heuristic plan, no kernel cache) vs a build
  with is_dynamic_shape_enabled and one kernel cache shared by the shapes;
- the kernel cache serialized (bytes, ms), and a fresh process that
  deserializes it and builds new shapes from it (its first and later builds);
- a plan built from the cache, serialized, loaded in that fresh process
  without the cache: does it run, and right;
- outputs of the dynamic plan vs the static one at each shape, and GPU time
  (CUDA events over repeated executes) of the dynamic plan vs the static
  autotuned plan at a few shapes.

    python3 scripts/dynamic_shapes_probe.py --out DIR      # DIR/dynamic_shapes_probe.json

`--study cache`: static graphs (no dynamic shapes) with a kernel cache: a
process builds a few shapes of each family into one cache and serializes
it; fresh processes build other shapes statically, with that cache and
without, each the first build of its process (so the cold cost is seen),
checked against torch (linear, SDPA) or a static plan (paged decode); and
dynamic SDPA against torch, to say which side the run-1 difference is on.
(DIR/kernel_cache_probe.json)
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _geo(name: str, shape: tuple[int, ...], dtype: str = "bfloat16", stride: tuple[int, ...] | None = None) -> Any:
    from plancache.functional._geometry import Geo
    from plancache.graphspec.layouts import row_major

    return Geo(name, shape, stride or row_major(shape), dtype, f"torch.{dtype}", "cuda")


def linear_spec(batch: int) -> Any:
    from plancache.functional._linear import linear_request

    return linear_request(_geo("input", (batch, 1024)), _geo("weight", (4096, 1024)), None, None).spec


def sdpa_spec(length: int) -> Any:
    from plancache.functional._attention import Attention, sdpa_request

    q = _geo("query", (1, 16, length, 128))
    return sdpa_request((q, q, q, None, None, None), Attention(0.0, True, None, False, None, False)).spec


def paged_spec(batch: int) -> Any:
    from plancache.functional._paged_decode import paged_decode_request

    pool = _geo("key_cache", (4096, 8, 64, 128))
    table = _geo("page_table", (batch, 32), "int32")
    return paged_decode_request(
        _geo("query", (batch, 16, 1, 128)),
        pool,
        pool,
        table,
        table,
        _geo("seq_lens", (batch,), "int32"),
        scale=None,
        max_seq_len=None,
    ).spec


def rms_norm_spec(rows: int, training: bool = False) -> Any:
    from plancache.functional._norms import rms_norm_request

    weight = _geo("weight", (1024,))
    return rms_norm_request(_geo("input", (rows, 1024)), (1024,), weight, 1e-5, training=training).spec


def layer_norm_spec(rows: int, training: bool = False) -> Any:
    from plancache.functional._norms import layer_norm_request

    x, w, b = _geo("input", (rows, 768)), _geo("weight", (768,)), _geo("bias", (768,))
    return layer_norm_request(x, (768,), w, b, 1e-5, training=training).spec


FAMILIES: dict[str, tuple[Callable[[int], Any], list[int], list[int]]] = {
    # name: (spec of a size, sizes built in this process, sizes the fresh process builds from the cache)
    "linear decode [B,1024]x[1024,4096] bf16": (linear_spec, [1, 8, 17, 64, 129, 256], [3, 100, 200]),
    "sdpa prefill causal h16 d128 bf16": (sdpa_spec, [128, 200, 512, 1000, 2048], [300, 777, 1500]),
    "paged decode h16/kv8 d128 page64 bf16": (paged_spec, [1, 8, 33, 64, 128], [5, 50, 100]),
    # Every rms_norm engine on sm_90 compiles at build time (scripts/build_time_probe.py, run 32): 0.28-0.59 s a
    # size, the floor of a norm family's members; does a kernel cache over sizes keep them right, and cheap?
    "rms_norm rows [N,1024] bf16": (rms_norm_spec, [1, 8, 33, 100, 199], [5, 64, 150]),
    "rms_norm training rows [N,1024] bf16": (
        lambda rows: rms_norm_spec(rows, training=True),
        [1, 8, 33, 100, 640],
        [5, 64, 150],
    ),
    "layer_norm rows [N,768] bf16": (layer_norm_spec, [1, 8, 33, 100, 640], [5, 64, 150]),
    "layer_norm training rows [N,768] bf16": (
        lambda rows: layer_norm_spec(rows, training=True),
        [1, 8, 33, 100, 640],
        [5, 64, 150],
    ),
}


def dynamic(spec: Any) -> Any:
    from plancache.graphspec.validation import normalize

    spec.is_dynamic_shape_enabled = True
    spec.kernel_cache = True
    return normalize(spec)


def build(spec: Any, handle: Any, cache: Any = None) -> tuple[Any, float]:
    import cudnn

    from plancache.frontend_graph.build import build_pygraph
    from plancache.graphspec.validation import normalize

    began = time.perf_counter()
    g = build_pygraph(normalize(spec), cudnn, handle=handle, kernel_cache=cache)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, (time.perf_counter() - began) * 1e3


def gpu_ms(g: Any, bindings: dict[int, Any], handle: Any, repeats: int = 50) -> float:
    import torch

    workspace = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
    for _ in range(3):
        g.execute(bindings, workspace, handle=handle)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        g.execute(bindings, workspace, handle=handle)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / repeats


def output_uids(spec: Any) -> tuple[int, ...]:
    """Every output the graph writes (a training norm's statistics too)."""
    return tuple(sorted({t.uid for n in spec.nodes for t in n.outputs.values() if not t.is_virtual}))


def run_and_compare(
    g: Any, reference: Any, bindings: dict[int, Any], handle: Any, out_uid: int | tuple[int, ...]
) -> float:
    """max over the outputs of max |dynamic - static| / max |static| (both executed on the same inputs)."""
    import torch

    uids = (out_uid,) if isinstance(out_uid, int) else out_uid
    outs: list[dict[int, Any]] = []
    for graph in (g, reference):
        bound = dict(bindings)
        for uid in uids:
            bound[uid] = torch.empty_like(bindings[uid])
        workspace = torch.empty(max(1, graph.get_workspace_size()), device="cuda", dtype=torch.uint8)
        graph.execute(bound, workspace, handle=handle)
        outs.append({uid: bound[uid].float() for uid in uids})
    torch.cuda.synchronize()
    return max(
        float((outs[0][uid] - outs[1][uid]).abs().max() / outs[1][uid].abs().max().clamp_min(1e-30)) for uid in uids
    )


def family(
    name: str, make: Callable[[int], Any], sizes: list[int], fresh_sizes: list[int], compiler: Any, handle: Any
) -> dict[str, Any]:
    import cudnn

    from plancache.graphspec.validation import normalize

    row: dict[str, Any] = {"family": name, "sizes": sizes, "shapes": []}
    cache = cudnn.create_kernel_cache()
    for size in sizes:
        shape: dict[str, Any] = {"size": size}
        try:
            began = time.perf_counter()
            spec = make(size)
            shape["spec_ms"] = (time.perf_counter() - began) * 1e3
            static, shape["static_build_ms"] = build(spec, handle)
            dyn, shape["dynamic_build_ms"] = build(dynamic(make(size)), handle, cache)
            bindings = compiler.random_bindings(normalize(spec))
            shape["dynamic_vs_static_rel_err"] = run_and_compare(dyn, static, bindings, handle, output_uids(spec))
            shape["dynamic_gpu_ms"] = gpu_ms(dyn, bindings, handle)
            shape["static_heuristic_gpu_ms"] = gpu_ms(static, bindings, handle)
        except Exception as e:
            shape["error"] = f"{type(e).__name__}: {e}"[:1500]
        row["shapes"].append(shape)
        print(name, json.dumps(shape)[:300], flush=True)
    try:
        began = time.perf_counter()
        text = cache.serialize()
        row["cache_serialize_ms"] = (time.perf_counter() - began) * 1e3
        row["cache_type"] = type(text).__name__
        blob = text.encode() if isinstance(text, str) else bytes(text)
        row["cache_bytes"] = len(blob)
        # A plan built from the cache, serialized: the fresh process loads it without the cache.
        plan_graph, _ = build(dynamic(make(sizes[1])), handle, cache)
        plan_blob = bytes(plan_graph.serialize())
        row["plan_from_cache_bytes"] = len(plan_blob)
        child = subprocess.run(
            [sys.executable, __file__, "--child", name],
            input=json.dumps(
                {
                    "cache": base64.b64encode(blob).decode(),
                    "is_str": isinstance(text, str),
                    "sizes": fresh_sizes,
                    "plan": base64.b64encode(plan_blob).decode(),
                    "plan_size": sizes[1],
                }
            ),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        row["fresh_process"] = (
            json.loads(child.stdout.strip().splitlines()[-1])
            if child.returncode == 0
            else {"error": child.stderr[-2000:]}
        )
    except Exception as e:
        row["cache_error"] = f"{type(e).__name__}: {e}"[:1500]
    # GPU time: the dynamic plan against the static autotuned one, at two shapes.
    row["tuned"] = []
    for size in (sizes[1], sizes[-1]):
        try:
            from bench.gpu_exec import build_spec_plan

            tuned_plan = build_spec_plan(compiler, make(size), autotune=True)
            tuned = cudnn.pygraph()
            tuned.deserialize(handle, tuned_plan.blob)
            dyn, _ = build(dynamic(make(size)), handle, cache)
            bindings = compiler.random_bindings(normalize(make(size)))
            entry = {
                "size": size,
                "tuned_gpu_ms": gpu_ms(tuned, bindings, handle),
                "dynamic_gpu_ms": gpu_ms(dyn, bindings, handle),
            }
            entry["dynamic_over_tuned"] = entry["dynamic_gpu_ms"] / entry["tuned_gpu_ms"]
            # Dynamic shapes with every candidate timed at this shape: does tuning the family recover the gap?
            row["tuned"].append(entry)
        except Exception as e:
            row["tuned"].append({"size": size, "error": f"{type(e).__name__}: {e}"[:1500]})
        print(name, "tuned", json.dumps(row["tuned"][-1])[:300], flush=True)
    return row


def child(name: str) -> None:
    """The fresh process: the kernel cache deserialized, new shapes built from it; the plan loaded without it."""
    import cudnn
    import torch

    from plancache.graphspec.validation import normalize
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    data = json.loads(sys.stdin.read())
    make = FAMILIES[name][0]
    torch.cuda.init()
    handle = cudnn.create_handle()
    compiler = CudnnCompiler(0)
    out: dict[str, Any] = {}
    blob = base64.b64decode(data["cache"])
    cache = cudnn.create_kernel_cache()
    began = time.perf_counter()
    cache.deserialize(blob.decode() if data["is_str"] else blob)
    out["cache_deserialize_ms"] = (time.perf_counter() - began) * 1e3
    out["builds"] = []
    for size in data["sizes"]:
        entry: dict[str, Any] = {"size": size}
        try:
            began = time.perf_counter()
            spec = dynamic(make(size))
            g, entry["build_ms"] = build(spec, handle, cache)
            entry["spec_and_build_ms"] = (time.perf_counter() - began) * 1e3
            static, entry["static_build_ms"] = build(make(size), handle)
            entry["rel_err_vs_static"] = run_and_compare(
                g, static, compiler.random_bindings(normalize(make(size))), handle, output_uids(make(size))
            )
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"[:1000]
        out["builds"].append(entry)
    try:
        g = cudnn.pygraph()
        began = time.perf_counter()
        g.deserialize(handle, base64.b64decode(data["plan"]))
        out["plan_deserialize_ms"] = (time.perf_counter() - began) * 1e3
        static, _ = build(make(data["plan_size"]), handle)
        out["plan_without_cache_rel_err"] = run_and_compare(
            g,
            static,
            compiler.random_bindings(normalize(make(data["plan_size"]))),
            handle,
            output_uids(make(data["plan_size"])),
        )
    except Exception as e:
        out["plan_error"] = f"{type(e).__name__}: {e}"[:1000]
    print(json.dumps(out), flush=True)


def torch_reference(name: str, bindings: dict[int, Any]) -> Any | None:
    """torch's result for the linear and SDPA families (None for paged decode)."""
    import torch

    from plancache.functional._attention import SDPA

    if name.startswith("linear"):
        return (bindings[1].float() @ bindings[2].float().T).to(torch.bfloat16)
    if name.startswith("sdpa"):
        return torch.nn.functional.scaled_dot_product_attention(
            bindings[SDPA.uid("query")], bindings[SDPA.uid("key")], bindings[SDPA.uid("value")], is_causal=True
        )
    return None


def checked(name: str, g: Any, spec: Any, handle: Any, compiler: Any, reference_graph: Any = None) -> float:
    """max |plan - reference| / max |reference|: torch's, or (paged decode) a static plan's."""
    import torch

    from plancache.functional._requests import OUTPUT_UID
    from plancache.graphspec.validation import normalize

    bindings = compiler.random_bindings(normalize(spec))
    expected = torch_reference(name, bindings)
    if expected is None:
        assert reference_graph is not None
        return run_and_compare(g, reference_graph, bindings, handle, OUTPUT_UID)
    bound = dict(bindings)
    bound[OUTPUT_UID] = torch.empty_like(bindings[OUTPUT_UID])
    workspace = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
    g.execute(bound, workspace, handle=handle)
    torch.cuda.synchronize()
    return float(
        (bound[OUTPUT_UID].float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-30)
    )


def cache_child(name: str) -> None:
    """A fresh process: one static build of a new shape (with the given cache, or none), timed and checked."""
    import cudnn
    import torch

    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    data = json.loads(sys.stdin.read())
    make = FAMILIES[name][0]
    torch.cuda.init()
    handle = cudnn.create_handle()
    compiler = CudnnCompiler(0)
    cache = None
    out: dict[str, Any] = {"with_cache": data["cache"] is not None, "builds": []}
    if data["cache"] is not None:
        cache = cudnn.create_kernel_cache()
        cache.deserialize(base64.b64decode(data["cache"]).decode())
    for size in data["sizes"]:
        entry: dict[str, Any] = {"size": size}
        try:
            spec = make(size)
            if cache is not None:
                spec.kernel_cache = True
            g, entry["build_ms"] = build(spec, handle, cache)
            reference = build(make(size), handle)[0] if name.startswith("paged") else None
            entry["rel_err"] = checked(name, g, make(size), handle, compiler, reference)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"[:800]
        out["builds"].append(entry)
    print(json.dumps(out), flush=True)


def cache_study(out: Path) -> None:
    import cudnn
    import torch

    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    torch.cuda.init()
    handle = cudnn.create_handle()
    compiler = CudnnCompiler(0)
    results: dict[str, Any] = {"families": []}
    for name, (make, sizes, fresh) in FAMILIES.items():
        row: dict[str, Any] = {"family": name}
        try:
            cache = cudnn.create_kernel_cache()
            row["seed_builds_ms"] = []
            for size in sizes[:3]:
                spec = make(size)
                spec.kernel_cache = True
                row["seed_builds_ms"].append(build(spec, handle, cache)[1])
            text = cache.serialize()
            row["cache_bytes"] = len(text)
            if name.startswith(
                "sdpa"
            ):  # run 1: dynamic SDPA plans at a second shape differed from static ones; against torch now
                dyn_cache = cudnn.create_kernel_cache()
                row["dynamic_vs_torch"] = {}
                for size in sizes[:3]:
                    g, _ = build(dynamic(make(size)), handle, dyn_cache)
                    row["dynamic_vs_torch"][size] = checked(name, g, make(size), handle, compiler)
                    static, _ = build(make(size), handle)
                    row.setdefault("static_vs_torch", {})[size] = checked(name, static, make(size), handle, compiler)
            for label, blob in (("with cache", base64.b64encode(text.encode()).decode()), ("without", None)):
                child = subprocess.run(
                    [sys.executable, __file__, "--cache-child", name],
                    input=json.dumps({"cache": blob, "sizes": fresh}),
                    capture_output=True,
                    text=True,
                    timeout=240,
                    check=False,
                )
                row[label] = (
                    json.loads(child.stdout.strip().splitlines()[-1])
                    if child.returncode == 0
                    else {"error": child.stderr[-1500:]}
                )
        except Exception:
            row["error"] = traceback.format_exc()[-1500:]
        results["families"].append(row)
        print(json.dumps(row)[:1500], flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "kernel_cache_probe.json").write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--study", choices=("dynamic", "cache"), default="dynamic")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cache-child", help=argparse.SUPPRESS)
    parser.add_argument("--only", help="the families whose name contains this (default: all)")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.cache_child:
        cache_child(args.cache_child)
        return
    if args.study == "cache":
        cache_study(args.out)
        return
    import cudnn
    import torch

    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    torch.cuda.init()
    handle = cudnn.create_handle()
    compiler = CudnnCompiler(0)
    results: dict[str, Any] = {"cudnn": cudnn.backend_version(), "frontend": cudnn.__version__, "families": []}
    for name, (make, sizes, fresh) in FAMILIES.items():
        if args.only and args.only not in name:
            continue
        try:
            results["families"].append(family(name, make, sizes, fresh, compiler, handle))
        except Exception:
            results["families"].append({"family": name, "error": traceback.format_exc()[-2000:]})
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dynamic_shapes_probe.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results)[:3000])


if __name__ == "__main__":
    main()

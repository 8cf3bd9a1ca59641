"""Shapes that vary (issue 31): a fresh process meeting 50 new shapes, built
locally, through today's plancache, and with the graphs' families stored.

A real deployment (Redis, plancache-server, one GPU worker; the bench's
signing key). Two workloads through plancache.functional, bf16:

- decode: one decode step at a batch size B (RMSNorm [B, 1024]; the query
  projection [B, 1024] x [2048, 1024]; paged decode attention, 16 query
  heads over 8 KV heads of 128, pages of 64, 32 pages per sequence; the MLP
  up [B, 1024] x [4096, 1024] with GELU and down): 5 graphs per batch size;
  50 distinct batch sizes drawn from 1..128 (seeded);
- prefill: causal SDPA [1, 16, S, 128] at 50 distinct lengths S drawn from
  16..1024 (seeded).

Paths, each a fresh process running the 50 shapes in the same order, the
clock around each step to its synchronize (its first execution):

- local: each graph built in the process by the frontend (the worker's
  compiler, cuDNN's heuristic plan, what a program does without plancache;
  it also serializes and loads the plan, 1-4 ms per graph);
- plancache: today's (one key per shape, nothing stored: each new shape a
  miss, the hedge on, no family asked for);
- family: the graphs' families stored first (decode: every batch size
  1..128 of each of the 5 graphs; prefill: lengths padded to the next
  multiple of 64 with pf.set_buckets, the family the 16 bucket sizes) by
  BuildFamily on the worker (its time reported), then the node.

Families are built with cuDNN's heuristic plan (autotune off: tuning 656
graphs does not fit the benchmark's time); each family plan's GPU time is
then compared, at a few sizes, with the exact shape's autotuned plan built
in the node process.

    python3 bench/families.py --out DIR      # DIR/families.json, DIR/families.png

Evidence, soonest first, a budget (issue 43): `--study evidence` runs instead,
against a real server and worker with the families as plancache.functional
asks for them by itself (default threshold, no family built beforehand):

- fixed: a fixed-shape training run (a GPT block's six linear layers of four
  weight shapes, hidden 768, GQA k/v 256, MLP 2304; batch 2, sequence 320;
  RMSNorm; bf16; three steps with autograd): families asked (target 0);
- sweep, first process: 40 distinct row counts drawn from 1..199 (seeded)
  through RMSNorm + linear [rows, 1024] x [1024, 1024]: per size the time to
  its first execution and whether both graphs were hits (target: >= 80 % of
  the sizes after the 10th hits, the median new size <= 20 ms);
  by default a layer's rows are padded to auto buckets once it met three row
  counts (plancache.frontdoors.buckets.AUTO), so from the third size on the
  sweep runs at multiples of 16;
- sweep, second process: the same sizes again;
- sweep, per size (a first process on a service of its own): the same sizes
  with `pf.set_auto_buckets(False)`, every size its own graphs (what the
  first process did before rows were bucketed by default: GPU run 36, 20 %
  hits after the 10th size, 84 % of the family's members never fetched);
- sweep, bucketed (a first process of its own workload): the same sizes with
  one line more, `pf.set_buckets(SWEEP_BUCKETS)` (rows padded up to the next
  multiple of 16, exact for rms_norm and linear: plancache.frontdoors.buckets):
  the route the README gives for a range too wide to build every size of. A
  size whose bucket this process already ran makes no new graph (ready at
  once, counted a hit: nothing to fetch or build); the padding's share of the
  work is reported;
- the families asked: members, built, fetched (the rest: speculative builds
  nobody used, target <= 20 %), bytes, and the time from asking to complete.

    python3 bench/families.py --out DIR --study evidence   # DIR/families_evidence.json and .png
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402

DECODE_SIZES = random.Random(31).sample(range(1, 129), 50)  # in the order met
PREFILL_SIZES = random.Random(32).sample(range(16, 1025), 50)
DECODE_FAMILY = list(range(1, 129))
PREFILL_BUCKETS = list(range(64, 1025, 64))
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, PAGE, PAGES_PER_SEQ = 1024, 16, 8, 128, 4096, 64, 32
POOL_PAGES = 128 * PAGES_PER_SEQ
PATHS = ("local", "plancache", "family")
TARGET_NEW_SHAPE_MS = 20.0


def _heuristic() -> Any:
    from plancache.keys.options import CompileOptions

    return CompileOptions(autotune=False)


HEURISTIC = _heuristic()  # the service's plans for every path: cuDNN's heuristic choice (module doc)


# ---- the workloads (in a node process) ------------------------------------------------


class Decode:
    def __init__(self) -> None:
        import torch

        g = torch.Generator(device="cuda").manual_seed(0)

        def r(*shape: int, scale: float = 1.0) -> Any:
            return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)

        self.norm = 1 + r(HIDDEN, scale=0.1)
        self.wq = r(HEADS * HEAD_DIM, HIDDEN, scale=HIDDEN**-0.5)
        self.w_up, self.w_down = r(MLP, HIDDEN, scale=HIDDEN**-0.5), r(HIDDEN, MLP, scale=MLP**-0.5)
        self.k_pool, self.v_pool = r(POOL_PAGES, KV_HEADS, PAGE, HEAD_DIM), r(POOL_PAGES, KV_HEADS, PAGE, HEAD_DIM)
        self.x = r(128, HIDDEN)
        self.tables = (
            torch.randperm(POOL_PAGES, device="cuda", generator=g)[: 128 * PAGES_PER_SEQ]
            .view(128, PAGES_PER_SEQ)
            .to(torch.int32)
        )
        self.lengths = torch.randint(1, PAGE * PAGES_PER_SEQ + 1, (128,), device="cuda", generator=g).to(torch.int32)

    def step(self, pf: Any, batch: int) -> Any:
        x = self.x[:batch]
        h = pf.rms_norm(x, (HIDDEN,), self.norm, 1e-5)
        q = pf.linear(h, self.wq).view(batch, HEADS, 1, HEAD_DIM)
        a = pf.paged_decode_attention(
            q, self.k_pool, self.v_pool, self.tables[:batch].contiguous(), self.lengths[:batch].contiguous()
        )
        y = pf.linear(pf.linear(h, self.w_up, activation="gelu"), self.w_down)
        return a, y


class Prefill:
    def __init__(self) -> None:
        import torch

        g = torch.Generator(device="cuda").manual_seed(1)
        self.qkv = (torch.randn(3, 1, HEADS, 1024, HEAD_DIM, device="cuda", generator=g)).to(torch.bfloat16)

    def step(self, pf: Any, length: int) -> Any:
        q, k, v = (t[:, :, :length].contiguous() for t in self.qkv)
        return pf.scaled_dot_product_attention(q, k, v, is_causal=True)


SWEEP_SIZES = random.Random(43).sample(range(1, 200), 40)  # in the order met
SWEEP_HIDDEN = 1024
SWEEP_BUCKETS = list(range(16, 257, 16))  # the bucketed sweep's row buckets (module doc)
EVIDENCE_PATHS = ("fixed", "sweep-first", "sweep-second", "sweep-bucketed", "sweep-per-size")
TARGET_HITS_AFTER_10TH = 0.8
TARGET_UNUSED = 0.2
# The held-out fixed-shape block (issue 43): six linear layers of four weight shapes (out, in).
FIXED_WEIGHTS = {
    "q": (768, 768),
    "k": (256, 768),
    "v": (256, 768),
    "o": (768, 768),
    "up": (2304, 768),
    "down": (768, 2304),
}
FIXED_BATCH, FIXED_SEQ, FIXED_HIDDEN = 2, 320, 768


class Sweep:
    def __init__(self) -> None:
        import torch

        g = torch.Generator(device="cuda").manual_seed(2)
        self.norm = (1 + 0.1 * torch.randn(SWEEP_HIDDEN, device="cuda", generator=g)).to(torch.bfloat16)
        self.w = (torch.randn(SWEEP_HIDDEN, SWEEP_HIDDEN, device="cuda", generator=g) / 32).to(torch.bfloat16)
        self.x = torch.randn(199, SWEEP_HIDDEN, device="cuda", generator=g).to(torch.bfloat16)

    def step(self, pf: Any, rows: int) -> Any:
        return pf.linear(pf.rms_norm(self.x[:rows], (SWEEP_HIDDEN,), self.norm, 1e-5), self.w)


def fixed_block_steps(pf: Any, steps: int = 3) -> None:
    """The held-out fixed-shape training run (module doc), through plancache.functional with autograd."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(3)
    w = {
        name: (torch.randn(*shape, device="cuda", generator=g) * shape[1] ** -0.5).to(torch.bfloat16).requires_grad_()
        for name, shape in FIXED_WEIGHTS.items()
    }
    norm = torch.ones(FIXED_HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(FIXED_BATCH, FIXED_SEQ, FIXED_HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    optimizer = torch.optim.AdamW([*w.values(), norm], lr=1e-4)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        h = pf.rms_norm(x, (FIXED_HIDDEN,), norm, 1e-5)
        q, k, v = pf.linear(h, w["q"]), pf.linear(h, w["k"]), pf.linear(h, w["v"])
        mixed = q + (k * v).repeat(1, 1, 3)  # a stand-in for GQA attention: the layers' shapes are the point
        y = x + pf.linear(mixed, w["o"])
        y = y + pf.linear(pf.linear(pf.rms_norm(y, (FIXED_HIDDEN,), norm, 1e-5), w["up"], activation="gelu"), w["down"])
        y.float().pow(2).mean().backward()
        optimizer.step()
    torch.cuda.synchronize()


def evidence_node(path: str, server: str) -> None:
    """One fresh process of the evidence study (module doc); prints one JSON line."""
    began = time.perf_counter()
    import torch

    import plancache.functional as pf
    from plancache import Client

    torch.cuda.init()
    own = path in ("sweep-bucketed", "sweep-per-size")  # the first and second sweep processes are one program
    workload = f"bench-{path}" if own else f"bench-{path.split('-', maxsplit=1)[0]}"
    pf.configure(Client(server, cache=False), options=HEURISTIC, workload=workload)
    pf.set_race_torch(False)  # the served plans are measured: none handed to torch's function
    if path == "sweep-bucketed":
        pf.set_buckets(SWEEP_BUCKETS, functions=["rms_norm", "linear"])
    if path == "sweep-per-size":  # every size its own graphs, as before rows were bucketed once they vary
        pf.set_auto_buckets(False)
    setup_s = time.perf_counter() - began
    result: dict[str, Any] = {"path": path, "setup_s": setup_s}
    if path == "fixed":
        started = time.perf_counter()
        fixed_block_steps(pf)
        result["steps_s"] = time.perf_counter() - started
    else:
        work = Sweep()
        torch.cuda.synchronize()
        seen: set[Any] = set()
        rows = []
        for size in SWEEP_SIZES:
            started = time.perf_counter()
            work.step(pf, size)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - started) * 1e3
            new = [g for g in pf.geometries() if g.key not in seen]
            seen.update(g.key for g in new)
            sources = [g.plan.source if g.plan is not None else "torch" for g in new]
            # no new graph (sources empty): the size ran on plans this process already held (its bucket's)
            hit = all(src in ("hit", "cache", "prefetched") for src in sources)
            rows.append({"size": size, "ms": ms, "sources": sources, "hit": hit, "new_graphs": len(new)})
        result["sizes"] = rows
        stats = pf.bucket_stats()  # a policy's (sweep-bucketed) or the auto buckets' (sweep-first, -second)
        result["buckets"] = {
            "calls": stats.calls,
            "padded_calls": stats.padded_calls,
            "waste": stats.waste,
            "auto_layers": stats.auto_layers,
        }
    asks = pf.families()
    result["families"] = [
        {
            "function": a.function,
            "status": a.status,
            "key": a.family_key,
            "graphs": a.graphs,
            "over_budget": a.over_budget,
            "reason": a.reason,
            "site": a.site,
            "sizes": a.sizes,
        }
        for a in asks
    ]
    print(json.dumps(result), flush=True)


WORKLOADS: dict[str, tuple[type[Decode] | type[Prefill], list[int]]] = {
    "decode": (Decode, DECODE_SIZES),
    "prefill": (Prefill, PREFILL_SIZES),
}


def node_main(path: str, workload: str, server: str) -> None:
    """One fresh process: the workload's 50 shapes; prints one JSON line."""
    began = time.perf_counter()
    import torch

    import plancache.functional as pf
    from plancache import Client

    torch.cuda.init()
    if path == "local":
        from bench.gpu_exec import InProcessClient
        from plancache_server.worker.compiler.cudnn import CudnnCompiler

        compiler = CudnnCompiler(0)
        pf.configure(InProcessClient(compiler), target=compiler.target)  # type: ignore[arg-type]
        pf.set_race_torch(False)  # the served plans are measured: none handed to torch's function
    else:
        pf.configure(Client(server, cache=False), options=HEURISTIC)
        pf.set_race_torch(False)  # the served plans are measured: none handed to torch's function
    pf.set_family_threshold(0)  # today's plancache asks for no family; the family path's are built already
    if path in ("local", "family"):  # every shape its own graph: a program without plancache's padding (local),
        pf.set_auto_buckets(False)  # and families built per size beforehand (family); plancache: the default
    if path == "family" and workload == "prefill":
        pf.set_buckets(PREFILL_BUCKETS, functions=["scaled_dot_product_attention"])
    make, sizes = WORKLOADS[workload]
    work = make()
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - began
    per_shape_ms = []
    for size in sizes:
        started = time.perf_counter()
        work.step(pf, size)  # type: ignore[arg-type]
        torch.cuda.synchronize()
        per_shape_ms.append((time.perf_counter() - started) * 1e3)
    again = time.perf_counter()
    for size in sizes[:10]:  # the same shapes again: what a known shape costs
        work.step(pf, size)  # type: ignore[arg-type]
    torch.cuda.synchronize()
    result: dict[str, Any] = {
        "path": path,
        "workload": workload,
        "setup_s": setup_s,
        "per_shape_ms": per_shape_ms,
        "total_s": sum(per_shape_ms) / 1e3,
        "known_shape_ms": (time.perf_counter() - again) * 1e3 / 10,
    }
    sources: dict[str, int] = {}
    for geometry in pf.geometries():
        source = geometry.plan.source if geometry.plan is not None else "torch"
        sources[source] = sources.get(source, 0) + 1
    result["sources"] = sources
    result["torch_calls"] = {n: s.reasons for n, s in pf.stats().items() if s.torch}
    if path == "family":
        stats = pf.bucket_stats()
        result["buckets"] = {"calls": stats.calls, "padded_calls": stats.padded_calls, "waste": stats.waste}
        result["gpu_time"] = gpu_time_against_tuned(pf, workload)
    print(json.dumps(result), flush=True)


def gpu_time_against_tuned(pf: Any, workload: str) -> list[dict[str, Any]]:
    """At a few sizes: the served (family) plan's GPU time against the exact shape's autotuned plan built here."""
    import cudnn

    from bench.gpu_exec import build_spec_plan
    from plancache.functional._table import Served
    from plancache.graphspec.validation import normalize
    from plancache.run.execution import handle_state
    from plancache_server.worker.compiler.cudnn import CudnnCompiler
    from scripts.dynamic_shapes_probe import gpu_ms

    compiler = CudnnCompiler(0)
    handle = handle_state().handle
    wanted = {"decode": ("linear", "paged_decode_attention"), "prefill": ("scaled_dot_product_attention",)}[workload]
    from plancache.functional._table import TABLE

    rows = []
    seen: dict[str, int] = {}
    for _, entry in TABLE.entries():
        if (
            not isinstance(entry, Served)
            or entry.request.function not in wanted
            or seen.get(entry.request.function, 0) >= 3
        ):
            continue
        seen[entry.request.function] = seen.get(entry.request.function, 0) + 1
        row: dict[str, Any] = {
            "function": entry.request.function,
            "dims": [list(t.dim) for t in entry.request.spec.tensors if t.dim][:1],
        }
        try:
            served = cudnn.pygraph()
            served.deserialize(handle, entry.plan.blob)
            spec = entry.request.spec
            tuned_plan = build_spec_plan(compiler, spec, autotune=True)
            tuned = cudnn.pygraph()
            tuned.deserialize(handle, tuned_plan.blob)
            bindings = compiler.random_bindings(normalize(spec))
            row["family_ms"], row["tuned_ms"] = gpu_ms(served, bindings, handle), gpu_ms(tuned, bindings, handle)
            row["family_over_tuned"] = row["family_ms"] / row["tuned_ms"]
            row["source"] = entry.plan.source
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:800]
        rows.append(row)
    return rows


def setup_families(workload: str, server: str) -> None:
    """A process that meets two sizes of each graph (specs recorded as the
    functions build them), derives each graph's family and asks the service
    to build it; prints the families' keys."""
    import torch

    import plancache.functional as pf
    from plancache import Client
    from plancache.frontdoors import service as _service
    from plancache.graphspec.family import derive

    torch.cuda.init()
    client = Client(server, cache=False)
    pf.configure(client, options=HEURISTIC)
    pf.set_race_torch(False)  # the served plans are measured: none handed to torch's function
    pf.set_family_threshold(0)
    recorded: list[Any] = []
    original = _service.SERVICE.compile

    def record(spec: Any, *args: Any, **kwargs: Any) -> Any:
        recorded.append(spec)
        return original(spec, *args, **kwargs)

    _service.SERVICE.compile = record  # type: ignore[method-assign]
    make, _ = WORKLOADS[workload]
    work = make()
    first_sizes = (8, 17) if workload == "decode" else (64, 128)
    per_size = []
    for size in first_sizes:
        before = len(recorded)
        if workload == "prefill":
            pf.set_buckets(PREFILL_BUCKETS, functions=["scaled_dot_product_attention"])
        work.step(pf, size)  # type: ignore[arg-type]
        per_size.append(recorded[before:])
    torch.cuda.synchronize()
    sizes = DECODE_FAMILY if workload == "decode" else PREFILL_BUCKETS
    keys = []
    for a, b in zip(per_size[0], per_size[1], strict=True):
        family = derive(a, b, size_range=(1, 1))
        family = derive(a, b, sizes={v.symbol: sizes for v in family.varying})
        status = client.admin.build_family(family, _service.SERVICE.target_for(0), _service.SERVICE.options)
        keys.append(status.family_key)
    print(json.dumps({"families": keys}), flush=True)


# ---- the orchestration -----------------------------------------------------------------


def run(out: Path, time_limit: float) -> dict[str, Any]:
    from bench import startup_deploy as deploy
    from plancache import Client
    from plancache.trust.signing import generate_keypair
    from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
    from tests.support.processes import child_env, server_process, trusting_env, worker_process

    deadline = time.monotonic() + time_limit
    tmp = Path(tempfile.mkdtemp(prefix="plancache-families-"))
    private_key, public_key = generate_keypair(tmp / "keys")
    result: dict[str, Any] = {
        "config": {
            "decode_sizes": DECODE_SIZES,
            "prefill_sizes": PREFILL_SIZES,
            "decode_family": [1, 128],
            "prefill_buckets": PREFILL_BUCKETS,
            "family_options": "autotune off (heuristic plans)",
        },
        "runs": [],
        "families": {},
        "skipped": [],
    }
    env = {**trusting_env(public_key), "PLANCACHE_CACHE_DIR": str(tmp / "disk-cache")}

    def child(args: list[str], label: str) -> dict[str, Any]:
        # Each process its own workload (the label): one script runs what are different programs here, and
        # under the script's default name each would stream the others' plans at its start (GPU run 36's
        # prefill family process streamed the decode processes' ~500 plans while it ran, and its record,
        # not listing the family's buckets, had it build each itself).
        started = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), *args],
                env={**env, "PLANCACHE_WORKLOAD": f"families-{label.replace('/', '-')}"},
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=max(30.0, deadline - time.monotonic()),
                check=False,
            )
            row = (
                json.loads(proc.stdout.strip().splitlines()[-1])
                if proc.returncode == 0
                else {"error": proc.stderr[-3000:]}
            )
        except Exception as e:
            row = {"error": f"{type(e).__name__}: {e}"}
        row["wall_s"] = time.monotonic() - started
        print(label, json.dumps({k: v for k, v in row.items() if k not in ("per_shape_ms",)})[:600], flush=True)
        return row

    redis = EmbeddedRedis(
        tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    try:
        address = f"127.0.0.1:{free_port()}"
        with server_process(
            address,
            redis.url,
            out / "families-server.log",
            "--gpus",
            "none",
            "--signing-key",
            str(private_key),
            "--data-dir",
            str(tmp / "server-data"),
            env=child_env(),
        ):
            log = out / "families-worker.log"
            with worker_process(
                redis.url, log, "--device", "0", "--signing-key", str(private_key), "--no-warm", env=child_env()
            ) as worker:
                deploy.wait_for_pool(log, worker, address)
                for workload in WORKLOADS:
                    for path in ("local", "plancache"):
                        if time.monotonic() > deadline:
                            result["skipped"].append(f"{workload}/{path}")
                            continue
                        row = child(["--node", path, "--workload", workload, "--server", address], f"{workload}/{path}")
                        row.update(path=path, workload=workload)
                        result["runs"].append(row)
                    if time.monotonic() > deadline:
                        result["skipped"].append(f"{workload}/family")
                        continue
                    began = time.monotonic()
                    made = child(["--setup-families", workload, "--server", address], f"{workload}/families")
                    keys = made.get("families", [])
                    with Client(address, cache=False) as client:
                        statuses: list[Any] = []
                        while keys and time.monotonic() < deadline:
                            statuses = [client.admin.family_status(k) for k in keys]
                            if all(s.complete for s in statuses):
                                break
                            time.sleep(0.5)
                    result["families"][workload] = {
                        "keys": keys,
                        "build_s": time.monotonic() - began,
                        "setup_error": made.get("error"),
                        "graphs": sum(s.total for s in statuses),
                        "stored": sum(s.stored for s in statuses),
                    }
                    print(workload, "families", json.dumps(result["families"][workload])[:400], flush=True)
                    row = child(["--node", "family", "--workload", workload, "--server", address], f"{workload}/family")
                    row.update(path="family", workload=workload)
                    result["runs"].append(row)
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        redis.stop()
    result["summary"] = summarize(result)
    return result


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for workload in WORKLOADS:
        rows = {r["path"]: r for r in result["runs"] if r.get("workload") == workload and "per_shape_ms" in r}
        entry: dict[str, Any] = {
            p: {
                "total_s": r["total_s"],
                "median_new_shape_ms": statistics.median(r["per_shape_ms"]),
                "max_new_shape_ms": max(r["per_shape_ms"]),
                "first_shape_ms": r["per_shape_ms"][0],
                "known_shape_ms": r.get("known_shape_ms"),
            }
            for p, r in rows.items()
        }
        if "local" in entry and "family" in entry:
            entry["local_over_family_total"] = entry["local"]["total_s"] / entry["family"]["total_s"]
        if "plancache" in entry and "family" in entry:
            entry["plancache_over_family_total"] = entry["plancache"]["total_s"] / entry["family"]["total_s"]
        family = rows.get("family")
        if family:
            graphs = 5 if workload == "decode" else 1
            entry["family_median_ms_per_graph"] = statistics.median(family["per_shape_ms"]) / graphs
            later = family["per_shape_ms"][1:]
            entry["family_new_shapes_within_target"] = sum(ms / graphs <= TARGET_NEW_SHAPE_MS for ms in later)
            entry["family_new_shapes"] = len(later)
            ratios = [g["family_over_tuned"] for g in family.get("gpu_time", []) if "family_over_tuned" in g]
            entry["family_over_tuned"] = ratios
            entry["buckets"] = family.get("buckets")
        summary[workload] = entry
    return summary


def report(result: dict[str, Any], out: Path) -> None:
    write_json(out / "families.json", result)
    rows = []
    for workload, entry in result["summary"].items():
        for path in PATHS:
            e = entry.get(path)
            if e:
                rows.append(
                    [
                        workload,
                        path,
                        f"{e['total_s']:.2f}",
                        f"{e['first_shape_ms']:.0f}",
                        f"{e['median_new_shape_ms']:.1f}",
                        f"{e['max_new_shape_ms']:.0f}",
                        f"{e['known_shape_ms']:.2f}" if e.get("known_shape_ms") else "—",
                    ]
                )
    print(
        table(
            ["workload", "path", "50 shapes s", "first ms", "median new shape ms", "worst ms", "known shape ms"], rows
        )
    )
    print(
        json.dumps({w: {k: v for k, v in e.items() if k not in PATHS} for w, e in result["summary"].items()}, indent=1)
    )
    fig, axes = figure(2)
    for ax, workload in zip(axes, WORKLOADS, strict=True):
        for r in result["runs"]:
            if r.get("workload") == workload and "per_shape_ms" in r:
                ax.plot(range(1, len(r["per_shape_ms"]) + 1), r["per_shape_ms"], marker=".", label=r["path"])
        ax.set_yscale("log"), ax.set_xlabel("new shape (in order met)"), ax.set_ylabel("ms to its first execution")
        ax.set_title(f"{workload}: 50 new shapes in a fresh process", fontsize=9), ax.legend(fontsize=7)
    save(fig, out / "families.png")


# Each group of paths meets a fresh service (Redis, server, worker): the bucketed program's bucket sizes are
# members of the per-size sweep's family, so sharing a store would hand it plans built for another workload.
EVIDENCE_GROUPS = (("fixed", "sweep-first", "sweep-second"), ("sweep-bucketed",), ("sweep-per-size",))


def run_evidence(
    out: Path, time_limit: float, beside: int | None = None, worker_norm_cache: bool = False
) -> dict[str, Any]:
    """Issue 43's study (module doc): fixed, sweep-first, sweep-second, sweep-bucketed, and the families they
    asked for. `beside`: the worker's --warm-beside-callers (None: its default); `worker_norm_cache`: the worker
    builds norm graphs from its kernel caches (PLANCACHE_WORKER_NORM_KERNEL_CACHE=1)."""
    from plancache.trust.signing import generate_keypair

    deadline = time.monotonic() + time_limit
    tmp = Path(tempfile.mkdtemp(prefix="plancache-families-evidence-"))
    private_key, public_key = generate_keypair(tmp / "keys")
    result: dict[str, Any] = {
        "config": {
            "sweep_sizes": SWEEP_SIZES,
            "sweep_buckets": SWEEP_BUCKETS,
            "fixed_weights": FIXED_WEIGHTS,
            "options": "autotune off",
            "warm_beside_callers": "default" if beside is None else beside,
            "worker_norm_kernel_cache": worker_norm_cache,
        },
        "runs": [],
        "families": [],
        "skipped": [],
    }
    for number, paths in enumerate(EVIDENCE_GROUPS):
        if time.monotonic() > deadline:
            result["skipped"].extend(paths)
            continue
        try:
            _evidence_group(
                result,
                paths,
                out,
                tmp / f"group{number}",
                (private_key, public_key),
                deadline,
                beside,
                worker_norm_cache,
            )
        except Exception as e:
            result.setdefault("errors", []).append(f"{'/'.join(paths)}: {type(e).__name__}: {e}")
    result["summary"] = summarize_evidence(result)
    return result


def _evidence_group(
    result: dict[str, Any],
    paths: Sequence[str],
    out: Path,
    tmp: Path,
    keys: tuple[Path, Path],
    deadline: float,
    beside: int | None,
    worker_norm_cache: bool,
) -> None:
    """`paths` in fresh processes against one fresh service; their runs and families appended to `result`."""
    from bench import startup_deploy as deploy
    from plancache import Client
    from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
    from tests.support.processes import child_env, server_process, trusting_env, worker_process

    private_key, public_key = keys
    tmp.mkdir(parents=True)
    name = paths[-1]
    env = {**trusting_env(public_key), "PLANCACHE_CACHE_DIR": str(tmp / "disk-cache")}
    redis = EmbeddedRedis(
        tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    try:
        address = f"127.0.0.1:{free_port()}"
        server_args = ("--gpus", "none", "--signing-key", str(private_key), "--data-dir", str(tmp / "server-data"))
        with server_process(
            address, redis.url, out / f"families-evidence-server-{name}.log", *server_args, env=child_env()
        ):
            log = out / f"families-evidence-worker-{name}.log"
            beside_args = () if beside is None else ("--warm-beside-callers", str(beside))
            with worker_process(
                redis.url,
                log,
                *("--device", "0", "--signing-key", str(private_key), "--no-warm", *beside_args),
                env=child_env(**({"PLANCACHE_WORKER_NORM_KERNEL_CACHE": "1"} if worker_norm_cache else {})),
            ) as worker:
                deploy.wait_for_pool(log, worker, address)
                runs = []
                for path in paths:
                    if time.monotonic() > deadline:
                        result["skipped"].append(path)
                        continue
                    started = time.monotonic()
                    proc = subprocess.run(
                        [sys.executable, str(Path(__file__).resolve()), "--evidence-node", path, "--server", address],
                        env=env,
                        cwd=REPO,
                        capture_output=True,
                        text=True,
                        timeout=max(30.0, deadline - time.monotonic()),
                        check=False,
                    )
                    row = (
                        json.loads(proc.stdout.strip().splitlines()[-1])
                        if proc.returncode == 0
                        else {"path": path, "error": proc.stderr[-3000:]}
                    )
                    row["wall_s"] = time.monotonic() - started
                    runs.append(row)
                    result["runs"].append(row)
                    print(path, json.dumps({k: v for k, v in row.items() if k != "sizes"})[:800], flush=True)
                asked_by = {f["key"]: r["path"] for r in runs for f in r.get("families", []) if f.get("key")}
                with Client(address, cache=False) as client:
                    while asked_by and time.monotonic() < deadline:  # what the service built ahead, and what was used
                        statuses = [client.admin.family_status(k) for k in asked_by]
                        if all(st.queued == 0 or st.complete for st in statuses):
                            break
                        time.sleep(0.5)
                    for key in sorted(asked_by):
                        st = client.admin.family_status(key)
                        result["families"].append(
                            {
                                "key": key,
                                "asked_by": asked_by[key],
                                "workload": st.workload,
                                "asked": st.total,
                                "stored": st.stored,
                                "fetched": st.fetched,
                                "bytes": st.bytes,
                                "queued": st.queued,
                                "complete_s": time.time() - st.created_at if st.complete else None,
                            }
                        )
    finally:
        redis.stop()


def summarize_evidence(result: dict[str, Any]) -> dict[str, Any]:
    runs = {r.get("path"): r for r in result["runs"]}
    summary: dict[str, Any] = {}
    fixed = runs.get("fixed")
    if fixed and "families" in fixed:
        summary["fixed_families_asked"] = len(fixed["families"])
    for path in ("sweep-first", "sweep-second", "sweep-bucketed", "sweep-per-size"):
        rows = runs.get(path, {}).get("sizes")
        if not rows:
            continue
        later = rows[10:]
        summary[path] = {
            "hits_after_10th": sum(r["hit"] for r in later) / len(later),
            "median_new_size_ms": statistics.median(r["ms"] for r in rows),
            "median_new_size_ms_after_10th": statistics.median(r["ms"] for r in later),
            "total_s": sum(r["ms"] for r in rows) / 1e3,
            "families_asked": len(runs[path].get("families", [])),
        }
        if "buckets" in runs[path]:
            summary[path]["padding_share"] = runs[path]["buckets"]["waste"]
    # the default (the fixed run and the two sweep processes: rows auto-bucketed once they vary), a set_buckets
    # policy, and every size its own graphs: three programs, three budgets
    for name, chosen in (
        (
            "speculative",
            [f for f in result["families"] if f.get("asked_by") in ("fixed", "sweep-first", "sweep-second")],
        ),
        ("speculative_bucketed", [f for f in result["families"] if f.get("asked_by") == "sweep-bucketed"]),
        ("speculative_per_size", [f for f in result["families"] if f.get("asked_by") == "sweep-per-size"]),
    ):
        stored = sum(f["stored"] for f in chosen)
        fetched = sum(f["fetched"] for f in chosen)
        summary[name] = {
            "asked": sum(f["asked"] for f in chosen),
            "built": stored,
            "fetched": fetched,
            "never_fetched_share": (stored - fetched) / stored if stored else None,
            "bytes": sum(f["bytes"] for f in chosen),
        }
    summary["targets"] = {
        "fixed_families_asked": 0,
        "hits_after_10th": TARGET_HITS_AFTER_10TH,
        "median_new_size_ms": TARGET_NEW_SHAPE_MS,
        "never_fetched_share": TARGET_UNUSED,
    }
    return summary


def report_evidence(result: dict[str, Any], out: Path) -> None:
    write_json(out / "families_evidence.json", result)
    print(json.dumps(result["summary"], indent=1))
    fig, axes = figure(1)
    ax = axes[0]
    for r in result["runs"]:
        if r.get("sizes"):
            ms = [row["ms"] for row in r["sizes"]]
            ax.plot(range(1, len(ms) + 1), ms, marker=".", label=r["path"])
            hits = [i + 1 for i, row in enumerate(r["sizes"]) if row["hit"]]
            ax.scatter(hits, [ms[i - 1] for i in hits], s=18, facecolors="none", edgecolors="black")
    ax.axhline(TARGET_NEW_SHAPE_MS, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log"), ax.set_xlabel("new row count (in order met; circled: both graphs hits)")
    ax.set_ylabel("ms to its first execution"), ax.legend(fontsize=7)
    ax.set_title("40 row counts through rms_norm + linear: first, second and bucketed process", fontsize=9)
    save(fig, out / "families_evidence.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--time-limit", type=float, default=420.0)
    parser.add_argument("--node", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=tuple(WORKLOADS), default="decode", help=argparse.SUPPRESS)
    parser.add_argument("--setup-families", choices=tuple(WORKLOADS), help=argparse.SUPPRESS)
    parser.add_argument("--server", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--study", choices=("shapes", "evidence"), default="shapes", help="evidence: issue 43's study (module doc)"
    )
    parser.add_argument("--warm-beside-callers", type=int, help="evidence: the worker's setting (default: its own)")
    parser.add_argument(
        "--worker-norm-cache", action="store_true", help="evidence: PLANCACHE_WORKER_NORM_KERNEL_CACHE=1 for the worker"
    )
    parser.add_argument("--evidence-node", choices=EVIDENCE_PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.evidence_node:
        evidence_node(args.evidence_node, args.server)
        return
    if args.study == "evidence":
        args.out.mkdir(parents=True, exist_ok=True)
        report_evidence(
            run_evidence(args.out, args.time_limit, args.warm_beside_callers, args.worker_norm_cache), args.out
        )
        return
    if args.node:
        node_main(args.node, args.workload, args.server)
        return
    if args.setup_families:
        setup_families(args.setup_families, args.server)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    report(run(args.out, args.time_limit), args.out)


if __name__ == "__main__":
    main()

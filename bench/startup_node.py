"""One node's start-up in a fresh process (run by bench/startup.py).

After its imports, the CUDA context, the cuDNN handle (with cuBLASLt loaded)
and its input tensors (a node needs all of those with or without plancache;
a local build's compiler is made then too; the step paths build their
model and its cache or optimizer then), the clock starts; it stops when
every graph of bench/startup_graphs.py has produced its first output (one
synchronize at the end). Paths:

  local-heuristic   build each graph with the frontend, its first plan (what a node does alone)
  local-autotuned   build every candidate, time each 3 times in a plain loop, run the fastest
  local-program     the frontend program a node runs alone, as local-heuristic builds: per graph its
                    pygraph (plancache.frontend_graph.build_pygraph), validate, build_operation_graph,
                    create_execution_plans([A, FALLBACK]), check_support, build_plans(), execute with a
                    workspace of get_workspace_size(); the real `cudnn` module
  first-dropin      the same program with `plancache.cudnn` in place of `cudnn` (its build step asks the
                    service PLANCACHE_SERVER names, hedged as PLANCACHE_HEDGE says); nothing stored
  fetch             one GetPlan per plan, deserialize, execute
  prefetch          one streamed Prefetch for all plans, then deserialize and execute
  background        prefetch_in_background(load=True) while a simulated weight load runs
                    (--foreground-s of sleep); then execute each plan
  floor             the frontend's own deserialize of the same blobs from a local file, execute
  floor-program     local-program's own calls up to its build step (pygraph, validate,
                    build_operation_graph), then its plan deserialized from the same file instead of
                    built, and executed: the least a cache under an unchanged frontend program can cost
                    (the drop-in's stored start, without fetching, keying or plancache at all)
  first-compile     nothing stored: one client.compile(spec) per graph, in order, each plan
                    (provisional or not) executed as soon as it returns
  first-lazy        the same with a --lazy-s "layer" (a sleep) after each graph's execute,
                    the last one's included, before the next compile
  hit-compile       first-compile's code with every plan stored: one compile() per graph, each a hit
  first-prefetch    nothing stored: one Prefetch with compile_missing; each plan is executed
                    as it arrives
  first-functional  one decode step of examples/decoder_step.py through plancache.functional, its
                    client the service's (`Client(server, cache=False)`); nothing stored
  local-functional  the same step, plancache.functional's client a stand-in that builds every
                    geometry here (plancache.run.local.build_local: the node's own build of a hedged
                    miss, the program's heuristic plan): the node building the same graphs itself
  torch-step        the same step in torch eager (examples/decoder_step.torch_ops), for reference
  first-functional-train, local-functional-train, torch-train-step
                    the same three for one training step of examples/train_transformer_block.py's
                    block (bf16) as examples/training_check.py's train() takes it: float32 master
                    weights, working copies in bf16, the loss's backward, one AdamW step

The step paths' clock stops when the step is done (a synchronize: the
training step's optimizer step included); they bind none of the 13 graphs'
tensors.

plancache's clients (Client, plancache.cudnn's, plancache.functional's)
hedge a miss as the environment says (PLANCACHE_HEDGE, set by the parent: 0
or 1); a client the path makes is closed after the clock stops (a node
keeps its client).

With --share I/N the process runs only graphs I, I+N, I+2N ... (one of N
processes of a node; the parent runs them side by side). With --barrier DIR
(the parent's start for processes it runs together, and for first-* paths
whose worker starts meanwhile) the process writes DIR/ready-I after its
set-up, waits for DIR/go, which holds the wall-clock time the parent let
them all go, and that time is its clock's start; every time it reports is
from it, and `end_wall` is the wall-clock time its last output was done.

Per graph (graph order, None for graphs of other shares): `runnable_s`, when
the node held a plan it could run (a local build returned; compile or the
prefetch handed it over; the program's build_plans() returned), and
`output_s`, when its first output was produced (a CUDA event after its
execute, read after the final synchronize); `source`, where the plan that
ran came from ("local": the node's own build won a hedged miss, or the
drop-in built the graph itself, `reason` saying why; else the plan's source:
"hit", "compiled", "provisional", ...; the drop-in's served plans' keys,
`plan_key`). The step paths through plancache.functional report per
geometry instead (`geometries`: its function, `source` as above, the plan's
key). When the tuned plans were stored is measured by the parent
(bench/startup.py).

Costs of the process: `cpu_s`, its CPU seconds (user + system, every thread:
getrusage) from the clock's start to its stop, and per thread (`thread_cpu_s`: each thread's CPU seconds over the
same span, by its Python name or, for threads of the C libraries, its kernel name: which of a hedged node's threads
took the interpreter from its build, GPU run 42); `gc`, the cyclic garbage collector's pauses over the same span
(per generation how many and their milliseconds, when each full one began on the clock, and the objects it tracked
when the clock started: a full collection walks every one of them, ~40-80 ms with torch imported, and a fresh
process's first graphs are where the first ones fall: one more of them on one side of a pair is a gap of that
size; PLANCACHE_BENCH_GC_FREEZE=1, set by bench/startup.py under BENCH_NODE_GC_FREEZE=1, freezes what set-up
made out of collections before the clock, both sides of a pair alike: whether the collector is the gap); after the
stop, `gpu_mib`,
the GPU memory nvidia-smi lists for it (None where it lists no process ids),
and torch's own share (`torch_reserved_mib`); `races`, plancache.race_stats()
(how its hedged misses ended, per path: compile, cudnn, functional).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import itertools
import json
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

IMPORT_STARTED = time.perf_counter()

import cudnn  # noqa: E402
import torch  # noqa: E402

import plancache  # noqa: E402
from bench import miss_phases  # noqa: E402
from bench.cpu_speed_map import pace_ms  # noqa: E402
from bench.startup_graphs import read_blobs, startup_graphs  # noqa: E402
from plancache import Client, CompileOptions, Manifest, ManifestEntry, Plan  # noqa: E402
from plancache.frontend_graph import build_pygraph  # noqa: E402
from plancache.gpu.stack import torch_dtype  # noqa: E402
from plancache.gpu.target import detect_target  # noqa: E402
from plancache.graphspec.graph import GraphSpec  # noqa: E402
from plancache.graphspec.validation import normalize  # noqa: E402
from plancache.keys.query import PlanQuery  # noqa: E402
from plancache.keys.target import Target  # noqa: E402
from plancache.run.gpu import cudnn_handle  # noqa: E402

COMPILER_PATHS = (
    "local-heuristic",
    "local-autotuned",
)  # built with the worker's compiler (CudnnCompiler), made before the clock
PROGRAM_PATHS = (
    "local-program",
    "first-dropin",
    "stored-dropin",
)  # the frontend program: cudnn, or plancache.cudnn in its place
TRAIN_PATHS = (
    "first-functional-train",
    "local-functional-train",
    "torch-train-step",
)  # one training step of examples/train_transformer_block.py
STEP_PATHS = (
    "first-functional",
    "local-functional",
    "torch-step",
    "stored-functional",
    *TRAIN_PATHS,
)  # one step of an example model: examples/decoder_step.py's decode step, or TRAIN_PATHS'
TORCH_PATHS = ("torch-step", "torch-train-step")  # a step in torch eager: plancache.functional never configured
PATHS = (
    *COMPILER_PATHS,
    *PROGRAM_PATHS,
    "fetch",
    "prefetch",
    "background",
    "floor",
    "floor-program",
    "first-compile",
    "first-lazy",
    "hit-compile",
    "first-prefetch",
    *STEP_PATHS,
)
BARRIER_POLL_S = 0.001
# Every thread that ends in this process: (name, perf_counter at its start and end, its CPU seconds); threads made
# with a target, as plancache's are (a subclass with its own run() is not seen). /proc lists only live threads, so a
# thread that ran beside the clocked part and ended before its end (plancache's workload stream) was missing from
# `thread_cpu_s`. GPU run 43's profile: the drop-in's frontend code ran ~1.9x slower per call than the local
# program's; another thread holding the interpreter was one explanation, the garbage collector (`gc`) the other.
ENDED_THREADS: list[tuple[str, float, float, float]] = []


def _record_ended_threads() -> None:
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            original(self)
        finally:
            ENDED_THREADS.append((self.name, began, time.perf_counter(), time.thread_time() - cpu))

    threading.Thread.run = run  # type: ignore[method-assign]


_record_ended_threads()  # before plancache makes any thread


class Clock:
    """Seconds since the clock's start: this process's start, or the parent's `go` time."""

    def __init__(self, go_wall: float | None = None) -> None:
        now_wall, self._origin, self._cpu = time.time(), time.perf_counter(), cpu_seconds()
        self._threads = thread_cpu_seconds()
        self.go_wall = now_wall if go_wall is None else go_wall
        self._offset = now_wall - self.go_wall  # how late this process saw the go (0 without a barrier)
        self._start_event = torch.cuda.Event(enable_timing=True)
        self._start_event.record()
        self._events: dict[int, torch.cuda.Event] = {}

    def now(self) -> float:
        return self._offset + time.perf_counter() - self._origin

    def ended_threads(self) -> list[list[object]]:
        """Threads that ended since the clock started: [name, start s, end s on the clock, CPU s], by start."""
        return [
            [
                name,
                round(self._offset + began - self._origin, 4),
                round(self._offset + ended - self._origin, 4),
                round(cpu, 4),
            ]
            for name, began, ended, cpu in sorted(ENDED_THREADS, key=lambda t: t[1])
            if ended >= self._origin
        ]

    def cpu_s(self) -> float:
        """This process's CPU seconds since the clock started (every thread, user and system)."""
        return cpu_seconds() - self._cpu

    def thread_cpu_s(self) -> dict[str, float]:
        """Each thread's CPU seconds since the clock started (threads of one name summed), most first."""
        spent: dict[str, float] = {}
        for tid, (name, seconds) in thread_cpu_seconds().items():
            before = self._threads.get(tid)
            used = seconds - (before[1] if before is not None else 0.0)
            if used > 0:
                spent[name] = spent.get(name, 0.0) + used
        return dict(sorted(((k, round(v, 4)) for k, v in spent.items()), key=lambda kv: -kv[1]))

    def output_done(self, index: int) -> None:
        """Marks graph `index`'s output on the stream (read by outputs() after the final synchronize)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events[index] = event

    def outputs(self) -> dict[int, float]:
        return {i: self._offset + self._start_event.elapsed_time(e) / 1e3 for i, e in self._events.items()}


class GcWatch:
    """The cyclic garbage collector's pauses while the clock runs (gc.callbacks: in whichever thread collects)."""

    def __init__(self, now: Callable[[], float], tracked: int) -> None:
        self._now = now
        self._began: float | None = None
        self.tracked_at_start = tracked
        self.count, self.ms = [0, 0, 0], [0.0, 0.0, 0.0]
        self.full_at_s: list[float] = []
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            self._began = time.perf_counter()
            if generation == 2:
                self.full_at_s.append(round(self._now(), 4))
        elif self._began is not None:
            self.count[generation] += 1
            self.ms[generation] += (time.perf_counter() - self._began) * 1000
            self._began = None

    def stop(self) -> dict[str, object]:
        gc.callbacks.remove(self._on)
        return {
            "collections": self.count,
            "pause_ms": [round(ms, 2) for ms in self.ms],
            "full_at_s": self.full_at_s,
            "tracked_at_start": self.tracked_at_start,
        }


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def thread_cpu_seconds() -> dict[int, tuple[str, float]]:
    """{thread id: (name, CPU seconds)} of this process's threads (Linux /proc; empty elsewhere)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for entry in tids:
        try:
            stat = Path(f"/proc/self/task/{entry}/stat").read_text()
        except OSError:  # the thread ended
            continue
        comm, _, rest = stat.partition(" (")[2].rpartition(") ")
        fields = rest.split()
        tid = int(entry)
        out[tid] = (names.get(tid) or f"[{comm}]", (int(fields[11]) + int(fields[12])) / tick)
    return out


def wait_for_go(barrier: Path, index: int) -> float:
    (barrier / f".ready-{index}").write_text(str(os.getpid()))
    os.replace(barrier / f".ready-{index}", barrier / f"ready-{index}")
    go = barrier / "go"
    while not go.exists():
        time.sleep(BARRIER_POLL_S)
    return float(go.read_text())


def bind(spec: GraphSpec) -> dict[int, torch.Tensor]:
    tensors = {}
    for t in spec.tensors:
        if t.is_virtual:
            continue
        assert t.uid is not None and t.data_type is not None
        x = torch.empty_strided(t.dim, t.stride, dtype=torch_dtype(t.data_type), device="cuda")
        x.fill_(float("nan")) if t.is_output else x.normal_()
        tensors[t.uid] = x
    return tensors


def workspace(size: int) -> torch.Tensor:
    return torch.empty(max(1, size), device="cuda", dtype=torch.uint8)


def local(
    compiler: object,
    specs: dict[int, GraphSpec],
    tensors: dict[int, dict[int, torch.Tensor]],
    clock: Clock,
    autotune: bool,
    per_graph: dict[str, dict[int, object]],
) -> dict[str, object]:
    handle = compiler.handle  # type: ignore[attr-defined]
    candidates = 0
    for index, spec in specs.items():
        bound = tensors[index]
        g = compiler.graph(spec)  # type: ignore[attr-defined]
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        if not autotune:
            g.build_plans()  # the first plan that builds
            per_graph["runnable_s"][index] = clock.now()
            g.execute(bound, workspace(g.get_workspace_size()), handle=handle)
            clock.output_done(index)
            continue
        g.build_plans(cudnn.build_plan_policy.ALL)
        count = g.get_execution_plan_count()
        candidates += count
        ws = workspace(max(_size_at(g, i) for i in range(count)))
        best, best_ms = 0, float("inf")
        for i in range(count):  # the plain loop: each candidate 3 times
            try:
                g.execute_plan_at_index(bound, ws, i, handle=handle)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(3):
                    g.execute_plan_at_index(bound, ws, i, handle=handle)
                end.record()
                end.synchronize()
            except Exception:
                continue
            if start.elapsed_time(end) < best_ms:
                best, best_ms = i, start.elapsed_time(end)
        per_graph["runnable_s"][index] = clock.now()
        g.execute_plan_at_index(bound, ws, best, handle=handle)
        clock.output_done(index)
    return {"candidates": candidates}


PROGRAM_STEPS = ("construct", "validate", "operation_graph", "plan_calls", "build_plans", "first_execute")


def program(
    frontend: Any,
    specs: dict[int, GraphSpec],
    tensors: dict[int, dict[int, torch.Tensor]],
    handle: object,
    clock: Clock,
    per_graph: dict[str, dict[int, object]],
) -> dict[str, list[float]]:
    """The frontend program local() runs for local-heuristic, written against `frontend`:
    the real cudnn module (local-program), or plancache.cudnn in its place (first-dropin); each step's ms."""
    # Each step's ms per graph (`steps`): the same program on both sides of a pair, so which of its steps a
    # drop-in node spends longer in is read directly (GPU run 44: its graphs' time outside the build step).
    steps: dict[str, list[float]] = {name: [] for name in PROGRAM_STEPS}
    for index, spec in specs.items():
        marks = [time.perf_counter()]
        g = build_pygraph(spec, frontend, handle=handle)
        marks.append(time.perf_counter())
        g.validate()
        marks.append(time.perf_counter())
        g.build_operation_graph()
        marks.append(time.perf_counter())
        g.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
        g.check_support()
        marks.append(time.perf_counter())
        g.build_plans()
        marks.append(time.perf_counter())
        per_graph["runnable_s"][index] = clock.now()
        g.execute(tensors[index], workspace(g.get_workspace_size()), handle=handle)
        marks.append(time.perf_counter())
        clock.output_done(index)
        for name, (began, ended) in zip(PROGRAM_STEPS, itertools.pairwise(marks), strict=True):
            steps[name].append(round((ended - began) * 1000, 3))
    return steps


def floor_program(
    specs: dict[int, GraphSpec],
    tensors: dict[int, dict[int, torch.Tensor]],
    handle: object,
    clock: Clock,
    per_graph: dict[str, dict[int, object]],
    blobs: list[bytes],
) -> None:
    """program()'s calls up to its build step with the real cudnn, then each graph's plan
    deserialized from `blobs` (as the drop-in loads a served plan: a fresh pygraph on the
    program's handle) instead of created and built."""
    for index, spec in specs.items():
        g = build_pygraph(spec, cudnn, handle=handle)
        g.validate()
        g.build_operation_graph()
        served = cudnn.pygraph(handle=handle)
        served.deserialize(handle, blobs[index])
        per_graph["runnable_s"][index] = clock.now()
        served.execute(tensors[index], workspace(served.get_workspace_size()), handle=handle)
        clock.output_done(index)


def dropin_sources(specs: dict[int, GraphSpec], per_graph: dict[str, dict[int, object]]) -> None:
    """How plancache.cudnn built each graph (plancache.cudnn.graphs(), after the clock, one
    record per graph): "local" when the program's own build ran (`reason` says why; a hedged
    miss it won is one, `taken_over` when the service's plan ran later), else the plan's source."""
    import plancache.cudnn

    records = {record.name: record for record in plancache.cudnn.graphs()}
    for index, spec in specs.items():
        built = records.get(spec.name or "")
        own = built is not None and (built.hedged or built.plan is None)
        per_graph["source"][index] = None if built is None else "local" if own else built.source
        per_graph["reason"][index] = built.reason[:300] if built is not None and built.reason else None
        per_graph["taken_over"][index] = built is not None and built.hedged and built.plan is not None
        per_graph["plan_key"][index] = built.plan.key if built is not None and built.plan is not None else None


class LocalBuilds:
    """STAND-IN for plancache.Client behind plancache.functional (local-functional):
    every geometry is built here by this node, with the hedged miss's own build
    (plancache.run.local.build_local: the program's heuristic plan on this
    thread's handle); no service. plancache.functional's service calls the
    client's `_compile(spec, target, options, ...)`; `compile` is the same."""

    hedge = False  # plancache.cudnn's race: never (not used by plancache.functional)

    def __init__(self) -> None:
        from plancache.run.local import build_local

        self._build = build_local  # imported here: a missing one fails the set-up, not the clock

    def compile(
        self,
        spec: GraphSpec | PlanQuery,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *_: object,
        **__: object,
    ) -> Plan:
        if isinstance(spec, PlanQuery):  # what plancache's front doors ask with
            query = spec
        else:
            resolved = target if isinstance(target, Target) else Target.parse(target) if target else detect_target()
            query = PlanQuery.of(spec, resolved, options)
        plan: Plan = self._build(query)
        return plan

    _compile = compile

    def race(
        self,
        spec: GraphSpec | PlanQuery,
        target: Target | str | None,
        options: CompileOptions | None,
        build: object,
        **_: object,
    ) -> object:
        """A race plancache's front doors may ask for: none here (the node's own plan, always)."""
        from plancache.transport.hedge import Raced

        return Raced(plan=self.compile(spec, target, options))

    def close(self) -> None:
        pass


def decode_setup(path: str, server: str) -> Callable[[], object]:
    """examples/decoder_step.py's step (its Config: 4 layers, batch 8, bf16), set up as
    its main() does: plancache.functional configured first (its workload's plans stream
    meanwhile), then the model, its cache and input made."""
    from examples.decoder_step import Config, build, decode_step, functional_ops, torch_ops

    if path == "torch-step":
        ops = torch_ops()
    else:
        import plancache.functional as pf

        served = path in ("first-functional", "stored-functional")
        pf.configure(Client(server, cache=False) if served else LocalBuilds())  # type: ignore[arg-type]
        ops = functional_ops()
    model, cache, x = build(Config(), torch.bfloat16, torch.device("cuda"))

    def step() -> object:
        with torch.inference_mode():
            return decode_step(model, cache, x, ops)

    return step


def train_setup(path: str, server: str) -> Callable[[], object]:
    """examples/train_transformer_block.py's block (bf16) and one training step as examples/training_check.py's
    train() takes it: float32 master weights, working copies in bf16, the loss's backward, the masters' gradients,
    one AdamW step. Set up as training_check.main() does: plancache.functional configured first (as decode_setup),
    then the block, its batch and the optimizer."""
    from examples.train_transformer_block import build, torch_ops
    from examples.train_transformer_block import step as block_step

    if path == "torch-train-step":
        ops = torch_ops()
    else:
        import plancache.functional as pf

        served = path == "first-functional-train"
        pf.configure(Client(server, cache=False) if served else LocalBuilds())  # type: ignore[arg-type]
        ops = pf  # the module itself, as training_check.main() passes it
    params, buffers, batch = build(torch.bfloat16, torch.device("cuda"), torch.Generator(device="cuda").manual_seed(0))
    masters = {name: p.detach().float().clone().requires_grad_(True) for name, p in params.items()}
    optimizer = torch.optim.AdamW(masters.values(), lr=1e-3)

    def step() -> object:
        optimizer.zero_grad(set_to_none=True)
        working = {name: m.detach().to(params[name].dtype).requires_grad_(True) for name, m in masters.items()}
        loss = block_step(working, buffers, batch, ops)
        loss.backward()
        for name, m in masters.items():
            m.grad = working[name].grad.float()
        optimizer.step()
        return loss

    return step


def step_record() -> dict[str, object]:
    """After a step through plancache.functional: each geometry it met (its function, where the
    plan that ran its first call came from, its key), the plans' keys, and its call counts."""
    import plancache.functional as pf

    try:
        from plancache.run.local import LocalPlan
    except ImportError:  # a client without the hedge: no plan is the node's own
        LocalPlan = None  # type: ignore[assignment,misc]  # noqa: N806
    geometries = []
    for g in pf.geometries():
        plan = g.plan
        own = LocalPlan is not None and isinstance(
            plan, LocalPlan
        )  # a LocalPlan stays one when the service's plan takes over
        geometries.append(
            {
                "function": g.function,
                "source": "local" if own else plan.source if plan is not None else "torch",
                "now": plan.source if plan is not None else None,
                "key": plan.key if plan is not None else None,
                "reason": g.reason,
            }
        )
    return {
        "geometries": geometries,
        "plan_keys": sorted({g["key"] for g in geometries if g["key"]}),
        "functional_stats": {name: dataclasses.asdict(c) for name, c in pf.stats().items()},
    }


def races() -> dict[str, dict[str, int]] | None:
    """plancache.race_stats() of this process (None for a client without the hedge)."""
    import plancache

    stats = getattr(plancache, "race_stats", None)
    if stats is None:
        return None
    return {path: dataclasses.asdict(counts) for path, counts in stats().items()}


def memory() -> dict[str, object]:
    """The GPU memory this process holds (after the clock: nvidia-smi takes its time)."""
    from bench.startup_deploy import process_memory

    return {
        **process_memory(os.getpid()),
        "torch_reserved_mib": torch.cuda.memory_reserved() / 2**20,
        "torch_max_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
    }


def _size_at(g: object, index: int) -> int:
    try:
        return int(g.get_workspace_size_plan_at_index(index))  # type: ignore[attr-defined]
    except Exception:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", choices=PATHS, required=True)
    parser.add_argument("--server", default="")
    parser.add_argument("--blobs", default="", help="floor: a file of length-prefixed plan blobs, in graph order")
    parser.add_argument("--foreground-s", type=float, default=2.0)
    parser.add_argument("--lazy-s", type=float, default=0.05, help="first-lazy: the sleep after each graph's execute")
    parser.add_argument("--share", default="0/1", help="I/N: this process runs graphs I, I+N, ... of the 13")
    parser.add_argument("--barrier", type=Path, help="start together: write ready-I there, wait for its go file")
    args = parser.parse_args()
    imports_s = time.perf_counter() - IMPORT_STARTED
    # PLANCACHE_BENCH_PHASES=1: where a miss's time goes
    timing_phases = miss_phases.install(dropin=args.path in ("first-dropin", "stored-dropin"))
    share, of = (int(x) for x in args.share.split("/"))
    torch.cuda.init()
    handle = cudnn_handle()  # with cuBLASLt: set-up every path pays
    target = detect_target()
    all_specs = [normalize(s) for s in startup_graphs()]
    manifest = Manifest.from_specs(all_specs, target)
    specs = {} if args.path in STEP_PATHS else {i: s for i, s in enumerate(all_specs) if i % of == share}
    tensors = {i: bind(s) for i, s in specs.items()}
    compiler = None
    if args.path in COMPILER_PATHS:
        from plancache_server.worker.compiler.cudnn import CudnnCompiler

        compiler = CudnnCompiler(0)  # its own handle
    # The program's one changed line for first-dropin (its service: PLANCACHE_SERVER, set by the parent).
    dropin = args.path in ("first-dropin", "stored-dropin")
    frontend = importlib.import_module("plancache.cudnn") if dropin else cudnn
    setup = train_setup if args.path in TRAIN_PATHS else decode_setup
    step = setup(args.path, args.server) if args.path in STEP_PATHS else None
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - IMPORT_STARTED - imports_s
    if os.environ.get("PLANCACHE_BENCH_PREIMPORT") == "1":  # a diagnosis (bench/startup.py IMPORTED): loaded, unused
        importlib.import_module("grpc")
        importlib.import_module("plancache.cudnn")
    if os.environ.get("PLANCACHE_BENCH_GC_FREEZE") == "1":  # a diagnosis arm, on both sides of a pair alike
        gc.collect()
        gc.freeze()  # what set-up made (torch, the frontend, plancache) is not walked by the clock's collections
    tracked = len(gc.get_objects())  # before the clock: the list costs ~10 ms
    pace_before = pace_ms()  # the host's pace just before the clock and just after it (`pace_ms`, below)
    go = wait_for_go(args.barrier, share) if args.barrier else None
    clock = Clock(go)
    collector = GcWatch(clock.now, tracked)
    result: dict[str, object] = {
        "path": args.path,
        "imports_s": imports_s,
        "setup_s": setup_s,
        "graphs": len(all_specs),
        "share": [share, of],
        "indices": sorted(specs),
        "target": target.id,
        "keys": [e.key for e in manifest.entries],
        "hedge_env": os.environ.get("PLANCACHE_HEDGE"),
    }
    per_graph: dict[str, dict[int, object]] = {
        "runnable_s": {},
        "provisional": {},
        "source": {},
        "reason": {},
        "taken_over": {},
        "plan_key": {},
    }
    client = None
    profile = miss_phases.Profile().__enter__()
    if compiler is not None:
        result.update(local(compiler, specs, tensors, clock, args.path == "local-autotuned", per_graph))
    elif args.path in PROGRAM_PATHS:
        result["steps"] = program(frontend, specs, tensors, handle, clock, per_graph)
    elif step is not None:
        step()
    elif args.path == "floor":
        blobs = read_blobs(args.blobs)
        for index in specs:
            g = cudnn.pygraph()
            g.deserialize(handle, blobs[index])
            g.execute(tensors[index], workspace(g.get_workspace_size()), handle=handle)
    elif args.path == "floor-program":
        floor_program(specs, tensors, handle, clock, per_graph, read_blobs(args.blobs))
    else:
        client = Client(args.server, cache=False)
        run_service_path(args, client, manifest, target, specs, tensors, result, clock, per_graph)
    torch.cuda.synchronize()
    result["total_s"] = clock.now()
    # Stamped here, at the clock's stop: GPU run 45's was stamped after the work below (the pace loop, the
    # collector's and threads' reads: 110-220 ms), and the parent's row of a node that went with others took that
    # for the node's end (bench/startup.py merge_shares now reads each process's own clock).
    result["end_wall"] = time.time()
    result["cpu_s"] = clock.cpu_s()
    result["thread_cpu_s"] = clock.thread_cpu_s()
    result["ended_threads"] = clock.ended_threads()
    result["gc"] = collector.stop()
    # GPU run 44's hosts ran the same program at two paces ~1.6x apart, switching between runs and within one: a
    # run whose pace moved across its clock, or a pair whose two runs differ, is told apart (bench/hedge_arms.py).
    result["pace_ms"] = [pace_before, pace_ms()]
    profile.__exit__()
    if timing_phases:
        result["phases"] = miss_phases.phases()
    if client is not None:
        client.close()
    per_graph["output_s"] = clock.outputs()  # type: ignore[assignment]
    if dropin:
        dropin_sources(specs, per_graph)
    if args.path in (
        "stored-dropin",
        "stored-functional",
        "first-dropin",
        "first-functional",
        "first-functional-train",
    ):
        result["workload"] = dataclasses.asdict(plancache.workload_stats())  # what the start-up record streamed
    if step is not None and args.path not in TORCH_PATHS:
        result.update(step_record())
    result.update(memory(), races=races())
    for name, values in per_graph.items():
        if any(v is not None for v in values.values()):
            result[name] = [values.get(i) for i in range(len(all_specs))]
    print(json.dumps(result), flush=True)


def run_service_path(
    args: argparse.Namespace,
    client: Client,
    manifest: Manifest,
    target: Target,
    specs: dict[int, GraphSpec],
    tensors: dict[int, dict[int, torch.Tensor]],
    result: dict[str, object],
    clock: Clock,
    per_graph: dict[str, dict[int, object]],
) -> None:
    def ran(index: int, plan: Plan) -> None:
        per_graph["runnable_s"][index] = clock.now()
        per_graph["provisional"][index], per_graph["source"][index] = plan.provisional, plan.source
        plan.execute(tensors[index])
        clock.output_done(index)

    if args.path == "fetch":
        for index in specs:
            key = manifest.entries[index].key
            assert key is not None
            client.get(key).execute(tensors[index])
    elif args.path == "prefetch":
        fetched = client.prefetch(Manifest(entries=[ManifestEntry(key=manifest.entries[i].key) for i in specs]))
        if fetched.errors:
            raise RuntimeError(f"prefetch failed: {fetched.errors}")
        result["fetched_s"] = clock.now()
        for position, index in enumerate(specs):
            fetched.plans[position].execute(tensors[index])
    elif args.path == "background":
        pending = client.prefetch_in_background(
            Manifest(entries=[ManifestEntry(key=manifest.entries[i].key) for i in specs]), load=True
        )
        time.sleep(args.foreground_s)  # the node's weight load
        foreground_done = time.perf_counter()
        for position, index in enumerate(specs):
            pending.wait_for(position, timeout=120).execute(tensors[index])
        torch.cuda.synchronize()
        result["after_foreground_s"] = time.perf_counter() - foreground_done
        result["prefetch_done_s"] = (pending.finished_at or time.perf_counter()) - pending.started_at
    elif args.path in ("first-compile", "first-lazy", "hit-compile"):
        lazy = args.lazy_s if args.path == "first-lazy" else 0.0
        result["lazy_s"] = lazy
        for index, spec in specs.items():
            ran(index, client.compile(spec, target))
            if lazy:
                time.sleep(lazy)  # the model's layer before it meets its next graph
    elif args.path == "first-prefetch":
        indices = list(specs)
        built = client.prefetch(
            Manifest.from_specs([specs[i] for i in indices], target),
            compile_missing=True,
            on_plan=lambda position, plan: ran(indices[position], plan),
            timeout=900,
        )
        if built.errors:
            raise RuntimeError(f"first node: {built.errors}")
        result["provisional_plans"] = built.provisional


if __name__ == "__main__":
    main()

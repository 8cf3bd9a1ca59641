"""The real compiler: cuDNN frontend graph build + autotune on one GPU.

Imported only inside a worker process (it pulls in torch and the cuDNN
frontend). The frontend facts it relies on (1.32, measured on an H200):
- there is no Python autotune, and serialize() stores the plan built last
  (after build_plans(ALL) a plain serialize() stores plan 0): so each
  candidate is built with build_plan_at_index(i) and serialized at once,
  in whichever process builds it, and timed after a deserialize, as a node
  runs it;
- plans run in microseconds to milliseconds: time them on the GPU, not the
  host (compiler/timing.py), on random inputs (never zeros);
- record the winner by engine id, knobs and plan name, never by index alone.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import cudnn
import torch

from plancache import dtypes
from plancache.errors import CompileFailed
from plancache.frontend_graph import build_pygraph
from plancache.frontend_graph.defects import check_known_defects
from plancache.frontend_graph.kernel_caches import KERNEL_CACHES
from plancache.frontend_graph.plan_list import first_index, make_plan_list, resolved_geometry
from plancache.gpu.stack import load_math_libraries, torch_dtype
from plancache.gpu.target import detect_target
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.validation import storage_elements
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache_server.settings import AUTOTUNE_STRATEGIES
from plancache_server.worker.compiler.base import (
    BuiltPlan,
    CandidateResult,
    CompiledPlan,
    Geometry,
    Heuristic,
    compile_inline,
)
from plancache_server.worker.compiler.faults import gpu_fault
from plancache_server.worker.compiler.plan_list import describe
from plancache_server.worker.compiler.timing import time_candidates
from plancache_server.worker.compiler.timing_inputs import timing_inputs

log = logging.getLogger(__name__)

PYTHON_PLAN_MAGIC = b"CUDNN_FE_PYPLAN"
# Graphs (with their execution plans) a process keeps between pieces of a build.
GRAPHS_KEPT = 4


class CudnnCompiler:
    def __init__(self, device: int, autotune_strategy: str = "screened") -> None:
        if autotune_strategy not in AUTOTUNE_STRATEGIES:
            raise ValueError(
                f"autotune strategy {autotune_strategy!r}: expected one of {', '.join(AUTOTUNE_STRATEGIES)}"
            )
        self.autotune_strategy = autotune_strategy
        if torch.version.cuda is None:  # a CPU build of torch: no GPU will appear later, so no restart loop
            raise ImportError("torch is a CPU build", name="torch with CUDA")
        torch.cuda.set_device(device)
        self._device = torch.device("cuda", device)
        self._handle = cudnn.create_handle()
        cudnn.set_stream(self._handle, torch.cuda.current_stream(self._device).cuda_stream)
        self._target = detect_target(device)
        # cuBLASLt loads on first use: at start, not in a first node's first
        # job (GPU run 12: its first plan came 1.1 s after the request, the
        # next ones every ~75 ms).
        load_math_libraries(device)
        self._graphs: dict[str, Any] = {}  # by plan key

    @property
    def target(self) -> Target:
        return self._target

    @property
    def handle(self) -> Any:
        """The cuDNN handle its graphs are built and timed with (this thread's)."""
        return self._handle

    # ---- spec -> pygraph ------------------------------------------------------

    def graph(self, spec: GraphSpec, result_strides: bool = True) -> Any:
        """The (unbuilt) cuDNN pygraph of a normalized spec, on this process's
        handle (plancache.frontend_graph: the same code plancache.cudnn
        checks a captured program against). `result_strides=False` leaves the
        classic ops' results' layout to the frontend: tests/gpu check
        normalize's inferred strides against it."""
        return build_pygraph(spec, cudnn, handle=self._handle, classic_result_strides=result_strides)

    # ---- inputs for timing ------------------------------------------------------

    def random_bindings(self, spec: GraphSpec, geometry: Geometry | None = None) -> dict[int, Any]:
        """Random data for every bound tensor (never zeros), honouring strides;
        `geometry` gives the dims and strides cuDNN chose for tensors the spec leaves to it."""
        rules = timing_inputs(spec)
        bindings: dict[int, Any] = {}
        for t in spec.tensors:
            if t.is_virtual or t.constant is not None:  # a constant is the graph's own, never bound
                continue
            assert t.uid is not None and t.data_type is not None
            dims, strides = (geometry or {}).get(t.uid, (list(t.dim), list(t.stride)))
            dtype = torch_dtype(t.data_type)
            if t.is_pass_by_value:
                value = 1.0 if t.scalar_value is None else t.scalar_value
                bindings[t.uid] = torch.full(dims, value, dtype=dtype)
                continue
            count = storage_elements(tuple(dims), tuple(strides))
            if t.uid in rules.ragged_steps:
                flat = (torch.arange(count, device=self._device) * rules.ragged_steps[t.uid]).to(dtype)
            elif t.data_type in dtypes.INTEGER_TYPES and t.uid in rules.indices:
                flat = torch.randint(0, rules.indices[t.uid], (count,), device=self._device).to(dtype)
            elif t.data_type in dtypes.INTEGER_TYPES:
                high = rules.lengths.get(t.uid, 8)
                flat = torch.randint(1, high + 1, (count,), device=self._device).to(dtype)
            else:
                flat = torch.randn(count, device=self._device, dtype=torch.float32).to(dtype)
            bindings[t.uid] = flat.as_strided(dims, strides)
        return bindings

    # ---- the pieces of a build (compiler/base.py) ---------------------------------

    def compile(self, query: PlanQuery) -> CompiledPlan:
        """The final plan, every piece in this process (tools and benchmarks)."""
        *_, final = compile_inline(self, query)
        return final

    def compile_phases(self, query: PlanQuery) -> Iterator[CompiledPlan]:
        return compile_inline(self, query)

    def heuristic(self, query: PlanQuery) -> Heuristic:
        """The plan the program's own build would run: the first entry of its
        plan list that builds (its selected plan, strictly, if it selected one)."""
        started = time.perf_counter()
        spec, options = query.spec, query.options
        g = self._planned(query)
        count = g.get_execution_plan_count()
        listing = [describe(g, i) for i in range(count)]
        untimed = timing_inputs(spec).untimeable
        failures: list[CandidateResult] = []
        start = first_index(options)
        for i in range(start, count if options.selected_plan is None else start + 1):
            plan = self._build(g, i, spec)
            if plan.built:
                return Heuristic(plan, count, time.perf_counter() - started, failures, listing, untimed)
            failures.append(plan.untimed())
        reasons = "; ".join(f"plan {f.index}: {f.error}" for f in failures)
        raise CompileFailed(
            f"cuDNN could not build {'the selected plan' if options.selected_plan is not None else 'any plan'} "
            f"on {self._target.id}: {reasons[:1000]}"
        )

    def candidate(self, query: PlanQuery, index: int) -> BuiltPlan:
        g = self._planned(query)
        count = g.get_execution_plan_count()
        if index >= count:  # the heuristics gave this process fewer candidates than the heuristic build saw
            return BuiltPlan(
                index, b"", f"plan {index}", -1, {}, 0, False, error=f"cuDNN offers {count} plans here, not {index + 1}"
            )
        return self._build(g, index, query.spec)

    def time_plans(self, query: PlanQuery, plans: Sequence[BuiltPlan]) -> list[CandidateResult]:
        """Each plan deserialized (as a node would) and timed on this GPU with
        random inputs, by this process's strategy (compiler/timing.py)."""
        graphs: list[Any] = []
        loaded: list[BuiltPlan] = []
        results: dict[int, CandidateResult] = {}
        for plan in plans:
            try:
                g = cudnn.pygraph()
                g.deserialize(self._handle, plan.blob)
            except Exception as e:
                results[plan.index] = CandidateResult(
                    plan.index, plan.plan_name, plan.engine_id, None, f"deserialize: {type(e).__name__}: {str(e)[:300]}"
                )
                continue
            graphs.append(g)
            loaded.append(plan)
        bindings = self.random_bindings(query.spec, next((p.geometry for p in loaded if p.geometry), {}))
        workspace = torch.empty(max([1, *(p.workspace_size for p in loaded)]), device=self._device, dtype=torch.uint8)
        launches = [functools.partial(g.execute, bindings, workspace, handle=self._handle) for g in graphs]
        for plan, t in zip(
            loaded, time_candidates(launches, self._handle, self._device, self.autotune_strategy), strict=True
        ):
            results[plan.index] = CandidateResult(plan.index, plan.plan_name, plan.engine_id, t.ms, t.error, t.method)
        return [results[p.index] for p in plans]

    def _planned(self, query: PlanQuery) -> Any:
        """The graph with its execution plans chosen (not built), kept for
        the next pieces of the same build: a build process asked for several
        candidates of one graph makes it once (by the query's key, made once
        per query: plancache_server.worker.build_tasks keeps the queries)."""
        g = self._graphs.pop(query.key, None)
        if g is None:
            g = self._make_plans(query)
        self._graphs[query.key] = g
        while len(self._graphs) > GRAPHS_KEPT:
            self._graphs.pop(next(iter(self._graphs)))
        return g

    def _make_plans(self, query: PlanQuery) -> Any:
        check_known_defects(query.spec, self._target)
        # A norm graph, where PLANCACHE_WORKER_NORM_KERNEL_CACHE=1: built with its layout's kernel cache
        # (plancache.frontend_graph.kernel_caches: later sizes reuse the kernel earlier ones compiled; off by
        # default there). A build process builds one thing at a time.
        prepared = KERNEL_CACHES.prepare(query.spec, cudnn, int(self._device.index or 0), worker=True)
        if prepared is None:
            g = self.graph(query.spec)
        else:
            g = build_pygraph(prepared.spec, cudnn, handle=self._handle, kernel_cache=prepared.cache)
        make_plan_list(g, cudnn, query.options, self._target.id)
        return g

    def _build(self, g: Any, index: int, spec: GraphSpec) -> BuiltPlan:
        """Candidate `index` built and serialized (serialize() stores the plan built last)."""
        started = time.perf_counter()
        record = describe(g, index)
        try:
            g.build_plan_at_index(index)
            blob = bytes(g.serialize(as_bytes=True))
            workspace = int(g.get_workspace_size_plan_at_index(index))
        except Exception as e:
            fault = gpu_fault(e)
            if fault is not None:  # not this plan's fault: the device's (no other plan would build either)
                raise fault from e
            return BuiltPlan(
                index,
                b"",
                record.plan_name,
                record.engine_id,
                record.knobs,
                0,
                False,
                time.perf_counter() - started,
                f"{type(e).__name__}: {str(e)[:300]}",
                record.behavior_notes,
            )
        return BuiltPlan(
            index,
            blob,
            record.plan_name,
            record.engine_id,
            record.knobs,
            workspace,
            blob.startswith(PYTHON_PLAN_MAGIC),
            time.perf_counter() - started,
            behavior_notes=record.behavior_notes,
            geometry=resolved_geometry(g, spec),
        )

    def candidates_workspace(self, g: Any, count: int) -> Any:
        """One workspace large enough for any of the built candidates (bench/autotune.py)."""
        sizes = []
        for i in range(count):
            try:
                sizes.append(int(g.get_workspace_size_plan_at_index(i)))
            except Exception:  # a candidate that did not build
                sizes.append(0)
        return torch.empty(max([1, *sizes]), device=self._device, dtype=torch.uint8)

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
from plancache.keys.options import CompileOptions
from plancache.keys.target import Target
from plancache.run.gpu import detect_target, load_math_libraries, torch_dtype
from plancache.spec.canonical import hash_normalized
from plancache.spec.graph import GraphSpec
from plancache.spec.ops import CATALOG
from plancache.spec.validation import storage_elements
from plancache_server.settings import AUTOTUNE_STRATEGIES
from plancache_server.worker.compiler.base import BuiltPlan, CandidateResult, CompiledPlan, Heuristic, compile_inline
from plancache_server.worker.compiler.defects import check_known_defects
from plancache_server.worker.compiler.timing import time_candidates
from plancache_server.worker.compiler.timing_inputs import timing_inputs

log = logging.getLogger(__name__)

PYTHON_PLAN_MAGIC = b"CUDNN_FE_PYPLAN"
# Enum-valued attributes and the cudnn enum each names.
_ENUM_ATTRS = {"norm_forward_phase": "norm_forward_phase", "mode": "reduction_mode"}
# Ops whose output dims cuDNN cannot infer; we push the normalized dims.
_PUSH_DIMS = {"conv_dgrad", "conv_wgrad", "reduction"}
# Graphs (with their execution plans) a process keeps between pieces of a build.
GRAPHS_KEPT = 4


def _cudnn_dtype(name: str) -> Any:
    return getattr(cudnn.data_type, {"fp8_e4m3": "FP8_E4M3", "fp8_e5m2": "FP8_E5M2"}.get(name, name.upper()))


class CudnnCompiler:
    def __init__(self, device: int, autotune_strategy: str = "screened") -> None:
        if autotune_strategy not in AUTOTUNE_STRATEGIES:
            raise ValueError(f"autotune strategy {autotune_strategy!r}: expected one of {', '.join(AUTOTUNE_STRATEGIES)}")
        self.autotune_strategy = autotune_strategy
        torch.cuda.set_device(device)
        self._device = torch.device("cuda", device)
        self._handle = cudnn.create_handle()
        cudnn.set_stream(self._handle, torch.cuda.current_stream(self._device).cuda_stream)
        self._target = detect_target(device)
        # cuBLASLt loads on first use: at start, not in a first node's first
        # job (GPU run 12: its first plan came 1.1 s after the request, the
        # next ones every ~75 ms).
        load_math_libraries(device)
        self._graphs: dict[tuple[str, str], Any] = {}

    @property
    def target(self) -> Target:
        return self._target

    @property
    def handle(self) -> Any:
        """The cuDNN handle its graphs are built and timed with (this thread's)."""
        return self._handle

    # ---- spec -> pygraph ------------------------------------------------------

    def graph(self, spec: GraphSpec, result_strides: bool = True) -> Any:
        """Translate a normalized spec into an (unbuilt) cuDNN pygraph.
        `result_strides=False` leaves the outputs' layout to the frontend:
        tests/gpu check normalize's inferred strides against it."""
        g = cudnn.pygraph(
            handle=self._handle,
            name=spec.name or "plancache",
            io_data_type=_cudnn_dtype(spec.io_data_type) if spec.io_data_type else cudnn.data_type.NOT_SET,
            intermediate_data_type=_cudnn_dtype(spec.intermediate_data_type or "float"),
            compute_data_type=_cudnn_dtype(spec.compute_data_type or "float"),
        )
        # Given outputs (sdpa_backward's dBias) are handed to their node as
        # tensors, the way the frontend takes them; other results it returns.
        given = {t.uid for n in spec.nodes for port, t in n.outputs.items() if port in CATALOG[n.op].optional_outputs}
        produced = {t.uid for n in spec.nodes for t in n.outputs.values()} - given
        made: dict[int, Any] = {}
        for t in spec.tensors:
            if t.uid not in produced:
                assert t.uid is not None and t.data_type is not None
                made[t.uid] = g.tensor(
                    name=t.name or f"t{t.uid}", dim=list(t.dim), stride=list(t.stride),
                    data_type=_cudnn_dtype(t.data_type), is_pass_by_value=t.is_pass_by_value, uid=t.uid,
                )  # fmt: skip
        for t in spec.tensors:
            if t.ragged_offset is not None and t.uid not in produced:
                made[t.uid or 0].set_ragged_offset(made[t.ragged_offset.uid or 0])
        for index, node in enumerate(spec.nodes):
            schema = CATALOG[node.op]
            kwargs: dict[str, Any] = {port: made[t.uid] for port, t in node.inputs.items() if t.uid is not None}
            kwargs.update({port: made[t.uid or 0] for port, t in node.outputs.items() if port in schema.optional_outputs})
            if "dropout_probability" in node.attributes:  # the frontend takes dropout as one tuple
                kwargs["dropout"] = (node.attributes["dropout_probability"], kwargs.pop("dropout_seed"), kwargs.pop("dropout_offset"))
            for key, value in node.attributes.items():
                if key == "dropout_probability":
                    continue
                if key in _ENUM_ATTRS:
                    kwargs[key] = getattr(getattr(cudnn, _ENUM_ATTRS[key]), str(value))
                else:
                    kwargs[key] = list(value) if isinstance(value, tuple) else value
            if schema.takes_compute_type and node.compute_data_type:
                kwargs["compute_data_type"] = _cudnn_dtype(node.compute_data_type)
            if node.op in _PUSH_DIMS:
                (only_output,) = node.outputs.values()
                kwargs["out_dims"] = list(only_output.dim)
            try:
                result = getattr(g, node.op)(name=node.name or f"{node.op}_{index}", **kwargs)
            except (TypeError, ValueError, RuntimeError) as e:
                raise CompileFailed(f"node {index} ({node.name or node.op}): the cuDNN frontend refused it: {e}") from e
            returned = result if isinstance(result, list | tuple) else [result]
            by_port = dict(zip(schema.all_outputs, returned, strict=False))
            for port, t in node.outputs.items():
                assert t.uid is not None and t.data_type is not None
                if t.uid in given:
                    made[t.uid].set_output(True)
                    continue
                out = by_port[port]
                made[t.uid] = out
                out.set_data_type(_cudnn_dtype(t.data_type))
                if t.is_output:
                    out.set_output(True).set_uid(t.uid).set_dim(list(t.dim))
                    if result_strides or t.ragged_offset is not None:
                        out.set_stride(list(t.stride))
                    if t.ragged_offset is not None:
                        out.set_ragged_offset(made[t.ragged_offset.uid or 0])
        return g

    # ---- inputs for timing ------------------------------------------------------

    def random_bindings(self, spec: GraphSpec) -> dict[int, Any]:
        """Random data for every bound tensor (never zeros), honouring strides."""
        rules = timing_inputs(spec)
        bindings: dict[int, Any] = {}
        for t in spec.tensors:
            if t.is_virtual:
                continue
            assert t.uid is not None and t.data_type is not None
            dtype = torch_dtype(t.data_type)
            if t.is_pass_by_value:
                value = 1.0 if t.scalar_value is None else t.scalar_value
                bindings[t.uid] = torch.full(t.dim, value, dtype=dtype)
                continue
            count = storage_elements(t.dim, t.stride)
            if t.uid in rules.ragged_steps:
                flat = (torch.arange(count, device=self._device) * rules.ragged_steps[t.uid]).to(dtype)
            elif t.data_type in dtypes.INTEGER_TYPES and t.uid in rules.indices:
                flat = torch.randint(0, rules.indices[t.uid], (count,), device=self._device).to(dtype)
            elif t.data_type in dtypes.INTEGER_TYPES:
                high = rules.lengths.get(t.uid, 8)
                flat = torch.randint(1, high + 1, (count,), device=self._device).to(dtype)
            else:
                flat = torch.randn(count, device=self._device, dtype=torch.float32).to(dtype)
            bindings[t.uid] = flat.as_strided(t.dim, t.stride)
        return bindings

    # ---- the pieces of a build (compiler/base.py) ---------------------------------

    def compile(self, spec: GraphSpec, options: CompileOptions) -> CompiledPlan:
        """The final plan, every piece in this process (tools and benchmarks)."""
        *_, final = compile_inline(self, spec, options)
        return final

    def compile_phases(self, spec: GraphSpec, options: CompileOptions) -> Iterator[CompiledPlan]:
        return compile_inline(self, spec, options)

    def heuristic(self, spec: GraphSpec, options: CompileOptions) -> Heuristic:
        started = time.perf_counter()
        g = self._planned(spec, options)
        count = g.get_execution_plan_count()
        failures: list[CandidateResult] = []
        for i in range(count):
            plan = self._build(g, i)
            if plan.built:
                return Heuristic(plan, count, time.perf_counter() - started, failures)
            failures.append(plan.untimed())
        reasons = "; ".join(f"plan {f.index}: {f.error}" for f in failures)
        raise CompileFailed(f"cuDNN could not build any plan on {self._target.id}: {reasons[:1000]}")

    def candidate(self, spec: GraphSpec, options: CompileOptions, index: int) -> BuiltPlan:
        g = self._planned(spec, options)
        count = g.get_execution_plan_count()
        if index >= count:  # the heuristics gave this process fewer candidates than the heuristic build saw
            return BuiltPlan(index, b"", f"plan {index}", -1, {}, 0, False, error=f"cuDNN offers {count} plans here, not {index + 1}")
        return self._build(g, index)

    def time_plans(self, spec: GraphSpec, options: CompileOptions, plans: Sequence[BuiltPlan]) -> list[CandidateResult]:
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
                results[plan.index] = CandidateResult(plan.index, plan.plan_name, plan.engine_id, None, f"deserialize: {type(e).__name__}: {str(e)[:300]}")
                continue
            graphs.append(g)
            loaded.append(plan)
        bindings = self.random_bindings(spec)
        workspace = torch.empty(max([1, *(p.workspace_size for p in loaded)]), device=self._device, dtype=torch.uint8)
        launches = [functools.partial(g.execute, bindings, workspace, handle=self._handle) for g in graphs]
        for plan, t in zip(loaded, time_candidates(launches, self._handle, self._device, self.autotune_strategy), strict=True):
            results[plan.index] = CandidateResult(plan.index, plan.plan_name, plan.engine_id, t.ms, t.error, t.method)
        return [results[p.index] for p in plans]

    def _planned(self, spec: GraphSpec, options: CompileOptions) -> Any:
        """The graph with its execution plans chosen (not built), kept for
        the next pieces of the same build: a build process asked for several
        candidates of one graph makes it once."""
        key = (hash_normalized(spec), options.id)
        g = self._graphs.pop(key, None)
        if g is None:
            g = self._make_plans(spec, options)
        self._graphs[key] = g
        while len(self._graphs) > GRAPHS_KEPT:
            self._graphs.pop(next(iter(self._graphs)))
        return g

    def _make_plans(self, spec: GraphSpec, options: CompileOptions) -> Any:
        check_known_defects(spec)
        g = self.graph(spec)
        try:
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in options.heuristic_modes])
            if options.excluded_behavior_notes:
                g.deselect_behavior_notes([getattr(cudnn.behavior_note, n) for n in options.excluded_behavior_notes])
            if options.workspace_limit:
                g.deselect_workspace_greater_than(options.workspace_limit)
            g.check_support()
        except Exception as e:  # cuDNN's reason is the message the user needs
            raise CompileFailed(f"cuDNN does not support this graph on {self._target.id}: {e}") from e
        if g.get_execution_plan_count() == 0:
            raise CompileFailed(f"cuDNN offers no execution plan for this graph on {self._target.id}")
        return g

    def _build(self, g: Any, index: int) -> BuiltPlan:
        """Candidate `index` built and serialized (serialize() stores the plan built last)."""
        started = time.perf_counter()
        name, engine_id = self._describe(g, index)
        try:
            g.build_plan_at_index(index)
            blob = bytes(g.serialize(as_bytes=True))
            _, knobs = g.get_engine_and_knobs_at_index(index)
            workspace = int(g.get_workspace_size_plan_at_index(index))
        except Exception as e:
            return BuiltPlan(index, b"", name, engine_id, {}, 0, False, time.perf_counter() - started, f"{type(e).__name__}: {str(e)[:300]}")
        return BuiltPlan(
            index, blob, name, engine_id, {getattr(k, "name", str(k)): int(v) for k, v in knobs.items()}, workspace,
            blob.startswith(PYTHON_PLAN_MAGIC), time.perf_counter() - started,
        )  # fmt: skip

    def _describe(self, g: Any, index: int) -> tuple[str, int]:
        try:
            name = str(g.get_plan_name_at_index(index))
        except Exception:
            name = f"plan {index}"
        try:
            engine_id = int(g.get_engine_and_knobs_at_index(index)[0])
        except Exception:
            engine_id = -1
        return name, engine_id

    def candidates_workspace(self, g: Any, count: int) -> Any:
        """One workspace large enough for any of the built candidates (bench/autotune.py)."""
        sizes = []
        for i in range(count):
            try:
                sizes.append(int(g.get_workspace_size_plan_at_index(i)))
            except Exception:  # a candidate that did not build
                sizes.append(0)
        return torch.empty(max([1, *sizes]), device=self._device, dtype=torch.uint8)

"""The real compiler: cuDNN frontend graph build + autotune on one GPU.

Imported only inside a worker process (it pulls in torch and the cuDNN
frontend). The frontend facts it relies on (1.32, measured on an H200):
- there is no Python autotune: build every candidate, time each with
  execute_plan_at_index, then build_plan_at_index(best) BEFORE serialize();
  after build_plans(ALL) a plain serialize() stores plan 0;
- plans run in microseconds to milliseconds: time them on the GPU, not the
  host (compiler/timing.py), on random inputs (never zeros);
- record the winner by engine id, knobs and plan name, never by index alone.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from typing import Any

import cudnn
import torch

from plancache import dtypes
from plancache.errors import CompileFailed
from plancache.gpu import detect_target, load_math_libraries, torch_dtype
from plancache.ops import CATALOG
from plancache.options import CompileOptions
from plancache.spec import GraphSpec
from plancache.target import Target
from plancache.validation import storage_elements
from plancache_server.compiler.base import AUTOTUNE_STRATEGIES, CandidateResult, CompiledPlan
from plancache_server.compiler.defects import check_known_defects
from plancache_server.compiler.timing import best, time_candidates
from plancache_server.compiler.timing_inputs import timing_inputs

log = logging.getLogger(__name__)

PYTHON_PLAN_MAGIC = b"CUDNN_FE_PYPLAN"
# Enum-valued attributes and the cudnn enum each names.
_ENUM_ATTRS = {"norm_forward_phase": "norm_forward_phase", "mode": "reduction_mode"}
# Ops whose output dims cuDNN cannot infer; we push the normalized dims.
_PUSH_DIMS = {"conv_dgrad", "conv_wgrad", "reduction"}


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

    # ---- build + autotune ---------------------------------------------------------

    def compile(self, spec: GraphSpec, options: CompileOptions) -> CompiledPlan:
        """The final plan (the last of compile_phases)."""
        *_, final = self.compile_phases(spec, options)
        return final

    def compile_phases(self, spec: GraphSpec, options: CompileOptions) -> Iterator[CompiledPlan]:
        started = time.perf_counter()
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
        count = g.get_execution_plan_count()
        if count == 0:
            raise CompileFailed(f"cuDNN offers no execution plan for this graph on {self._target.id}")
        # cuDNN's heuristic choice first: what a node building locally would run.
        candidates, chosen = self._first_buildable(g, count)
        heuristic_s = time.perf_counter() - started
        if not options.autotune or count == 1:
            yield self._plan(g, chosen, candidates, heuristic_s, 0.0, provisional=False)
            return
        yield self._plan(g, chosen, candidates, heuristic_s, 0.0, provisional=True)
        candidates, chosen, build_s, tune_s = self._autotune(g, spec, count, heuristic_s)
        yield self._plan(g, chosen, candidates, build_s, tune_s, provisional=False)

    def _plan(self, g: Any, chosen: int, candidates: list[CandidateResult], build_s: float, tune_s: float, provisional: bool) -> CompiledPlan:
        """The plan built last at `chosen`, serialized (serialize() stores the plan built last)."""
        blob = bytes(g.serialize(as_bytes=True))
        engine_id, knobs = g.get_engine_and_knobs_at_index(chosen)
        return CompiledPlan(
            blob=blob,
            workspace_size=int(g.get_workspace_size()),
            engine_id=int(engine_id),
            knobs={getattr(k, "name", str(k)): int(v) for k, v in knobs.items()},
            plan_name=str(g.get_plan_name_at_index(chosen)),
            is_python_engine=blob.startswith(PYTHON_PLAN_MAGIC),
            candidates=candidates,
            build_seconds=build_s,
            autotune_seconds=tune_s,
            provisional=provisional,
        )

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

    def _autotune(self, g: Any, spec: GraphSpec, count: int, heuristic_s: float) -> tuple[list[CandidateResult], int, float, float]:
        """(candidates, the winner's index, build seconds, autotune seconds),
        the winner built last. Build seconds: the heuristic build before it
        plus building every candidate."""
        started = time.perf_counter()
        try:
            g.build_plans(cudnn.build_plan_policy.ALL)
        except Exception as e:
            raise CompileFailed(f"cuDNN could not build any plan for this graph on {self._target.id}: {e}") from e
        build_s = heuristic_s + time.perf_counter() - started
        tune_started = time.perf_counter()
        bindings = self.random_bindings(spec)
        workspace = self.candidates_workspace(g, count)
        launches = [functools.partial(g.execute_plan_at_index, bindings, workspace, i, handle=self._handle) for i in range(count)]
        timed = time_candidates(launches, self._handle, self._device, self.autotune_strategy)
        candidates = [
            CandidateResult(index=t.index, plan_name=name, engine_id=engine_id, median_ms=t.ms, error=t.error, timing=t.method)
            for t, (name, engine_id) in zip(timed, (self._describe(g, i) for i in range(count)), strict=True)
        ]
        winner = best(timed)
        if winner is None:
            raise CompileFailed(f"none of the {count} candidate plans ran on {self._target.id}: {candidates[0].error}")
        # Selects the winner for serialize(); without it plan 0 is serialized.
        g.build_plan_at_index(winner.index)
        return candidates, winner.index, build_s, time.perf_counter() - tune_started

    def candidates_workspace(self, g: Any, count: int) -> Any:
        """One workspace large enough for any of the built candidates."""
        sizes = []
        for i in range(count):
            try:
                sizes.append(int(g.get_workspace_size_plan_at_index(i)))
            except Exception:  # a candidate that did not build
                sizes.append(0)
        return torch.empty(max([1, *sizes]), device=self._device, dtype=torch.uint8)

    def _first_buildable(self, g: Any, count: int) -> tuple[list[CandidateResult], int]:
        errors = []
        for i in range(count):
            name, engine_id = self._describe(g, i)
            try:
                g.build_plan_at_index(i)
            except Exception as e:
                errors.append(f"plan {i}: {e}")
                continue
            return [CandidateResult(index=i, plan_name=name, engine_id=engine_id, median_ms=None)], i
        raise CompileFailed(f"cuDNN could not build any plan on {self._target.id}: {'; '.join(errors)[:1000]}")

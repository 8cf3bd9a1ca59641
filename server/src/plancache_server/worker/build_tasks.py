"""A piece of a build as a worker's pool runs it: the task, running it with
a compiler, and its answer across the pipe (plancache_server.worker.build_pool).

A task carries its query's wire form, made by the worker from the job it
verified (plancache_server.worker.verified_job): the spec in it is
normalized already. A build process is started by its worker and reads
only its worker's pipe, which is not a trust boundary, so the query is
taken as it comes (`PlanQuery.normalized`) and not normalized again; the
last few are remembered by their bytes, so that the candidates of one
build parse once in each process and hash their spec once there.
"""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import asdict, dataclass
from typing import Any

from plancache.errors import CompileFailed
from plancache.graphspec import spec_io
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.worker.compiler.base import BuiltPlan, CandidateResult, Compiler, Heuristic
from plancache_server.worker.compiler.faults import GpuLost, GpuOutOfMemory, gpu_fault

# The pool's log: a task's failure reads as it always has.
log = logging.getLogger("plancache_server.worker.build_pool")

HEURISTIC, CANDIDATE = "heuristic", "candidate"
# Queries a build process remembers (by their bytes): the builds whose pieces it may be sent next.
QUERIES_KEPT = 8

task_ids = itertools.count(1)


@dataclass(frozen=True)
class BuildTask:
    task_id: int
    kind: str  # HEURISTIC or CANDIDATE
    query: bytes  # a serialized PlanQuery (task_query): the spec normalized by the worker, its target and options
    index: int = 0  # the candidate's


@dataclass(frozen=True)
class TaskResult:
    task: BuildTask
    heuristic: Heuristic | None = None
    plan: BuiltPlan | None = None
    error: str = ""
    rejected: bool = False  # cuDNN refused the graph (or it ran past the budget): remembered, not retried
    lost: bool = False  # the process building it died: worth another try elsewhere
    gpu_lost: bool = False  # the process's CUDA context is gone (compiler.faults.GpuLost): so is its worker's
    worker: str = ""  # which process built it, for logs


def task_query(query: PlanQuery) -> bytes:
    """What the tasks of a build carry: the query's wire form (its spec normalized where the query was made)."""
    return query.proto.SerializeToString()


@functools.lru_cache(maxsize=QUERIES_KEPT)
def task_plan_query(query: bytes) -> PlanQuery:
    """The query a task carries, as its worker made it (not normalized again: see the module's docstring)."""
    parsed = pb.PlanQuery.FromString(query)
    return PlanQuery.normalized(
        spec_io.from_proto(parsed.spec), Target.from_proto(parsed.target), CompileOptions.from_proto(parsed.options)
    )


def run_task(compiler: Compiler, task: BuildTask) -> TaskResult:
    """One piece of a build, in this process (a build process, or a thread)."""
    try:
        query = task_plan_query(task.query)
        if task.kind == HEURISTIC:
            return TaskResult(task, heuristic=compiler.heuristic(query))
        return TaskResult(task, plan=compiler.candidate(query, task.index))
    except CompileFailed as e:
        return TaskResult(task, error=e.message, rejected=True)
    except Exception as e:
        fault = gpu_fault(e)
        if isinstance(fault, GpuLost):  # the worker says it, once
            return TaskResult(task, error=f"the GPU was lost: {fault}", gpu_lost=True)
        if isinstance(fault, GpuOutOfMemory):  # the job fails with it; nothing remembered against the graph
            return TaskResult(task, error=f"out of GPU memory: {fault}")
        # A bug: reported with the task, the process goes on.
        log.exception("build task %d (%s) failed", task.task_id, task.kind)
        return TaskResult(task, error=f"{type(e).__name__}: {str(e)[:500]}")


# ---- across the pipe ---------------------------------------------------------------------


def encode_task(task: BuildTask) -> tuple[dict[str, Any], bytes]:
    return {"task": task.task_id, "kind": task.kind, "index": task.index}, task.query


def decode_task(header: dict[str, Any], payload: bytes) -> BuildTask:
    return BuildTask(int(header["task"]), str(header["kind"]), payload, int(header.get("index", 0)))


def encode_result(result: TaskResult) -> tuple[dict[str, Any], bytes]:
    header: dict[str, Any] = {
        "task": result.task.task_id,
        "error": result.error,
        "rejected": result.rejected,
        "gpu_lost": result.gpu_lost,
    }
    blob = b""
    if result.heuristic is not None:
        h = result.heuristic
        header["heuristic"] = {
            "count": h.count,
            "seconds": h.seconds,
            "candidates": [asdict(c) for c in h.candidates],
            "chosen": _plan_fields(h.chosen),
            "listing": [asdict(c) for c in h.listing],
            "untimed_reason": h.untimed_reason,
        }
        blob = h.chosen.blob
    elif result.plan is not None:
        header["plan"] = _plan_fields(result.plan)
        blob = result.plan.blob
    return header, blob


def decode_result(task: BuildTask, header: dict[str, Any], blob: bytes, worker: str) -> TaskResult:
    error, rejected = str(header.get("error") or ""), bool(header.get("rejected"))
    if "heuristic" in header:
        h = header["heuristic"]
        heuristic = Heuristic(
            _plan(h["chosen"], blob),
            int(h["count"]),
            float(h["seconds"]),
            [_candidate(c) for c in h["candidates"]],
            [_candidate(c) for c in h.get("listing", [])],
            str(h.get("untimed_reason", "")),
        )
        return TaskResult(task, heuristic=heuristic, worker=worker)
    if "plan" in header:
        return TaskResult(task, plan=_plan(header["plan"], blob), worker=worker)
    return TaskResult(
        task,
        error=error or "the build process answered nothing",
        rejected=rejected,
        gpu_lost=bool(header.get("gpu_lost")),
        worker=worker,
    )


def _plan_fields(plan: BuiltPlan) -> dict[str, Any]:
    fields = asdict(plan)
    del fields["blob"]
    fields["geometry"] = {
        str(uid): [dims, strides] for uid, (dims, strides) in plan.geometry.items()
    }  # JSON keys are strings
    return fields


def _plan(fields: dict[str, Any], blob: bytes) -> BuiltPlan:
    geometry = {
        int(uid): ([int(d) for d in g[0]], [int(s) for s in g[1]]) for uid, g in fields.get("geometry", {}).items()
    }
    knobs = {str(k): int(v) for k, v in fields["knobs"].items()}
    return BuiltPlan(
        blob=blob,
        **{**fields, "knobs": knobs, "behavior_notes": tuple(fields.get("behavior_notes", ())), "geometry": geometry},
    )


def _candidate(fields: dict[str, Any]) -> CandidateResult:
    return CandidateResult(
        **{
            **fields,
            "knobs": {str(k): int(v) for k, v in fields.get("knobs", {}).items()},
            "behavior_notes": tuple(fields.get("behavior_notes", ())),
        }
    )

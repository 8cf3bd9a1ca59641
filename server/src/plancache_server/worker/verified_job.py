"""A job as a worker builds it: its query, derived by the worker and checked
against the plan key the job names, and the metadata of its plans."""

from __future__ import annotations

from dataclasses import dataclass

from plancache.errors import InvalidRequest, PlanCacheError
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache.wire import metadata as wire_metadata
from plancache.wire.metadata import Built
from plancache_server.store.jobs import Job
from plancache_server.worker.compiler import CompiledPlan


@dataclass(frozen=True)
class VerifiedJob:
    """A job whose plan key is the one its spec, target and options make,
    for a target this worker builds: what it builds and signs."""

    query: PlanQuery  # derived by this worker from the job's spec, target and options

    @property
    def plan_key(self) -> str:
        return self.query.key

    @property
    def spec(self) -> GraphSpec:  # normalized by this worker
        return self.query.spec

    @property
    def target(self) -> Target:
        return self.query.target

    @property
    def options(self) -> CompileOptions:
        return self.query.options


def verify_job(job: Job, served: list[Target]) -> VerifiedJob:
    """Derive the job's plan key; a job is data from Redis, not an authority.
    Raises InvalidRequest naming what does not hold."""
    try:
        query = PlanQuery.from_proto(job.query)
    except PlanCacheError as e:
        raise InvalidRequest(f"its query does not parse: {e.message[:300]}") from e
    if query.target.id not in {t.id for t in served}:
        raise InvalidRequest(
            f"it is for target {query.target.id}, which this worker does not build "
            f"(it builds {', '.join(t.id for t in served)})"
        )
    if query.key != job.plan_key:
        raise InvalidRequest(
            f"it names plan {job.plan_key[:300]} but its spec, target and options make plan {query.key}"
        )
    return VerifiedJob(query)


def plan_metadata(job: VerifiedJob, compiled: CompiledPlan, worker_id: str, built_on: pb.Target) -> pb.PlanMetadata:
    """Everything a client needs to execute the blob without the spec (plancache.wire.metadata)."""
    candidates = [
        pb.CandidateTiming(
            index=c.index,
            plan_name=c.plan_name,
            engine_id=c.engine_id,
            median_ms=c.median_ms,
            error=c.error,
            timing=c.timing,
            knobs=[pb.Knob(name=k, value=v) for k, v in sorted(c.knobs.items())],
            behavior_notes=c.behavior_notes,
            workspace_size=c.workspace_size,
        )
        for c in compiled.candidates
    ]
    built = Built(
        blob=compiled.blob,
        geometry=compiled.geometry,
        workspace_size=compiled.workspace_size,
        plan_name=compiled.plan_name,
        built_by=worker_id,
        built_on=built_on,
        provisional=compiled.provisional,
        build_seconds=compiled.build_seconds,
        autotune_seconds=compiled.autotune_seconds,
        engine_id=compiled.engine_id,
        knobs=dict(compiled.knobs),
        is_python_engine=compiled.is_python_engine,
        candidates=candidates,
    )
    return wire_metadata.plan_metadata(job.query, built)

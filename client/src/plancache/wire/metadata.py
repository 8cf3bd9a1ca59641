"""A plan's metadata, made in one place: everything a node needs to run a
blob without its spec (the tensors it binds, the workspace), what it was
built from (its query's key, spec hash, target and options) and how (the
engine, the candidates timed). A worker's plans and a node's own build of a
hedged miss (plancache.run.local) both describe their plans here, so the
two cannot say different things of the same graph.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from plancache.keys.query import PlanQuery
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.bindings import ResolvedGeometry, tensor_bindings

_ENGINE_KINDS = {True: pb.ENGINE_KIND_PYTHON, False: pb.ENGINE_KIND_BACKEND, None: pb.ENGINE_KIND_UNSPECIFIED}


@dataclass(frozen=True)
class Built:
    """What the build of one plan says of it (a worker's compiled plan, or a node's own)."""

    blob: bytes
    geometry: ResolvedGeometry  # what cuDNN gave the results the spec leaves open
    workspace_size: int
    plan_name: str
    built_by: str
    built_on: pb.Target
    provisional: bool
    build_seconds: float = 0.0
    autotune_seconds: float = 0.0
    engine_id: int = 0
    knobs: dict[str, int] = field(default_factory=dict)
    is_python_engine: bool | None = None  # None: not known (a node's own build does not tell)
    candidates: Sequence[pb.CandidateTiming] = ()


def plan_metadata(query: PlanQuery, built: Built) -> pb.PlanMetadata:
    """The metadata of the plan `built` for `query`."""
    return pb.PlanMetadata(
        key=query.key,
        spec_hash=query.spec_hash,
        target=built.built_on,
        options=query.options.to_proto(),
        tensors=tensor_bindings(query.spec, built.geometry),
        workspace_size=built.workspace_size,
        engine_id=built.engine_id,
        knobs=[pb.Knob(name=k, value=v) for k, v in sorted(built.knobs.items())],
        plan_name=built.plan_name,
        engine_kind=_ENGINE_KINDS[built.is_python_engine],
        candidates=list(built.candidates),
        build_seconds=built.build_seconds,
        autotune_seconds=built.autotune_seconds,
        blob_sha256=hashlib.sha256(built.blob).hexdigest(),
        blob_size=len(built.blob),
        created_at=time.time(),
        built_by=built.built_by,
        provisional=built.provisional,
        op_family=query.op_family,
    )

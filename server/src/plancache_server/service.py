"""The domain object behind the gRPC servicer: compile, get, stats.

Everything here speaks plancache types and raises plancache errors; the
servicer only converts protos, and the interceptor maps the errors.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from plancache import spec_io
from plancache.canonical import hash_normalized
from plancache.errors import InvalidRequest, NotFound, TargetUnavailable
from plancache.options import CompileOptions
from plancache.plankey import make_key, parse_key
from plancache.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache.validation import Limits, normalize
from plancache_server.builds import Builds
from plancache_server.jobs import JobQueue
from plancache_server.stats import Counter, Stats
from plancache_server.store import PlanStore, StoredPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedQuery:
    plan_key: str
    target: Target
    query: pb.PlanQuery  # with the normalized spec


class PlanService:
    def __init__(self, store: PlanStore, queue: JobQueue, builds: Builds, stats: Stats, limits: Limits, compile_timeout_s: float) -> None:
        self._store = store
        self._queue = queue
        self._builds = builds
        self._stats = stats
        self._limits = limits
        self._compile_timeout_s = compile_timeout_s

    def resolve(self, spec: pb.GraphSpec, target: pb.Target, options: pb.CompileOptions) -> ResolvedQuery:
        """Validate everything the caller sent and compute the plan key."""
        normalized = normalize(spec_io.from_proto(spec), self._limits)
        resolved_target = Target.from_proto(target)
        resolved_options = CompileOptions.from_proto(options)
        plan_key = make_key(hash_normalized(normalized), resolved_target, resolved_options)
        query = pb.PlanQuery(spec=spec_io.to_proto(normalized), target=resolved_target.to_proto(), options=resolved_options.to_proto())
        return ResolvedQuery(plan_key, resolved_target, query)

    def compile(self, request: pb.CompileRequest, time_remaining: float | None) -> tuple[StoredPlan, int]:
        resolved = self.resolve(request.spec, request.target, request.options)
        target_id = resolved.target.id
        plan = self._store.get(resolved.plan_key)
        if plan is not None:
            self._stats.incr(target_id, Counter.HITS)
            return plan, pb.COMPILE_SOURCE_HIT
        self._stats.incr(target_id, Counter.MISSES)
        if self._queue.live_workers(resolved.target) == 0:
            live = self._queue.known_targets()
            raise TargetUnavailable(
                f"no live GPU worker can build for target {target_id}; "
                + (f"targets with workers now: {', '.join(live)}" if live else "no worker is connected to this deployment")
            )
        job_id, started = self._builds.start_or_join(resolved.target, resolved.plan_key, resolved.query)
        self._stats.incr(target_id, Counter.COMPILES if started else Counter.JOINED)
        log.info("%s build of %s (job %s)", "started" if started else "joined", resolved.plan_key, job_id)
        budget = self._compile_timeout_s if time_remaining is None else min(time_remaining, self._compile_timeout_s)
        try:
            plan = self._builds.wait(resolved.plan_key, job_id, time.monotonic() + budget)
        except Exception:
            if started:
                self._stats.incr(target_id, Counter.FAILURES)
            raise
        return plan, pb.COMPILE_SOURCE_COMPILED if started else pb.COMPILE_SOURCE_JOINED

    def get(self, ref: pb.PlanRef) -> StoredPlan:
        kind = ref.WhichOneof("ref")
        if kind == "key":
            plan_key = ref.key
            parse_key(plan_key)
        elif kind == "query":
            plan_key = self.resolve(ref.query.spec, ref.query.target, ref.query.options).plan_key
        else:
            raise InvalidRequest("GetPlan needs a plan key, or a spec with its target and options")
        plan = self._store.get(plan_key)
        if plan is None:
            raise NotFound(f"no stored plan {plan_key} (GetPlan never compiles; use Compile)")
        return plan

    def stats(self) -> list[pb.TargetStats]:
        counters = self._stats.read()
        rows = []
        for target_id in sorted(set(counters) | set(self._queue.known_targets())):
            row = counters.get(target_id, {})
            try:
                workers = self._queue.live_workers(Target.parse(target_id))
            except InvalidRequest:
                workers = 0
            rows.append(
                pb.TargetStats(
                    target_id=target_id,
                    hits=row.get("hits", 0),
                    misses=row.get("misses", 0),
                    compiles=row.get("compiles", 0),
                    failures=row.get("failures", 0),
                    joined=row.get("joined", 0),
                    live_workers=workers,
                )
            )
        return rows

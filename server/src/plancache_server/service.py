"""The domain object behind the gRPC servicer: compile, get, stats.

Everything here speaks plancache types and raises plancache errors; the
servicer only converts protos, and the interceptor maps the errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from plancache import spec_io
from plancache.canonical import hash_normalized
from plancache.errors import CompileFailed, InvalidRequest, NotFound, PlanCacheError, TargetUnavailable
from plancache.ops import CATALOG
from plancache.options import CompileOptions
from plancache.plankey import make_key, parse_key
from plancache.spec import GraphSpec
from plancache.target import Target, slug
from plancache.v1 import plancache_pb2 as pb
from plancache.validation import Limits, normalize
from plancache_server import metrics
from plancache_server.builds import Builds
from plancache_server.jobs import JobQueue
from plancache_server.stats import WINDOWS, Counter, Stats, target_ids, target_scope
from plancache_server.store import PlanStore, StoredPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedQuery:
    plan_key: str
    target: Target
    query: pb.PlanQuery  # with the normalized spec
    family: str  # the op family that anchors the graph, for statistics


def anchor_family(spec: GraphSpec) -> str:
    """The first non-pointwise op family of a graph, else "pointwise"."""
    families = [CATALOG[n.op].family for n in spec.nodes]
    return next((f for f in families if f != "pointwise"), "pointwise")


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
        return ResolvedQuery(plan_key, resolved_target, query, anchor_family(normalized))

    def compile(self, request: pb.CompileRequest, time_remaining: float | None) -> tuple[StoredPlan, int]:
        resolved = self.resolve(request.spec, request.target, request.options)
        plan = self._lookup(resolved.plan_key, resolved.target, resolved.family)
        if plan is not None:
            return plan, pb.COMPILE_SOURCE_HIT
        job_id, started = self._start_build(resolved)
        try:
            plan = self._builds.wait(resolved.plan_key, job_id, self._deadline(time_remaining))
        except Exception:
            if started:
                self._stats.incr(Counter.FAILURES, target_id=resolved.target.id, family=resolved.family)
            raise
        return plan, pb.COMPILE_SOURCE_COMPILED if started else pb.COMPILE_SOURCE_JOINED

    def _deadline(self, time_remaining: float | None) -> float:
        budget = self._compile_timeout_s if time_remaining is None else min(time_remaining, self._compile_timeout_s)
        return time.monotonic() + budget

    def _lookup(self, plan_key: str, target: Target, family: str | None = None) -> StoredPlan | None:
        """The stored plan, counted as a hit (with the bytes it serves and the
        build time it saves) or a miss of its target and op family."""
        plan = self._store.get(plan_key)
        if plan is None:
            self._stats.incr(Counter.MISSES, target_id=target.id, family=family)
        else:
            saved = plan.metadata.build_seconds + plan.metadata.autotune_seconds
            self._stats.hit(plan_key, len(plan.blob), saved, target_id=target.id, family=family)
        metrics.LOOKUPS.labels(target.id, "hit" if plan is not None else "miss").inc()
        return plan

    def _start_build(self, resolved: ResolvedQuery) -> tuple[str, bool]:
        """Start the build of a missing plan, or join the one in progress."""
        target_id = resolved.target.id
        known = self._builds.known_failure(resolved.plan_key)
        if known is not None:
            raise CompileFailed(known)
        if self._queue.live_workers(resolved.target) == 0:
            live = self._queue.known_targets()
            raise TargetUnavailable(
                f"no live GPU worker can build for target {target_id}; "
                + (f"targets with workers now: {', '.join(live)}" if live else "no worker is connected to this deployment")
            )
        job_id, started = self._builds.start_or_join(resolved.target, resolved.plan_key, resolved.query)
        self._stats.incr(Counter.COMPILES if started else Counter.JOINED, target_id=target_id, family=resolved.family)
        log.info("%s build of %s (job %s)", "started" if started else "joined", resolved.plan_key, job_id)
        return job_id, started

    def prefetch(self, request: pb.PrefetchRequest, time_remaining: float | None) -> Iterator[pb.PrefetchItem]:
        """Stored plans at once; then, with compile_missing, each build as it
        finishes. A failure answers its own item and never ends the stream."""
        deadline = self._deadline(time_remaining)
        building: list[tuple[int, ResolvedQuery, str, bool]] = []
        for index, ref in enumerate(request.refs):
            key = ""
            try:
                key, resolved = self._ref_key(ref)
                plan = self._lookup(key, resolved.target if resolved else parse_key(key).target, resolved.family if resolved else None)
                if plan is not None:
                    yield pb.PrefetchItem(index=index, key=key, plan=plan.proto, source=pb.COMPILE_SOURCE_HIT)
                elif not request.compile_missing:
                    raise NotFound(f"no stored plan {key} (compile_missing is off)")
                elif resolved is None:
                    raise NotFound(f"no stored plan {key}; send its spec, target and options to have it compiled")
                else:
                    building.append((index, resolved, *self._start_build(resolved)))
            except PlanCacheError as e:
                yield _error_item(index, key, e)
        for index, resolved, job_id, started in building:
            try:
                plan = self._builds.wait(resolved.plan_key, job_id, deadline)
            except PlanCacheError as e:
                if started:
                    self._stats.incr(Counter.FAILURES, target_id=resolved.target.id, family=resolved.family)
                yield _error_item(index, resolved.plan_key, e)
                continue
            source = pb.COMPILE_SOURCE_COMPILED if started else pb.COMPILE_SOURCE_JOINED
            yield pb.PrefetchItem(index=index, key=resolved.plan_key, plan=plan.proto, source=source)

    def _ref_key(self, ref: pb.PlanRef) -> tuple[str, ResolvedQuery | None]:
        kind = ref.WhichOneof("ref")
        if kind == "key":
            parse_key(ref.key)
            return ref.key, None
        if kind == "query":
            resolved = self.resolve(ref.query.spec, ref.query.target, ref.query.options)
            return resolved.plan_key, resolved
        raise InvalidRequest("a plan reference needs a plan key, or a spec with its target and options")

    def get(self, ref: pb.PlanRef) -> StoredPlan:
        plan_key, resolved = self._ref_key(ref)
        plan = self._lookup(plan_key, resolved.target if resolved else parse_key(plan_key).target, resolved.family if resolved else None)
        if plan is None:
            raise NotFound(f"no stored plan {plan_key} (GetPlan never compiles; use Compile)")
        return plan

    def invalidate(self, request: pb.InvalidateRequest) -> int:
        """Delete stored plans: one key, every plan of a spec, or of a target."""
        what = request.WhichOneof("what")
        if what == "key":
            parse_key(request.key)
            doomed = [request.key]
        elif what == "spec_hash":
            if len(request.spec_hash) != 64:
                raise InvalidRequest("spec_hash must be 64 hex digits")
            doomed = self._store.keys_of_spec(request.spec_hash)
        elif what == "target_id":
            doomed = self._store.keys_of_target(Target.parse(request.target_id).id)
        else:
            raise InvalidRequest("Invalidate needs a key, a spec_hash or a target_id")
        deleted = 0
        for key in doomed:
            if self._store.get(key) is not None:
                deleted += 1
            self._store.delete(key)
        self._stats.forget_plans(doomed)
        log.warning("invalidated %d plan(s) (%s %s)", deleted, what, getattr(request, what or "key"))
        return deleted

    def explain(self, query: pb.PlanQuery) -> pb.ExplainResponse:
        """How the asked key differs from the stored keys of the same spec."""
        resolved = self.resolve(query.spec, query.target, query.options)
        asked = parse_key(resolved.plan_key)
        stored = self._store.get(resolved.plan_key) is not None
        variants = []
        for key in self._store.keys_of_spec(asked.spec_hash):
            if key == resolved.plan_key or self._store.get(key) is None:
                continue
            other = parse_key(key)
            variants.append(pb.StoredVariant(key=key, differences=_differences(resolved.target, other.target, asked.options_id, other.options_id)))
        if stored:
            summary = "stored: a lookup hits"
        elif variants:
            summary = f"not stored for this target and options; {len(variants)} plan(s) of the same spec are stored under other keys"
        else:
            summary = "no plan of this spec is stored under any target or options (the spec differs from every stored one, or was never compiled)"
        return pb.ExplainResponse(key=resolved.plan_key, stored=stored, spec_hash=asked.spec_hash, variants=variants, summary=summary)

    def drain_worker(self, worker_id: str) -> bool:
        if not worker_id or len(worker_id) > 256:
            raise InvalidRequest("DrainWorker needs a worker id (see ListTargets)")
        known = self._queue.request_drain(worker_id)
        log.warning("asked worker %s to drain (%s)", worker_id, "live" if known else "not live now")
        return known

    def list_targets(self) -> list[pb.TargetInfo]:
        infos = []
        for target_id in self._queue.known_targets():
            workers = self._queue.workers_of(target_id)
            infos.append(pb.TargetInfo(target_id=target_id, live_workers=len(workers), worker_ids=workers))
        return infos

    def stats(self) -> pb.GetStatsResponse:
        readings = self._stats.read()
        response = pb.GetStatsResponse()
        for target_id in sorted(target_ids(readings) | set(self._queue.known_targets())):
            windows = readings.get(target_scope(target_id), {})
            total = windows.get("total", {})
            try:
                workers = self._queue.live_workers(Target.parse(target_id))
            except InvalidRequest:
                workers = 0
            row = _window(total, "total")
            response.targets.append(
                pb.TargetStats(
                    target_id=target_id, hits=row.hits, misses=row.misses, compiles=row.compiles, failures=row.failures, joined=row.joined,
                    live_workers=workers, bytes_served=row.bytes_served, build_seconds_saved=row.build_seconds_saved,
                    windows=[_window(windows.get(w, {}), w) for w in WINDOWS],
                )
            )  # fmt: skip
        for scope in sorted(readings):
            if scope.startswith("family:"):
                response.op_families.append(
                    pb.FamilyStats(family=scope.removeprefix("family:"), windows=[_window(readings[scope].get(w, {}), w) for w in WINDOWS])
                )
        return response


def _error_item(index: int, key: str, error: PlanCacheError) -> pb.PrefetchItem:
    return pb.PrefetchItem(index=index, key=key, error=pb.PrefetchError(code=error.code.name, message=error.message, error_class=type(error).__name__))


def _differences(asked: Target, stored: Target, asked_options: str, stored_options: str) -> list[str]:
    parts = [
        ("compute capability", asked.compute_capability, stored.compute_capability),
        ("cuDNN version", asked.cudnn_version, stored.cudnn_version),
        ("frontend version", asked.frontend_version, stored.frontend_version),
        ("device", slug(asked.device_name) or "(any)", slug(stored.device_name) or "(any)"),  # keys hold the slug
        ("SM count", asked.sm_count or "(any)", stored.sm_count or "(any)"),
        ("options", asked_options, stored_options),
    ]
    return [f"{name}: stored {theirs}, asked {ours}" for name, ours, theirs in parts if str(ours) != str(theirs)]


def _window(values: dict[str, float], window: str) -> pb.WindowStats:
    def count(counter: Counter) -> int:
        return round(values.get(counter.value, 0.0))

    return pb.WindowStats(
        window=window, hits=count(Counter.HITS), misses=count(Counter.MISSES), compiles=count(Counter.COMPILES), failures=count(Counter.FAILURES),
        joined=count(Counter.JOINED), bytes_served=count(Counter.BYTES_SERVED), build_seconds_saved=values.get(Counter.SECONDS_SAVED.value, 0.0),
    )  # fmt: skip

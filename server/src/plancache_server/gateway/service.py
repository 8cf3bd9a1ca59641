"""The domain object behind the gRPC servicer: compile, get, prefetch, stats.

Everything here speaks plancache types and raises plancache errors; the
servicer only converts protos, and the interceptors map the errors. Plans
go out as bytes serialized once per plan (see StoredPlan), whatever the
number of callers they are sent to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence

from plancache.errors import InvalidRequest, NotFound, PlanCacheError, ResourceExhausted, TargetUnavailable
from plancache.graphspec.validation import Limits
from plancache.keys.plankey import parse_key
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target, slug
from plancache.v1 import plancache_pb2 as pb
from plancache.wire.rich_status import bounded, duration
from plancache_server import telemetry
from plancache_server.gateway.builds import Builds, Waiter
from plancache_server.gateway.offload import CpuOffload
from plancache_server.store import fleet
from plancache_server.store.directory import WorkerDirectory
from plancache_server.store.jobs import JobQueue
from plancache_server.store.lifecycle import Janitor, TargetUsage
from plancache_server.store.plans import PlanStore, StoredPlan
from plancache_server.store.stats import WINDOWS, Counter, Stats, target_ids, target_scope

log = logging.getLogger(__name__)

# Resolved queries remembered by their wire form: a herd sends the same
# specs thousands of times, and normalizing and hashing one costs far more
# than looking it up. Large specs are not remembered.
RESOLVED_KEPT = 4096
# Race outcomes one ReportFirstUses may carry (a client batches at most 256).
MAX_FIRST_USES = 1024
# Outcome and race counts one ReportFirstUses may carry (a client sends at most 256 and 15).
MAX_OUTCOMES = 512
MAX_RACES = 64
# Compile's answer to a miss the caller races (answer_miss_at_once): no plan, the build under way.
BUILDING = pb.CompileResponse(source=pb.COMPILE_SOURCE_BUILDING).SerializeToString()
RESOLVED_MAX_SPEC_BYTES = 64 * 1024


class PlanService:
    def __init__(
        self,
        store: PlanStore,
        queue: JobQueue,
        builds: Builds,
        stats: Stats,
        directory: WorkerDirectory,
        offload: CpuOffload,
        limits: Limits,
        compile_timeout_s: float,
        max_prefetch_refs: int,
        janitor: Janitor,
    ) -> None:
        self._janitor = janitor
        self._store = store
        self._queue = queue
        self._builds = builds
        self._stats = stats
        self._directory = directory
        self._offload = offload
        self._limits = limits
        self._compile_timeout_s = compile_timeout_s
        self._max_prefetch_refs = max_prefetch_refs
        self._resolved: OrderedDict[tuple[bytes, bytes, bytes], PlanQuery] = OrderedDict()

    # ---- resolving requests --------------------------------------------------

    async def resolve(self, spec: pb.GraphSpec, target: pb.Target, options: pb.CompileOptions) -> PlanQuery:
        """Validate everything the caller sent and compute the plan key."""
        size = spec.ByteSize()
        if size > RESOLVED_MAX_SPEC_BYTES:
            return await self._offload.run(size, self.resolve_now, spec, target, options)
        wire = (
            spec.SerializeToString(deterministic=True),
            target.SerializeToString(deterministic=True),
            options.SerializeToString(deterministic=True),
        )
        resolved = self._resolved.get(wire)
        if resolved is None:
            resolved = self.resolve_now(spec, target, options)
            self._resolved[wire] = resolved
            if len(self._resolved) > RESOLVED_KEPT:
                self._resolved.popitem(last=False)
        return resolved

    def resolve_now(self, spec: pb.GraphSpec, target: pb.Target, options: pb.CompileOptions) -> PlanQuery:
        """A caller's query, validated and normalized here (what it claims is not trusted), its key derived."""
        query = PlanQuery.from_wire(spec, target, options, self._limits, refuse_unknown_fields=True)
        query.key  # noqa: B018 - hashed now, on this thread (a large spec's resolve runs in the CPU offload)
        return query

    async def _ref_key(self, ref: pb.PlanRef) -> tuple[str, PlanQuery | None]:
        kind = ref.WhichOneof("ref")
        if kind == "key":
            parse_key(ref.key)
            return ref.key, None
        if kind == "query":
            resolved = await self.resolve(ref.query.spec, ref.query.target, ref.query.options)
            return resolved.key, resolved
        raise InvalidRequest("a plan reference needs a plan key, or a spec with its target and options")

    def _deadline(self, time_remaining: float | None) -> float:
        budget = self._compile_timeout_s if time_remaining is None else min(time_remaining, self._compile_timeout_s)
        return time.monotonic() + budget

    # ---- lookups and builds --------------------------------------------------

    async def _lookup(
        self, plan_key: str, target_id: str, family: str | None = None, tuned_only: bool = False, count: bool = True
    ) -> StoredPlan | None:
        """The stored plan, counted as a hit (with the bytes it serves and the
        build time it saves) or a miss of its target and op family. A key
        whose build callers here already wait for is a miss without asking
        Redis: a herd of callers costs one read, when the plan lands. A
        provisional plan is a miss for a caller who wants the tuned one."""
        plan = self._store.cached(plan_key)
        if plan is None and not self._builds.flying(plan_key):
            plan = await self._store.get(plan_key)
        if plan is not None and tuned_only and plan.provisional:
            plan = None
        if count:
            self._count(plan_key, plan, target_id, family)
        return plan

    def _count(self, plan_key: str, plan: StoredPlan | None, target_id: str, family: str | None) -> None:
        if family is None and plan is not None:  # a lookup by key: the plan knows its family
            family = plan.metadata.op_family or None
        if plan is None:
            self._stats.incr(Counter.MISSES, target_id=target_id, family=family)
        else:
            saved = plan.metadata.build_seconds + plan.metadata.autotune_seconds
            self._stats.hit(plan_key, len(plan.blob), saved, target_id=target_id, family=family)
        telemetry.child(
            telemetry.LOOKUPS, self._directory.scope(target_id), "hit" if plan is not None else "miss"
        ).inc()

    async def _start_build(self, resolved: PlanQuery, tuned_only: bool = False, count: bool = True) -> Waiter:
        """Wait for the build of a missing plan: started here, or joined (counted unless not `count`)."""
        try:
            waiter = await self._builds.join(resolved.target, resolved.key, resolved.proto, tuned_only)
        except TargetUnavailable:  # the first caller learns it while the build is being queued
            self._stats.incr(Counter.REFUSED, target_id=resolved.target.id, family=resolved.op_family)
            raise
        if count or waiter.started:
            self._stats.incr(
                Counter.COMPILES if waiter.started else Counter.JOINED,
                target_id=resolved.target.id,
                family=resolved.op_family,
            )
        if waiter.started:
            log.info("started the build of %s (job %s)", resolved.key, waiter.flight.job_id)
        return waiter

    def _failed(self, waiter: Waiter, resolved: PlanQuery, error: PlanCacheError) -> None:
        if isinstance(error, TargetUnavailable):  # no build happened: a refusal, counted per caller
            self._stats.incr(Counter.REFUSED, target_id=resolved.target.id, family=resolved.op_family)
        elif waiter.started:
            self._stats.incr(Counter.FAILURES, target_id=resolved.target.id, family=resolved.op_family)

    # ---- calls -----------------------------------------------------------------

    async def compile(
        self, request: pb.CompileRequest, time_remaining: float | None, when_sent: Callable[[Callable[[], None]], None]
    ) -> bytes:
        """A serialized CompileResponse. `when_sent(callback)` calls back once
        the response is written (it frees the caller's delivery slot)."""
        resolved = await self.resolve(request.spec, request.target, request.options)
        count = not request.counted  # the caller's own earlier request (answer_miss_at_once) was counted
        plan = await self._lookup(resolved.key, resolved.target.id, resolved.op_family, request.tuned_only, count=count)
        if plan is not None:
            return plan.compile_response(
                pb.COMPILE_SOURCE_HIT
            )  # a stored plan, provisional or not (its metadata says which)
        waiter = await self._start_build(resolved, request.tuned_only, count=count)
        if (
            request.answer_miss_at_once
        ):  # a hedged miss: the caller builds meanwhile, and asks again (counted) for this build
            waiter.release()
            return BUILDING
        when_sent(waiter.release)
        try:
            plan = await waiter.result(self._deadline(time_remaining))
        except PlanCacheError as e:
            self._failed(waiter, resolved, e)
            raise
        # A counted request is the second half of a hedged compile: the build its first half started or joined (said as compiled).
        return plan.compile_response(
            _source(plan, pb.COMPILE_SOURCE_COMPILED if waiter.started or request.counted else pb.COMPILE_SOURCE_JOINED)
        )

    async def report(self, request: pb.ReportFirstUsesRequest) -> pb.ReportFirstUsesResponse:
        """A node's background report: first uses, and its graphs' outcomes and races (see count_outcomes)."""
        if len(request.outcomes) > MAX_OUTCOMES or len(request.races) > MAX_RACES:
            raise ResourceExhausted(
                f"a ReportFirstUses takes at most {MAX_OUTCOMES} outcomes and {MAX_RACES} races: send several"
            )
        counted = await self.report_first_uses(request.uses)
        return pb.ReportFirstUsesResponse(
            counted=counted, outcomes_counted=self.count_outcomes(request.outcomes, request.races)
        )

    def count_outcomes(self, entries: Sequence[pb.OutcomeCount], races: Sequence[pb.RaceCount]) -> int:
        """Add a node's counts to the fleet's, every label folded into its
        fixed set (plancache_server.store.fleet) and every count bounded:
        a report can add to counts, never a label value."""
        counted = 0
        for entry in entries:
            labels = fleet.labels(entry)
            amount = fleet.count_of(entry)
            if labels is None or not amount:
                continue
            target = self._directory.scope(entry.target_id)
            self._stats.fleet(target, labels.field(), amount)
            telemetry.child(
                telemetry.FLEET_GRAPHS, target, labels.path, labels.outcome, labels.reason, labels.node_type
            ).inc(amount)
            member = fleet.local_spec_member(target, labels, entry.spec_hash) if entry.spec_hash else None
            if member is not None:
                self._stats.local_spec(member, amount)
            counted += 1
        for race in races:
            field, amount = fleet.race_field(race), fleet.count_of(race)
            if field is None or not amount:
                continue
            self._stats.race(field, amount)
            telemetry.child(telemetry.FLEET_RACES, *field.split(fleet.SEP)).inc(amount)
            counted += 1
        return counted

    async def report_first_uses(self, uses: Sequence[pb.FirstUse]) -> int:
        """Count how hedged misses ended on a node. Only a plan this service
        knows (stored, or being built here) is counted, once per report:
        a report cannot invent keys or targets."""
        if len(uses) > MAX_FIRST_USES:
            raise ResourceExhausted(
                f"a ReportFirstUses takes at most {MAX_FIRST_USES} uses, this one has {len(uses)}: send several"
            )
        counted = 0
        for plan_key, local in {use.plan_key: use.local for use in uses}.items():
            try:
                target_id = parse_key(plan_key).target.id
            except PlanCacheError:
                continue
            if (
                not self._builds.flying(plan_key)
                and self._store.cached(plan_key) is None
                and await self._store.get(plan_key) is None
            ):
                continue
            self._stats.incr(Counter.FIRST_USES_LOCAL if local else Counter.FIRST_USES_SERVED, target_id=target_id)
            counted += 1
        return counted

    async def get(self, ref: pb.PlanRef) -> StoredPlan:
        if ref.WhichOneof("ref") == "key":  # a fleet node's fetch by key, from memory: nothing to await
            plan = self._store.cached(ref.key)
            if plan is not None:
                self._count(ref.key, plan, parse_key(ref.key).target.id, None)
                return plan
        plan_key, resolved = await self._ref_key(ref)
        plan = await self._lookup(
            plan_key,
            resolved.target.id if resolved else parse_key(plan_key).target.id,
            resolved.op_family if resolved else None,
        )
        if plan is None:
            raise NotFound(f"no stored plan {plan_key} (GetPlan never compiles; use Compile)")
        return plan

    async def prefetch(
        self, request: pb.PrefetchRequest, time_remaining: float | None
    ) -> AsyncIterator[bytes | pb.PrefetchItem]:
        """Stored plans first, then, with compile_missing, each build as it
        finishes. A failure answers its own item and never ends the stream.

        Every missing plan's build is queued before the first plan is sent,
        so a slow reader delays nothing but itself; and the stream holds no
        copy of a plan: it writes one item at a time, paced by the gRPC
        window (a caller that stops reading holds one message, not a thread).
        """
        refs = request.refs
        if len(refs) > self._max_prefetch_refs:
            raise ResourceExhausted(
                f"a Prefetch takes at most {self._max_prefetch_refs} plan refs, this one has {len(refs)}: split the manifest"
            )
        deadline = self._deadline(time_remaining)
        stored: list[tuple[int, str]] = []
        waiting: dict[asyncio.Future[StoredPlan], tuple[int, Waiter, PlanQuery]] = {}
        try:
            for index, ref in enumerate(refs):
                key = ""
                try:
                    key, resolved = await self._ref_key(ref)
                    target_id = resolved.target.id if resolved else parse_key(key).target.id
                    plan = await self._lookup(
                        key, target_id, resolved.op_family if resolved else None, request.tuned_only
                    )
                    if plan is not None:
                        stored.append((index, key))
                    elif not request.compile_missing:
                        raise NotFound(
                            f"no {'autotuned ' if request.tuned_only else ''}stored plan {key} (compile_missing is off)"
                        )
                    elif resolved is None:
                        raise NotFound(f"no stored plan {key}; send its spec, target and options to have it compiled")
                    else:
                        waiter = await self._start_build(resolved, request.tuned_only)
                        waiting[waiter.future] = (index, waiter, resolved)
                except PlanCacheError as e:
                    yield _error_item(index, key, e)
            for index, key in stored:
                # From the memory cache as a rule; read again otherwise (the
                # stream keeps keys, not plans, while the caller reads).
                plan = self._store.cached(key) or await self._store.get(key)
                yield (
                    plan.prefetch_item(index, key, pb.COMPILE_SOURCE_HIT)
                    if plan
                    else _error_item(index, key, NotFound(f"plan {key} was deleted meanwhile"))
                )
            while waiting:
                done, _ = await asyncio.wait(
                    waiting, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    for index, waiter, _ in waiting.values():
                        yield _error_item(index, waiter.plan_key, waiter.timeout())
                    break
                for future in done:
                    index, waiter, resolved = waiting.pop(future)
                    try:
                        try:
                            plan = future.result()
                        except PlanCacheError as e:
                            self._failed(waiter, resolved, e)
                            yield _error_item(index, resolved.key, e)
                            continue
                        source = pb.COMPILE_SOURCE_COMPILED if waiter.started else pb.COMPILE_SOURCE_JOINED
                        yield plan.prefetch_item(index, resolved.key, _source(plan, source))
                    finally:
                        waiter.release()  # resumed: the item is written, its delivery slot is free
        finally:
            for _, waiter, _ in waiting.values():
                waiter.release()

    async def list_plans(self, target_id: str) -> list[str]:
        """Stored plan keys, of one target or all."""
        if target_id:
            return await self._store.keys_of_target(Target.parse(target_id).id)
        return await self._store.keys_of_target(None)

    async def invalidate(self, request: pb.InvalidateRequest) -> int:
        """Delete stored plans: one key, every plan of a spec, or of a target."""
        what = request.WhichOneof("what")
        if what == "key":
            parse_key(request.key)
            doomed = [request.key]
        elif what == "spec_hash":
            if len(request.spec_hash) != 64:
                raise InvalidRequest("spec_hash must be 64 hex digits")
            doomed = await self._store.keys_of_spec(request.spec_hash)
        elif what == "target_id":
            doomed = await self._store.keys_of_target(Target.parse(request.target_id).id)
        else:
            raise InvalidRequest("Invalidate needs a key, a spec_hash or a target_id")
        removed = await asyncio.to_thread(lambda: [key for key in doomed if self._janitor.remove(key, "invalidated")])
        for key in doomed:
            self._store.forget(key)
        deleted = len(removed)
        await self._stats.forget_plans(doomed)
        log.warning(
            "invalidated %d plan(s) (%s %s)", deleted, what, bounded(str(getattr(request, what or "key")))[:200]
        )
        return deleted

    async def explain(self, query: pb.PlanQuery) -> pb.ExplainResponse:
        """How the asked key differs from the stored keys of the same spec."""
        resolved = await self.resolve(query.spec, query.target, query.options)
        asked = parse_key(resolved.key)
        stored = await self._store.get(resolved.key) is not None
        variants = []
        for key in await self._store.keys_of_spec(asked.spec_hash):
            if key == resolved.key or await self._store.get(key) is None:
                continue
            other = parse_key(key)
            variants.append(
                pb.StoredVariant(
                    key=key, differences=_differences(resolved.target, other.target, asked.options_id, other.options_id)
                )
            )
        if stored:
            summary = "stored: a lookup hits"
        elif variants:
            summary = f"not stored for this target and options; {len(variants)} plan(s) of the same spec are stored under other keys"
        else:
            summary = "no plan of this spec is stored under any target or options (the spec differs from every stored one, or was never compiled)"
        return pb.ExplainResponse(
            key=resolved.key, stored=stored, spec_hash=asked.spec_hash, variants=variants, summary=summary
        )

    async def drain_worker(self, worker_id: str) -> bool:
        if not worker_id or len(worker_id) > 256:
            raise InvalidRequest("DrainWorker needs a worker id (see ListTargets)")
        known = await self._queue.request_drain(worker_id)
        log.warning("asked worker %s to drain (%s)", worker_id, "live" if known else "not live now")
        return known

    async def list_targets(self) -> list[pb.TargetInfo]:
        await self._directory.refresh()
        return [
            pb.TargetInfo(target_id=t, live_workers=len(w), worker_ids=w)
            for t, w in sorted(self._directory.live.items())
        ]

    async def stats(self) -> pb.GetStatsResponse:
        await self._directory.refresh()
        readings = await self._stats.read()
        usage = await asyncio.to_thread(self._janitor.usage)
        live = self._directory.live
        response = pb.GetStatsResponse()
        for target_id in sorted(
            target_ids(readings) | set(live) | {t for t, u in usage.items() if u.stored_plans or u.evicted or u.expired}
        ):
            windows = readings.get(target_scope(target_id), {})
            row = _window(windows.get("total", {}), "total")
            stored = usage.get(target_id, TargetUsage())
            response.targets.append(
                pb.TargetStats(
                    target_id=target_id,
                    hits=row.hits,
                    misses=row.misses,
                    compiles=row.compiles,
                    failures=row.failures,
                    joined=row.joined,
                    live_workers=len(live.get(target_id, ())),
                    bytes_served=row.bytes_served,
                    build_seconds_saved=row.build_seconds_saved,
                    windows=[_window(windows.get(w, {}), w) for w in WINDOWS],
                    stored_bytes=stored.stored_bytes,
                    stored_plans=stored.stored_plans,
                    evicted=stored.evicted,
                    expired=stored.expired,
                )
            )
        for scope in sorted(readings):
            if scope.startswith("family:"):
                response.op_families.append(
                    pb.FamilyStats(
                        family=scope.removeprefix("family:"),
                        windows=[_window(readings[scope].get(w, {}), w) for w in WINDOWS],
                    )
                )
        return response


def _source(plan: StoredPlan, source: int) -> int:
    """How a built plan reached its caller; a provisional one says so
    instead. A stored plan is a hit, provisional or not (its metadata says)."""
    return pb.COMPILE_SOURCE_PROVISIONAL if plan.provisional else source


def _error_item(index: int, key: str, error: PlanCacheError) -> pb.PrefetchItem:
    item = pb.PrefetchItem(
        index=index,
        key=key,
        error=pb.PrefetchError(code=error.code.name, message=bounded(error.message), error_class=type(error).__name__),
    )
    if error.retry_after is not None:
        item.error.retry_delay.CopyFrom(duration(error.retry_after))
    return item


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
        window=window,
        hits=count(Counter.HITS),
        misses=count(Counter.MISSES),
        compiles=count(Counter.COMPILES),
        failures=count(Counter.FAILURES),
        joined=count(Counter.JOINED),
        bytes_served=count(Counter.BYTES_SERVED),
        build_seconds_saved=values.get(Counter.SECONDS_SAVED.value, 0.0),
        refused=count(Counter.REFUSED),
        untrusted_builds=count(Counter.UNTRUSTED),
    )

"""Client: compile or fetch plans from a plancache server.

    with Client("plancache.internal:50051") as client:
        plan = client.compile(spec)          # target detected from the local GPU
        plan.execute({"A": a, "B": b, "C": c})

gRPC failures come back as typed plancache errors (SpecError,
TargetUnavailable, NotFound, ...), raised `from` the grpc.RpcError.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc

from plancache.errors import CompileTimeout, InvalidRequest, PlanCacheError, UntrustedPlan, error_from_status
from plancache.graphspec import spec_io
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.family import Family
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.validation import normalize
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import parse_key
from plancache.keys.target import Target
from plancache.run.local import LocalPlan
from plancache.run.plan import SOURCE_NAMES, Plan
from plancache.transport import outcomes
from plancache.transport.background import BackgroundPrefetch
from plancache.transport.calls import remaining, retry_pause, typed
from plancache.transport.hedge import (
    NOT_HEDGED,
    FrontendBuilder,
    LocalBuilder,
    Race,
    Raced,
    hedge_after_s,
    hedge_default,
    run_race,
)
from plancache.transport.manifest import Manifest
from plancache.transport.reports import Reports
from plancache.transport.results import FamilyStatus, PrefetchResult, TargetInfo, TargetStats, WindowCounts
from plancache.trust.answers import Asked
from plancache.trust.disk_cache import DiskCache
from plancache.trust.signing import TrustPolicy
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache.warm import WarmStatus
from plancache.wire import outcome_labels
from plancache.wire.rich_status import seconds_of

Response = TypeVar("Response")
T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
# A miss builds and autotunes on a GPU: seconds to minutes.
DEFAULT_COMPILE_TIMEOUT_S = 900.0
MAX_MESSAGE_BYTES = 64 * 2**20
# Plans this node built itself (hedged misses), held for a compile() of the same key again.
LOCAL_PLANS_HELD = 1024
# Seconds a background report (ReportFirstUses) may take.
REPORT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class TLSConfig:
    """TLS to the server: `ca` verifies it (default: the system roots);
    `cert` and `key` are this client's certificate for mutual TLS."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca), private_key=read(self.key), certificate_chain=read(self.cert)
        )


class Client:
    def __init__(
        self,
        server: str | grpc.Channel,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT_S,
        cache: DiskCache | bool = True,
        trusted_keys: Sequence[Path | str | bytes] = (),
        allow_unsigned: bool | None = None,
        token: str | None = None,
        tls: TLSConfig | None = None,
        hedge: bool | None = None,
        local_builder: LocalBuilder | None = None,
        report: bool | None = None,
    ) -> None:
        """`server` is "host:port" (an insecure channel is opened and owned)
        or a grpc.Channel the caller configured and keeps owning. `cache`:
        the disk cache (default: one under the XDG cache folder; False: none);
        plans it holds are verified and cost no network call.
        `trusted_keys`: Ed25519 public keys (PEM bytes or paths; default
        PLANCACHE_TRUSTED_KEYS) whose signatures this client accepts; every
        plan is checked before anyone can deserialize it. `allow_unsigned`
        (default PLANCACHE_ALLOW_UNSIGNED=1) accepts unsigned plans.
        `token`: bearer token sent with every call (default PLANCACHE_TOKEN).
        `tls`: connect over TLS (mutual TLS with a client certificate).
        `hedge`: on a miss, build the plan here too and run whichever is
        ready first (plancache.transport.hedge; default PLANCACHE_HEDGE, on;
        only where this process can build for the target).
        `local_builder`: how this node builds (default: its cuDNN frontend).
        `report`: tell the service, in the background, how this process's
        graphs and races ended (plancache.transport.reports; default
        PLANCACHE_REPORT, on)."""
        self._metadata = (
            (("authorization", f"Bearer {token or os.environ['PLANCACHE_TOKEN']}"),)
            if token or os.environ.get("PLANCACHE_TOKEN")
            else ()
        )
        if isinstance(server, str):
            options = [
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ]
            if tls is not None:
                self._channel = grpc.secure_channel(server, tls.credentials(), options=options)
            else:
                self._channel = grpc.insecure_channel(server, options=options)
            self._owns_channel = True
        else:
            self._channel = server
            self._owns_channel = False
        self._stub = pb_grpc.PlanCacheStub(self._channel)
        self.timeout = timeout
        self.compile_timeout = compile_timeout
        self.cache: DiskCache | None = DiskCache() if cache is True else (cache or None)
        self.trust = TrustPolicy.create(trusted_keys, allow_unsigned)
        self.hedge = hedge_default() if hedge is None else hedge
        self.hedge_after_s = hedge_after_s()
        self.local_builder: LocalBuilder = local_builder or FrontendBuilder()
        self._local_plans: OrderedDict[str, LocalPlan] = OrderedDict()
        self._reports = Reports(self._report, enabled=outcomes.report_default() if report is None else report)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._reports.close()
        if self._owns_channel:
            self._channel.close()

    # ---- calls --------------------------------------------------------------

    def compile(
        self,
        spec: GraphSpec,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *,
        timeout: float | None = None,
        tuned_only: bool = False,
        hedge: bool | None = None,
        hedge_path: str = "compile",
    ) -> Plan:
        """The plan for `spec` on `target` (default: this machine's GPU 0):
        from the disk cache, stored on the server, or built and autotuned on
        a GPU worker of that target. A first build answers with cuDNN's
        heuristic plan (`plan.provisional`) as soon as it exists, while the
        autotuned one is built; `tuned_only=True` waits for the tuned plan.
        On a miss, with `hedge` (default: the client's), this node builds
        the plan too and runs whichever is ready first: `plan.source` is
        "local" while its own build runs, until the service's plan takes over.
        `hedge_path`: which counters of race_stats() such a race adds to
        (plancache.functional says "functional")."""
        normalized = normalize(spec)
        resolved, opts = _target(target), options or CompileOptions()
        plan = self._compile(normalized, resolved, opts, timeout, tuned_only, hedge, hedge_path)
        if hedge_path == "compile":  # the front doors (plancache.cudnn, plancache.functional) count their own graphs
            _count(plan, resolved.id, outcome_labels.anchor_of_ops(n.op for n in normalized.nodes))
        return plan

    def _compile(
        self,
        normalized: GraphSpec,
        resolved: Target,
        opts: CompileOptions,
        timeout: float | None,
        tuned_only: bool,
        hedge: bool | None,
        hedge_path: str,
    ) -> Plan:
        asked = Asked.query(hash_normalized(normalized), resolved, opts)
        cached = self._cached(asked.key, tuned_only)
        if cached is not None:
            return cached
        hedged = not tuned_only and (self.hedge if hedge is None else hedge) and self.local_builder.can_build(resolved)
        request = pb.CompileRequest(
            spec=spec_io.to_proto(normalized),
            target=resolved.to_proto(),
            options=opts.to_proto(),
            tuned_only=tuned_only,
            answer_miss_at_once=hedged,
        )
        budget = timeout if timeout is not None else self.compile_timeout
        if hedged:
            held = self._local_plans.get(asked.key)
            if held is not None and held.local and held.waiting:
                return held  # the service's plan is on its way to it

            def build() -> Plan:
                if (
                    held is not None and held.local
                ):  # the service failed it: asked again, this node's plan reused, not rebuilt
                    return held
                return self.local_builder.build(normalized, opts, asked.key, resolved)

            raced = self._race(request, asked, budget, build, hedge_path)
            if raced.plan is not None:
                return raced.plan
            plan = raced.local
            assert plan is not None and raced.race is not None
            if isinstance(plan, LocalPlan):
                plan.replace_with(raced.race)
                self._hold(plan)
            return plan
        response = self._call(self._stub.Compile, request, budget)
        return self._remember(Plan.from_proto(response.plan, SOURCE_NAMES.get(response.source, "stored")), asked)

    def race(
        self,
        spec: GraphSpec,
        target: Target | str | None,
        options: CompileOptions | None,
        build: Callable[[], T],
        *,
        path: str,
        timeout: float | None = None,
    ) -> Raced[T]:
        """A hedged miss with the caller's own build: the stored plan (disk
        cache, or the server's: `build` never runs), else `build()` run on
        this thread while the service builds, and whichever is ready first
        (plancache.transport.hedge). plancache.cudnn races the program's own
        build this way. `path` names the front door in race_stats()."""
        normalized = normalize(spec)
        resolved, opts = _target(target), options or CompileOptions()
        asked = Asked.query(hash_normalized(normalized), resolved, opts)
        cached = self._cached(asked.key, tuned_only=False)
        if cached is not None:
            return Raced(plan=cached)
        request = pb.CompileRequest(
            spec=spec_io.to_proto(normalized),
            target=resolved.to_proto(),
            options=opts.to_proto(),
            answer_miss_at_once=True,
        )
        return self._race(request, asked, timeout if timeout is not None else self.compile_timeout, build, path)

    def _race(
        self, request: pb.CompileRequest, asked: Asked, budget: float | None, build: Callable[[], T], path: str
    ) -> Raced[T]:
        """A hedged miss (plancache.transport.hedge): `request` (with
        answer_miss_at_once) asked as a hit is, one unary Compile on this
        thread; on a miss, `build()` here while a thread waits for the
        service's plan (a second Compile, for the same build, counted once)."""
        deadline = None if budget is None else time.monotonic() + budget

        def remember(response: pb.CompileResponse) -> Plan:
            return self._remember(Plan.from_proto(response.plan, SOURCE_NAMES.get(response.source, "stored")), asked)

        error: PlanCacheError | None = None
        try:
            # Bounded: a server that cannot say hit or miss within hedge_after_s is as good as a miss.
            response = self._call(
                self._stub.Compile, request, self.hedge_after_s if budget is None else min(self.hedge_after_s, budget)
            )
            if response.source != pb.COMPILE_SOURCE_BUILDING:
                return Raced(plan=remember(response))  # a hit (or a plan the server had at once): nothing to race
        except PlanCacheError as e:  # down, refusing, slow, or a hit that failed verification
            if isinstance(e, NOT_HEDGED):
                raise
            error = e
        follow = pb.CompileRequest()
        follow.CopyFrom(request)
        follow.answer_miss_at_once, follow.counted = False, error is None
        ask = None
        if (
            error is None or error.retry_after is not None or isinstance(error, CompileTimeout)
        ):  # the service may still answer
            ask = lambda remaining: self._stub.Compile.future(follow, timeout=remaining, metadata=self._metadata)  # noqa: E731
        race = Race(ask, remember, path, deadline, building=error is None, error=error)
        return run_race(race, build, deadline, self._reports.add, asked.key)

    def _hold(self, plan: LocalPlan) -> None:
        self._local_plans[plan.key] = plan
        self._local_plans.move_to_end(plan.key)
        while len(self._local_plans) > LOCAL_PLANS_HELD:
            self._local_plans.popitem(last=False)

    def _report(self, request: pb.ReportFirstUsesRequest) -> None:
        # Short: a report lost costs only the report, and close() sends what is left.
        self._stub.ReportFirstUses(request, timeout=REPORT_TIMEOUT_S, metadata=self._metadata)

    def get(
        self,
        key: str | None = None,
        *,
        spec: GraphSpec | None = None,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        timeout: float | None = None,
    ) -> Plan:
        """A stored plan by key, or by spec + target + options; NotFound otherwise."""
        if (key is None) == (spec is None):
            raise InvalidRequest("get() takes a plan key or a spec, not both")
        node_type = ""
        if key is None:
            assert spec is not None
            normalized = normalize(spec)
            asked = Asked.query(hash_normalized(normalized), _target(target), options or CompileOptions())
            node_type = outcome_labels.anchor_of_ops(n.op for n in normalized.nodes)
        else:
            asked = Asked(key)
        plan = self._cached(asked.key, tuned_only=False)
        if plan is None:
            request = pb.GetPlanRequest(ref=pb.PlanRef(key=asked.key))
            response = self._call(self._stub.GetPlan, request, timeout if timeout is not None else self.timeout)
            plan = self._remember(Plan.from_proto(response.plan), asked)
        _count(plan, parse_key(plan.key).target.id, node_type)
        return plan

    def prefetch(
        self,
        manifest: Manifest,
        target: Target | str | None = None,
        *,
        compile_missing: bool = False,
        progress: Callable[[int, int], None] | None = None,
        timeout: float | None = None,
        tuned_only: bool = False,
        on_plan: Callable[[int, Plan], None] | None = None,
    ) -> PrefetchResult:
        """Every plan of a manifest: from the disk cache, else in ONE streaming
        call (stored plans at once, then, with compile_missing, each build as
        it finishes). Failures are collected per entry, not raised.
        `progress(done, total)` is called as plans arrive. Provisional
        plans held in the disk cache are asked for again (the tuned plan
        replaces them when it exists; they are kept otherwise);
        `tuned_only=True` accepts autotuned plans only. `on_plan(index,
        plan)` is called as each entry's plan is ready. The manifest's graph
        families are asked for first (`result.families`, `family_errors`)."""
        resolved = manifest.target or (
            _target(target)
            if target is not None or any(e.spec for e in manifest.entries) or manifest.families
            else None
        )
        result = PrefetchResult(total=len(manifest.entries))
        for index, family in enumerate(
            manifest.families
        ):  # built by the service (what is not stored); each size a hit at its first use
            try:
                status = self.build_family(family, resolved, manifest.options, timeout=timeout)
                result.families[status.family_key] = status
            except PlanCacheError as e:
                result.family_errors[index] = e
        refs: list[tuple[int, pb.PlanRef]] = []
        held: dict[int, Plan] = {}
        for index, entry in enumerate(manifest.entries):
            try:
                key = manifest.key_of(entry, resolved)
            except PlanCacheError as e:
                result.errors[index] = e
                continue
            result.keys[index] = key
            cached = self._cached(key, tuned_only, refresh=False)
            if cached is not None and cached.provisional:
                held[index] = cached  # asked for again below; kept if nothing better comes
            if cached is not None and not cached.provisional:
                result.plans[index] = cached
                result.from_cache += 1
                if on_plan is not None:
                    on_plan(index, cached)
            elif compile_missing and entry.spec is not None and resolved is not None:
                query = pb.PlanQuery(
                    spec=spec_io.to_proto(normalize(entry.spec)),
                    target=resolved.to_proto(),
                    options=manifest.options.to_proto(),
                )
                refs.append((index, pb.PlanRef(query=query)))
            else:
                refs.append((index, pb.PlanRef(key=key)))
        if progress is not None:
            progress(result.done, result.total)
        budget = timeout if timeout is not None else (self.compile_timeout if compile_missing else self.timeout)
        deadline = None if budget is None else time.monotonic() + budget
        attempt = 0
        while refs:
            # Refs the server refused for now (admission control) are asked
            # for again after its retry delay, within the deadline.
            refused = self._prefetch_once(refs, compile_missing, tuned_only, result, deadline, progress, on_plan)
            pause = (
                retry_pause(max(e.retry_after or 0.0 for _, _, e in refused), attempt, deadline) if refused else None
            )
            if pause is None:
                for index, _, error in refused:
                    result.errors[index] = error
                break
            time.sleep(pause)
            refs, attempt = [(index, ref) for index, ref, _ in refused], attempt + 1
        for index, plan in held.items():
            if index not in result.plans:  # the server had nothing better (or could not be asked)
                result.errors.pop(index, None)
                result.plans[index] = plan
                result.from_cache += 1
                if on_plan is not None:
                    on_plan(index, plan)
        return result

    def prefetch_in_background(
        self,
        manifest: Manifest,
        target: Target | str | None = None,
        *,
        compile_missing: bool = False,
        timeout: float | None = None,
        tuned_only: bool = False,
        load: bool = False,
    ) -> BackgroundPrefetch:
        """`prefetch` on a thread of its own, returning at once: the node
        does its other start-up work (weights, warm-up) meanwhile and waits
        only for the plans it needs (`ready(i)`, `wait_for(i)`, `wait()`).
        `load=True` deserializes each plan on that thread as it arrives
        (needs the [gpu] extra): `plan.execute` then starts at once; a plan
        that does not load is that entry's error."""

        def run(on_plan: Callable[[int, Plan], None]) -> PrefetchResult:
            return self.prefetch(
                manifest,
                target,
                compile_missing=compile_missing,
                timeout=timeout,
                tuned_only=tuned_only,
                on_plan=on_plan,
            )

        return BackgroundPrefetch(run, load)

    def _prefetch_once(
        self,
        refs: list[tuple[int, pb.PlanRef]],
        compile_missing: bool,
        tuned_only: bool,
        result: PrefetchResult,
        deadline: float | None,
        progress: Callable[[int, int], None] | None,
        on_plan: Callable[[int, Plan], None] | None,
    ) -> list[tuple[int, pb.PlanRef, PlanCacheError]]:
        """One streaming call; the refs refused with a retry delay, with their errors."""
        refused: list[tuple[int, pb.PlanRef, PlanCacheError]] = []
        answered: set[int] = set()
        request = pb.PrefetchRequest(
            refs=[ref for _, ref in refs], compile_missing=compile_missing, tuned_only=tuned_only
        )
        try:
            for item in self._stub.Prefetch(request, timeout=remaining(deadline), metadata=self._metadata):
                if not 0 <= item.index < len(refs) or item.index in answered:
                    continue  # not an answer to anything asked
                answered.add(item.index)
                index, ref = refs[item.index]
                error = self._take(result, index, item)
                if error is None and on_plan is not None:
                    on_plan(index, result.plans[index])
                if error is not None and error.retry_after is not None:
                    refused.append((index, ref, error))
                elif error is not None:
                    result.errors[index] = error
                if progress is not None:
                    progress(result.done, result.total)
        except grpc.RpcError as exc:
            error = typed(exc)
            for position, (index, ref) in enumerate(refs):
                if position not in answered:
                    if error.retry_after is not None:
                        refused.append((index, ref, error))
                    else:
                        result.errors[index] = error
        return refused

    def _take(self, result: PrefetchResult, index: int, item: pb.PrefetchItem) -> PlanCacheError | None:
        """Keep the plan of an answer; the error it carries, if any."""
        if item.WhichOneof("result") == "error":
            code = getattr(grpc.StatusCode, item.error.code, grpc.StatusCode.UNKNOWN)
            retry_after = seconds_of(item.error.retry_delay) if item.error.HasField("retry_delay") else None
            return error_from_status(code, item.error.message, item.error.error_class, retry_after)
        try:
            plan = self._remember(
                Plan.from_proto(item.plan, SOURCE_NAMES.get(item.source, "stored")), Asked(result.keys[index])
            )
        except PlanCacheError as e:  # a blob that does not match its sha256, or an untrusted signature
            return e
        result.plans[index] = plan
        if plan.source in ("compiled", "joined", "provisional"):
            result.compiled += 1
        else:
            result.fetched += 1
        return None

    def invalidate(
        self,
        key: str | None = None,
        *,
        spec_hash: str | None = None,
        target: Target | str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Delete stored plans (admin token): one key, a spec's, or a target's. Returns how many."""
        if sum(x is not None for x in (key, spec_hash, target)) != 1:
            raise InvalidRequest("invalidate() takes exactly one of key, spec_hash, target")
        if key is not None:
            request = pb.InvalidateRequest(key=key)
        elif spec_hash is not None:
            request = pb.InvalidateRequest(spec_hash=spec_hash)
        else:
            request = pb.InvalidateRequest(target_id=target.id if isinstance(target, Target) else str(target))
        if self.cache is not None and key is not None:
            self.cache.delete(key)
        response: pb.InvalidateResponse = self._call(
            self._stub.Invalidate, request, timeout if timeout is not None else self.timeout
        )
        return response.deleted

    def explain(
        self,
        spec: GraphSpec,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *,
        timeout: float | None = None,
    ) -> pb.ExplainResponse:
        """Why a lookup misses: stored plans of the same spec and how their keys differ."""
        query = pb.PlanQuery(
            spec=spec_io.to_proto(normalize(spec)),
            target=_target(target).to_proto(),
            options=(options or CompileOptions()).to_proto(),
        )
        response: pb.ExplainResponse = self._call(
            self._stub.Explain, pb.ExplainRequest(query=query), timeout if timeout is not None else self.timeout
        )
        return response

    def drain_worker(self, worker_id: str, *, timeout: float | None = None) -> bool:
        """Ask a worker to finish its current build and leave (admin token).
        Whether a live worker had that id."""
        response: pb.DrainWorkerResponse = self._call(
            self._stub.DrainWorker,
            pb.DrainWorkerRequest(worker_id=worker_id),
            timeout if timeout is not None else self.timeout,
        )
        return response.known

    def list_plans(self, target: Target | str | None = None, *, timeout: float | None = None) -> list[str]:
        """Keys of the stored plans, of one target or all (admin token)."""
        target_id = (target.id if isinstance(target, Target) else Target.parse(target).id) if target is not None else ""
        response: pb.ListPlansResponse = self._call(
            self._stub.ListPlans,
            pb.ListPlansRequest(target_id=target_id),
            timeout if timeout is not None else self.timeout,
        )
        return list(response.keys)

    def warm(
        self,
        target: Target | str,
        *,
        from_target: Target | str | None = None,
        served_days: int | None = None,
        manifest: Manifest | None = None,
        top: int = 0,
        min_hits: float = 0.0,
        timeout: float | None = None,
    ) -> WarmStatus:
        """Plan warming `target` (admin token): its workers build the
        source's specs, most hit in the last 24 h first, at the lowest
        priority. One source: another target's plans, the specs served in the
        last `served_days` days, or a manifest's specs. `top`: at most this
        many (0: the server's default, 1000); `min_hits`: recent hits at least."""
        if sum(x is not None for x in (from_target, served_days, manifest)) != 1:
            raise InvalidRequest("warm() takes exactly one source: from_target, served_days or manifest")
        request = pb.WarmRequest(target_id=_target(target).id, top=top, min_hits=min_hits)
        if from_target is not None:
            request.from_target = _target(from_target).id
        elif served_days is not None:
            request.served_days = served_days
        elif manifest is not None:
            entries = [e for e in manifest.entries if e.spec is not None]
            if len(entries) != len(manifest.entries):
                raise InvalidRequest("a warming manifest needs specs, not only plan keys")
            options = manifest.options.to_proto()
            request.manifest.queries.extend(
                pb.PlanQuery(spec=spec_io.to_proto(normalize(e.spec)), options=options) for e in entries if e.spec
            )
        response: pb.WarmResponse = self._call(
            self._stub.Warm, request, timeout if timeout is not None else self.timeout
        )
        return WarmStatus.from_proto(response.status)

    def cancel_warm(self, target: Target | str, *, timeout: float | None = None) -> WarmStatus:
        """Stop warming `target` (admin token); what was built stays."""
        response: pb.WarmResponse = self._call(
            self._stub.Warm,
            pb.WarmRequest(target_id=_target(target).id, cancel=True),
            timeout if timeout is not None else self.timeout,
        )
        return WarmStatus.from_proto(response.status)

    def warm_status(self, target: Target | str | None = None, *, timeout: float | None = None) -> list[WarmStatus]:
        """Where warming stands: per target (every warmed one, or `target`)."""
        request = pb.WarmStatusRequest(target_id=_target(target).id if target is not None else "")
        response: pb.WarmStatusResponse = self._call(
            self._stub.WarmStatus, request, timeout if timeout is not None else self.timeout
        )
        return [WarmStatus.from_proto(s) for s in response.targets]

    def build_family(
        self,
        family: Family,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *,
        timeout: float | None = None,
    ) -> FamilyStatus:
        """Have every graph of `family` (plancache.graphspec.family) built for
        `target` with `options`: the ones not stored are queued at warming's
        priority (a caller's miss goes first), and from then on each is a
        hit for any node whose graph it is exactly. Returns at once."""
        request = pb.BuildFamilyRequest(
            family=family.to_proto(),
            target=_target(target).to_proto(),
            options=(options or CompileOptions()).to_proto(),
        )
        response: pb.FamilyStatus = self._call(
            self._stub.BuildFamily, request, timeout if timeout is not None else self.timeout
        )
        return FamilyStatus.from_proto(response)

    def family_status(self, family_key: str, *, timeout: float | None = None) -> FamilyStatus:
        """Where a family asked for earlier stands (NotFound if never asked)."""
        response: pb.FamilyStatus = self._call(
            self._stub.GetFamily,
            pb.GetFamilyRequest(family_key=family_key),
            timeout if timeout is not None else self.timeout,
        )
        return FamilyStatus.from_proto(response)

    def list_targets(self, *, timeout: float | None = None) -> list[TargetInfo]:
        """Targets with live workers now: what Compile can build."""
        response = self._call(
            self._stub.ListTargets, pb.ListTargetsRequest(), timeout if timeout is not None else self.timeout
        )
        return [TargetInfo(t.target_id, t.live_workers, tuple(t.worker_ids)) for t in response.targets]

    def _cached(self, key: str, tuned_only: bool, refresh: bool = True) -> Plan | None:
        """The disk cache's plan for `key`, checked. A provisional one is
        none for `tuned_only`; otherwise, with `refresh`, the server is asked
        for the key once more (the tuned plan replaces it when it exists)."""
        plan = self.cache.get(key) if self.cache is not None else None
        if plan is None:
            return None
        try:
            self.trust.check(plan.metadata, plan.signature)
        except UntrustedPlan as e:  # e.g. its key was rotated out: fetch it again
            log.warning("disk cache: %s; fetching it again", e.message)
            return None
        if plan.provisional and tuned_only:
            return None
        if plan.provisional and refresh:
            try:
                response = self._call(self._stub.GetPlan, pb.GetPlanRequest(ref=pb.PlanRef(key=key)), self.timeout)
                return self._remember(Plan.from_proto(response.plan, "stored"), Asked(key))
            except PlanCacheError as e:  # the server cannot say better now: the provisional plan runs
                log.debug("provisional plan %s kept: %s", key, e.message)
        return plan

    def _remember(self, plan: Plan, asked: Asked) -> Plan:
        """Accept a plan from the server: verified (signature, and that it
        answers what was asked) before anything else sees it."""
        self.trust.check(plan.metadata, plan.signature)
        asked.check(plan.metadata)
        if self.cache is not None:
            self.cache.put(plan)
        return plan

    def stats(self, *, timeout: float | None = None) -> list[TargetStats]:
        """Counters per target, shared by every gateway of the deployment."""
        response = self._stats_response(timeout)
        return [
            TargetStats(
                t.target_id,
                t.hits,
                t.misses,
                t.compiles,
                t.failures,
                t.joined,
                t.live_workers,
                t.bytes_served,
                t.build_seconds_saved,
                {w.window: WindowCounts.from_proto(w) for w in t.windows},
                t.stored_bytes,
                t.stored_plans,
                t.evicted,
                t.expired,
            )
            for t in response.targets
        ]

    def family_stats(self, *, timeout: float | None = None) -> dict[str, dict[str, WindowCounts]]:
        """Counters per op family (matmul, conv, sdpa, norm, pointwise ...) and window."""
        response = self._stats_response(timeout)
        return {f.family: {w.window: WindowCounts.from_proto(w) for w in f.windows} for f in response.op_families}

    def _stats_response(self, timeout: float | None) -> pb.GetStatsResponse:
        response: pb.GetStatsResponse = self._call(
            self._stub.GetStats, pb.GetStatsRequest(), timeout if timeout is not None else self.timeout
        )
        return response

    def _call(self, method: Callable[..., Response], request: Any, timeout: float | None) -> Response:
        """One unary call; a refusal for now (admission control) is tried
        again after the server's retry delay, with jittered backoff, as long
        as the deadline allows."""
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = 0
        while True:
            try:
                return method(request, timeout=remaining(deadline), metadata=self._metadata)
            except grpc.RpcError as exc:
                error = typed(exc)
                pause = retry_pause(error.retry_after, attempt, deadline)
                if pause is None:
                    raise error from exc
            log.debug("server asked to retry later (%s); retrying in %.2f s", error.message, pause)
            time.sleep(pause)
            attempt += 1


def _target(target: Target | str | None) -> Target:
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        return Target.parse(target)
    from plancache.gpu.target import detect_target

    return detect_target()


def _count(plan: Plan, target_id: str, node_type: str) -> None:
    """One graph of the Client's own front door (path "compile"), by where its plan came from."""
    outcome = outcomes.served_outcome(plan.source)
    outcomes.record(
        "compile", target_id, outcome, node_type, reason="hedged" if outcome is outcomes.Outcome.LOCAL else ""
    )

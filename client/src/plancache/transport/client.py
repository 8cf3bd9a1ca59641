"""Client: compile or fetch plans from a plancache server.

    with Client("plancache.internal:50051") as client:
        plan = client.compile(spec)          # target detected from the local GPU
        plan.execute({"A": a, "B": b, "C": c})

The hot path of a node: `compile` (one graph), `get` (a stored plan),
`race` (a hedged miss with the caller's own build) and `prefetch` (a
manifest at start-up). An operator's calls (statistics, warming, families,
invalidation, ...) are on `client.admin`, an AdminClient over the same
connection (plancache.transport.admin).

gRPC failures come back as typed plancache errors (SpecError,
TargetUnavailable, NotFound, ...), raised `from` the grpc.RpcError.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc

from plancache.errors import InvalidRequest, NotStored, PlanCacheError
from plancache.graphspec.graph import GraphSpec
from plancache.keys.arguments import check_options, check_spec, check_text
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import parse_key
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.run.local import can_build_here
from plancache.run.plan import Plan
from plancache.transport import outcomes
from plancache.transport.admin import AdminClient
from plancache.transport.background import BackgroundPrefetch
from plancache.transport.calls import resolve_target
from plancache.transport.connection import DEFAULT_TIMEOUT_S, Connection, TLSConfig
from plancache.transport.hedge import (
    FrontendBuilder,
    LocalBuilder,
    Raced,
    hedge_default,
)
from plancache.transport.hedged_calls import SETTLE_ASKS_S, HedgedCalls
from plancache.transport.intake import PlanIntake
from plancache.transport.manifest import Manifest
from plancache.transport.prefetching import ManifestPrefetch, OnPlan, PrefetchStop, Progress
from plancache.transport.reports import Reports
from plancache.transport.results import PrefetchResult
from plancache.transport.workload import (
    WorkloadStart,
    WorkloadStats,
    deserialize_setting,
    prefetch_default,
    workload_name,
)
from plancache.trust.answers import Asked
from plancache.trust.disk_cache import DiskCache
from plancache.trust.signing import TrustPolicy
from plancache.v1 import plancache_pb2 as pb
from plancache.wire import outcome_labels

__all__ = ["Client", "TLSConfig"]

T = TypeVar("T")
log = logging.getLogger(__name__)

# A miss builds and autotunes on a GPU: seconds to minutes.
DEFAULT_COMPILE_TIMEOUT_S = 900.0
# Seconds a background report (ReportFirstUses) may take.
REPORT_TIMEOUT_S = 2.0
# An operator's calls, which were Client methods before they moved to AdminClient: still answered (with a warning).
_ADMIN_CALLS = frozenset(
    name for name in vars(AdminClient) if not name.startswith("_") and name not in ("close", "connection")
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
        workload: str | None = None,
        workload_prefetch: bool | None = None,
    ) -> None:
        """`server` is "host:port" (an insecure channel is opened and owned;
        a host alone is port 50051, plancache-server's default, warned once)
        or a grpc.Channel the caller configured and keeps owning. `cache`:
        the disk cache (default: one under the XDG cache folder; False: none);
        plans it holds are verified and cost no network call.
        `trusted_keys`: Ed25519 public keys (PEM bytes or paths) whose
        signatures this client accepts, exactly; default PLANCACHE_TRUSTED_KEYS,
        else the keys pinned with `plancache trust HOST:PORT` (see
        TrustPolicy.create); every plan is checked before anyone can
        deserialize it. `allow_unsigned`
        (default PLANCACHE_ALLOW_UNSIGNED=1) accepts unsigned plans.
        `token`: bearer token sent with every call (default PLANCACHE_TOKEN).
        `tls`: connect over TLS (mutual TLS with a client certificate).
        `hedge`: on a miss, build the plan here too and run whichever is
        ready first (plancache.transport.hedge; default PLANCACHE_HEDGE, on;
        only where this process can build for the target).
        `local_builder`: how this node builds (default: its cuDNN frontend).
        `report`: tell the service, in the background, how this process's
        graphs and races ended (plancache.transport.reports; default
        PLANCACHE_REPORT, on). `workload`: the name of the workload this
        process is one of (default PLANCACHE_WORKLOAD, else the program's);
        `workload_prefetch`: at the first call, stream the plans the
        workload's earlier processes used (plancache.transport.workload;
        default PLANCACHE_WORKLOAD_PREFETCH, else where this process runs plans)."""
        self.connection = Connection(server, timeout=timeout, token=token, tls=tls)
        self._stub = self.connection.stub
        self.compile_timeout = compile_timeout
        self.intake = PlanIntake(
            self.connection,
            DiskCache() if cache is True else (cache or None),
            TrustPolicy.create(trusted_keys, allow_unsigned, server=server if isinstance(server, str) else None),
        )
        self.hedge = hedge_default() if hedge is None else hedge
        self.local_builder: LocalBuilder = local_builder or FrontendBuilder()
        reporting = outcomes.report_default() if report is None else report
        self._workload_deserialize = deserialize_setting()  # a wrong value: refused here
        self.workload = WorkloadStart(
            self.connection,
            self._workload_prefetch,
            name=workload_name(workload),
            prefetch=(lambda: workload_prefetch) if workload_prefetch is not None else _runs_plans_here,
            report=reporting,
            timeout=self.connection.timeout,
        )
        self._reports = Reports(self._report, enabled=reporting, workload=self.workload.take_report)
        self.workload.wake = self._reports.wake  # a first use starts the reports' thread, as a hedged miss does
        self._hedged = HedgedCalls(self.connection, self.intake, self._reports, listed=self.workload.lists)

    @property
    def timeout(self) -> float | None:
        """Seconds a call other than a build may take (a build: `compile_timeout`)."""
        return self.connection.timeout

    @property
    def cache(self) -> DiskCache | None:
        return self.intake.cache

    @property
    def trust(self) -> TrustPolicy:
        return self.intake.trust

    @functools.cached_property
    def admin(self) -> AdminClient:
        """An operator's calls (AdminClient) over this client's connection and disk cache."""
        return AdminClient(self.connection, cache=self.cache)

    def __getattr__(self, name: str) -> Any:
        if name in _ADMIN_CALLS:  # only reached for names a Client does not have
            warnings.warn(
                f"Client.{name}() moved to AdminClient: call client.admin.{name}()", DeprecationWarning, stacklevel=2
            )
            return getattr(self.admin, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._hedged.settle_asks(SETTLE_ASKS_S)  # before its uses are reported: the service knows their builds
        self._reports.close()
        self.connection.close()

    def query(
        self, spec: GraphSpec | PlanQuery, target: Target | str | None = None, options: CompileOptions | None = None
    ) -> PlanQuery:
        """What a call asks for: `spec` validated and normalized (once) for
        `target` (default: this machine's GPU 0) and `options`; a PlanQuery
        is taken as it is (it says its own target and options). Any other
        type is InvalidRequest naming it and how to make a GraphSpec."""
        return self._query(spec, target, options, "query()")

    def _query(
        self, spec: GraphSpec | PlanQuery, target: Target | str | None, options: CompileOptions | None, call: str
    ) -> PlanQuery:
        check_spec(spec, call, query=PlanQuery)
        if isinstance(spec, PlanQuery):
            if target is not None or options is not None:
                raise InvalidRequest("a PlanQuery names its own target and options: pass neither with it")
            return spec
        check_options(options, call)
        return PlanQuery.of(spec, resolve_target(target, call), options)

    # ---- one graph ---------------------------------------------------------------------

    def compile(
        self,
        spec: GraphSpec | PlanQuery,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *,
        timeout: float | None = None,
        tuned_only: bool = False,
        hedge: bool | None = None,
        hedge_path: str = "compile",
        stored_only: bool = False,
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
        (plancache.functional says "functional"). `stored_only`: a plan
        already stored (disk cache, the workload's stream, the server's
        store), else NotStored at once, the service building it meanwhile:
        one round trip, no build waited for (plancache.torch's routes, whose
        own build is torch's function)."""
        query = self._query(spec, target, options, "compile()")
        plan = self._compile(query, timeout, tuned_only, hedge, hedge_path, stored_only)
        if hedge_path == "compile":  # the front doors (plancache.cudnn, plancache.functional) count their own graphs
            _count(plan, query.target.id, outcome_labels.anchor_of_ops(n.op for n in query.spec.nodes))
        return plan

    def _compile(
        self,
        query: PlanQuery,
        timeout: float | None,
        tuned_only: bool,
        hedge: bool | None,
        hedge_path: str,
        stored_only: bool = False,
    ) -> Plan:
        asked = Asked.of(query)
        workload = self.workload
        began = workload.begin(query.target)
        try:
            plan = self._compile_asked(query, asked, timeout, tuned_only, hedge, hedge_path, began, stored_only)
        except NotStored:
            # In the workload's record all the same (the service was asked to build it): the next process streams
            # it once stored, rather than asking for it graph by graph (GPU run 56: a process after ones that found
            # nothing stored had no record).
            workload.used(asked.key, query.target.id)
            raise
        workload.used(asked.key, query.target.id)
        return plan

    def _compile_asked(
        self,
        query: PlanQuery,
        asked: Asked,
        timeout: float | None,
        tuned_only: bool,
        hedge: bool | None,
        hedge_path: str,
        began: bool,
        stored_only: bool = False,
    ) -> Plan:
        """The plan: prefetched, in the disk cache, else the service's. `stored_only`: only a stored one (one
        Compile answered at once; a graph expected to miss asked on a kept thread: plancache.transport.
        hedged_calls), else NotStored, the service building it, which no one waits for here."""
        prefetched = self.workload.take(asked, began=began)
        if prefetched is not None and not (tuned_only and prefetched.provisional):
            return prefetched
        cached = self.intake.cached(asked.key, tuned_only)
        if cached is not None:
            return cached
        if stored_only:

            def remember(response: pb.CompileResponse) -> Plan:
                return self.intake.answer(response.plan, response.source, asked)

            request = _compile_request(query, answer_miss_at_once=True)
            budget = timeout if timeout is not None else self.compile_timeout
            return self._hedged.stored(request, asked, budget, remember, hedge_path)
        hedged = (
            not tuned_only and (self.hedge if hedge is None else hedge) and self.local_builder.can_build(query.target)
        )
        request = _compile_request(query, tuned_only=tuned_only, answer_miss_at_once=hedged)
        budget = timeout if timeout is not None else self.compile_timeout
        if not hedged:
            response = self.connection.call(self._stub.Compile, request, budget)
            return self.intake.answer(response.plan, response.source, asked)
        return self._hedged.compile(
            request, asked, budget, functools.partial(self.local_builder.build, query), hedge_path
        )

    def race(
        self,
        spec: GraphSpec | PlanQuery,
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
        query = self._query(spec, target, options, "race()")
        asked = Asked.of(query)
        workload = self.workload
        # The caller runs the plan in a graph of its own (plancache.cudnn deserializes it on the program's
        # handle), so a stream this call begins leaves deserializing to it.
        began = workload.begin(query.target, load=False)
        try:
            prefetched = workload.take(asked, began=began)
            if prefetched is not None:
                return Raced(plan=prefetched)
            cached = self.intake.cached(asked.key, tuned_only=False)
            if cached is not None:
                return Raced(plan=cached)
            request = _compile_request(query, answer_miss_at_once=True)
            budget = timeout if timeout is not None else self.compile_timeout
            return self._hedged.race(request, asked, budget, build, path)
        finally:
            workload.used(asked.key, query.target.id)

    def ask_first(self, key: str) -> None:
        """The service may be building plan `key` ahead for this process (a
        member of a graph family it asked for): a hedged miss of it asks the
        service first instead of expecting a miss (plancache.transport.hedged_calls)."""
        self._hedged.ask_first(key)

    def workload_stats(self) -> WorkloadStats:
        """This client's start-up prefetch of its workload (plancache.workload_stats(): the process's)."""
        return self.workload.stats_now()

    def _workload_prefetch(self, manifest: Manifest, target: Target, load: bool, held: bool) -> BackgroundPrefetch:
        """The workload's start-up stream (plancache.transport.workload): fetched and verified on a thread,
        and each plan deserialized there as it arrives, on a CUDA stream of that thread's own, where this
        process runs plans of `target` (on the default stream, beside the program's own CUDA work, it failed
        the decode step's first torch op on the H200, GPU run 27: "operation would make the legacy stream
        depend on a capturing blocking stream"; its own stream ran every time, run 29).
        PLANCACHE_WORKLOAD_DESERIALIZE=first-use, or a stream begun by the drop-in (`load` False: its graphs
        deserialize on the program's handle), leaves each to its first use, on the caller's thread. `held`
        (a record not settled), or PLANCACHE_WORKLOAD_DESERIALIZE=listed: nothing deserialized until the
        process's graphs have taken the record in order (plancache.transport.workload: another program's
        record costs fetches only)."""
        on_stream = load and self._workload_deserialize != "first-use" and self.local_builder.can_build(target)
        held = held or self._workload_deserialize == "listed"
        return self.prefetch_in_background(manifest, target, load=on_stream, held=held)

    def _report(self, request: pb.ReportFirstUsesRequest) -> None:
        # Short: a report lost costs only the report, and close() sends what is left.
        self._stub.ReportFirstUses(request, timeout=REPORT_TIMEOUT_S, metadata=self.connection.metadata)

    def get(
        self,
        key: str | None = None,
        *,
        spec: GraphSpec | PlanQuery | None = None,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        timeout: float | None = None,
    ) -> Plan:
        """A stored plan by key, or by spec + target + options; NotFound otherwise."""
        if (key is None) == (spec is None):
            raise InvalidRequest("get() takes a plan key or a spec, not both")
        node_type = ""
        if key is not None:
            hint = ": pass a spec as get(spec=...)" if isinstance(key, GraphSpec | PlanQuery) else ""
            check_text(key, "get()", "the plan key", hint)
        if spec is not None:
            query = self._query(spec, target, options, "get(spec=...)")
            asked = Asked.of(query)
            node_type = outcome_labels.anchor_of_ops(n.op for n in query.spec.nodes)
        else:
            assert key is not None
            asked = Asked(key)
        plan = self.intake.cached(asked.key, tuned_only=False)
        if plan is None:
            request = pb.GetPlanRequest(ref=pb.PlanRef(key=asked.key))
            response = self.connection.call(self._stub.GetPlan, request, self.connection.budget(timeout))
            plan = self.intake.answer(response.plan, pb.COMPILE_SOURCE_UNSPECIFIED, asked)
        _count(plan, parse_key(plan.key).target.id, node_type)
        return plan

    # ---- many graphs at start-up ------------------------------------------------------

    def prefetch(
        self,
        manifest: Manifest,
        target: Target | str | None = None,
        *,
        compile_missing: bool = False,
        progress: Progress | None = None,
        timeout: float | None = None,
        tuned_only: bool = False,
        on_plan: OnPlan | None = None,
        stop: PrefetchStop | None = None,
    ) -> PrefetchResult:
        """Every plan of a manifest: from the disk cache, else in ONE streaming
        call (stored plans at once, then, with compile_missing, each build as
        it finishes). Failures are collected per entry, not raised.
        `progress(done, total)` is called as plans arrive. Provisional
        plans held in the disk cache are asked for again (the tuned plan
        replaces them when it exists; they are kept otherwise);
        `tuned_only=True` accepts autotuned plans only. `on_plan(index,
        plan)` is called as each entry's plan is ready. The manifest's graph
        families are asked for first (`result.families`, `family_errors`).
        `stop.stop()`, from another thread, ends the prefetch early: what came
        is kept, the rest counted in `result.stopped`."""
        needs_target = target is not None or any(e.spec for e in manifest.entries) or manifest.families
        resolved = manifest.target or (resolve_target(target) if needs_target else None)
        fetch = ManifestPrefetch(
            self.connection,
            self.intake,
            manifest,
            resolved,
            compile_missing=compile_missing,
            tuned_only=tuned_only,
            progress=progress,
            on_plan=on_plan,
            stop=stop,
        )
        # Built by the service (what is not stored); each size a hit at its first use.
        for index, family in enumerate(manifest.families):
            try:
                status = self.admin.build_family(family, resolved, manifest.options, timeout=timeout)
                fetch.result.families[status.family_key] = status
            except PlanCacheError as e:
                fetch.result.family_errors[index] = e
        return fetch.run(
            timeout if timeout is not None else (self.compile_timeout if compile_missing else self.timeout)
        )

    def prefetch_in_background(
        self,
        manifest: Manifest,
        target: Target | str | None = None,
        *,
        compile_missing: bool = False,
        timeout: float | None = None,
        tuned_only: bool = False,
        load: bool = False,
        held: bool = False,
    ) -> BackgroundPrefetch:
        """`prefetch` on a thread of its own, returning at once: the node
        does its other start-up work (weights, warm-up) meanwhile and waits
        only for the plans it needs (`ready(i)`, `wait_for(i)`, `wait()`).
        `load=True` deserializes each plan on that thread as it arrives
        (needs the [gpu] extra): `plan.execute` then starts at once; a plan
        that does not load is that entry's error; with `held`, from
        `start_loading()` on (the plans already fetched then too). `cancel()`
        ends it early."""
        stop = PrefetchStop()

        def run(on_plan: OnPlan) -> PrefetchResult:
            return self.prefetch(
                manifest,
                target,
                compile_missing=compile_missing,
                timeout=timeout,
                tuned_only=tuned_only,
                on_plan=on_plan,
                stop=stop,
            )

        return BackgroundPrefetch(run, load, stop=stop.stop, held=held)


def _runs_plans_here() -> bool:
    """The workload prefetch's default: PLANCACHE_WORKLOAD_PREFETCH, else where this process runs plans (as the
    hedge: torch loaded, the frontend and a GPU there)."""
    return prefetch_default(lambda: "torch" in sys.modules and can_build_here())


def _compile_request(query: PlanQuery, *, tuned_only: bool = False, answer_miss_at_once: bool) -> pb.CompileRequest:
    return pb.CompileRequest(
        spec=query.spec_proto,
        target=query.target.to_proto(),
        options=query.options.to_proto(),
        tuned_only=tuned_only,
        answer_miss_at_once=answer_miss_at_once,
        # A hedged miss is told before the service derives the key itself (it still does, to build).
        claimed_key=query.key if answer_miss_at_once else "",
        # And its follow-up (a copy): the service builds it for later, not for this caller now (it yields).
        builds_itself=answer_miss_at_once,
    )


def _count(plan: Plan, target_id: str, node_type: str) -> None:
    """One graph of the Client's own front door (path "compile"), by where its plan came from."""
    outcome = outcomes.served_outcome(plan.source)
    reason = "hedged" if outcome is outcomes.Outcome.LOCAL else ""
    outcomes.record("compile", target_id, outcome, node_type, reason=reason)

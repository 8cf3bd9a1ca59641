"""The plancache service the two no-spec front doors ask: `plancache.cudnn`
(frontend programs, one line changed) and `plancache.functional` (torch-style
functions). One process talks to one service, so both read one setting:

    plancache.functional.configure("plancache.internal:50051")   # or a Client
    # or, with no code at all: PLANCACHE_SERVER=host:port

`plancache.cudnn.configure` is the same function. Without either, nothing is
asked: frontend graphs build locally and functions run torch's own code,
which is what the program did before (logged once).

Why a failure here is never raised to the program: these front doors
promise that the program's own code path still works when the service
cannot serve; the caller gets what it would have had without plancache, and
the reason is logged once (`Once`) and counted.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from plancache.errors import (
    CompileFailed,
    CompileTimeout,
    InvalidRequest,
    NotStored,
    PlanCacheError,
    ResourceExhausted,
    SpecError,
    TargetUnavailable,
    Unavailable,
)
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.run.plan import Plan
from plancache.transport.background import BackgroundPrefetch
from plancache.transport.client import Client
from plancache.transport.hedge import Raced

T = TypeVar("T")

SERVER_ENV = "PLANCACHE_SERVER"
# Errors that may pass (a server restarting, a worker joining): worth asking again later.
TRANSIENT: tuple[type[PlanCacheError], ...] = (
    Unavailable,
    TargetUnavailable,
    CompileTimeout,
    ResourceExhausted,
    NotStored,
)
# Errors about one graph, not about the service: reported per graph, not once for all.
ABOUT_THE_GRAPH: tuple[type[PlanCacheError], ...] = (SpecError, CompileFailed, InvalidRequest)


log = logging.getLogger("plancache.functional")


class NotConfigured(Unavailable):
    """No server was given: neither configure() nor PLANCACHE_SERVER."""

    reason_class = "no_server"  # plancache.wire.outcome_labels.REASONS


class Service:
    """Which client, target and options the front doors compile with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._owned = False  # a client made here from an address is closed here
        self._target: Target | None = None
        self._detected: dict[int, Target] = {}
        self.options: CompileOptions | None = None
        self.timeout: float | None = None
        self._from_env = True
        self.touched = False  # touch() ran: the workload's plans were asked for (or there is no service)
        # Plans a manifest prefetch fetches (and loads) for this process: plan key -> (the prefetch, its entry).
        self._prefetched: dict[str, tuple[BackgroundPrefetch, int]] = {}

    def configure(
        self,
        client: Client | str | None = None,
        *,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        timeout: float | None = None,
        workload: str | None = None,
    ) -> None:
        """`client`: a Client, or "host:port" (a Client with the default disk
        cache and PLANCACHE_TRUSTED_KEYS is made and owned), or None: read
        PLANCACHE_SERVER again on next use. `target`: what to compile for
        (default: the GPU the call runs on). `options`: CompileOptions (the
        frontend shim keeps the heuristic modes, workspace limit and
        behavior-note filters a program sets). `timeout`: seconds a first
        call may wait for a build (default: the client's compile timeout).
        `workload`: the name of this process's workload, whose plans its
        client streams at its first call (plancache.transport.workload;
        default PLANCACHE_WORKLOAD, else the program's)."""
        made = Client(client, workload=workload) if isinstance(client, str) else client
        if workload is not None and made is not None and hasattr(made, "workload"):
            made.workload.rename(workload)
        with self._lock:
            self._close_owned()
            self._prefetched.clear()  # keyed for the old service's target and options
            self._client, self._owned, self._from_env = made, isinstance(client, str), client is None
            self._target = Target.parse(target) if isinstance(target, str) else target
            self.options, self.timeout = options, timeout
            self.touched = False
        if made is not None:
            self.touch()  # a program configures plancache first: its workload's plans stream meanwhile

    def touch(self, device: int | None = None, *, load: bool = True) -> None:
        """The program uses plancache now (configured it, made a graph): its
        client starts streaming its workload's plans (plancache.transport.workload)
        on a thread, before its graphs ask; `load` as WorkloadStart.begin's. Nothing
        when no service is configured."""
        self.touched = True
        try:
            client = self.client()
        except NotConfigured:
            return
        workload = getattr(client, "workload", None)  # a stand-in for a Client may have none
        if workload is not None:
            workload.begin_in_background(lambda: self.target_for(0 if device is None else device), load=load)

    def client(self) -> Client:
        """The configured client, or one made from PLANCACHE_SERVER; NotConfigured otherwise."""
        with self._lock:
            if self._client is None and self._from_env:
                address = os.environ.get(SERVER_ENV, "").strip()
                if address:
                    self._client, self._owned = Client(address), True
            if self._client is None:
                raise NotConfigured(
                    f"no plancache server configured: set {SERVER_ENV}=host:port "
                    "or call plancache.functional.configure(client)"
                )
            return self._client

    def target_for(self, device: int) -> Target:
        """The configured target, else the one of GPU `device` (detected once)."""
        if self._target is not None:
            return self._target
        found = self._detected.get(device)
        if found is None:
            from plancache.gpu.target import detect_target

            found = self._detected[device] = detect_target(device)
        return found

    def known_target_id(self, device: int) -> str:
        """The target asked for on GPU `device`, if known without detecting it ("" otherwise):
        what outcomes are counted under."""
        target = self._target or self._detected.get(device)
        return target.id if target is not None else ""

    def query(self, spec: GraphSpec, device: int, options: CompileOptions | None, *, normalized: bool) -> PlanQuery:
        """What a front door asks for: `spec` on GPU `device`'s target (or the
        configured one) with `options` (default: the configured ones),
        normalized once (`normalized`: the caller did, plancache.cudnn's capture)."""
        target, chosen = self.target_for(device), options or self.options
        return PlanQuery.normalized(spec, target, chosen) if normalized else PlanQuery.of(spec, target, chosen)

    def compile(
        self,
        spec: GraphSpec,
        device: int,
        options: CompileOptions | None = None,
        *,
        path: str = "functional",
        normalized: bool = False,
        ask_first: bool = False,
        stored_only: bool = False,
    ) -> Plan:
        """The plan for `spec` on GPU `device`: disk cache, then the server,
        hedged as the client is (a miss may answer with this node's own
        build, a LocalPlan). `ask_first`: the service may be building it ahead
        (a graph family's member): never an expected miss. `stored_only`, with
        a client that hedges: a stored plan or NotStored, the service building
        it (plancache.torch: the caller's own build is torch's function, which
        runs the call now); a client that does not hedge waits for the
        service's plan as it chose. Every error is a PlanCacheError (the
        client's, or NotConfigured)."""
        query = self.query(spec, device, options, normalized=normalized) if self._prefetched else None
        prefetched = self._prefetched_plan(query) if query is not None else None
        if prefetched is not None:
            return prefetched
        client = self.client()
        query = query or self.query(spec, device, options, normalized=normalized)
        if ask_first:
            _ask_first(client, query.key)
        if stored_only and getattr(client, "hedge", False):
            return client.compile(query, timeout=self.timeout, hedge_path=path, stored_only=True)
        return client.compile(query, timeout=self.timeout, hedge_path=path)

    def expect(self, keys: list[str], pending: BackgroundPrefetch) -> None:
        """Plan `keys[i]` is entry i of `pending` (a manifest prefetch): a
        first call that asks for one of them waits for it there instead of
        asking the service again."""
        with self._lock:
            for index, key in enumerate(keys):
                self._prefetched[key] = (pending, index)

    def _prefetched_plan(self, query: PlanQuery) -> Plan | None:
        """The plan a prefetch fetched for `query` (waiting for it while it is
        under way: bounded by the prefetch's own deadline and `timeout`), or
        None: not prefetched, or the prefetch could not get it (the service
        is then asked as for any first call). A manifest the program's owner
        prefetched is waited for wherever its plan is in the stream (the
        workload's record, which nobody chose, is not: plancache.transport.workload)."""
        with self._lock:
            found = self._prefetched.pop(query.key, None)
        if found is None:
            return None
        pending, index = found
        try:
            return pending.wait_for(index, timeout=self.timeout)
        except (PlanCacheError, TimeoutError) as e:
            key = query.key
            log.debug("plancache: the prefetch has no plan %s (%s: %s); asking the service", key, type(e).__name__, e)
            return None

    def race(
        self,
        spec: GraphSpec,
        device: int,
        options: CompileOptions | None,
        build: Callable[[], T],
        *,
        path: str,
        normalized: bool = False,
        ask_first: bool = False,
    ) -> Raced[T]:
        """The plan for `spec`, or the caller's own `build()` when the
        service misses and that build is ready first (the client's hedge,
        plancache.transport.hedge; the caller's build is what it would have
        run without plancache, whatever target the service is asked for).
        Without the hedge: the service's plan alone."""
        query = self.query(spec, device, options, normalized=normalized) if self._prefetched else None
        prefetched = self._prefetched_plan(query) if query is not None else None
        if prefetched is not None:
            return Raced(plan=prefetched)
        client = self.client()
        query = query or self.query(spec, device, options, normalized=normalized)
        if ask_first:
            _ask_first(client, query.key)
        if client.hedge:
            return client.race(query, None, None, build, path=path, timeout=self.timeout)
        return Raced(plan=client.compile(query, timeout=self.timeout, hedge=False, hedge_path=path))

    def hedges(self) -> bool:
        """Whether race() races the caller's build against the service (the client hedges), rather than waiting
        for the service's plan (NotConfigured without a service)."""
        return bool(self.client().hedge)

    def reset(self) -> None:
        """Back to the start: no client, PLANCACHE_SERVER read on next use."""
        self.configure(None)

    def _close_owned(self) -> None:
        if self._client is not None and self._owned:
            self._client.close()


def reason_key(error: PlanCacheError) -> str:
    """What "the same reason" means for logging once: the class for the
    service's failures (a server down is one reason however many graphs
    meet it), the class and message for a graph's own (each graph says why)."""
    if isinstance(error, ABOUT_THE_GRAPH):
        return f"{type(error).__name__}: {error.message}"
    return type(error).__name__


def describe(error: PlanCacheError) -> str:
    return f"{type(error).__name__}: {error.message}"


class Once:
    """Log a message the first time its key is seen (bounded: a process
    meeting endlessly many geometries forgets old keys rather than memory)."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(
        self, logger: logging.Logger, key: str, message: str, *args: Any, level: int = logging.WARNING
    ) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            self._seen.add(key)
        logger.log(level, message, *args)
        return True

    def forget(self) -> None:
        with self._lock:
            self._seen.clear()


SERVICE = Service()


def configure(
    client: Client | str | None = None,
    *,
    target: Target | str | None = None,
    options: CompileOptions | None = None,
    timeout: float | None = None,
    workload: str | None = None,
) -> None:
    """Set the plancache service of this process (see Service.configure);
    `plancache.cudnn.configure` and `plancache.functional.configure` are this."""
    SERVICE.configure(client, target=target, options=options, timeout=timeout, workload=workload)


def _ask_first(client: Any, key: str) -> None:
    """Tell `client` that `key` may be built ahead (a stand-in client without the notion ignores it)."""
    ask = getattr(client, "ask_first", None)
    if ask is not None:
        ask(key)

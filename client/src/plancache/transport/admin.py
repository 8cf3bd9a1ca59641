"""AdminClient: an operator's calls, beside the hot path of Client.

    with AdminClient("plancache.internal:50051", token=ADMIN_TOKEN) as admin:
        admin.stats()                         # counters per target
        admin.warm("sm_90/cudnn-92000/fe-1.33.0", from_target="sm_90/cudnn-91900/fe-1.32.0")

    admin = client.admin                      # the same calls over a Client's connection

What a node runs at start-up and per graph (compile, get, prefetch) is on
`Client`; what a fleet's operator or a rollout asks (statistics, targets,
warming, graph families, invalidation, draining a worker, why a lookup
misses) is here. The server checks each call's token role (admin, compile,
read); the client only carries the token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from plancache.errors import InvalidRequest
from plancache.graphspec.family import Family
from plancache.graphspec.graph import GraphSpec
from plancache.keys.arguments import check_spec, check_target, check_text
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.transport.calls import resolve_target
from plancache.transport.connection import DEFAULT_TIMEOUT_S, Connection, TLSConfig
from plancache.transport.manifest import Manifest
from plancache.transport.results import FamilyStatus, TargetInfo, TargetStats, WindowCounts
from plancache.trust.disk_cache import DiskCache
from plancache.trust.pins import ServedKey
from plancache.v1 import plancache_pb2 as pb
from plancache.warm import WarmStatus

__all__ = ["AdminClient"]


class AdminClient:
    def __init__(
        self,
        server: str | grpc.Channel | Connection,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        token: str | None = None,
        tls: TLSConfig | None = None,
        cache: DiskCache | None = None,
    ) -> None:
        """`server`: "host:port", a grpc.Channel, or a Client's Connection
        (then `timeout`, `token` and `tls` are the connection's).
        `cache`: a disk cache to drop a plan from when `invalidate` deletes it."""
        self._owns = not isinstance(server, Connection)
        self.connection = (
            server if isinstance(server, Connection) else Connection(server, timeout=timeout, token=token, tls=tls)
        )
        self._cache = cache
        self._stub = self.connection.stub

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel this client opened (a Client's connection is the Client's to close)."""
        if self._owns:
            self.connection.close()

    def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        return self.connection.call(method, request, self.connection.budget(timeout))

    # ---- what the deployment holds -------------------------------------------------------

    def stats(self, *, timeout: float | None = None) -> list[TargetStats]:
        """Counters per target, shared by every gateway of the deployment."""
        return [TargetStats.from_proto(t) for t in self._stats(timeout).targets]

    def family_stats(self, *, timeout: float | None = None) -> dict[str, dict[str, WindowCounts]]:
        """Counters per op family (matmul, conv, sdpa, norm, pointwise ...) and window."""
        return {
            f.family: {w.window: WindowCounts.from_proto(w) for w in f.windows}
            for f in self._stats(timeout).op_families
        }

    def _stats(self, timeout: float | None) -> pb.GetStatsResponse:
        response: pb.GetStatsResponse = self._call(self._stub.GetStats, pb.GetStatsRequest(), timeout)
        return response

    def list_targets(self, *, timeout: float | None = None) -> list[TargetInfo]:
        """Targets with live workers now: what Compile can build."""
        response: pb.ListTargetsResponse = self._call(self._stub.ListTargets, pb.ListTargetsRequest(), timeout)
        return [TargetInfo(t.target_id, t.live_workers, tuple(t.worker_ids)) for t in response.targets]

    def list_plans(self, target: Target | str | None = None, *, timeout: float | None = None) -> list[str]:
        """Keys of the stored plans, of one target or all (admin token)."""
        target_id = resolve_target(target, "list_plans()").id if target is not None else ""
        response: pb.ListPlansResponse = self._call(
            self._stub.ListPlans, pb.ListPlansRequest(target_id=target_id), timeout
        )
        return list(response.keys)

    def explain(
        self,
        spec: GraphSpec,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *,
        timeout: float | None = None,
    ) -> pb.ExplainResponse:
        """Why a lookup misses: stored plans of the same spec and how their keys differ."""
        check_spec(spec, "explain()")
        query = PlanQuery.of(spec, resolve_target(target, "explain()"), options)
        response: pb.ExplainResponse = self._call(
            self._stub.Explain, pb.ExplainRequest(query=query.to_proto()), timeout
        )
        return response

    def signing_keys(self, *, timeout: float | None = None) -> list[ServedKey]:
        """The public keys the server's plans are signed with (a read token):
        current, next (staged for a rotation) and previous. Each key id and
        fingerprint is recomputed from the key's PEM (IntegrityError when the
        server's differ). Fetching trusts nothing: `plancache trust` pins them."""
        response: pb.GetSigningKeysResponse = self._call(self._stub.GetSigningKeys, pb.GetSigningKeysRequest(), timeout)
        return [ServedKey.from_proto(k) for k in response.keys]

    # ---- changing it ---------------------------------------------------------------------

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
            check_text(key, "invalidate()", "key")
            request = pb.InvalidateRequest(key=key)
        elif spec_hash is not None:
            hint = ": a spec's hash is spec.spec_hash()" if isinstance(spec_hash, GraphSpec) else ""
            request = pb.InvalidateRequest(spec_hash=check_text(spec_hash, "invalidate()", "spec_hash", hint))
        else:
            check_target(target, "invalidate()")
            request = pb.InvalidateRequest(target_id=target.id if isinstance(target, Target) else str(target))
        if self._cache is not None and key is not None:
            self._cache.delete(key)
        response: pb.InvalidateResponse = self._call(self._stub.Invalidate, request, timeout)
        return response.deleted

    def drain_worker(self, worker_id: str, *, timeout: float | None = None) -> bool:
        """Ask a worker to finish its current build and leave (admin token).
        Whether a live worker had that id."""
        response: pb.DrainWorkerResponse = self._call(
            self._stub.DrainWorker,
            pb.DrainWorkerRequest(worker_id=check_text(worker_id, "drain_worker()", "worker_id")),
            timeout,
        )
        return response.known

    # ---- building ahead ------------------------------------------------------------------

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
        resolved = resolve_target(target, "warm()")
        request = pb.WarmRequest(target_id=resolved.id, top=top, min_hits=min_hits)
        if from_target is not None:
            request.from_target = resolve_target(from_target, "warm()").id
        elif served_days is not None:
            request.served_days = served_days
        elif manifest is not None:
            if any(e.spec is None for e in manifest.entries):
                raise InvalidRequest("a warming manifest needs specs, not only plan keys")
            for entry in manifest.entries:
                query = manifest.query_of(entry, resolved)
                request.manifest.queries.append(pb.PlanQuery(spec=query.spec_proto, options=query.options.to_proto()))
        return self._warm_status(self._call(self._stub.Warm, request, timeout))

    def cancel_warm(self, target: Target | str, *, timeout: float | None = None) -> WarmStatus:
        """Stop warming `target` (admin token); what was built stays."""
        request = pb.WarmRequest(target_id=resolve_target(target, "cancel_warm()").id, cancel=True)
        return self._warm_status(self._call(self._stub.Warm, request, timeout))

    @staticmethod
    def _warm_status(response: pb.WarmResponse) -> WarmStatus:
        return WarmStatus.from_proto(response.status)

    def warm_status(self, target: Target | str | None = None, *, timeout: float | None = None) -> list[WarmStatus]:
        """Where warming stands: per target (every warmed one, or `target`)."""
        request = pb.WarmStatusRequest(
            target_id=resolve_target(target, "warm_status()").id if target is not None else ""
        )
        response: pb.WarmStatusResponse = self._call(self._stub.WarmStatus, request, timeout)
        return [WarmStatus.from_proto(s) for s in response.targets]

    def build_family(
        self,
        family: Family,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *,
        seen: Mapping[str, Sequence[int]] | None = None,
        workload: str = "",
        timeout: float | None = None,
    ) -> FamilyStatus:
        """Have every graph of `family` (plancache.graphspec.family) built for
        `target` with `options` (compile token): the ones not stored are
        queued at warming's priority (a caller's miss goes first), and from
        then on each is a hit for any node whose graph it is exactly.
        `seen`: sizes per symbol the program met; the members nearest them
        are queued first (default: in size order). `workload`: whose budget
        of speculative builds it spends (the server's --family-budget per
        target and day; default: the caller's identity); members past it are
        not queued (`over_budget`). Returns at once."""
        if not isinstance(family, Family):
            hint = ": a family's JSON form as a dict is Family.from_dict(d)" if isinstance(family, dict) else ""
            raise InvalidRequest(f"build_family() takes a Family, not {type(family).__name__}{hint}")
        request = pb.BuildFamilyRequest(
            family=family.to_proto(),
            target=resolve_target(target, "build_family()").to_proto(),
            options=(options or CompileOptions()).to_proto(),
            seen=[pb.SizesSeen(symbol=symbol, sizes=list(sizes)) for symbol, sizes in (seen or {}).items()],
            workload=workload,
        )
        response: pb.FamilyStatus = self._call(self._stub.BuildFamily, request, timeout)
        return FamilyStatus.from_proto(response)

    def family_status(self, family_key: str, *, timeout: float | None = None) -> FamilyStatus:
        """Where a family asked for earlier stands (NotFound if never asked)."""
        response: pb.FamilyStatus = self._call(
            self._stub.GetFamily,
            pb.GetFamilyRequest(family_key=check_text(family_key, "family_status()", "family_key")),
            timeout,
        )
        return FamilyStatus.from_proto(response)

    def cancel_family(self, family_key: str, *, timeout: float | None = None) -> FamilyStatus:
        """Stop building a family's members not built yet (admin token): the
        workers skip them; the stored ones stay (NotFound if never asked)."""
        response: pb.FamilyStatus = self._call(
            self._stub.CancelFamily,
            pb.GetFamilyRequest(family_key=check_text(family_key, "cancel_family()", "family_key")),
            timeout,
        )
        return FamilyStatus.from_proto(response)

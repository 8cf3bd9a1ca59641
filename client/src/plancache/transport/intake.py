"""Where every plan a client takes comes in: from its disk cache, or as a
server's answer. Nothing reaches a caller (or the disk cache) unverified:
the signature is one a trusted key made, and the plan is the answer to
what was asked (plancache.trust.answers), whatever the server says.
"""

from __future__ import annotations

import logging

from plancache.errors import PlanCacheError, UntrustedPlan
from plancache.run.plan import SOURCE_NAMES, Plan
from plancache.transport.connection import Connection
from plancache.trust.answers import Asked
from plancache.trust.disk_cache import DiskCache
from plancache.trust.signing import TrustPolicy
from plancache.v1 import plancache_pb2 as pb

log = logging.getLogger("plancache.transport.client")


class PlanIntake:
    """The disk cache and the trust policy of one client, and the checks every plan passes."""

    def __init__(self, connection: Connection, cache: DiskCache | None, trust: TrustPolicy) -> None:
        self._connection = connection
        self.cache = cache
        self.trust = trust

    def cached(self, key: str, tuned_only: bool, refresh: bool = True) -> Plan | None:
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
            connection = self._connection
            try:
                request = pb.GetPlanRequest(ref=pb.PlanRef(key=key))
                response = connection.call(connection.stub.GetPlan, request, connection.timeout)
                return self.answer(response.plan, pb.COMPILE_SOURCE_UNSPECIFIED, Asked(key))
            except PlanCacheError as e:  # the server cannot say better now: the provisional plan runs
                log.debug("provisional plan %s kept: %s", key, e.message)
        return plan

    def answer(self, plan: pb.Plan, source: pb.CompileSource, asked: Asked) -> Plan:
        """A server's plan for `asked` (its answer's source, as the wire says it), accepted once verified."""
        return self.remember(Plan.from_proto(plan, SOURCE_NAMES.get(source, "stored")), asked)

    def remember(self, plan: Plan, asked: Asked) -> Plan:
        """Accept a plan: verified (signature, and that it answers what was
        asked) before anything else sees it, then kept in the disk cache."""
        self.trust.check(plan.metadata, plan.signature)
        asked.check(plan.metadata)
        if self.cache is not None:
            self.cache.put(plan)
        return plan

"""Builds whose plan this gateway refused (signed by a key it does not
trust, or not signed): remembered for a while, since a rebuild would be
signed the same way, and counted."""

from __future__ import annotations

import logging
from collections.abc import Callable

from plancache.errors import IntegrityError, Unavailable, UntrustedBuild, UntrustedPlan
from plancache_server.store import keys
from plancache_server.store.redis_conn import AsyncRedis, text, translated_errors

log = logging.getLogger(__name__)

# A build whose plan this gateway refused is not started again for this
# long: a rebuild would be signed the same way. Long enough that callers
# retrying in a loop cost no builds, short enough that mended keys take
# effect soon.
UNTRUSTED_BUILD_TTL_S = 120
MEND_KEYS = (
    "give its workers a --signing-key this gateway trusts, or add their public key to the gateway's "
    "--trusted-keys (PLANCACHE_SERVER_TRUSTED_KEYS)"
)


class RefusedBuilds:
    def __init__(self, client: AsyncRedis, on_untrusted_build: Callable[[str], None] = lambda plan_key: None) -> None:
        """`on_untrusted_build(plan_key)`: once per build whose plan this gateway refused (counted)."""
        self._redis = client
        self._on_untrusted_build = on_untrusted_build

    async def untrusted_build(
        self, plan_key: str, job_id: str, refused: IntegrityError, state: dict[str, str]
    ) -> UntrustedBuild:
        """The error for every waiter of a build whose plan this gateway
        refused; remembered (no same rebuild for a while) and counted."""
        cause = _refusal_cause(refused)
        if cause is not None:
            try:
                with translated_errors("remembering a refused build"):
                    await self._redis.set(keys.untrusted_build(plan_key), cause, ex=UNTRUSTED_BUILD_TTL_S)
            except Unavailable as e:
                log.warning("could not remember the refused build of %s: %s", plan_key, e.message)
        self._on_untrusted_build(plan_key)
        worker = state.get("worker") or "a worker"
        message = f"the plan {worker} built for this call (job {job_id}) fails this gateway's checks: {refused.message}"
        if cause is not None:
            message += (
                f". No rebuild is started for {UNTRUSTED_BUILD_TTL_S} s, since it would be signed the same way: "
                f"{MEND_KEYS}"
            )
        log.error("%s", message)
        return UntrustedBuild(message)

    async def refuse_same_rebuild(self, plan_key: str, refused: IntegrityError) -> None:
        """UntrustedBuild when the stored plan is refused for the reason our
        last build of it was: building it again would end the same way."""
        cause = _refusal_cause(refused)
        if cause is None:
            return
        with translated_errors("reading a refused build"):
            remembered = await self._redis.get(keys.untrusted_build(plan_key))
            ttl = await self._redis.ttl(keys.untrusted_build(plan_key)) if remembered is not None else 0
        if remembered is not None and text(remembered) == cause:
            raise UntrustedBuild(
                f"{refused.message}. The last build of this plan was refused for this reason; no rebuild is started "
                f"for another {max(ttl, 1)} s, since it would be signed the same way: {MEND_KEYS}"
            )


def _refusal_cause(refused: IntegrityError) -> str | None:
    """What a rebuild would repeat: a key this gateway does not trust, or
    no signature. None for damaged or altered bytes, which a rebuild writes anew."""
    if isinstance(refused, UntrustedPlan) and refused.unknown_key:
        return f"signer:{refused.signer}" if refused.signer else "unsigned"
    return None

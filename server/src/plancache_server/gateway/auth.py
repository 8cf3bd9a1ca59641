"""Bearer tokens and their roles, checked once per call by the interceptor.

Roles nest: `read` (GetPlan, Prefetch without compile_missing, GetStats,
ListTargets, GetSigningKeys) < `compile` (Compile, ReportFirstUses, Prefetch
with compile_missing) < `admin` (Invalidate, DrainWorker). With no tokens
file the service is open, and says so in its log.

Tokens file: one `<role> <token>` per line; `#` starts a comment.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from plancache.errors import InvalidRequest, PermissionDenied, Unauthenticated


class Role(enum.IntEnum):
    READ = 1
    COMPILE = 2
    ADMIN = 3


SERVICE_PREFIX = "/plancache.v1.PlanCache/"
METHOD_ROLES = {
    "GetPlan": Role.READ,
    "GetStats": Role.READ,
    "ListTargets": Role.READ,
    "Prefetch": Role.READ,
    "Compile": Role.COMPILE,
    "ReportFirstUses": Role.COMPILE,
    "Explain": Role.READ,
    "Invalidate": Role.ADMIN,
    "DrainWorker": Role.ADMIN,
    "ListPlans": Role.ADMIN,
    "Warm": Role.ADMIN,
    "WarmStatus": Role.READ,
    "BuildFamily": Role.COMPILE,
    "GetFamily": Role.READ,
    "CancelFamily": Role.ADMIN,
    "GetSigningKeys": Role.READ,
    "GetWorkload": Role.READ,
}


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Authorizer:
    def __init__(self, tokens: dict[str, Role] | None) -> None:
        # Kept as digests: the tokens themselves are not held in memory.
        self._roles = None if tokens is None else [(_digest(t), role) for t, role in tokens.items()]

    @property
    def open(self) -> bool:
        return self._roles is None

    @classmethod
    def from_file(cls, path: Path | str | None) -> Authorizer:
        if path is None:
            return cls(None)
        tokens: dict[str, Role] = {}
        for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
            parts = raw.split("#", 1)[0].split()
            if not parts:
                continue
            if len(parts) != 2 or parts[0].upper() not in Role.__members__ or len(parts[1]) < 16:
                raise InvalidRequest(f"{path}:{number}: expected '<read|compile|admin> <token of 16+ characters>'")
            tokens[parts[1]] = Role[parts[0].upper()]
        return cls(tokens)

    def role_of(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Role:
        """The role of the call's bearer token (the scheme is case-insensitive,
        RFC 6750); Unauthenticated without a known one. Reads metadata only."""
        return self.identify(metadata)[0]

    def identify(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> tuple[Role, str]:
        """The role of the call's bearer token and the token's id (a prefix of its digest: names the caller's
        share, plancache_server.gateway.shares, never the token)."""
        assert self._roles is not None, "an open service has no roles"
        header = next((v for k, v in metadata or () if k == "authorization"), "")
        text = header.decode(errors="replace") if isinstance(header, bytes) else str(header)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated(
                "this server requires a bearer token (metadata 'authorization: Bearer <token>'; "
                "Client(token=...) or PLANCACHE_TOKEN)"
            )
        presented = _digest(token.strip())
        role = next((r for digest, r in self._roles if hmac.compare_digest(digest, presented)), None)
        if role is None:
            raise Unauthenticated("unknown bearer token")
        return role, presented[:6].hex()

    def require(self, method: str, role: Role) -> None:
        """PermissionDenied unless `role` may call `method` at all (a call's
        body may need more: see needed_role)."""
        name = method.rsplit("/", 1)[-1]
        needed = METHOD_ROLES.get(name, Role.ADMIN)
        if role < needed:
            raise PermissionDenied(
                f"{name} needs a {needed.name.lower()} token; this token's role is {role.name.lower()}"
            )


def needed_role(name: str, request: Any) -> Role:
    """The role a parsed request needs: Prefetch asking for builds needs compile."""
    if name == "Prefetch" and getattr(request, "compile_missing", False):
        return Role.COMPILE
    return METHOD_ROLES.get(name, Role.ADMIN)

"""Bearer tokens and their roles, checked once per call by the interceptor.

Roles nest: `read` (GetPlan, Prefetch without compile_missing, GetStats,
ListTargets) < `compile` (Compile, Prefetch with compile_missing) < `admin`
(Invalidate, DrainWorker). With no tokens file the service is open, and says so in its log.

Tokens file: one `<role> <token>` per line; `#` starts a comment.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from pathlib import Path
from typing import Any

import grpc

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
    "Explain": Role.READ,
    "Invalidate": Role.ADMIN,
    "DrainWorker": Role.ADMIN,
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

    def check(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        """Raise Unauthenticated or PermissionDenied unless the call may proceed."""
        if self._roles is None or not method.startswith(SERVICE_PREFIX):
            return  # health checks and reflection stay open, for load balancers and tools
        name = method.rsplit("/", 1)[-1]
        header = next((str(v) for k, v in context.invocation_metadata() if k == "authorization"), "")
        if not header.startswith("Bearer "):
            raise Unauthenticated("this server requires a bearer token (metadata 'authorization: Bearer <token>'; Client(token=...) or PLANCACHE_TOKEN)")
        presented = _digest(header.removeprefix("Bearer ").strip())
        role = next((r for digest, r in self._roles if hmac.compare_digest(digest, presented)), None)
        if role is None:
            raise Unauthenticated("unknown bearer token")
        needed = METHOD_ROLES.get(name, Role.ADMIN)
        if name == "Prefetch" and getattr(request, "compile_missing", False):
            needed = Role.COMPILE
        if role < needed:
            raise PermissionDenied(f"{name} needs a {needed.name.lower()} token; this token's role is {role.name.lower()}")

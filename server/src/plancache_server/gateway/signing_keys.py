"""The public keys this gateway's plans are signed with: what GetSigningKeys
answers, the status page lists, the start-up log prints, and what the
gateway itself checks stored plans against.

They are the key ring of its workers' key (--signing-key, or the key the
server generated in --data-dir: current, next and previous, see
plancache.trust.key_ring) and the keys it was told its workers sign with
(--trusted-keys, served as current). The keys are read again only when a
file or folder they live in changed (a few stat calls per ask): a key staged
while the server runs is served at once, and a caller asking in a loop costs
the gateway no reads and no thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from plancache.errors import InvalidRequest, ServerError
from plancache.trust.key_ring import CURRENT, NEXT, PREVIOUS, KeyRing, RingKey
from plancache.trust.public_keys import fingerprint, key_id, load_public_key, public_pem
from plancache.v1 import plancache_pb2 as pb
from plancache_server.settings import Settings

log = logging.getLogger(__name__)

STATES = {
    CURRENT: pb.SIGNING_KEY_STATE_CURRENT,
    NEXT: pb.SIGNING_KEY_STATE_NEXT,
    PREVIOUS: pb.SIGNING_KEY_STATE_PREVIOUS,
}
_WILDCARD_HOSTS = ("", "0.0.0.0", "[::]", "::")


class SigningKeys:
    """The keys of one gateway's plans (no private key is held here: only paths)."""

    def __init__(self, signing_key: Path | None, listed: tuple[Path, ...] = ()) -> None:
        self.ring = KeyRing(signing_key) if signing_key is not None else None
        self._listed = listed
        self._recent: tuple[tuple[int, ...], list[RingKey]] | None = None

    @classmethod
    def of(cls, settings: Settings) -> SigningKeys:
        return cls(settings.signing_key, settings.trusted_keys)

    def read(self) -> list[RingKey]:
        """The ring's keys, then the listed ones it does not hold. InvalidRequest naming a file that cannot be read."""
        found = {k.key_id: k for k in (self.ring.read() if self.ring is not None else [])}
        for path in self._listed:
            public = load_public_key(path)
            found.setdefault(
                key_id(public),
                RingKey(key_id(public), fingerprint(public), CURRENT, public_pem(public), path.stat().st_mtime, path),
            )
        return list(found.values())

    def _files_state(self) -> tuple[int, ...]:
        """The change times of every file and folder the keys are read from (-1: absent)."""
        paths = list(self._listed)
        if self.ring is not None:
            ring = self.ring
            paths += [ring.private.parent, ring.private, ring.public, ring.next_private, ring.previous_dir]
        state = []
        for path in paths:
            try:
                info = os.stat(path)
                state += [info.st_mtime_ns, info.st_ctime_ns, info.st_size]
            except OSError:
                state += [-1, -1, -1]
        return tuple(state)

    async def recent(self) -> list[RingKey]:
        """The keys, read again (on a thread) only when their files changed since the last read."""
        state = self._files_state()
        if self._recent is not None and self._recent[0] == state:
            return self._recent[1]
        keys = await asyncio.to_thread(self.read)
        self._recent = (state, keys)
        return keys

    async def response(self) -> pb.GetSigningKeysResponse:
        """GetSigningKeys' answer; ServerError when a key file cannot be read."""
        try:
            keys = await self.recent()
        except (InvalidRequest, OSError) as e:
            message = e.message if isinstance(e, InvalidRequest) else str(e)
            log.error("cannot serve the signing keys: %s", message)
            raise ServerError(f"this server cannot read its signing keys: {message}") from e
        return pb.GetSigningKeysResponse(keys=[to_proto(k) for k in keys])

    def log_at_start(self, listen: str, port: int) -> None:
        """One line per key: what an operator compares a client's fingerprint with, and the command to pin it."""
        try:
            keys = self.read()
        except (InvalidRequest, OSError) as e:
            log.error("cannot read the signing keys: %s", e.message if isinstance(e, InvalidRequest) else e)
            return
        address = clients_address(listen, port)
        for key in keys:
            log.info(
                "signing key %s (%s): fingerprint %s; clients pin it with `plancache trust %s --expect %s` "
                "(over TLS or with a token: `plancache trust %s`)",
                key.key_id,
                key.state,
                key.fingerprint,
                address,
                key.fingerprint,
                address,
            )


def to_proto(key: RingKey) -> pb.SigningKey:
    return pb.SigningKey(
        public_key_pem=key.public_pem.decode(),
        key_id=key.key_id,
        fingerprint=key.fingerprint,
        state=STATES[key.state],
        created_at=key.created_at,
        endorsed_by=key.endorsed_by,
        endorsement=key.endorsement,
    )


def clients_address(listen: str, port: int) -> str:
    """The address a client names, as far as the listen address says it ("HOST" for a wildcard)."""
    if listen.startswith("unix:"):
        return listen
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    return f"{'HOST' if host in _WILDCARD_HOSTS else host}:{port}"

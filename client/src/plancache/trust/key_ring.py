"""A signing key's files and their rotation, as plancache-server keeps them.

Beside the private key the workers sign with, `<dir>/<name>.pem` (its
public half `<name>.pub.pem`; a server's generated one is
`<data dir>/keys/plan-signing.pem`):

    <name>.next.pem, <name>.next.pub.pem   the next key, staged: published, not signing yet
    <name>.previous/<key id>.pub.pem       retired keys, public halves only: plans they signed may still be stored
    <name>.endorsed, <name>.next.endorsed, <name>.previous/<key id>.endorsed
                                           each key's endorsement by the key it follows (JSON: by, signature)

Staging a key has the current key endorse it (plancache.trust.public_keys):
a client that pinned the current key pins the next one over any channel,
with no fingerprint to compare, and so on along the chain of rotations.

A rotation that breaks no client, in two steps an operator runs:
1. stage (`plancache-server --stage-signing-key`): the next key is written
   and served at once (GetSigningKeys, the status page) as `next`; the
   workers still sign with the current one. Clients pin it
   (`plancache trust HOST:PORT` pins every key a server serves).
2. promote (`plancache-server --promote-signing-key`, then restart the
   server and its workers, which load their key at start): next becomes
   current, current becomes previous. Plans signed by either verify for
   clients that pinned both; the server keeps trusting and serving the
   previous key's plans.

What the files say is read afresh on each call (the ring holds only paths),
so a key staged while a server runs is served at once. Created times are the
key files' modification times (a rename keeps them).

Lives beside the signatures (not in the server) because both server programs
read it: the gateway serves and trusts the ring, a worker trusts it.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path

from plancache.errors import InvalidRequest
from plancache.trust.public_keys import fingerprint, key_id, load_public_key, public_pem
from plancache.trust.signing import Signer, generate_keypair

CURRENT, NEXT, PREVIOUS = "current", "next", "previous"


@dataclass(frozen=True)
class RingKey:
    key_id: str
    fingerprint: str
    state: str  # CURRENT, NEXT or PREVIOUS
    public_pem: bytes
    created_at: float
    path: Path  # the file it was read from
    endorsed_by: str = ""  # the key id of the key it follows, which endorsed it ("" for none)
    endorsement: bytes = b""


class KeyRing:
    """The rotation files around one private key (`private`: the current key's path)."""

    def __init__(self, private: Path | str) -> None:
        self.private = Path(private)
        name = self.private.name.removesuffix(".pem")
        self.public = self.private.with_name(f"{name}.pub.pem")
        self.next_private = self.private.with_name(f"{name}.next.pem")
        self.next_public = self.private.with_name(f"{name}.next.pub.pem")
        self.previous_dir = self.private.with_name(f"{name}.previous")
        self._next_name = f"{name}.next"

    def read(self) -> list[RingKey]:
        """Current (when its file exists), next (when staged), previous (newest first).
        InvalidRequest naming a key file that cannot be read."""
        found: list[RingKey] = []
        if self.private.exists():
            found.append(self._private_key(self.private, CURRENT))
        if self.next_private.exists():
            found.append(self._private_key(self.next_private, NEXT))
        if self.previous_dir.is_dir():
            retired = [self._public_key(p) for p in self.previous_dir.glob("*.pub.pem")]
            found += sorted(retired, key=lambda k: k.created_at, reverse=True)
        unique: dict[str, RingKey] = {}
        for key in found:  # a key in two places (a promotion cut short) counts in its first
            unique.setdefault(key.key_id, key)
        return list(unique.values())

    def stage(self) -> RingKey:
        """Write the next key; InvalidRequest when there is no current key or one is staged already."""
        if not self.private.exists():
            raise InvalidRequest(
                f"no signing key at {self.private} to rotate from (a server with GPUs generates one at its first "
                "start; pass --signing-key for another)"
            )
        if self.next_private.exists():
            staged = self._private_key(self.next_private, NEXT)
            raise InvalidRequest(
                f"key {staged.key_id} is staged already ({self.next_private}): promote it "
                "(--promote-signing-key), or delete that file to stage another"
            )
        current = Signer.from_file(self.private)
        generate_keypair(self.private.parent, self._next_name)
        staged = self._private_key(self.next_private, NEXT)
        record = {"by": current.key_id, "signature": base64.b64encode(current.endorse(staged.fingerprint)).decode()}
        _replace(_endorsement_path(self.next_private), json.dumps(record).encode())
        return self._private_key(self.next_private, NEXT)

    def promote(self) -> tuple[RingKey, RingKey]:
        """Next becomes current, current becomes previous; (new current, now previous).
        Each step can be repeated: a promotion cut short is finished by running it again."""
        if not self.next_private.exists():
            raise InvalidRequest(f"no key is staged ({self.next_private} does not exist): stage one first")
        retiring = self._private_key(self.private, CURRENT)
        incoming = Signer.from_file(self.next_private)
        self.previous_dir.mkdir(mode=0o700, exist_ok=True)
        kept = self.previous_dir / f"{retiring.key_id}.pub.pem"
        _replace(kept, retiring.public_pem)
        os.utime(kept, (retiring.created_at, retiring.created_at))  # created, not retired, time
        if _endorsement_path(self.private).exists():
            os.replace(_endorsement_path(self.private), _endorsement_path(kept))
        _replace(self.public, incoming.public_pem())
        if _endorsement_path(self.next_private).exists():
            os.replace(_endorsement_path(self.next_private), _endorsement_path(self.private))
        os.replace(self.next_private, self.private)  # keeps the mode (0600) and the created time
        self.next_public.unlink(missing_ok=True)
        return self._private_key(self.private, CURRENT), self._public_key(kept)

    def _private_key(self, path: Path, state: str) -> RingKey:
        try:
            pem = Signer.from_file(path).public_pem()
        except InvalidRequest as e:
            raise InvalidRequest(f"the {state} signing key: {e.message}") from e
        public = load_public_key(pem)
        return RingKey(key_id(public), fingerprint(public), state, pem, path.stat().st_mtime, path, *_endorsement(path))

    def _public_key(self, path: Path) -> RingKey:
        try:
            public = load_public_key(path)
        except InvalidRequest as e:
            raise InvalidRequest(f"the previous signing key {path}: {e.message}") from e
        created = path.stat().st_mtime
        return RingKey(
            key_id(public), fingerprint(public), PREVIOUS, public_pem(public), created, path, *_endorsement(path)
        )


def _replace(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _endorsement_path(key_file: Path) -> Path:
    """<name>.pem, <name>.next.pem, <key id>.pub.pem -> <name>.endorsed, <name>.next.endorsed, <key id>.endorsed."""
    return key_file.with_name(key_file.name.removesuffix(".pem").removesuffix(".pub") + ".endorsed")


def _endorsement(key_file: Path) -> tuple[str, bytes]:
    """(endorser's key id, signature), or ("", b"") when there is none or it does not read: an
    endorsement only spares a person a comparison, and a client checks it anyway."""
    try:
        record = json.loads(_endorsement_path(key_file).read_text())
        return str(record["by"]), base64.b64decode(record["signature"], validate=True)
    except (OSError, ValueError, KeyError, TypeError):
        return "", b""

"""Ed25519 public keys as plancache names them: a key id (what a plan's
signature carries), a fingerprint (what a human compares), PEM in and out.

Both come from one digest, sha256 of the 32-byte raw key: the key id is its
first 16 hex digits, the fingerprint all 64, so a key id is the beginning of
its fingerprint.

An endorsement is a signing key's signature of another key (the next one of
a rotation): a client that trusts the first can trust the second without a
person comparing fingerprints. What is signed is ENDORSEMENT_VERSION, a line
feed and the endorsed key's fingerprint (ASCII, no trailing line feed).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from plancache.errors import InvalidRequest

KEY_ID_DIGITS = 16
FINGERPRINT_DIGITS = 64
ENDORSEMENT_VERSION = b"plancache/key-endorsement/v1"


def _digest(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def key_id(public_key: Ed25519PublicKey) -> str:
    """What PlanSignature.key_id says: the first 16 hex of sha256 of the raw key."""
    return _digest(public_key)[:KEY_ID_DIGITS]


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """The whole sha256 of the raw key, lowercase hex: what the server logs
    and shows on its status page, and what `plancache trust --expect` takes."""
    return _digest(public_key)


def normal_fingerprint(text: str) -> str:
    """A fingerprint as a person may paste it ("SHA256:", colons, spaces,
    capitals) in plancache's form; InvalidRequest unless 64 hex digits."""
    cleaned = text.strip().lower().removeprefix("sha256:").replace(":", "").replace(" ", "")
    if len(cleaned) != FINGERPRINT_DIGITS or any(c not in "0123456789abcdef" for c in cleaned):
        raise InvalidRequest(
            f"{text[:80]!r} is not a key fingerprint: expected the 64 hex digits the server logs "
            "('signing key ... fingerprint ...') and shows on its status page"
        )
    return cleaned


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_paths(text: str) -> tuple[Path, ...]:
    """A list of key files, as every plancache program reads one: paths
    separated by commas or by the OS path separator (':' on Linux), blanks
    ignored."""
    return tuple(Path(p.strip()) for p in text.replace(",", os.pathsep).split(os.pathsep) if p.strip())


def load_public_key(source: Path | str | bytes) -> Ed25519PublicKey:
    """A PEM public key, from bytes or a file path."""
    if isinstance(source, bytes):
        data = source
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as e:
            raise InvalidRequest(f"cannot read the public key {source}: {e.strerror}") from e
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as e:
        raise InvalidRequest(f"not a PEM public key: {e}") from e
    if not isinstance(key, Ed25519PublicKey):
        raise InvalidRequest("not an Ed25519 public key")
    return key


def endorsement_envelope(endorsed_fingerprint: str) -> bytes:
    """What a key signs to endorse the key of `endorsed_fingerprint`."""
    return ENDORSEMENT_VERSION + b"\n" + endorsed_fingerprint.encode()


def endorses(endorser: Ed25519PublicKey, endorsed_fingerprint: str, signature: bytes) -> bool:
    """Whether `signature` is `endorser`'s endorsement of the key of `endorsed_fingerprint`."""
    try:
        endorser.verify(signature, endorsement_envelope(endorsed_fingerprint))
    except InvalidSignature:
        return False
    return True

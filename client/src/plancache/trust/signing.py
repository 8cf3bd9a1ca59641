"""Signed plans: workers sign, clients verify before deserializing.

A plan blob can carry native code (the frontend's Python-engine plans embed
compiled kernels), so deserializing a forged one runs it. Workers hold an
Ed25519 private key and sign an envelope of the plan key, the blob's sha256
and the sha256 of the metadata's bytes, which travel with the signature
(`PlanSignature.signed_metadata`), so a client in any language checks the
bytes it received instead of re-encoding a message (the envelope is written
down in the .proto); clients hold one or more public keys (several
during a rotation) and refuse a plan whose signature does not verify under
any of them. A client's keys are the ones it is given (trusted_keys, else
PLANCACHE_TRUSTED_KEYS), else the ones its user pinned with `plancache trust
HOST:PORT` (plancache.trust.pins): see TrustPolicy.create. Unsigned
operation is possible only when configured explicitly:
`--unsigned` on the workers, `allow_unsigned=True` (or
PLANCACHE_ALLOW_UNSIGNED=1) on the clients.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import DecodeError

from plancache.env import env_bool
from plancache.errors import InvalidRequest, UntrustedPlan
from plancache.trust.pins import PinStore
from plancache.trust.public_keys import endorsement_envelope, key_id, key_paths, load_public_key
from plancache.v1 import plancache_pb2 as pb

# key_id, key_paths and load_public_key moved to plancache.trust.public_keys and are still found here.
__all__ = [
    "ENVELOPE_VERSION",
    "ENVELOPE_VERSION_1",
    "FROM_ARGUMENT",
    "FROM_ENVIRONMENT",
    "FROM_PINS",
    "TRUSTED_KEYS_ENV",
    "Signer",
    "TrustPolicy",
    "envelope",
    "generate_keypair",
    "key_id",
    "key_paths",
    "load_public_key",
]
ENVELOPE_VERSION = b"plancache/plan-signature/v2"
# v1 (plans stored before v2): the digest was of Python's deterministic
# serialization of the metadata, which other languages cannot reproduce.
ENVELOPE_VERSION_1 = b"plancache/plan-signature/v1"


def envelope(key: str, blob_sha256: str, metadata_bytes: bytes) -> bytes:
    """What is signed (v2): four lines, no trailing newline."""
    digest = hashlib.sha256(metadata_bytes).hexdigest()
    return b"\n".join([ENVELOPE_VERSION, key.encode(), blob_sha256.encode(), digest.encode()])


def _envelope_v1(metadata: pb.PlanMetadata) -> bytes:
    digest = hashlib.sha256(metadata.SerializeToString(deterministic=True)).hexdigest()
    return b"\n".join([ENVELOPE_VERSION_1, metadata.key.encode(), metadata.blob_sha256.encode(), digest.encode()])


# The clients' list of trusted public keys. A server's own list is its
# --trusted-keys (PLANCACHE_SERVER_TRUSTED_KEYS): a host that runs both
# keeps them apart.
TRUSTED_KEYS_ENV = "PLANCACHE_TRUSTED_KEYS"


class Signer:
    """A worker's signing key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.key_id = key_id(private_key.public_key())

    @classmethod
    def from_file(cls, path: Path | str) -> Signer:
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError) as e:
            raise InvalidRequest(f"cannot load the signing key {path}: {e}") from e
        if not isinstance(key, Ed25519PrivateKey):
            raise InvalidRequest(f"{path} is not an Ed25519 private key")
        return cls(key)

    def public_pem(self) -> bytes:
        """The public key that checks this signer's signatures (PEM)."""
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def endorse(self, endorsed_fingerprint: str) -> bytes:
        """This key's endorsement of another (plancache.trust.public_keys): the next key of a rotation."""
        return self._key.sign(endorsement_envelope(endorsed_fingerprint))

    def sign(self, metadata: pb.PlanMetadata) -> pb.PlanSignature:
        signed = metadata.SerializeToString(deterministic=True)
        return pb.PlanSignature(
            key_id=self.key_id,
            signature=self._key.sign(envelope(metadata.key, metadata.blob_sha256, signed)),
            signed_metadata=signed,
        )


# Where a client's keys came from (TrustPolicy.source), said in its refusals.
FROM_ARGUMENT, FROM_ENVIRONMENT, FROM_PINS = "trusted_keys", TRUSTED_KEYS_ENV, "pinned"


@dataclass(frozen=True)
class TrustPolicy:
    """What a client accepts: plans signed by one of `keys`; unsigned ones
    (and signed ones it cannot check) only with `allow_unsigned`.

    `source` says where the keys came from (FROM_ARGUMENT, FROM_ENVIRONMENT,
    FROM_PINS, or "" for a server's own list); `server` is the address the
    client talks to, when it knows it: both go into a refusal, with the
    command that fetches and pins the server's keys."""

    keys: dict[str, Ed25519PublicKey]
    allow_unsigned: bool = False
    holder: str = "this client"
    source: str = ""
    server: str | None = None
    pins: PinStore | None = None

    @classmethod
    def create(
        cls,
        trusted_keys: Iterable[Path | str | bytes] = (),
        allow_unsigned: bool | None = None,
        *,
        holder: str = "this client",
        server: str | None = None,
        pinned: bool = True,
    ) -> TrustPolicy:
        """The keys of one source, the first there is, never a mix:
        1. `trusted_keys` (PEM bytes or paths): exactly these;
        2. else PLANCACHE_TRUSTED_KEYS (paths, see `key_paths`): exactly these;
        3. else, with `pinned` (servers pass False), the keys the user pinned
           (`plancache trust HOST:PORT`, plancache.trust.pins).
        So a program or a deployment that names its keys restricts itself to
        them, whatever the user pinned. Unsigned plans: `allow_unsigned`,
        else PLANCACHE_ALLOW_UNSIGNED=1. `holder` names who trusts, in
        refusals ("this client", "this gateway"); `server` is where the plans
        come from ("host:port"), named in the command a refusal suggests."""
        sources: Sequence[Path | str | bytes] = list(trusted_keys)
        source = FROM_ARGUMENT if sources else ""
        if not sources and os.environ.get(TRUSTED_KEYS_ENV):
            sources, source = list(key_paths(os.environ[TRUSTED_KEYS_ENV])), FROM_ENVIRONMENT
        if allow_unsigned is None:
            allow_unsigned = env_bool("PLANCACHE_ALLOW_UNSIGNED", False)
        keys = {key_id(k): k for k in map(load_public_key, sources)}
        store = PinStore() if pinned else None
        if not sources and store is not None:
            keys, source = store.keys(), FROM_PINS
        return cls(keys, allow_unsigned, holder, source, server, store)

    @property
    def trusted_text(self) -> str:
        listed = ", ".join(self.keys)
        if self.source == FROM_PINS and self.pins is not None:
            return f"{listed}, pinned in {self.pins.directory}" if listed else f"none pinned in {self.pins.directory}"
        if self.source == FROM_ENVIRONMENT:
            return f"{listed}, from {TRUSTED_KEYS_ENV}, in place of any pinned keys"
        if self.source == FROM_ARGUMENT and self.pins is not None:
            return f"{listed}, from trusted_keys, in place of any pinned keys"
        return listed or f"none: pass trusted_keys or set {TRUSTED_KEYS_ENV}"

    @property
    def remedy(self) -> str:
        """What to run when a plan's signer is unknown (a client's policy; empty for a server's)."""
        if self.pins is None:
            return ""
        fetch = f"run `plancache trust {self.server or 'HOST:PORT'}` to fetch and pin the server's keys"
        if self.source == FROM_PINS:
            return f": {fetch}"
        where = "trusted_keys" if self.source == FROM_ARGUMENT else TRUSTED_KEYS_ENV
        return f": add the server's key to {where}, or leave {where} empty and {fetch}"

    def check(self, metadata: pb.PlanMetadata, signature: pb.PlanSignature | None) -> None:
        """Raise UntrustedPlan unless this plan may be deserialized here."""
        if signature is None or not signature.signature:
            if self.allow_unsigned:
                return
            raise UntrustedPlan(
                f"plan {metadata.key} is not signed, and {self.holder} requires signed plans (allow_unsigned is off)",
                unknown_key=True,
            )
        key = self.keys.get(signature.key_id)
        if key is None:
            if not self.keys and self.allow_unsigned:
                return  # nothing to check against, and unsigned plans are acceptable anyway
            raise UntrustedPlan(
                f"plan {metadata.key} is signed by key {signature.key_id}, "
                f"which {self.holder} does not trust (trusted: {self.trusted_text}){self.remedy}",
                signer=signature.key_id,
                unknown_key=True,
            )
        if signature.signed_metadata:
            try:
                signed = pb.PlanMetadata.FromString(signature.signed_metadata)
            except DecodeError:
                raise UntrustedPlan(
                    f"plan {metadata.key}: its signed metadata does not parse; refusing to deserialize it",
                    signer=signature.key_id,
                ) from None
            if signed != metadata:
                raise UntrustedPlan(
                    f"plan {metadata.key}: its metadata differs from the signed metadata (altered plan); "
                    "refusing to deserialize it",
                    signer=signature.key_id,
                )
            message = envelope(signed.key, signed.blob_sha256, signature.signed_metadata)
        else:
            message = _envelope_v1(metadata)
        try:
            key.verify(signature.signature, message)
        except InvalidSignature:
            raise UntrustedPlan(
                f"plan {metadata.key}: its signature by key {signature.key_id} does not verify "
                "(forged or altered plan); refusing to deserialize it",
                signer=signature.key_id,
            ) from None


def generate_keypair(directory: Path | str, name: str = "plan-signing") -> tuple[Path, Path]:
    """Write `<name>.pem` (private, mode 0600 whatever the umask or an older
    file's mode) and `<name>.pub.pem`; returns both paths. The private key
    is written beside its place and renamed, so a reader never sees half a key."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    private_path, public_path = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    partial = private_path.with_name(f".{private_path.name}.{os.getpid()}.partial")
    try:
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(
                private.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
        os.replace(partial, private_path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    public_path.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private_path, public_path

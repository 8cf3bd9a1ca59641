"""Pinned signing keys: the servers' public keys a user chose to trust, kept
in the client's config folder (`plancache trust HOST:PORT` writes them).

Where: `$PLANCACHE_CONFIG_DIR/trusted-keys/`, else
`$XDG_CONFIG_HOME/plancache/trusted-keys/`, else
`~/.config/plancache/trusted-keys/` (folder mode 0700). One key is two
files named by its key id, each mode 0600:

    <key id>.pem    the public key (PEM: usable as --trusted-key or in PLANCACHE_TRUSTED_KEYS)
    <key id>.json   the record: fingerprint, state when pinned, the server address(es) it was pinned from, when

Every pinned key is trusted by every client of the user (TrustPolicy.create
with no explicit keys), whichever server it came from. A pin is refused, not
skipped, when it cannot be read as written here (a PEM whose key id is not
its name, a record that does not parse) or when group or others could change
it: the error names the file and what to run.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from plancache.errors import IntegrityError, InvalidRequest
from plancache.trust.public_keys import endorses, fingerprint, key_id, load_public_key
from plancache.v1 import plancache_pb2 as pb

CONFIG_DIR_ENV = "PLANCACHE_CONFIG_DIR"
PINS_FOLDER = "trusted-keys"
_KEY_ID = re.compile(r"[0-9a-f]{16}")
# Any write permission for group or others: whoever has it can make this user trust a key.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH

STATE_NAMES = {
    pb.SIGNING_KEY_STATE_CURRENT: "current",
    pb.SIGNING_KEY_STATE_NEXT: "next",
    pb.SIGNING_KEY_STATE_PREVIOUS: "previous",
}


def config_dir() -> Path:
    """The client's config folder: $PLANCACHE_CONFIG_DIR, else $XDG_CONFIG_HOME/plancache, else ~/.config/plancache."""
    explicit = os.environ.get(CONFIG_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "plancache"


def pins_dir() -> Path:
    return config_dir() / PINS_FOLDER


@dataclass(frozen=True)
class ServedKey:
    """A signing key a server serves (GetSigningKeys), its id and fingerprint
    recomputed from its PEM here: the server's own fields are only compared."""

    key_id: str
    fingerprint: str
    state: str  # current, next, previous (STATE_NAMES); "unknown" for a state this client does not know
    public_key_pem: bytes
    created_at: float
    endorsed_by: str = ""  # the key that endorsed this one (checked by `endorsed_by_one_of`, not here)
    endorsement: bytes = b""

    def endorsed_by_one_of(self, trusted: dict[str, Ed25519PublicKey]) -> str | None:
        """The id of the key in `trusted` whose endorsement of this key verifies, or None."""
        endorser = trusted.get(self.endorsed_by)
        if endorser is None or not self.endorsement:
            return None
        return self.endorsed_by if endorses(endorser, self.fingerprint, self.endorsement) else None

    @classmethod
    def from_proto(cls, key: pb.SigningKey) -> ServedKey:
        pem = key.public_key_pem.encode()
        try:
            public = load_public_key(pem)
        except InvalidRequest as e:
            raise IntegrityError(f"the server's signing key {key.key_id[:16]!r} is not usable: {e.message}") from e
        computed_id, computed_fp = key_id(public), fingerprint(public)
        if key.key_id != computed_id or key.fingerprint.lower() != computed_fp:
            raise IntegrityError(
                f"the server's signing key {key.key_id[:16]!r} (fingerprint {key.fingerprint[:64]!r}) is not the key "
                f"its PEM holds ({computed_id}, fingerprint {computed_fp}): refusing the server's answer"
            )
        state = STATE_NAMES.get(key.state, "unknown")
        return cls(computed_id, computed_fp, state, pem, key.created_at, key.endorsed_by, key.endorsement)


@dataclass(frozen=True)
class Pin:
    """A pinned key, as read back (and checked) from the folder."""

    key_id: str
    fingerprint: str
    state: str  # the key's state when it was last pinned
    servers: tuple[str, ...]  # the addresses it was pinned from
    pinned_at: float
    path: Path  # the PEM
    public_key: Ed25519PublicKey = field(compare=False, repr=False)


class PinStore:
    """The folder of pinned keys (default: pins_dir(), read when asked, not at construction)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory if directory is not None else pins_dir()

    def pins(self) -> list[Pin]:
        """Every pinned key, oldest pin first; InvalidRequest naming the first file that cannot be trusted."""
        if not self.directory.exists():
            return []
        _check_mode(self.directory, folder=True)
        pins = [self._read(path) for path in sorted(self.directory.glob("*.pem"))]
        return sorted(pins, key=lambda p: (p.pinned_at, p.key_id))

    def keys(self) -> dict[str, Ed25519PublicKey]:
        return {p.key_id: p.public_key for p in self.pins()}

    def pin(self, key: ServedKey, server: str) -> Pin:
        """Write (or refresh) the pin of `key`, fetched from `server`."""
        self._make_folder()
        pem_path = self.directory / f"{key.key_id}.pem"
        servers: list[str] = []
        if (self.directory / f"{key.key_id}.json").exists():
            try:
                servers = list(self._read(pem_path).servers)
            except InvalidRequest:
                servers = []  # a damaged pin of this very key: written afresh
        if server not in servers:
            servers.append(server)
        record = {
            "key_id": key.key_id,
            "fingerprint": key.fingerprint,
            "state": key.state,
            "servers": servers,
            "pinned_at": time.time(),
            "created_at": key.created_at,
        }
        _write_private(pem_path, key.public_key_pem)
        _write_private(pem_path.with_suffix(".json"), (json.dumps(record, indent=1) + "\n").encode())
        return self._read(pem_path)

    def remove(self, key_id_: str) -> list[Path]:
        """Delete a pin (even a damaged one); the files removed. InvalidRequest when nothing is pinned under that id."""
        if not _KEY_ID.fullmatch(key_id_):
            raise InvalidRequest(f"{key_id_[:40]!r} is not a key id (16 hex digits, as `plancache trust --list` shows)")
        removed = []
        for path in (self.directory / f"{key_id_}.pem", self.directory / f"{key_id_}.json"):
            if path.exists() or path.is_symlink():
                path.unlink()
                removed.append(path)
        if not removed:
            raise InvalidRequest(f"no key {key_id_} is pinned in {self.directory}")
        return removed

    # ---- the files ---------------------------------------------------------------------

    def _make_folder(self) -> None:
        if self.directory.exists():
            _check_mode(self.directory, folder=True)
            return
        parent = self.directory.parent
        if not parent.exists():
            parent.mkdir(parents=True, mode=0o700)
        self.directory.mkdir(mode=0o700)
        os.chmod(self.directory, 0o700)  # whatever the umask

    def _read(self, pem_path: Path) -> Pin:
        name = pem_path.stem
        fix = (
            f"remove it (`plancache trust --remove {name}`, or delete the file) and pin again "
            "(`plancache trust HOST:PORT`)"
        )
        if not _KEY_ID.fullmatch(name):
            raise InvalidRequest(f"pinned key {pem_path}: the name is not a key id (16 hex digits); {fix}")
        _check_mode(pem_path, folder=False)
        try:
            public = load_public_key(pem_path)
        except InvalidRequest as e:
            raise InvalidRequest(f"pinned key {pem_path}: {e.message}; {fix}") from e
        if key_id(public) != name:
            raise InvalidRequest(f"pinned key {pem_path} holds key {key_id(public)}, not {name}; {fix}")
        record_path = pem_path.with_suffix(".json")
        record: dict[str, Any] = {}
        if record_path.exists():
            _check_mode(record_path, folder=False)
            try:
                record = json.loads(record_path.read_text())
                if not isinstance(record, dict) or record.get("key_id", name) != name:
                    raise ValueError("not the record of this key")
                servers = tuple(str(s) for s in record.get("servers", ()))
                pinned_at = float(record.get("pinned_at", 0.0))
            except (OSError, ValueError, TypeError) as e:
                raise InvalidRequest(f"pinned key record {record_path} does not parse ({e}); {fix}") from e
        else:  # a PEM put there by hand: trusted as the user wrote it
            servers, pinned_at = (), pem_path.stat().st_mtime
        return Pin(name, fingerprint(public), str(record.get("state", "")), servers, pinned_at, pem_path, public)


def _check_mode(path: Path, *, folder: bool) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & _OTHERS_WRITE:
        wanted = "700" if folder else "600"
        raise InvalidRequest(
            f"{path} can be changed by group or others (mode {mode:04o}), and a key pinned there is trusted "
            f"to sign plans: run `chmod {wanted} {path}`"
        )


def _write_private(path: Path, data: bytes) -> None:
    """Mode 0600 whatever the umask; written beside and renamed, so a reader never sees half a file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise

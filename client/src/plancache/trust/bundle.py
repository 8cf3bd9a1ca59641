"""Bundles: many plans in one file, for container images and backups.

A node started from an image that carries a bundle imports it into its
disk cache (`plancache import bundle.plans --cache-dir DIR`) and starts
with no network call; an operator exports a server's plans
(`plancache export`) and loads them into another store
(`plancache-server-import`), or keeps them as a backup.

The file, for readers in any language:

    "plancache-bundle/v1\\n"
    then per plan: its length as an 8-byte big-endian unsigned integer, then
        a serialized `plancache.v1.Plan` (metadata, blob, signature)
    then the trailer: 8 zero bytes, the plan count (8 bytes, big endian),
        and the sha256 of every byte before the trailer (32 bytes)

Reading checks everything before anything is used: the trailer (a
truncated file has none, or a wrong count or digest), and every plan: its
blob's sha256, its signature under the reader's trust policy (signed
metadata included) and that its metadata names a well-formed plan key.
A refusal names the entry (its index and key).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError

from plancache.errors import IntegrityError, PlanCacheError
from plancache.keys.plankey import parse_key
from plancache.run.plan import Plan
from plancache.trust.signing import TrustPolicy

MAGIC = b"plancache-bundle/v1\n"
_LENGTH = struct.Struct(">Q")
MAX_ENTRY_BYTES = 1 << 31  # one plan; a larger length is damage, not a plan


def write_bundle(path: Path | str, plans: Iterable[Plan]) -> int:
    """Write `plans` to `path` (atomically: a temporary file renamed); the count."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    digest = hashlib.sha256()
    count = 0
    with open(partial, "wb") as out:

        def emit(data: bytes) -> None:
            digest.update(data)
            out.write(data)

        emit(MAGIC)
        for plan in plans:
            data = plan.to_bytes()
            emit(_LENGTH.pack(len(data)))
            emit(data)
            count += 1
        out.write(_LENGTH.pack(0) + _LENGTH.pack(count) + digest.digest())
    partial.replace(path)
    return count


def read_bundle(path: Path | str, trust: TrustPolicy) -> list[Plan]:
    """Every plan of the bundle at `path`, each verified; IntegrityError
    (naming the entry) for a damaged, truncated or tampered bundle."""
    with open(path, "rb") as f:
        entries, intact = _entries(f, str(path))
    plans = []
    for index, data in enumerate(entries):
        where = f"bundle {path}, entry {index}"
        try:
            plan = Plan.from_bytes(data, source="bundle")
        except DecodeError:
            raise IntegrityError(f"{where}: not a plan (damaged)") from None
        except IntegrityError as e:
            raise IntegrityError(f"{where}: {e.message}") from None
        try:
            parse_key(plan.key)
            trust.check(plan.metadata, plan.signature)
        except PlanCacheError as e:
            raise IntegrityError(f"{where} ({plan.key or 'no key'}): {e.message}") from None
        plans.append(plan)
    if not intact:  # every entry checked out on its own: the framing around them was altered
        raise IntegrityError(f"bundle {path}: its sha256 does not match its content (damaged or altered)")
    return plans


def _entries(f: BinaryIO, name: str) -> tuple[list[bytes], bool]:
    """The raw entries (framing checked) and whether the trailer's digest matches.
    The digest is judged after the entries, so that a damaged plan is named."""
    digest = hashlib.sha256()
    magic = f.read(len(MAGIC))
    if magic != MAGIC:
        raise IntegrityError(f"bundle {name}: not a plancache bundle (it starts with {magic[:24]!r})")
    digest.update(magic)
    entries: list[bytes] = []
    while True:
        head = f.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            raise IntegrityError(f"bundle {name}: truncated after entry {len(entries) - 1} (no trailer)")
        (length,) = _LENGTH.unpack(head)
        if length == 0:
            break
        if length > MAX_ENTRY_BYTES:
            raise IntegrityError(f"bundle {name}, entry {len(entries)}: length {length} is not plausible (damaged)")
        data = f.read(length)
        if len(data) < length:
            raise IntegrityError(f"bundle {name}, entry {len(entries)}: truncated ({len(data)} of {length} bytes)")
        digest.update(head)
        digest.update(data)
        entries.append(data)
    trailer = f.read(_LENGTH.size + 32)
    if len(trailer) < _LENGTH.size + 32 or f.read(1):
        raise IntegrityError(f"bundle {name}: its trailer is damaged or followed by extra bytes")
    (count,) = _LENGTH.unpack(trailer[: _LENGTH.size])
    if count != len(entries):
        raise IntegrityError(f"bundle {name}: the trailer counts {count} plans, the file holds {len(entries)}")
    return entries, trailer[_LENGTH.size :] == digest.digest()

"""Plan keys: `<spec sha256>/<target id>/<options id>`.

Readable on purpose: an operator can see which target and spec a key belongs
to. Redis key names built from it live in plancache_server.store.keys, nowhere else.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from plancache.errors import InvalidRequest
from plancache.keys.options import CompileOptions
from plancache.keys.target import Target

_SPEC_HASH = re.compile(r"^[0-9a-f]{64}$")
_OPTIONS_ID = re.compile(r"^opt-[0-9a-f]{16}$")


def make_key(spec_hash: str, target: Target, options: CompileOptions) -> str:
    return f"{spec_hash}/{target.id}/{options.id}"


def make_family_key(family_hash: str, target: Target, options: CompileOptions) -> str:
    """A graph family's key (plancache.graphspec.family): a plan key's form, of the family's hash,
    marked as a family's."""
    return "family-" + make_key(family_hash, target, options)


@dataclass(frozen=True)
class ParsedKey:
    spec_hash: str
    target: Target
    options_id: str


# Keys parsed and kept (a hot key is parsed once). Each held ~665 bytes with a Target of its own, 65,536 of
# them: a worker storing a new plan a second grew ~5 MB an hour (bench/soak.py, issue 44; tracemalloc named
# this cache). With the targets shared, ~360 bytes beyond the key string: ~3 MB at most.
PARSED_KEYS_KEPT = 8192


@functools.lru_cache(maxsize=256)
def _target(text: str) -> Target:
    """A target id parsed once: a deployment has a few (frozen: shared by every key of it)."""
    return Target.parse(text)


@functools.lru_cache(maxsize=PARSED_KEYS_KEPT)
def parse_key(key: str) -> ParsedKey:
    """Parsed and validated (cached: a hot key is parsed once; failures are not cached)."""
    parts = key.split("/")
    if len(key) > 512 or len(parts) < 5 or not _SPEC_HASH.match(parts[0]) or not _OPTIONS_ID.match(parts[-1]):
        raise InvalidRequest(f"plan key {key[:100]!r} is not like '<sha256>/<target id>/opt-<16 hex>'")
    return ParsedKey(parts[0], _target("/".join(parts[1:-1])), parts[-1])

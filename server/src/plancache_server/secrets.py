"""Secrets on disk: refused when others can read them, as ssh and Postgres do.

A tokens file, a plan-signing key or a TLS private key that group or others
can read (or write) is a secret already shared with every account on the
host. A server or worker refuses to start with one, naming the file, its
mode and the fix; `--allow-readable-secrets` starts anyway, with a warning
(a secret mounted by an orchestrator whose mode cannot be set).
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterable
from pathlib import Path

from plancache.errors import InvalidRequest
from plancache_server.settings import Settings

log = logging.getLogger(__name__)

# Any permission for group or others.
LOOSE_BITS = stat.S_IRWXG | stat.S_IRWXO


def secret_files(settings: Settings) -> Iterable[tuple[str, Path]]:
    """(what it is, where) of each secret these settings read."""
    for what, path in (
        ("tokens file", settings.tokens_file),
        ("plan-signing key", settings.signing_key),
        ("TLS private key", settings.tls_key),
    ):
        if path is not None:
            yield what, path


def check_secret(what: str, path: Path, allow_readable: bool) -> None:
    """InvalidRequest when `path` is missing or open to group or others
    (unless `allow_readable`: then a warning)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)  # follows a link: the file's own mode is what matters
    except OSError as e:
        raise InvalidRequest(f"cannot read the {what} {path}: {e.strerror}") from e
    if not mode & LOOSE_BITS:
        return
    problem = f"the {what} {path} can be read by group or others (mode {mode:04o})"
    if allow_readable:
        log.warning("%s; starting anyway (--allow-readable-secrets)", problem)
        return
    raise InvalidRequest(f"{problem}: run `chmod 600 {path}`, or start with --allow-readable-secrets")


def check_secrets(settings: Settings) -> None:
    for what, path in secret_files(settings):
        check_secret(what, path, settings.allow_readable_secrets)

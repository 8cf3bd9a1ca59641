"""Rotating the plan-signing key without breaking a client: two commands of
plancache-server, each of which changes the key files and exits
(plancache.trust.key_ring says what the files are).

    plancache-server --stage-signing-key [--data-dir D | --signing-key P]
        writes the next key beside the current one, endorsed by it. A running
        server serves it at once as `next` (GetSigningKeys, the status page);
        its workers still sign with the current key. Then, on every client:
        `plancache trust HOST:PORT` (it pins every key the server serves; a
        client that pinned the current key takes its endorsement, over any
        channel, with no fingerprint to compare).
    plancache-server --promote-signing-key [--data-dir D | --signing-key P]
        next becomes current, current becomes previous (its public half
        kept, still served and trusted: the plans it signed stay valid for
        clients that pinned it). Restart the server and any worker using
        the key: a worker loads its key at start.

The key is the one a server would sign with: --signing-key, else the one it
generated in --data-dir (keys/plan-signing.pem).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from plancache.errors import PlanCacheError
from plancache.trust.key_ring import KeyRing, RingKey
from plancache_server.settings import Settings

STAGE, PROMOTE = "stage", "promote"


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The two commands, on plancache-server's parser (they are actions, not settings: no environment variable)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--stage-signing-key",
        dest="signing_key_action",
        action="store_const",
        const=STAGE,
        help="write the next plan-signing key (served as `next` at once), print its fingerprint and exit",
    )
    group.add_argument(
        "--promote-signing-key",
        dest="signing_key_action",
        action="store_const",
        const=PROMOTE,
        help="make the staged key current (the current one stays served as `previous`) and exit; "
        "then restart the server and its workers",
    )


def signing_key_path(settings: Settings) -> Path:
    """The private key a server's own workers sign with: --signing-key, else the one generated in --data-dir."""
    return settings.signing_key or settings.data_dir / "keys" / "plan-signing.pem"


def run(settings: Settings, action: str) -> int:
    ring = KeyRing(signing_key_path(settings))
    try:
        if action == STAGE:
            staged = ring.stage()
            print(f"staged {_line(staged)}\n  {staged.path}")
            print(
                "A running server serves it now as `next` (its workers still sign with the current key).\n"
                "On every client: plancache trust HOST:PORT   (it pins every key the server serves; the current "
                "key endorsed this one, so a client that pinned the current key needs nothing more, over any "
                f"channel; a client new to this server, over a plain channel, adds --expect {staged.fingerprint})\n"
                "Then: plancache-server --promote-signing-key (with the same --data-dir or --signing-key) and "
                "restart the server and its workers."
            )
        else:
            current, previous = ring.promote()
            print(f"current  {_line(current)}\nprevious {_line(previous)}")
            print(
                "Restart the server and any worker that signs with this key: they load it at start. The previous "
                f"key stays served and trusted (delete {previous.path} once no stored plan needs it)."
            )
    except PlanCacheError as e:
        print(f"plancache-server: {e.message}", file=sys.stderr)
        return 1
    return 0


def _line(key: RingKey) -> str:
    created = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(key.created_at))
    return f"key {key.key_id} ({key.state}), fingerprint {key.fingerprint}, created {created}"

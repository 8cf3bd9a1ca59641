"""`plancache trust`: a server's plan-signing keys fetched, shown and pinned
in one step a user can audit, so that every client of this user verifies
the server's plans with no key file copied by hand.

    plancache trust HOST:PORT [--token T | --token-file F] [--tls] [--tls-ca CA] [--expect FINGERPRINT ...] [--yes]
    plancache trust --list
    plancache trust --remove KEYID

Each served key (current, next, previous) is printed with its key id, state
and fingerprint, then pinned (plancache.trust.pins). Nothing is trusted
silently: over TLS or with a token the keys are pinned after they are
printed (on a terminal after a yes, unless --yes); over a plain channel
(no TLS, no token) anyone on the path could substitute them, so a key not
pinned already is pinned only when an --expect names its fingerprint (the
server logs it at start, and shows it on its status page), when a key
trusted already endorsed it (a rotation's next key: plancache.trust.key_ring),
or when a person at a terminal answers yes. Otherwise nothing new is pinned, and the command
exits 1 printing the command to run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from plancache.errors import InvalidRequest
from plancache.transport.admin import AdminClient
from plancache.transport.connection import TLSConfig
from plancache.trust.pins import Pin, PinStore, ServedKey
from plancache.trust.public_keys import load_public_key, normal_fingerprint

USAGE = "plancache trust HOST:PORT [--expect FINGERPRINT ...] | --list | --remove KEYID"


def add_parser(sub: Any) -> None:
    """The `trust` sub-command on the `plancache` parser's sub-parsers."""
    p = sub.add_parser(
        "trust",
        help="fetch a server's plan-signing keys, print their fingerprints and pin them for this user's clients",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    p.add_argument("server", nargs="?", help="host:port of the server (default: $PLANCACHE_SERVER)")
    p.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="FINGERPRINT",
        help="a fingerprint the server logged at start or shows on its status page: its key is pinned even over "
        "a plain channel, and the command fails when the server serves no key with it (repeat for several)",
    )
    p.add_argument(
        "--yes", action="store_true", help="pin without asking at a terminal (over TLS or with a token only)"
    )
    p.add_argument("--list", action="store_true", help="show the pinned keys")
    p.add_argument("--remove", action="append", default=[], metavar="KEYID", help="unpin a key (repeat for several)")
    p.add_argument("--token", help="bearer token (default: $PLANCACHE_TOKEN)")
    p.add_argument("--token-file", type=Path, help="a file holding the bearer token")
    p.add_argument("--tls", action="store_true", help="connect over TLS (with --tls-ca, --tls-cert, --tls-key)")
    p.add_argument("--tls-ca", type=Path, help="PEM CA that signed the server's certificate")
    p.add_argument("--tls-cert", type=Path, help="PEM client certificate (mutual TLS)")
    p.add_argument("--tls-key", type=Path, help="PEM key of --tls-cert")
    p.add_argument("--timeout", type=float, default=None, help="seconds for the call")


def run(args: argparse.Namespace) -> int:
    store = PinStore()
    if args.list:
        return _list(store)
    if args.remove:
        for key_id in args.remove:
            for path in store.remove(key_id):
                print(f"removed {path}")
        print("plans signed by the removed key(s) are refused from now on")
        return 0
    server = args.server or os.environ.get("PLANCACHE_SERVER")
    if not server:
        raise InvalidRequest(f"name the server whose keys to pin: {USAGE}")
    return _trust(store, server, args)


def _trust(store: PinStore, server: str, args: argparse.Namespace) -> int:
    expected = [normal_fingerprint(f) for f in args.expect]
    tls = TLSConfig(args.tls_ca, args.tls_cert, args.tls_key) if (args.tls or args.tls_ca or args.tls_cert) else None
    token = args.token or (_read_token(args.token_file) if args.token_file else None)
    pinned = {p.key_id: p for p in store.pins()}  # a damaged pin stops here, named, before anything is fetched
    with AdminClient(server, timeout=args.timeout or 30.0, token=token, tls=tls) as admin:
        served = admin.signing_keys()
        tokened = bool(admin.connection.metadata)
    channel = "TLS" if tls is not None else ("an unencrypted channel with a token" if tokened else "a plain channel")
    if not served:
        print(
            f"plancache trust: {server} serves no signing key: its plans are unsigned, or signed by workers it was "
            "not told of (--trusted-keys); nothing pinned",
            file=sys.stderr,
        )
        return 1
    print(f"{server} serves {len(served)} signing key(s), over {channel}:")
    for key in served:
        print(_key_line(key, "pinned already" if key.key_id in pinned else "new"))
    unmatched = sorted(set(expected) - {k.fingerprint for k in served})
    if unmatched:
        print(
            f"plancache trust: no key {server} serves has the fingerprint {', '.join(unmatched)}: a different "
            "server, or someone on the path substituting keys; nothing pinned",
            file=sys.stderr,
        )
        return 1
    new = [k for k in served if k.key_id not in pinned]
    endorsed: dict[str, str] = {}
    if tls is None and not tokened:
        vouched, endorsed = _vouched(new, expected, {p.key_id: p.public_key for p in pinned.values()})
        unvouched = [k for k in new if k not in vouched]
        if unvouched and _ask(
            "these keys came over a plain channel (no TLS, no token), where anyone on the path could substitute "
            "them. Compare each fingerprint with the server's log ('signing key ... fingerprint ...') or its "
            f"status page. Pin {len(unvouched)} key(s) not named by --expect?"
        ):
            vouched, unvouched = vouched + unvouched, []
    else:
        if tokened and tls is None:
            print(
                "note: the channel is not encrypted: a token proves this client to the server, not the server to "
                "this client; on a network that is not yours, compare the fingerprints with the server's log"
            )
        if new and not args.yes and _ask(f"pin {len(new)} new key(s)?") is False:
            print("nothing pinned", file=sys.stderr)
            return 1
        vouched, unvouched = new, []
    for key in served:
        if key.key_id in pinned or key in vouched:  # a pinned key's record is refreshed (its state, this address)
            pin = store.pin(key, server)
            if key in vouched:
                why = f", endorsed by pinned key {endorsed[key.key_id]}" if key.key_id in endorsed else ""
                print(f"pinned {pin.key_id} ({pin.state}{why}): {pin.path}")
    _note_unserved(pinned.values(), served, server)
    if unvouched:
        command = " ".join([f"plancache trust {server}", *(f"--expect {k.fingerprint}" for k in unvouched)])
        print(
            f"plancache trust: not pinned: {', '.join(k.key_id for k in unvouched)} came over a plain channel "
            "(no TLS, no token), where anyone on the path could substitute keys.\n"
            "Check each fingerprint above against the server's: its log at start ('signing key <id> (<state>): "
            "fingerprint ...'), its status page, or what --stage-signing-key printed; then run:\n"
            f"  {command}\n"
            "(or fetch them over TLS, --tls-ca CA, or with a token, --token-file FILE)",
            file=sys.stderr,
        )
        return 1
    if not new:
        print(f"every key {server} serves is pinned already ({store.directory})")
    return 0


def _vouched(
    new: list[ServedKey], expected: list[str], trusted: dict[str, Ed25519PublicKey]
) -> tuple[list[ServedKey], dict[str, str]]:
    """The new keys a plain channel may pin: those an --expect names, and those a trusted key endorsed
    (a rotation's next key, endorsed by the current one), along the chain; with who endorsed each."""
    trusted = dict(trusted)
    vouched: list[ServedKey] = []
    endorsed: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for key in new:
            if key in vouched:
                continue
            endorser = None if key.fingerprint in expected else key.endorsed_by_one_of(trusted)
            if key.fingerprint in expected or endorser is not None:
                vouched.append(key)
                trusted[key.key_id] = load_public_key(key.public_key_pem)
                if endorser is not None:
                    endorsed[key.key_id] = endorser
                grew = True
    return vouched, endorsed


def _key_line(key: ServedKey, note: str) -> str:
    created = time.strftime("%Y-%m-%d", time.gmtime(key.created_at)) if key.created_at else "?"
    return f"  key {key.key_id}  {key.state:8}  fingerprint {key.fingerprint}  created {created}  ({note})"


def _note_unserved(pins: Any, served: list[ServedKey], server: str) -> None:
    """Keys pinned from this address that it no longer serves: kept (never dropped silently), said."""
    ids = {k.key_id for k in served}
    gone = [p for p in pins if server in p.servers and p.key_id not in ids]
    for pin in gone:
        print(
            f"key {pin.key_id}, pinned from {server}, is no longer served there; still trusted "
            f"(`plancache trust --remove {pin.key_id}` unpins it)"
        )


def _list(store: PinStore) -> int:
    pins: list[Pin] = store.pins()
    if not pins:
        print(f"no key is pinned in {store.directory} (`plancache trust HOST:PORT` pins a server's keys)")
        return 0
    print(f"pinned keys in {store.directory}:")
    for pin in pins:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(pin.pinned_at))
        origin = ", ".join(pin.servers) or "placed by hand"
        print(f"  key {pin.key_id}  {pin.state or '?':8}  fingerprint {pin.fingerprint}  pinned {when}  from {origin}")
    return 0


def _ask(question: str) -> bool | None:
    """A person's answer at a terminal; None when nobody can answer (no terminal)."""
    if not sys.stdin.isatty():
        return None
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _read_token(path: Path) -> str:
    token = next((line.strip() for line in path.read_text().splitlines() if line.strip()), "")
    if not token:
        raise InvalidRequest(f"the token file {path} is empty")
    return token

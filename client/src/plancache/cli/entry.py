"""The `plancache` command's entry point: parse, connect when the command needs a server, run it, and turn
errors into one line and an exit code."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence

from plancache.cli import admin, node, trust
from plancache.cli.parser import parser
from plancache.errors import PlanCacheError
from plancache.transport.client import Client, TLSConfig
from plancache.trust.disk_cache import DiskCache

# Commands that need no server.
OFFLINE: dict[str, Callable[[argparse.Namespace], int]] = {
    "hash": node.hash_spec,
    "keygen": node.keygen,
    "import": node.import_bundle,
    "manifest": node.write_manifest,
    "ops": node.list_ops,
    "trust": trust.run,  # opens its own connection: fetching keys must not need the keys it fetches
}
CONNECTED: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "compile": node.compile_plan,
    "get": node.get_plan,
    "prefetch": node.prefetch,
    "invalidate": admin.invalidate,
    "explain": admin.explain,
    "retire": admin.retire,
    "drain": admin.drain,
    "warm": admin.warm,
    "export": admin.export,
    "targets": admin.targets,
    "stats": admin.stats,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        offline = OFFLINE.get(args.command)
        if offline is not None:
            return offline(args)
        with _client(args) as client:
            return CONNECTED[args.command](client, args)
    except PlanCacheError as e:
        print(f"plancache: {type(e).__name__}: {e.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`plancache stats | head`): stop quietly, as
        # `yes | head` does; stdout is pointed at /dev/null so that the
        # interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as e:
        print(f"plancache: {e}", file=sys.stderr)
        return 1


def _client(args: argparse.Namespace) -> Client:
    cache: DiskCache | bool = False if args.no_cache else DiskCache(args.cache_dir)
    tls = TLSConfig(args.tls_ca, args.tls_cert, args.tls_key) if (args.tls or args.tls_ca or args.tls_cert) else None
    return Client(
        args.server,
        timeout=args.timeout or 30.0,
        cache=cache,
        trusted_keys=args.trusted_key,
        allow_unsigned=args.allow_unsigned,
        token=args.token,
        tls=tls,
    )

"""The `plancache` command's arguments: one sub-command each, with the connection's and the plan's flags
shared where a command takes them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from plancache.cli import trust
from plancache.versions import add_version


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plancache", description="Compile once per GPU kind, fetch everywhere.")
    add_version(parser, "plancache", "plancache")
    sub = parser.add_subparsers(dest="command", required=True)
    compile_ = sub.add_parser("compile", help="compile (or fetch) the plan for a spec")
    compile_.add_argument("spec", type=Path)
    _with_server(compile_)
    _with_target(compile_)

    get = sub.add_parser("get", help="fetch a stored plan; never compiles")
    get.add_argument("spec", type=Path, nargs="?")
    get.add_argument("--key")
    _with_server(get)
    _with_target(get)

    stats = sub.add_parser("stats", help="hits, misses, compiles, failures per target")
    _with_server(stats)

    targets = sub.add_parser("targets", help="targets with live workers now")
    _with_server(targets)

    manifest = sub.add_parser("manifest", help="write a start-up manifest from specs")
    manifest.add_argument("specs", type=Path, nargs="+")
    manifest.add_argument("--target", required=True, help="e.g. sm_90/cudnn-91900/fe-1.32.0/dev-nvidia-h200/sms-132")
    manifest.add_argument("--no-autotune", action="store_true")
    manifest.add_argument("--out", type=Path, help="default: standard output")

    prefetch = sub.add_parser(
        "prefetch", help="fetch every plan of a manifest into the disk cache, in one streaming call"
    )
    prefetch.add_argument("manifest", type=Path)
    prefetch.add_argument("--target", help="for manifests without one (default: this machine's GPU 0)")
    prefetch.add_argument("--compile-missing", action="store_true", help="build plans that are not stored yet")
    prefetch.add_argument(
        "--json", action="store_true", help="one JSON document (for scripts) instead of the table, no progress bar"
    )
    _with_server(prefetch)

    invalidate = sub.add_parser("invalidate", help="delete stored plans (admin token): --key, --spec-hash or --target")
    group = invalidate.add_mutually_exclusive_group(required=True)
    group.add_argument("--key")
    group.add_argument("--spec-hash")
    group.add_argument("--target")
    _with_server(invalidate)

    explain = sub.add_parser(
        "explain", help="why a lookup misses: stored plans of the same spec and how their keys differ"
    )
    explain.add_argument("spec", type=Path)
    _with_server(explain)
    _with_target(explain)

    retire = sub.add_parser("retire", help="delete every stored plan of a target no longer in the fleet (admin token)")
    retire.add_argument("--target", required=True)
    _with_server(retire)

    drain = sub.add_parser("drain", help="ask a worker to finish its current build and leave (admin token)")
    drain.add_argument("worker_id")
    _with_server(drain)

    export = sub.add_parser(
        "export", help="write stored plans to one bundle file (--all and --target need an admin token)"
    )
    scope = export.add_mutually_exclusive_group(required=True)
    scope.add_argument("--manifest", type=Path, help="the plans of a manifest")
    scope.add_argument("--target", help="every stored plan of a target")
    scope.add_argument("--all", action="store_true", help="every stored plan")
    export.add_argument("--out", type=Path, required=True)
    _with_server(export)

    import_ = sub.add_parser(
        "import",
        help="verify a bundle and load its plans into a node's disk cache (a server's store: plancache-server-import)",
    )
    import_.add_argument("bundle", type=Path)
    import_.add_argument(
        "--cache-dir", type=Path, help="the disk cache to fill (default: $PLANCACHE_CACHE_DIR or the XDG cache folder)"
    )
    import_.add_argument(
        "--trusted-key",
        type=Path,
        action="append",
        default=[],
        help="Ed25519 public key (PEM) whose plans to accept (default: $PLANCACHE_TRUSTED_KEYS)",
    )
    import_.add_argument(
        "--allow-unsigned",
        action="store_true",
        default=None,
        help="accept unsigned plans (default: $PLANCACHE_ALLOW_UNSIGNED=1)",
    )

    warm = sub.add_parser(
        "warm", help="build a target's plans before its nodes ask (admin token), or see where warming stands (--status)"
    )
    warm.add_argument("--target", help="the target to warm (a full target id)")
    source = warm.add_mutually_exclusive_group()
    source.add_argument(
        "--from", dest="from_target", help="warm from this target's plans, most hit in the last 24 h first"
    )
    source.add_argument("--days", type=int, help="warm from the specs any target served in the last DAYS days")
    source.add_argument("--manifest", type=Path, help="warm the specs of a manifest")
    warm.add_argument("--top", type=int, default=0, help="at most this many specs (default 1000, at most 10000)")
    warm.add_argument(
        "--min-hits", type=float, default=0.0, help="only specs with at least this many hits in the last 24 h"
    )
    warm.add_argument(
        "--status", action="store_true", help="where warming stands, per target (every target, or --target)"
    )
    warm.add_argument("--cancel", action="store_true", help="stop warming --target")
    warm.add_argument("--json", action="store_true")
    _with_server(warm)

    keygen = sub.add_parser(
        "keygen", help="write an Ed25519 key pair for signing plans (workers) and verifying them (clients)"
    )
    keygen.add_argument(
        "--out", type=Path, required=True, help="folder for plan-signing.pem (private) and plan-signing.pub.pem"
    )

    hash_ = sub.add_parser("hash", help="validate a spec and print its hash")
    hash_.add_argument("spec", type=Path)

    ops = sub.add_parser("ops", help="the ops a spec may use, or one op's ports, outputs and attributes")
    ops.add_argument("op", nargs="?", help="an op's name (default: list them all)")

    trust.add_parser(sub)
    return parser


def _with_server(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        default=os.environ.get("PLANCACHE_SERVER", "127.0.0.1:50051"),
        help="host:port, or a host alone for port 50051 (env PLANCACHE_SERVER)",
    )
    p.add_argument("--timeout", type=float, default=None, help="seconds for this call")
    p.add_argument(
        "--cache-dir", type=Path, help="the disk cache (default: $PLANCACHE_CACHE_DIR or the XDG cache folder)"
    )
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the disk cache")
    p.add_argument(
        "--trusted-key",
        type=Path,
        action="append",
        default=[],
        help="Ed25519 public key (PEM) whose plans to accept; repeat during a rotation "
        "(default: $PLANCACHE_TRUSTED_KEYS)",
    )
    p.add_argument(
        "--allow-unsigned",
        action="store_true",
        default=None,
        help="accept unsigned plans (default: $PLANCACHE_ALLOW_UNSIGNED=1)",
    )
    p.add_argument("--token", help="bearer token (default: $PLANCACHE_TOKEN)")
    p.add_argument(
        "--tls", action="store_true", help="connect over TLS (with --tls-ca, --tls-cert, --tls-key as needed)"
    )
    p.add_argument("--tls-ca", type=Path, help="PEM CA that signed the server's certificate")
    p.add_argument("--tls-cert", type=Path, help="PEM client certificate (mutual TLS)")
    p.add_argument("--tls-key", type=Path, help="PEM key of --tls-cert")


def _with_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        help="e.g. sm_90/cudnn-91900/fe-1.32.0, or a prefix (sm_90) of a target the server has workers for "
        "(default: this machine's GPU 0)",
    )
    p.add_argument("--no-autotune", action="store_true", help="take the heuristics' first plan")
    p.add_argument(
        "--exclude-note",
        action="append",
        default=[],
        help="cudnn.behavior_note to exclude, e.g. RUNTIME_COMPILATION",
    )
    p.add_argument("--workspace-limit", type=int, default=0, help="bytes; 0 = no limit")
    p.add_argument("--out", type=Path, help="write the plan (metadata + blob) to this file")

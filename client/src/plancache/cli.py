"""plancache: the command line.

plancache compile SPEC.json --server HOST:PORT [--target T] [--out FILE]
plancache get (--key KEY | SPEC.json) --server HOST:PORT [--target T] [--out FILE]
plancache stats --server HOST:PORT
plancache targets --server HOST:PORT
plancache manifest SPEC.json [SPEC.json ...] --target T [--out MANIFEST]
plancache prefetch MANIFEST --server HOST:PORT [--target T] [--compile-missing]
plancache invalidate (--key KEY | --spec-hash H | --target T) --server HOST:PORT --token ADMIN
plancache explain SPEC.json --server HOST:PORT [--target T]
plancache keygen --out DIR
plancache hash SPEC.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from plancache.errors import InvalidRequest, PlanCacheError
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.keys.target import Target
from plancache.run.plan import Plan
from plancache.transport.client import Client, TLSConfig
from plancache.transport.manifest import Manifest, ManifestEntry
from plancache.transport.results import WindowCounts
from plancache.trust.bundle import read_bundle, write_bundle
from plancache.trust.disk_cache import DiskCache
from plancache.trust.signing import TrustPolicy, generate_keypair


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plancache", description="Compile once per GPU kind, fetch everywhere.")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_server(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--server",
            default=os.environ.get("PLANCACHE_SERVER", "127.0.0.1:50051"),
            help="host:port (env PLANCACHE_SERVER)",
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
            help="Ed25519 public key (PEM) whose plans to accept; repeat during a rotation (default: $PLANCACHE_TRUSTED_KEYS)",
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

    def with_target(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--target",
            help="e.g. sm_90/cudnn-91900/fe-1.32.0, or a prefix (sm_90) of a target the server has workers for (default: this machine's GPU 0)",
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

    compile_ = sub.add_parser("compile", help="compile (or fetch) the plan for a spec")
    compile_.add_argument("spec", type=Path)
    with_server(compile_)
    with_target(compile_)

    get = sub.add_parser("get", help="fetch a stored plan; never compiles")
    get.add_argument("spec", type=Path, nargs="?")
    get.add_argument("--key")
    with_server(get)
    with_target(get)

    stats = sub.add_parser("stats", help="hits, misses, compiles, failures per target")
    with_server(stats)

    targets = sub.add_parser("targets", help="targets with live workers now")
    with_server(targets)

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
    with_server(prefetch)

    invalidate = sub.add_parser("invalidate", help="delete stored plans (admin token): --key, --spec-hash or --target")
    group = invalidate.add_mutually_exclusive_group(required=True)
    group.add_argument("--key")
    group.add_argument("--spec-hash")
    group.add_argument("--target")
    with_server(invalidate)

    explain = sub.add_parser(
        "explain", help="why a lookup misses: stored plans of the same spec and how their keys differ"
    )
    explain.add_argument("spec", type=Path)
    with_server(explain)
    with_target(explain)

    retire = sub.add_parser("retire", help="delete every stored plan of a target no longer in the fleet (admin token)")
    retire.add_argument("--target", required=True)
    with_server(retire)

    drain = sub.add_parser("drain", help="ask a worker to finish its current build and leave (admin token)")
    drain.add_argument("worker_id")
    with_server(drain)

    export = sub.add_parser(
        "export", help="write stored plans to one bundle file (--all and --target need an admin token)"
    )
    scope = export.add_mutually_exclusive_group(required=True)
    scope.add_argument("--manifest", type=Path, help="the plans of a manifest")
    scope.add_argument("--target", help="every stored plan of a target")
    scope.add_argument("--all", action="store_true", help="every stored plan")
    export.add_argument("--out", type=Path, required=True)
    with_server(export)

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
    with_server(warm)

    keygen = sub.add_parser(
        "keygen", help="write an Ed25519 key pair for signing plans (workers) and verifying them (clients)"
    )
    keygen.add_argument(
        "--out", type=Path, required=True, help="folder for plan-signing.pem (private) and plan-signing.pub.pem"
    )

    hash_ = sub.add_parser("hash", help="validate a spec and print its hash")
    hash_.add_argument("spec", type=Path)
    return parser


def _options(args: argparse.Namespace) -> CompileOptions:
    return CompileOptions(
        autotune=not args.no_autotune,
        excluded_behavior_notes=tuple(args.exclude_note),
        workspace_limit=args.workspace_limit,
    )


def _report(plan: Plan, out: Path | None) -> None:
    meta = plan.metadata
    timed = [c for c in meta.candidates if c.HasField("median_ms")]
    print(
        json.dumps(
            {
                "key": plan.key,
                "source": plan.source,
                "plan_name": meta.plan_name,
                "engine_id": meta.engine_id,
                "blob_bytes": len(plan.blob),
                "workspace_bytes": meta.workspace_size,
                "candidates": len(meta.candidates),
                "fastest_ms": min((c.median_ms for c in timed), default=None),
                "build_seconds": round(meta.build_seconds, 3),
                "autotune_seconds": round(meta.autotune_seconds, 3),
                "built_by": meta.built_by,
            },
            indent=2,
        )
    )
    if out is not None:
        out.write_bytes(plan.to_bytes())
        print(f"wrote {out}", file=sys.stderr)


def _print_stats(client: Client, timeout: float | None) -> None:
    header = f"{'':60} {'window':>6} {'hit rate':>8} {'hits':>8} {'misses':>8} {'compiles':>8} {'failures':>8} {'refused':>7} {'joined':>7} {'MB served':>10} {'s saved':>9}"

    def line(label: str, window: str, w: WindowCounts) -> str:
        return (
            f"{label:60} {window:>6} {w.hit_rate:8.1%} {w.hits:8} {w.misses:8} {w.compiles:8} {w.failures:8} {w.refused:7} {w.joined:7} "
            f"{w.bytes_served / 1e6:10.1f} {w.build_seconds_saved:9.1f}"
        )

    targets = client.admin.stats(timeout=timeout)  # both answers before any output: an error prints alone
    families = client.admin.family_stats(timeout=timeout)
    print(header)
    for target in targets:
        for i, (window, counts) in enumerate(target.windows.items()):
            print(line(f"{target.target_id} ({target.live_workers} workers)" if i == 0 else "", window, counts))
    if not targets:
        print("(no lookups yet and no live worker)")
    if families:
        print(f"\n{'op family':60}")
        for family, windows in families.items():
            for i, (window, counts) in enumerate(windows.items()):
                print(line(family if i == 0 else "", window, counts))


def _warm(client: Client, args: argparse.Namespace) -> int:
    if args.status:
        shown = client.admin.warm_status(args.target, timeout=args.timeout)
    elif not args.target:
        print(
            "plancache warm: give --target (with --from, --days or --manifest; or --cancel), or --status",
            file=sys.stderr,
        )
        return 2
    elif args.cancel:
        shown = [client.admin.cancel_warm(args.target, timeout=args.timeout)]
    elif args.from_target or args.days or args.manifest:
        manifest = Manifest.load(args.manifest) if args.manifest else None
        shown = [
            client.admin.warm(
                args.target,
                from_target=args.from_target,
                served_days=args.days,
                manifest=manifest,
                top=args.top,
                min_hits=args.min_hits,
                timeout=args.timeout,
            )
        ]
    else:
        print("plancache warm: give a source: --from TARGET, --days N or --manifest FILE", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([dataclasses.asdict(s) for s in shown], indent=2))
    else:
        for status in shown:
            print(status.line())
            for plan_key, reason in status.failures[:5]:
                print(f"    failed {plan_key}: {reason}")
        if not shown:
            print("no warming plan")
    return 0


def _load_spec(path: Path) -> GraphSpec:
    return GraphSpec.from_json(path.read_text())


def _progress_bar(done: int, total: int) -> None:
    width = 30
    filled = width * done // max(total, 1)
    print(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} plans",
        end="" if done < total else "\n",
        file=sys.stderr,
        flush=True,
    )


def _prefetch(client: Client, args: argparse.Namespace) -> int:
    manifest = Manifest.load(args.manifest)
    shown = {"done": 0, "total": 0}

    def progress(done: int, total: int) -> None:
        shown.update(done=done, total=total)
        _progress_bar(done, total)

    result = client.prefetch(
        manifest,
        args.target,
        compile_missing=args.compile_missing,
        progress=None if args.json else progress,
        timeout=args.timeout,
    )
    if shown["total"] and shown["done"] < shown["total"]:
        print(file=sys.stderr)  # end the progress bar's line
    failures = [
        {
            "entry": i,
            "name": manifest.entries[i].name,
            "key": result.keys.get(i, ""),
            "error": type(e).__name__,
            "reason": e.message,
        }
        for i, e in sorted(result.errors.items())
    ]
    if args.json:
        print(
            json.dumps(
                {
                    "total": result.total,
                    "from_cache": result.from_cache,
                    "fetched": result.fetched,
                    "compiled": result.compiled,
                    "provisional": result.provisional,
                    "failed": result.failed,
                    "failures": failures,
                },
                indent=2,
            )
        )
        return 1 if failures else 0
    print(f"{'entry':>5}  {'name':40}  outcome")
    for i, entry in enumerate(manifest.entries):
        plan, error = result.plans.get(i), result.errors.get(i)
        outcome = (
            f"{type(error).__name__}"
            if error is not None
            else (plan.source + (" (provisional)" if plan.provisional else "") if plan else "-")
        )
        print(f"{i:>5}  {(entry.name or result.keys.get(i, ''))[:40]:40}  {outcome}")
    print(
        f"\n{result.total} plans: {result.from_cache} from the disk cache, {result.fetched} fetched, {result.compiled} compiled"
        f"{f' ({result.provisional} provisional)' if result.provisional else ''}, {result.failed} failed"
    )
    by_reason: dict[tuple[str, str], list[int]] = {}
    for i, failure in sorted(result.errors.items()):
        by_reason.setdefault((type(failure).__name__, failure.message), []).append(i)
    for (kind, reason), entries in by_reason.items():  # one line per distinct error, not per plan
        shown_entries = ", ".join(map(str, entries[:10])) + (
            f" and {len(entries) - 10} more" if len(entries) > 10 else ""
        )
        print(f"{len(entries)} failed with {kind}: {reason} (entries {shown_entries})", file=sys.stderr)
    return 1 if failures else 0


def _export(client: Client, args: argparse.Namespace) -> int:
    if args.manifest:
        manifest = Manifest.load(args.manifest)
    else:
        keys = client.admin.list_plans(None if args.all else args.target, timeout=args.timeout)
        manifest = Manifest(entries=[ManifestEntry(key=key) for key in keys])
    result = client.prefetch(manifest, timeout=args.timeout)  # each plan verified as any fetch is
    if result.errors:
        for index, error in sorted(result.errors.items()):
            print(
                f"entry {index} ({result.keys.get(index, '')}): {type(error).__name__}: {error.message}",
                file=sys.stderr,
            )
        print(f"no bundle written: {len(result.errors)} of {result.total} plans could not be fetched", file=sys.stderr)
        return 1
    count = write_bundle(args.out, [result.plans[i] for i in range(result.total)])
    print(f"wrote {count} plan(s) to {args.out}")
    return 0


def _target(client: Client, text: str | None, timeout: float | None) -> Target | str | None:
    """--target as given, completed from the server's live targets when it is
    only a prefix ("sm_90"); without it, this machine's GPU (None), or an error
    that lists what the server can build."""
    if text is None:
        try:
            from plancache.gpu.target import detect_target

            detect_target()
            return None
        except InvalidRequest as e:
            raise InvalidRequest(
                f"{e.message.split(':')[0]}: pass --target ({_live_targets(client, timeout)})"
            ) from None
    try:
        return Target.parse(text)
    except InvalidRequest:
        matches = [
            t.target_id
            for t in client.admin.list_targets(timeout=timeout)
            if t.target_id == text or t.target_id.startswith(text.rstrip("/") + "/")
        ]
        longest = max(matches, key=len, default="")
        if matches and all(longest == m or longest.startswith(m + "/") for m in matches):
            matches = [longest]  # a GPU's exact target and its generic forms: the exact one
        if len(matches) == 1:
            print(f"target: {matches[0]}", file=sys.stderr)
            return matches[0]
        if matches:
            raise InvalidRequest(
                f"--target {text} matches several targets the server has workers for: {', '.join(matches)}"
            ) from None
        raise InvalidRequest(
            f"--target {text} is not a full target id and matches none the server has workers for ({_live_targets(client, timeout)})"
        ) from None


def _live_targets(client: Client, timeout: float | None) -> str:
    live = [t.target_id for t in client.admin.list_targets(timeout=timeout) if t.live_workers]
    return "the server has workers for: " + ", ".join(live) if live else "the server has no live worker now"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "hash":
            print(_load_spec(args.spec).spec_hash())
            return 0
        if args.command == "keygen":
            private, public = generate_keypair(args.out)
            print(f"private key (workers: --signing-key): {private}\npublic key (clients: --trusted-key): {public}")
            return 0
        if args.command == "import":
            plans = read_bundle(args.bundle, TrustPolicy.create(args.trusted_key, args.allow_unsigned))
            disk = DiskCache(args.cache_dir)
            for plan in plans:
                disk.put(plan)
            print(f"imported {len(plans)} plan(s) into {disk.root}")
            return 0
        if args.command == "manifest":
            options = CompileOptions(autotune=not args.no_autotune)
            text = Manifest.from_specs(
                [_load_spec(p) for p in args.specs], Target.parse(args.target), options, [p.stem for p in args.specs]
            ).to_json()
            if args.out:
                args.out.write_text(text + "\n")
            else:
                print(text)
            return 0
        cache: DiskCache | bool = False if args.no_cache else DiskCache(args.cache_dir)
        tls = (
            TLSConfig(args.tls_ca, args.tls_cert, args.tls_key) if (args.tls or args.tls_ca or args.tls_cert) else None
        )
        with Client(
            args.server,
            timeout=args.timeout or 30.0,
            cache=cache,
            trusted_keys=args.trusted_key,
            allow_unsigned=args.allow_unsigned,
            token=args.token,
            tls=tls,
        ) as client:
            if args.command == "compile":
                target = _target(client, args.target, args.timeout)
                _report(client.compile(_load_spec(args.spec), target, _options(args), timeout=args.timeout), args.out)
            elif args.command == "get":
                if args.key:
                    plan = client.get(args.key, timeout=args.timeout)
                elif args.spec:
                    plan = client.get(
                        spec=_load_spec(args.spec),
                        target=_target(client, args.target, args.timeout),
                        options=_options(args),
                        timeout=args.timeout,
                    )
                else:
                    print("plancache get: give --key KEY or a SPEC file", file=sys.stderr)
                    return 2
                _report(plan, args.out)
            elif args.command == "invalidate":
                deleted = client.admin.invalidate(
                    args.key, spec_hash=args.spec_hash, target=args.target, timeout=args.timeout
                )
                print(f"deleted {deleted} plan(s)")
            elif args.command == "explain":
                answer = client.admin.explain(
                    _load_spec(args.spec),
                    _target(client, args.target, args.timeout),
                    _options(args),
                    timeout=args.timeout,
                )
                print(f"{answer.key}\n{answer.summary}")
                for variant in answer.variants:
                    print(f"  {variant.key}\n    " + "\n    ".join(variant.differences))
            elif args.command == "retire":
                deleted = client.admin.invalidate(target=Target.parse(args.target), timeout=args.timeout)
                print(f"retired {args.target}: deleted {deleted} plan(s)")
            elif args.command == "drain":
                known = client.admin.drain_worker(args.worker_id, timeout=args.timeout)
                print(f"asked {args.worker_id} to drain" + ("" if known else " (no live worker has that id now)"))
            elif args.command == "prefetch":
                return _prefetch(client, args)
            elif args.command == "warm":
                return _warm(client, args)
            elif args.command == "export":
                return _export(client, args)
            elif args.command == "targets":
                listed = client.admin.list_targets(timeout=args.timeout)
                for t in listed:
                    print(f"{t.target_id:70} {t.live_workers:3} worker(s): {', '.join(t.worker_ids)}")
                if not listed:
                    print("no live worker: nothing can be compiled now (stored plans are still served)")
            elif args.command == "stats":
                _print_stats(client, args.timeout)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

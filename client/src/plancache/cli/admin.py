"""An operator's commands, each through client.admin (the AdminClient): the statistics and live targets, plans
explained, invalidated, retired and exported, workers drained, targets warmed."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from plancache.cli.plan_args import compile_options, load_spec, resolve_target
from plancache.keys.target import Target
from plancache.transport.client import Client
from plancache.transport.manifest import Manifest, ManifestEntry
from plancache.transport.results import WindowCounts
from plancache.trust.bundle import write_bundle


def stats(client: Client, args: argparse.Namespace) -> int:
    header = (
        f"{'':60} {'window':>6} {'hit rate':>8} {'hits':>8} {'misses':>8} {'compiles':>8} {'failures':>8} "
        f"{'refused':>7} {'joined':>7} {'MB served':>10} {'s saved':>9}"
    )

    def line(label: str, window: str, w: WindowCounts) -> str:
        return (
            f"{label:60} {window:>6} {w.hit_rate:8.1%} {w.hits:8} {w.misses:8} {w.compiles:8} {w.failures:8} "
            f"{w.refused:7} {w.joined:7} {w.bytes_served / 1e6:10.1f} {w.build_seconds_saved:9.1f}"
        )

    timeout = args.timeout
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
    return 0


def targets(client: Client, args: argparse.Namespace) -> int:
    listed = client.admin.list_targets(timeout=args.timeout)
    for t in listed:
        print(f"{t.target_id:70} {t.live_workers:3} worker(s): {', '.join(t.worker_ids)}")
    if not listed:
        print("no live worker: nothing can be compiled now (stored plans are still served)")
    return 0


def invalidate(client: Client, args: argparse.Namespace) -> int:
    deleted = client.admin.invalidate(args.key, spec_hash=args.spec_hash, target=args.target, timeout=args.timeout)
    print(f"deleted {deleted} plan(s)")
    return 0


def explain(client: Client, args: argparse.Namespace) -> int:
    answer = client.admin.explain(
        load_spec(args.spec),
        resolve_target(client, args.target, args.timeout),
        compile_options(args),
        timeout=args.timeout,
    )
    print(f"{answer.key}\n{answer.summary}")
    for variant in answer.variants:
        print(f"  {variant.key}\n    " + "\n    ".join(variant.differences))
    return 0


def retire(client: Client, args: argparse.Namespace) -> int:
    deleted = client.admin.invalidate(target=Target.parse(args.target), timeout=args.timeout)
    print(f"retired {args.target}: deleted {deleted} plan(s)")
    return 0


def drain(client: Client, args: argparse.Namespace) -> int:
    known = client.admin.drain_worker(args.worker_id, timeout=args.timeout)
    print(f"asked {args.worker_id} to drain" + ("" if known else " (no live worker has that id now)"))
    return 0


def warm(client: Client, args: argparse.Namespace) -> int:
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


def export(client: Client, args: argparse.Namespace) -> int:
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

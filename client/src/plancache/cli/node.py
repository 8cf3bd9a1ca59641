"""A node's commands: a plan compiled or fetched (compile, get), a manifest written and prefetched, and those
that need no server (hash, keygen, import, ops)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from plancache.cli.plan_args import compile_options, load_spec, resolve_target
from plancache.errors import SpecError
from plancache.graphspec.ops import CATALOG
from plancache.graphspec.suggest import unknown_op
from plancache.keys.options import CompileOptions
from plancache.keys.target import Target
from plancache.run.plan import Plan
from plancache.transport.client import Client
from plancache.transport.manifest import Manifest
from plancache.trust.bundle import read_bundle
from plancache.trust.disk_cache import DiskCache
from plancache.trust.signing import TrustPolicy, generate_keypair


def compile_plan(client: Client, args: argparse.Namespace) -> int:
    target = resolve_target(client, args.target, args.timeout)
    _report(client.compile(load_spec(args.spec), target, compile_options(args), timeout=args.timeout), args.out)
    return 0


def get_plan(client: Client, args: argparse.Namespace) -> int:
    if args.key:
        plan = client.get(args.key, timeout=args.timeout)
    elif args.spec:
        plan = client.get(
            spec=load_spec(args.spec),
            target=resolve_target(client, args.target, args.timeout),
            options=compile_options(args),
            timeout=args.timeout,
        )
    else:
        print("plancache get: give --key KEY or a SPEC file", file=sys.stderr)
        return 2
    _report(plan, args.out)
    return 0


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


def write_manifest(args: argparse.Namespace) -> int:
    options = CompileOptions(autotune=not args.no_autotune)
    text = Manifest.from_specs(
        [load_spec(p) for p in args.specs], Target.parse(args.target), options, [p.stem for p in args.specs]
    ).to_json()
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


def prefetch(client: Client, args: argparse.Namespace) -> int:
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
        f"\n{result.total} plans: {result.from_cache} from the disk cache, {result.fetched} fetched, "
        f"{result.compiled} compiled"
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


def _progress_bar(done: int, total: int) -> None:
    width = 30
    filled = width * done // max(total, 1)
    print(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} plans",
        end="" if done < total else "\n",
        file=sys.stderr,
        flush=True,
    )


def hash_spec(args: argparse.Namespace) -> int:
    print(load_spec(args.spec).spec_hash())
    return 0


def list_ops(args: argparse.Namespace) -> int:
    """Every op a spec may use (one line each), or one op's ports, outputs and attributes."""
    if args.op is None:
        width = max(map(len, CATALOG))
        for name in sorted(CATALOG):
            listed = CATALOG[name]
            print(f"{name:<{width}}  {listed.family:<16}  {', '.join(listed.inputs)}".rstrip())
        return 0
    schema = CATALOG.get(args.op)
    if schema is None:
        raise SpecError(unknown_op(args.op, CATALOG))
    print(f"{schema.name} ({schema.family})")
    print(f"  inputs: {', '.join(schema.inputs) or 'none'}")
    if schema.optional_inputs or schema.list_inputs:
        print(f"  optional inputs: {', '.join((*schema.optional_inputs, *(f'{p}_0..' for p in schema.list_inputs)))}")
    print(f"  outputs: {', '.join(schema.all_outputs)}")
    for key, attr in sorted(schema.attributes.items()):
        said = "required" if attr.required else ("optional" if attr.default is None else f"default {attr.default!r}")
        choices = f", one of {', '.join(attr.choices)}" if attr.choices else ""
        print(f"  attribute {key}: {attr.kind.value} ({said}{choices})")
    return 0


def keygen(args: argparse.Namespace) -> int:
    private, public = generate_keypair(args.out)
    print(f"private key (workers: --signing-key): {private}\npublic key (clients: --trusted-key): {public}")
    return 0


def import_bundle(args: argparse.Namespace) -> int:
    plans = read_bundle(args.bundle, TrustPolicy.create(args.trusted_key, args.allow_unsigned))
    disk = DiskCache(args.cache_dir)
    for plan in plans:
        disk.put(plan)
    print(f"imported {len(plans)} plan(s) into {disk.root}")
    return 0

"""`plancache-server-import BUNDLE --redis-url URL`: load a bundle into a
plan store, every plan verified first (plancache.trust.bundle).

It writes plans as a worker does (accounted, indexed, under --store-max-mb),
so it runs with the workers' Redis credentials: gateways never write
plans. Plans must be signed by one of --trusted-keys (the workers' public
keys; a server's generated one is <data dir>/keys/plan-signing.pub.pem)
unless --unsigned accepts unsigned ones.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from plancache.errors import PlanCacheError
from plancache.trust.bundle import read_bundle
from plancache.trust.signing import TrustPolicy
from plancache.versions import add_version
from plancache_server.store.plans import RedisPlanStore, StoredPlan
from plancache_server.store.redis_conn import connect

log = logging.getLogger(__name__)


def import_bundle(
    bundle: Path, redis_url: str, trusted_keys: Sequence[Path], allow_unsigned: bool, max_bytes: int = 0
) -> int:
    """Verify every plan of `bundle`, then store them all; the count."""
    plans = read_bundle(bundle, TrustPolicy.create(trusted_keys, allow_unsigned, pinned=False))
    store = RedisPlanStore(connect(redis_url), max_bytes=max_bytes)
    for plan in plans:
        store.put(StoredPlan(blob=plan.blob, metadata=plan.metadata, signature=plan.signature))
    return len(plans)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="plancache-server-import", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    add_version(parser, "plancache-server-import", "plancache-server")
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--redis-url", required=True, help="the store (the workers' Redis user)")
    parser.add_argument(
        "--trusted-keys",
        type=Path,
        action="append",
        default=[],
        help="public key (PEM) the plans must be signed by; repeatable",
    )
    parser.add_argument("--unsigned", action="store_true", help="accept unsigned plans")
    parser.add_argument(
        "--store-max-mb", type=int, default=0, help="the store's bound, as the workers have it (0: none)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        count = import_bundle(args.bundle, args.redis_url, args.trusted_keys, args.unsigned, args.store_max_mb * 2**20)
    except (PlanCacheError, OSError) as e:
        print(f"plancache-server-import: {e}", file=sys.stderr)
        return 1
    print(f"imported {count} plan(s) from {args.bundle}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

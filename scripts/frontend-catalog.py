#!/usr/bin/env python3
"""Record the installed cuDNN frontend's graph API (scripts/frontend_api.py) in
client/src/plancache/graphspec/frontend_ops.json, and publish the whole op catalog
(plancache.graphspec.ops.CATALOG, as other languages read it) in
proto/plancache/v1/catalog.json.

    .venv/bin/python scripts/frontend-catalog.py           # rewrite both
    .venv/bin/python scripts/frontend-catalog.py --check   # exit 1 if either is stale

Run it after upgrading nvidia-cudnn-frontend; tests/unit/test_catalog.py
fails until it has been run (and on the GPU, tests/gpu check the frontend
there against the recorded file)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "client/src/plancache/graphspec/frontend_ops.json"
PUBLISHED = REPO / "proto/plancache/v1/catalog.json"


def render(data: object) -> str:
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare with the committed files")
    args = parser.parse_args()
    sys.path[:0] = [str(REPO / "client/src")]
    from frontend_api import derive

    stale = []
    recorded = render(derive())
    if RECORDED.read_text() != recorded if RECORDED.exists() else True:
        stale.append(RECORDED)
        if not args.check:
            RECORDED.write_text(recorded)
    from plancache.graphspec.catalog_export import export  # reads the (new) recorded file

    published = render(export())
    if PUBLISHED.read_text() != published if PUBLISHED.exists() else True:
        stale.append(PUBLISHED)
        if not args.check:
            PUBLISHED.write_text(published)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(REPO)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())

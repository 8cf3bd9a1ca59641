#!/usr/bin/env python3
"""Rewrites the README's generated parts from the code: the configuration
table (plancache_server.settings.markdown_table) and the Redis ACL lines
(plancache_server.store.keys.acl_setuser). tests/unit/test_compose.py fails when
they drift; run `.venv/bin/python scripts/sync-readme.py` to mend them."""

from __future__ import annotations

from pathlib import Path

from plancache_server.settings import markdown_table
from plancache_server.store import keys

README = Path(__file__).resolve().parent.parent / "README.md"


def main() -> None:
    lines = README.read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| flag | environment |"))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    lines[start:end] = markdown_table().split("\n")
    for role, user in (("gateway", "plancache-gateway"), ("worker", "plancache-worker")):
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"ACL SETUSER {user} "))
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        lines[at] = indent + "ACL SETUSER " + " ".join(keys.acl_setuser(role, user, f"<{role} password>"))
    README.write_text("\n".join(lines))


if __name__ == "__main__":
    main()

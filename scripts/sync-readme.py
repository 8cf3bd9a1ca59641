#!/usr/bin/env python3
"""Rewrites the docs' generated parts from the code: the configuration table
in docs/configuration.md (plancache_server.settings.markdown_table), the
Redis ACL commands in docs/operations.md (plancache_server.store.keys.acl_setuser)
and the table of contents of README.md and of every docs page written by hand
(from its headings; docs/architecture.md and docs/performance.md are written
whole by their own scripts). tests/unit/test_compose.py and
tests/unit/test_docs.py fail when any of them drifts; run
`.venv/bin/python scripts/sync-readme.py` to mend them."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plancache_server.settings import markdown_table  # noqa: E402
from plancache_server.store import keys  # noqa: E402
from tests.support.markdown import with_contents  # noqa: E402

README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
OPERATIONS = ROOT / "docs" / "operations.md"
# Written whole by scripts/architecture-doc.py and scripts/performance-doc.py (contents included).
GENERATED_PAGES = {"architecture.md", "performance.md"}
# Pages this long or longer carry a table of contents.
CONTENTS_FROM_LINES = 80
ACL_USERS = (("gateway", "plancache-gateway"), ("worker", "plancache-worker"))
END = "<!-- /generated -->"


def acl_commands(width: int = 100) -> str:
    """One `redis-cli ACL SETUSER` command per role, wrapped in shell continuation lines."""
    blocks = []
    for role, user in ACL_USERS:
        words = [
            "redis-cli",
            "ACL",
            "SETUSER",
            *(shlex.quote(w) for w in keys.acl_setuser(role, user, f"<{role} password>")),
        ]
        lines, line = [], ""
        for word in words:
            if line and len(line) + 1 + len(word) > width - 2:
                lines.append(line + " \\")
                line = "  " + word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
        blocks.append("\n".join(lines))
    return "```sh\n" + "\n\n".join(blocks) + "\n```"


def _replace_generated(text: str, marker: str, body: str, page: Path) -> str:
    """The text with what lies between the comment line starting with `marker` and END replaced by `body`."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(marker)), None)
    if start is None:
        raise SystemExit(f"{page}: no line starting with {marker!r}")
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == END)
    return "\n".join([*lines[: start + 1], body, *lines[end:]])


def contents_pages() -> list[Path]:
    """README.md and the hand-written docs pages (not the GPU runs' records)."""
    return [README, *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in GENERATED_PAGES)]


def wants_contents(text: str) -> bool:
    return len(text.split("\n")) >= CONTENTS_FROM_LINES or "<!-- contents" in text


def main() -> None:
    text = CONFIGURATION.read_text()
    text = _replace_generated(
        text, "<!-- generated from server/src/plancache_server/settings/", markdown_table(), CONFIGURATION
    )
    CONFIGURATION.write_text(text)
    text = OPERATIONS.read_text()
    text = _replace_generated(text, "<!-- generated from plancache_server.store.keys", acl_commands(), OPERATIONS)
    OPERATIONS.write_text(text)
    for page in contents_pages():
        text = page.read_text()
        if wants_contents(text):
            page.write_text(with_contents(text))


if __name__ == "__main__":
    main()

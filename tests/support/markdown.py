"""Markdown helpers shared by the docs' generators and their tests: the
anchor GitHub gives a heading, and the table of contents a page carries
between two comment lines (scripts/sync-readme.py writes it on the pages
written by hand, scripts/architecture-doc.py and scripts/performance-doc.py
on theirs, tests/unit/test_docs.py checks that each is current)."""

from __future__ import annotations

import re

CONTENTS_START = "<!-- contents: written from the headings by scripts/sync-readme.py -->"
CONTENTS_END = "<!-- /contents -->"

_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_FENCE = re.compile(r"^(```|~~~)")


def plain(heading: str) -> str:
    """A heading's text as a reader sees it: links as their text, no backticks or emphasis."""
    text = _LINK.sub(r"\1", heading)
    return text.replace("`", "").replace("**", "").strip()


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", plain(heading).lower()).replace(" ", "-")


def headings(text: str, level: int | None = None) -> list[tuple[int, str]]:
    """(level, text) of every heading outside code blocks, in order."""
    found = []
    in_code = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        m = re.match(r"^(#{1,6}) (.+?)\s*#*\s*$", line)
        if m and (level is None or len(m.group(1)) == level):
            found.append((len(m.group(1)), m.group(2)))
    return found


def anchors(text: str) -> set[str]:
    """Every anchor a page defines (GitHub numbers repeated headings: -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, heading in headings(text):
        base = anchor(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def contents(text: str) -> str:
    """The contents block of a page: one line per second-level heading."""
    lines = [CONTENTS_START, "**Contents**", ""]
    for _, heading in headings(text, level=2):
        label = plain(heading)
        short = label.split(" (", 1)[0] if " (" in label and not label.startswith("(") else label
        lines.append(f"- [{short}](#{anchor(heading)})")
    lines.append(CONTENTS_END)
    return "\n".join(lines)


def with_contents(text: str) -> str:
    """The page with its contents block current: replaced between its
    markers, or put after the first paragraph under the title."""
    if CONTENTS_START in text:
        head, rest = text.split(CONTENTS_START, 1)
        _, tail = rest.split(CONTENTS_END, 1)
        return head + contents(text) + tail
    lines = text.split("\n")
    at = 1
    while at < len(lines) and not lines[at].strip():
        at += 1
    while at < len(lines) and lines[at].strip() and not lines[at].startswith("#"):
        at += 1
    after = [] if at < len(lines) and not lines[at].strip() else [""]
    return "\n".join([*lines[:at], "", contents(text), *after, *lines[at:]])

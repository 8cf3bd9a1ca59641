"""Names someone mistyped: the closest known ones, first in the refusal ("did you mean 'matmul'?"), instead
of every name the catalog has (107 ops: `plancache ops` lists them, `plancache ops NAME` one op's ports and
attributes)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

OPS_LISTED_BY = "`plancache ops` lists them"


def closest(word: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to `word`, best first; case is ignored (MatMul is matmul)."""
    by_folded: dict[str, str] = {}
    for name in known:
        by_folded.setdefault(name.lower(), name)
    folded = word.lower()
    if folded in by_folded:
        return [by_folded[folded]]
    return [by_folded[m] for m in difflib.get_close_matches(folded, list(by_folded), n=n, cutoff=0.6)]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """ "; did you mean 'a' or 'b'?" for the closest known names, "" when none is close."""
    names = [repr(m) for m in closest(word, known)]
    if not names:
        return ""
    return f"; did you mean {' or '.join([', '.join(names[:-1]), names[-1]] if len(names) > 1 else names)}?"


def unknown_op(op: str, known: Iterable[str]) -> str:
    """The refusal's text for an op name the catalog does not have."""
    names = list(known)
    return f"unknown op {op!r}{did_you_mean(op, names)} ({len(names)} ops: {OPS_LISTED_BY})"

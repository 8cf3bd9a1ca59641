"""What a workload's name may be: the client cleans its own to it, the
service refuses any other (a name is part of Redis key names and of /metrics
labels, and anyone may send one)."""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}")
_NOT_NAME = re.compile(r"[^A-Za-z0-9._:/@+-]")


def clean_name(name: str) -> str:
    """`name` made one of NAME's: other characters become "_", cut at 128 ("python" for nothing)."""
    return _NOT_NAME.sub("_", name)[:128] or "python"

"""Redis' append-only file read as commands, to damage one of them on purpose."""

from __future__ import annotations

from pathlib import Path


def commands(data: bytes) -> list[tuple[int, list[bytes]]]:
    """(offset, arguments) of every whole command (RESP arrays of bulk strings)."""
    found, at = [], 0
    while at < len(data) and data[at : at + 1] == b"*":
        start = at
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2
        args = []
        for _ in range(count):
            end = data.index(b"\r\n", at)
            length, at = int(data[at + 1 : end]), end + 2
            args.append(data[at : at + length])
            at += length + 2
        found.append((start, args))
    return found


def incremental_file(redis_dir: Path) -> Path:
    """The (only) incremental AOF of a private store's folder."""
    (path,) = (redis_dir / "appendonlydir").glob("*.incr.aof")
    return path

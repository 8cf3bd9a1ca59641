"""What a repair can keep after the damage in an append-only file.

`redis-check-aof --fix` cuts the file at its first damaged command, and with
it every command written after (GPU run-free measurement, issue 33: garbage
over one plan write in the middle lost 10 of 20 plans). The commands after
the damage are whole and were acknowledged: this finds them again. From the
cut bytes it skips the damaged command, resumes at the first offset where
whole commands parse again, and keeps those, so only what the damage
touched is lost.

What it keeps is only ever whole RESP commands (an array of bulk strings of
the lengths they declare, ending where they say), starting with a command
name Redis' own AOF writes; a resumption inside a MULTI block drops the
rest of that block through its EXEC (a transaction is applied whole or not
at all). Nothing kept can make a wrong plan: a plan's blob is checked
against its signed sha256 wherever it is served.
"""

from __future__ import annotations

from dataclasses import dataclass

# The commands plancache's stores write (and Redis' AOF framing): a resumption starts only at one of these.
WRITTEN = frozenset(
    {
        b"select",
        b"multi",
        b"exec",
        b"hset",
        b"hsetnx",
        b"hdel",
        b"hincrby",
        b"hincrbyfloat",
        b"set",
        b"del",
        b"unlink",
        b"expire",
        b"pexpire",
        b"pexpireat",
        b"persist",
        b"zadd",
        b"zrem",
        b"zincrby",
        b"zremrangebyscore",
        b"zremrangebyrank",
        b"sadd",
        b"srem",
        b"rpush",
        b"lpush",
        b"lpop",
        b"rpop",
        b"ltrim",
        b"lrem",
        b"xadd",
        b"xdel",
        b"xtrim",
        b"xack",
        b"xgroup",
        b"xclaim",
        b"xautoclaim",
        b"xsetid",
        b"incr",
        b"incrby",
        b"incrbyfloat",
        b"decr",
        b"getdel",
        b"rename",
        b"copy",
        b"restore",
        b"flushdb",
        b"flushall",
        b"setex",
        b"psetex",
        b"setnx",
        b"swapdb",
    }
)
# Declared sizes past these are not a command of this store (a resumption inside a blob would claim them).
MAX_ARGS = 1 << 20
MAX_BULK = 1 << 30


@dataclass(frozen=True)
class Salvage:
    kept: bytes  # whole commands after the damage, in order
    dropped: bytes  # what was skipped (the damaged command, and a transaction it broke)
    commands: int


def command_end(data: bytes, at: int) -> int | None:
    """The offset after the whole command starting at `at`, or None."""
    args, at = _header(data, at, b"*", MAX_ARGS)
    if args is None or args < 1:
        return None
    for index in range(args):
        length, at = _header(data, at, b"$", MAX_BULK)
        if length is None or at + length + 2 > len(data) or data[at + length : at + length + 2] != b"\r\n":
            return None
        if index == 0 and data[at : at + length].lower() not in WRITTEN:
            return None
        at += length + 2
    return at


def _header(data: bytes, at: int, mark: bytes, bound: int) -> tuple[int | None, int]:
    if data[at : at + 1] != mark:
        return None, at
    end = data.find(b"\r\n", at + 1, at + 24)
    digits = data[at + 1 : end] if end > 0 else b""
    if not digits.isdigit() or int(digits) > bound:
        return None, at
    return int(digits), end + 2


def _name(data: bytes, at: int) -> bytes:
    _, at = _header(data, at, b"*", MAX_ARGS)
    length, at = _header(data, at, b"$", MAX_BULK)
    return data[at : at + (length or 0)].lower()


def salvage(cut: bytes) -> Salvage:
    """The whole commands of `cut` (the bytes redis-check-aof cut, starting at the damage)."""
    kept: list[bytes] = []
    dropped: list[bytes] = []
    at, skipped_from = 0, 0
    in_transaction = False
    resumed = False
    while at < len(cut):
        end = command_end(cut, at)
        if end is None:
            at = cut.find(b"*", at + 1)  # the next place a command could start
            if at < 0:
                at = len(cut)
            resumed = False
            continue
        if not resumed:  # a resumption: what lies before it is dropped
            dropped.append(cut[skipped_from:at])
            resumed = True
            in_transaction = _opened_before(cut, at)
        name = _name(cut, at)
        if in_transaction:  # resumed inside a transaction whose MULTI was damaged: drop through its EXEC
            dropped.append(cut[at:end])
            in_transaction = name != b"exec"
        else:
            kept.append(cut[at:end])
        at = end
        skipped_from = end
    if skipped_from < len(cut) and not resumed:
        dropped.append(cut[skipped_from:])
    return Salvage(b"".join(kept), b"".join(dropped), len(kept))


def _opened_before(cut: bytes, at: int) -> bool:
    """Whether commands from `at` run inside a transaction: an EXEC comes before any MULTI after `at`."""
    scan = at
    while scan < len(cut):
        end = command_end(cut, scan)
        if end is None:
            return False
        name = _name(cut, scan)
        if name == b"multi":
            return False
        if name == b"exec":
            return True
        scan = end
    return False

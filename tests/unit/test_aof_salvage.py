"""What a store repair keeps after the damage (plancache_server.store.aof_salvage):
every whole command after the damaged one, never a piece of one, never
part of a transaction whose start was damaged."""

from __future__ import annotations

import random

from plancache_server.store.aof_salvage import command_end, salvage


def resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def plan_write(i: int) -> bytes:
    rng = random.Random(i)
    blob = (
        rng.randbytes(300) + b"*3\r\n$4\r\nhset\r\n" + rng.randbytes(50)
    )  # a blob may hold what looks like a command's start
    return resp(b"HSET", b"plancache:{key-%d}:plan" % i, b"blob", blob)


def test_the_commands_after_a_damaged_one_are_kept_whole() -> None:
    writes = [plan_write(i) for i in range(10)]
    damaged = b"GARBAGE!" + writes[4][8:]
    salvaged = salvage(damaged + b"".join(writes[5:]))
    assert salvaged.kept == b"".join(writes[5:]) and salvaged.commands == 5
    assert b"key-4" in salvaged.dropped and b"key-5" not in salvaged.dropped


def test_a_transaction_whose_start_was_damaged_is_dropped_through_its_exec() -> None:
    block = resp(b"MULTI") + plan_write(1) + resp(b"ZADD", b"plancache:plan-index", b"1", b"key-1") + resp(b"EXEC")
    after = plan_write(2)
    salvaged = salvage(b"GARBAGE!" + block[8:] + after)
    assert salvaged.kept == after  # the index update without its plan write is not applied alone
    assert b"key-1" in salvaged.dropped


def test_a_damage_at_the_end_keeps_nothing_and_only_whole_known_commands_count() -> None:
    assert salvage(b"GARBAGE!" + plan_write(1)[8:]).kept == b""
    assert command_end(resp(b"NOTACOMMAND", b"x"), 0) is None
    assert command_end(b"*999999999\r\n", 0) is None
    whole = resp(b"SET", b"a", b"b")
    assert command_end(whole, 0) == len(whole) and command_end(whole[:-1], 0) is None

"""The gateway's memory of resolved queries is bounded by what it holds, not only by its count."""

from __future__ import annotations

import asyncio

import pytest

from plancache.graphspec import spec_proto
from plancache.graphspec.validation import Limits
from plancache.keys.query import CompileOptions
from plancache_server.gateway import resolver
from plancache_server.gateway.resolver import QueryResolver, entry_cost
from tests.support.specs import matmul_spec
from tests.support.standin import StandInCompiler

TARGET = StandInCompiler().target


def _wire(m: int) -> tuple[object, object, object]:
    return spec_proto.to_proto(matmul_spec(m=m)), TARGET.to_proto(), CompileOptions().to_proto()


def _cost(m: int) -> int:
    spec, target, options = _wire(m)
    return entry_cost(
        (
            spec.SerializeToString(deterministic=True),  # type: ignore[attr-defined]
            target.SerializeToString(deterministic=True),  # type: ignore[attr-defined]
            options.SerializeToString(deterministic=True),  # type: ignore[attr-defined]
        )
    )


def test_distinct_queries_never_hold_more_than_the_byte_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    bound = 5 * _cost(16) + _cost(16) // 2  # room for five entries of this size
    monkeypatch.setattr(resolver, "RESOLVED_MAX_BYTES", bound)
    queries = QueryResolver(None, Limits())  # type: ignore[arg-type]  # small specs never reach the offload

    async def flood() -> None:
        for m in range(16, 16 + 40):
            await queries.resolve(*_wire(m))  # type: ignore[arg-type]
            assert queries.remembered_bytes <= bound

    asyncio.run(flood())
    assert queries.remembered == 5


def test_a_query_asked_again_and_again_outlives_a_flood_of_new_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolver, "RESOLVED_MAX_BYTES", 5 * _cost(16) + _cost(16) // 2)
    queries = QueryResolver(None, Limits())  # type: ignore[arg-type]

    async def herd_and_flood() -> tuple[object, list[object]]:
        first = await queries.resolve(*_wire(8))  # type: ignore[arg-type]
        again = []
        for m in range(16, 16 + 40):
            await queries.resolve(*_wire(m))  # type: ignore[arg-type]
            again.append(await queries.resolve(*_wire(8)))  # type: ignore[arg-type]
        return first, again

    first, again = asyncio.run(herd_and_flood())
    # The same object each time: remembered, never resolved anew (least recently used out first).
    assert all(query is first for query in again)

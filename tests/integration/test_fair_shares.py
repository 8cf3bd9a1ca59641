"""Issue 44, item 1: one caller cannot take the service from the others. A
caller (its token and host) past its share of Prefetch streams, plan refs,
waits or queued builds is answered RESOURCE_EXHAUSTED with a retry delay,
at once; another caller, meanwhile, is served as if nothing happened. A
real gateway, Redis and a stand-in worker with one slow build thread."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import redis

from plancache import Client
from plancache.keys.query import PlanQuery
from plancache.transport.calls import typed
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler

FLOOD, HONEST = secrets.token_hex(16), secrets.token_hex(16)


def two_callers_stack(redis_url: str, tmp_path: Path, build_seconds: float, **shares: object) -> Iterator[Stack]:
    """A gateway with a token for each of the two callers, one stand-in build thread."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"compile {FLOOD}\ncompile {HONEST}\n")
    tokens.chmod(0o600)
    s, stop = start_stack(
        redis_url,
        StandInCompiler(build_seconds=build_seconds),
        pool_size=1,
        tokens_file=tokens,
        retry_delay_s=0.25,
        **shares,
    )
    yield s
    stop()


@pytest.fixture
def shared(redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path) -> Iterator[Stack]:
    yield from two_callers_stack(
        redis_server.url, tmp_path, 1.0, caller_streams=2, caller_refs=50, caller_builds=3, caller_waiters=5
    )


def query(i: int) -> pb.PlanQuery:
    return PlanQuery.of(matmul_spec(m=64 + 16 * i, name=f"share-{i}"), TARGET).to_proto()


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def test_a_flooding_caller_is_refused_past_its_share_while_another_is_served(shared: Stack) -> None:
    channel = grpc.insecure_channel(shared.address)
    stub = pb_grpc.PlanCacheStub(channel)
    flood = metadata(FLOOD)
    # Streams: two open (each waits for a build), unread; the third is refused at once.
    held = [
        stub.Prefetch(
            pb.PrefetchRequest(refs=[pb.PlanRef(query=query(100 + j))], compile_missing=True),
            metadata=flood,
            timeout=30,
        )
        for j in range(2)
    ]
    time.sleep(0.5)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        list(stub.Prefetch(pb.PrefetchRequest(refs=[pb.PlanRef(query=query(103))]), metadata=flood, timeout=30))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--caller-streams" in (refused.value.details() or "") and time.monotonic() - started < 2
    for call in held:
        call.cancel()
    # Builds: three distinct compiles wait; the fourth is refused at once, with the retry delay.
    with ThreadPoolExecutor(8) as pool, Client(shared.address, cache=False, hedge=False, token=FLOOD) as flooder:
        waiting = [
            pool.submit(flooder.compile, matmul_spec(m=64 + 16 * (200 + j), name=f"share-{200 + j}"), TARGET)
            for j in range(3)
        ]
        time.sleep(0.5)
        refused_at = time.monotonic()
        fourth = query(300)
        with pytest.raises(grpc.RpcError) as full:  # the raw call: plancache.Client would wait and ask again
            stub.Compile(
                pb.CompileRequest(spec=fourth.spec, target=fourth.target, options=fourth.options),
                metadata=flood,
                timeout=30,
            )
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() - refused_at < 2
        assert "--caller-builds" in (full.value.details() or "")
        assert typed(full.value).retry_after == pytest.approx(0.25)
        # Meanwhile another caller's compile is taken and answered (behind the builds already queued).
        with Client(shared.address, cache=False, hedge=False, token=HONEST) as honest:
            plan = honest.compile(matmul_spec(m=64 + 16 * 400, name="share-400"), TARGET, timeout=60)
            assert plan.key == PlanQuery.of(matmul_spec(m=64 + 16 * 400, name="share-400"), TARGET).key
            assert honest.get(plan.key).key == plan.key  # and its stored plans are hits
        for future in waiting:
            future.result(timeout=60)
    # Refs: a Prefetch of more refs than the share holds is refused; one within it is served.
    with pytest.raises(grpc.RpcError) as too_many:
        list(stub.Prefetch(pb.PrefetchRequest(refs=[pb.PlanRef(key=f"k{j}") for j in range(51)]), metadata=flood))
    assert too_many.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--caller-refs" in (
        too_many.value.details() or ""
    )
    answered = list(stub.Prefetch(pb.PrefetchRequest(refs=[pb.PlanRef(key=plan.key)]), metadata=metadata(HONEST)))
    assert [item.key for item in answered] == [plan.key]
    channel.close()


def test_a_prefetch_past_the_builds_share_answers_those_refs_with_a_retry_delay(shared: Stack) -> None:
    """Within one stream, refs whose builds would pass the caller's share are answered RESOURCE_EXHAUSTED
    (per ref, with the retry delay: the client asks for them again later); the others are built."""
    channel = grpc.insecure_channel(shared.address)
    stub = pb_grpc.PlanCacheStub(channel)
    refs = [pb.PlanRef(query=query(500 + j)) for j in range(5)]
    items = list(
        stub.Prefetch(pb.PrefetchRequest(refs=refs, compile_missing=True), metadata=metadata(FLOOD), timeout=60)
    )
    refused = [i for i in items if i.HasField("error")]
    built = [i for i in items if i.HasField("plan")]
    assert len(built) == 3 and len(refused) == 2
    assert all(i.error.code == "RESOURCE_EXHAUSTED" and i.error.HasField("retry_delay") for i in refused)
    channel.close()


def test_a_hit_is_served_while_every_other_redis_connection_is_held(
    redis_server: EmbeddedRedis, redis_client: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Redis pool cannot be exhausted from the wire for hits: a gateway's callers' lookups read plans
    through a pool of their own. Here every connection of the gateway's other pool (builds followed,
    queues, statistics: what a flood of misses holds) is taken, and a stored plan (not in the gateway's
    memory) is still served at once; before, the hit waited the pool's 10 s and failed UNAVAILABLE."""
    from plancache_server.store import redis_conn

    monkeypatch.setattr(redis_conn, "GATEWAY_CONNECTIONS", 4)
    s, stop = start_stack(redis_server.url, StandInCompiler(), memory_cache_bytes=0)
    try:
        with s.client() as client:
            plan = client.compile(matmul_spec(m=96, name="held"), TARGET)
            pool = s.gateway.front.redis.connection_pool

            async def take_all() -> list[object]:
                """Every connection the pool has left (some are the gateway's listeners' for good)."""
                taken: list[object] = []
                while True:
                    try:
                        taken.append(await asyncio.wait_for(pool.get_connection(), 0.5))
                    except (TimeoutError, redis.exceptions.ConnectionError):
                        return taken

            held = s.gateway.run(take_all())
            try:
                started = time.monotonic()
                assert client.get(plan.key).key == plan.key
                assert time.monotonic() - started < 2.0
            finally:

                async def give_back() -> None:
                    for connection in held:
                        await pool.release(connection)

                s.gateway.run(give_back())
    finally:
        stop()


@pytest.fixture
def one_slow_builder(redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path) -> Iterator[Stack]:
    yield from two_callers_stack(redis_server.url, tmp_path, 0.3, caller_queued=2)


def test_another_callers_miss_waits_behind_at_most_the_flooders_queue_slots(one_slow_builder: Stack) -> None:
    """The build queue is one first-in-first-out stream per target: a caller with 10 builds queued used to
    put all 10 before another caller's next miss. With --caller-queued 2, at most 2 of them wait in the queue
    (and those the worker has taken go first); the others wait on the gateway for their caller's turn."""
    finished: list[tuple[float, str]] = []

    def compile_as(client: Client, i: int, who: str) -> None:
        client.compile(matmul_spec(m=64 + 16 * i, name=f"queued-{i}"), TARGET, timeout=60)
        finished.append((time.monotonic(), who))

    with (
        ThreadPoolExecutor(12) as pool,
        Client(one_slow_builder.address, cache=False, hedge=False, token=FLOOD) as flooder,
        Client(one_slow_builder.address, cache=False, hedge=False, token=HONEST) as honest,
    ):
        floods = [pool.submit(compile_as, flooder, 600 + j, "flood") for j in range(10)]
        time.sleep(0.6)  # all ten at the gateway, the first building
        asked = time.monotonic()
        compile_as(honest, 700, "honest")
        for future in floods:
            future.result(timeout=60)
    answered = next(at for at, who in finished if who == "honest")
    ahead = [at for at, who in finished if who == "flood" and asked < at < answered]
    # Ahead of it: the flooder's build under way, the one its worker took ahead of its free process, and its
    # two waiting in the queue; its other builds waited for their turn (without the bound: 9).
    assert len(ahead) <= 4, (len(ahead), sorted(finished))
    assert sum(who == "flood" for _, who in finished) == 10


def test_on_a_busy_loop_a_callers_steps_are_paced_while_another_callers_hits_are_served(
    redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path
) -> None:
    """The pacing wired end to end (the guard tells the turns who calls; a Prefetch's refs are its caller's
    steps): with the loop counted busy at any load (`--busy-loop-share` tiny), a caller's 300 refs wait for
    its share while another caller reads a stored plan without pause; both are answered in full."""
    stacks = two_callers_stack(redis_server.url, tmp_path, 0.01, busy_loop_share=1e-9, caller_refs=1000)
    stack = next(stacks)
    try:
        turns = stack.gateway.front.shares.turns  # type: ignore[union-attr]
        reads: list[float] = []
        done = threading.Event()
        with Client(stack.address, cache=False, hedge=False, token=HONEST) as honest:
            stored = honest.compile(matmul_spec(m=64, name="stored"), TARGET, timeout=60).key

            def read() -> None:
                while not done.is_set():
                    started = time.monotonic()
                    assert honest.get(stored).key == stored
                    reads.append(time.monotonic() - started)

            with ThreadPoolExecutor(1) as pool:
                reading = pool.submit(read)
                time.sleep(0.3)
                channel = grpc.insecure_channel(stack.address)
                stub = pb_grpc.PlanCacheStub(channel)
                refs = [pb.PlanRef(query=query(2000 + j)) for j in range(300)]
                items = list(stub.Prefetch(pb.PrefetchRequest(refs=refs), metadata=metadata(FLOOD), timeout=60))
                paced = turns.paced_s
                # Stored plans by key are lookups, hits: never paced, the other caller still reading.
                stored_refs = [pb.PlanRef(key=stored) for _ in range(300)]
                hits = list(stub.Prefetch(pb.PrefetchRequest(refs=stored_refs), metadata=metadata(FLOOD), timeout=60))
                paced_after_hits = turns.paced_s
                # Keys that are not stored: each an error item's work, a stream of misses: paced after its first.
                keys = [pb.PlanRef(key=f"{j:064x}/{TARGET.id}/opt-{'0' * 16}") for j in range(300)]
                by_key = list(stub.Prefetch(pb.PrefetchRequest(refs=keys), metadata=metadata(FLOOD), timeout=60))
                channel.close()
                done.set()
                reading.result(timeout=30)
        assert len(items) == 300 and all(i.error.code == "NOT_FOUND" for i in items)  # each ref answered
        assert paced > 0  # the refs waited for their caller's share
        assert len(hits) == 300 and all(i.plan.metadata.key == stored for i in hits)
        assert paced_after_hits == paced
        assert len(by_key) == 300 and all(i.error.code == "NOT_FOUND" for i in by_key)
        assert turns.paced_s > paced_after_hits
        assert len(reads) > 10  # the other caller read all along
    finally:
        next(stacks, None)

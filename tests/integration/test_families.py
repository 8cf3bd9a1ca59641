"""Graph families on a real server and stand-in worker (issue 31): every
graph of a family is queued at warming's priority and stored; from then on
each size is a hit for any node whose graph it is, a size outside the
family is a miss as before, and the family's status counts what is stored."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from plancache import Client, CompileOptions, InvalidRequest, Manifest, NotFound, SpecError
from plancache.graphspec.family import derive
from plancache.graphspec.graph import GraphSpec
from plancache.keys.plankey import make_family_key
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.store.families import FamilyRecords
from plancache_server.store.lifecycle import Janitor
from tests.conftest import Stack, start_stack
from tests.support.standin import STANDIN_TARGET, StandInCompiler

OPTIONS = CompileOptions(autotune=False)


def decode_step(batch: int) -> GraphSpec:
    """A linear over a batch of rows, as a program declares it at each batch size."""
    g = GraphSpec(io_data_type="half")
    x = g.tensor(name="x", dim=[1, batch, 64], stride=[batch * 64, 64, 1], uid=1)
    w = g.tensor(name="w", dim=[1, 64, 32], stride=[64 * 32, 32, 1], uid=2)
    g.matmul(x, w).set_output(True).set_uid(3)
    return g


@pytest.fixture
def family_stack(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Iterator[Stack]:
    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.02), pool_size=2, warm=True)
    yield s
    stop()


def wait_complete(client: Client, family_key: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        status = client.admin.family_status(family_key)
        if status.complete:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def test_every_size_of_a_built_family_is_a_hit_and_others_miss(family_stack: Stack) -> None:
    family = derive(decode_step(8), decode_step(17), sizes={"d0": [1, 2, 3, 8, 17, 24]})
    with family_stack.client() as client:
        status = client.admin.build_family(family, STANDIN_TARGET, OPTIONS)
        assert (status.total, status.stored, status.queued) == (6, 0, 6) and status.family_key == make_family_key(
            family.family_hash(), STANDIN_TARGET, OPTIONS
        )
        done = wait_complete(client, status.family_key)
        assert (done.stored, done.queued) == (6, 0)
        for batch in (1, 2, 3, 8, 17, 24):  # each size as the program declares it: a hit, no build
            assert client.compile(decode_step(batch), STANDIN_TARGET, OPTIONS).source == "hit", batch
        assert (
            client.compile(decode_step(5), STANDIN_TARGET, OPTIONS).source != "hit"
        )  # outside the family: a miss as before
        again = client.admin.build_family(family, STANDIN_TARGET, OPTIONS)  # asked again: nothing to queue
        assert (again.stored, again.queued) == (6, 0)


def test_what_a_family_cannot_be_is_refused_by_the_server(family_stack: Stack) -> None:
    family = derive(decode_step(8), decode_step(17), sizes={"d0": [1, 2]})
    with family_stack.client() as client:
        with pytest.raises(NotFound, match="no graph family"):
            client.admin.family_status("family-nothing")
        with pytest.raises(InvalidRequest, match="is unknown"):
            client.admin.build_family(family, Target.parse("sm_100/cudnn-91900/fe-1.32.0"), OPTIONS)
        forged = family.to_proto()
        forged.varying[0].places[0].axis = 9  # an axis the tensor does not have: sent as is, past the client's checks
        request = pb.BuildFamilyRequest(family=forged, target=STANDIN_TARGET.to_proto(), options=OPTIONS.to_proto())
        with pytest.raises(SpecError, match="has no declared axis 9"):
            client.connection.call(client._stub.BuildFamily, request, 10)
        huge = family.to_proto()
        huge.varying[0].sizes[:] = range(
            1, 600_000
        )  # over a megabyte of sizes: refused on the wire, before it is parsed
        with pytest.raises(SpecError, match="field 2 of GraphFamily entry 1 has"):
            client.connection.call(
                client._stub.BuildFamily,
                pb.BuildFamilyRequest(family=huge, target=STANDIN_TARGET.to_proto(), options=OPTIONS.to_proto()),
                10,
            )
        too_many = family.to_proto()
        too_many.varying[0].sizes[:] = range(1, 5000)
        with pytest.raises(SpecError, match="at most 1,024 graphs"):
            client.connection.call(
                client._stub.BuildFamily,
                pb.BuildFamilyRequest(family=too_many, target=STANDIN_TARGET.to_proto(), options=OPTIONS.to_proto()),
                10,
            )


def test_a_family_over_a_parameters_dims_is_refused_naming_it(family_stack: Stack) -> None:
    """Issue 43: a family that varies a dim of a tensor it names fixed (a call's weight) is refused by the
    server, whatever the client checked."""
    family = derive(decode_step(8), decode_step(17), sizes={"d0": [1, 2]})
    forged = family.to_proto()
    forged.fixed_uids[:] = [1]  # x's rows are the varying dim: say x is a parameter
    request = pb.BuildFamilyRequest(family=forged, target=STANDIN_TARGET.to_proto(), options=OPTIONS.to_proto())
    with family_stack.client() as client:
        with pytest.raises(SpecError, match=r"sits in axis 1 of 'x' \(uid 1\), a parameter of the call"):
            client.connection.call(client._stub.BuildFamily, request, 10)
        seen_elsewhere = pb.BuildFamilyRequest(
            family=family.to_proto(),
            target=STANDIN_TARGET.to_proto(),
            options=OPTIONS.to_proto(),
            seen=[pb.SizesSeen(symbol="d7", sizes=[3])],
        )
        with pytest.raises(InvalidRequest, match="sizes seen of 'd7', which the family does not vary"):
            client.connection.call(client._stub.BuildFamily, seen_elsewhere, 10)
        too_many_seen = pb.BuildFamilyRequest(
            family=family.to_proto(),
            target=STANDIN_TARGET.to_proto(),
            options=OPTIONS.to_proto(),
            seen=[pb.SizesSeen(symbol="d0", sizes=range(1, 300))],
        )
        with pytest.raises(InvalidRequest, match="at most 256 positive sizes, not 299"):
            client.connection.call(client._stub.BuildFamily, too_many_seen, 10)
        with pytest.raises(InvalidRequest, match="a workload name is 1 to 128 of"):
            client.admin.build_family(family, STANDIN_TARGET, OPTIONS, workload="no spaces allowed")


def test_the_members_nearest_the_sizes_seen_are_queued_first(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """Issue 43, soonest first: a program that met rows 17 and 150 meets their neighbours next; they are
    queued (so built) before the sizes between."""
    stack, stop = start_stack(redis_server.url, StandInCompiler(), pool_size=2, warm=False)
    try:
        family = derive(decode_step(8), decode_step(17), sizes={"d0": range(1, 161)})
        with stack.client() as client:
            status = client.admin.build_family(family, STANDIN_TARGET, OPTIONS, seen={"d0": [17, 150]})
            assert status.queued == 160
            key_of = {
                PlanQuery.of(spec, STANDIN_TARGET, OPTIONS).key: values["d0"] for values, spec in family.instances()
            }
        items = redis_client.lrange(keys.warm_items(STANDIN_TARGET.id), 0, -1)
        order = [key_of[json.loads(item)["plan_key"]] for item in items]
        assert order[:6] == [17, 150, 16, 18, 149, 151]
        assert sorted(order) == list(range(1, 161)) and order.index(83) > order.index(1)  # 83 is the farthest
    finally:
        stop()


def test_a_manifest_names_a_family_instead_of_every_size(family_stack: Stack, tmp_path: Any) -> None:
    family = derive(decode_step(8), decode_step(17), sizes={"d0": [4, 12, 20]})
    Manifest(target=STANDIN_TARGET, options=OPTIONS, families=[family]).save(tmp_path / "m.json")
    manifest = Manifest.load(tmp_path / "m.json")
    assert [f.family_hash() for f in manifest.families] == [family.family_hash()]
    with family_stack.client() as client:
        result = client.prefetch(manifest)
        ((key, status),) = result.families.items()
        assert status.total == 3 and not result.family_errors
        wait_complete(client, key)
        assert [client.compile(decode_step(n), STANDIN_TARGET, OPTIONS).source for n in (4, 12, 20)] == ["hit"] * 3


def test_a_workloads_speculative_builds_are_bounded_and_what_they_cost_is_shown(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """Issue 43's budget: a workload queues at most --family-budget members per target and day (the nearest
    the sizes seen first), the rest are counted as over_budget; another workload has its own; GetFamily says
    who asked, what was built, fetched and its bytes."""
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.01), pool_size=2, warm=True, family_budget=5
    )
    try:
        family = derive(decode_step(8), decode_step(17), sizes={"d0": range(1, 9)})
        with stack.client() as client:
            asked = client.admin.build_family(family, STANDIN_TARGET, OPTIONS, seen={"d0": [8]}, workload="sweep")
            assert (asked.total, asked.queued, asked.over_budget, asked.workload) == (8, 5, 3, "sweep")
            again = client.admin.build_family(family, STANDIN_TARGET, OPTIONS, workload="sweep")
            assert again.queued == 0 and again.over_budget == 8 - again.stored  # its budget is spent today
            deadline = time.monotonic() + 30
            while (status := client.admin.family_status(asked.family_key)).stored < 5:
                assert time.monotonic() < deadline, status
                time.sleep(0.05)
            stored_sizes = {
                values["d0"]
                for values, spec in family.instances()
                if redis_client.exists(keys.plan(PlanQuery.of(spec, STANDIN_TARGET, OPTIONS).key))
            }
            assert stored_sizes == {4, 5, 6, 7, 8}  # the five nearest size 8
            assert status.bytes > 0 and status.fetched == 0  # built ahead, never served: first to go
            client.get(spec=decode_step(8), target=STANDIN_TARGET, options=OPTIONS)
            deadline = time.monotonic() + 10
            while client.admin.family_status(asked.family_key).fetched != 1:  # counted at the stats' flush
                assert time.monotonic() < deadline
                time.sleep(0.05)
            other = client.admin.build_family(family, STANDIN_TARGET, OPTIONS, workload="another")
            assert other.queued == 3 and other.over_budget == 0  # its own budget
    finally:
        stop()


def test_a_member_counts_as_fetched_only_once_served_not_while_its_worker_accounts_for_it(
    redis_client: redis.Redis,
) -> None:
    """CI caught fetched=1 for a family nobody asked: a blob is written before its worker puts it in the warmed
    index, and "not in the warmed index" read that moment as "served". Fetched means in the index of last use."""
    members = ["plan-a/sm_90/x", "plan-b/sm_90/x", "plan-c/sm_90/x", "plan-d/sm_90/x"]
    janitor = Janitor(redis_client)
    for key in members[:3]:
        redis_client.hset(keys.plan(key), "blob", b"x" * 10)
    janitor.record_put(members[1], 10, None, warmed=True)  # built ahead, accounted
    janitor.record_put(members[2], 10, None, warmed=True)
    redis_client.zadd(keys.PLAN_INDEX, {members[2]: time.time()})  # then served: the stats' flush moves it
    redis_client.zrem(keys.WARMED_INDEX, members[2])
    counts = FamilyRecords(redis_client).counts(members)  # members[0]: written, not accounted yet; [3]: absent
    assert (counts.stored, counts.fetched, counts.bytes) == ([True, True, True, False], 1, 30)


def test_a_cancelled_family_is_not_built_until_asked_again(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    stack, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.2), pool_size=2, warm=True)
    try:
        family = derive(decode_step(8), decode_step(17), sizes={"d0": range(1, 41)})
        with stack.client() as client:
            with pytest.raises(NotFound, match="no graph family"):
                client.admin.cancel_family("family-nothing")
            asked = client.admin.build_family(family, STANDIN_TARGET, OPTIONS)
            cancelled = client.admin.cancel_family(asked.family_key)
            assert cancelled.cancelled and cancelled.queued == 0
            deadline = time.monotonic() + 30
            while (warm := client.admin.warm_status(STANDIN_TARGET)[0]).state != "done" or warm.in_flight:
                assert time.monotonic() < deadline, warm
                time.sleep(0.1)
            after = client.admin.family_status(asked.family_key)
            assert after.cancelled and after.stored <= cancelled.stored + 2  # at most what was already building
            assert warm.skipped >= 40 - after.stored
            asked_again = client.admin.build_family(family, STANDIN_TARGET, OPTIONS)  # asked again: built this time
            assert not asked_again.cancelled and asked_again.queued == 40 - after.stored
            assert wait_complete(client, asked.family_key).stored == 40
    finally:
        stop()


def test_a_family_of_1024_members_never_delays_a_callers_miss(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """Warming's priority rule under the largest family: its 1,024 members take ~26 s of builds on this
    worker (two build threads, 50 ms each); a caller's miss asked meanwhile is built at once, and a second
    one again (the family waits while a caller's heuristic plan waits or builds)."""
    stack, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.05), pool_size=2, warm=True)
    try:
        family = derive(decode_step(8), decode_step(17), sizes={"d0": range(1, 1025)})
        with stack.client() as client:
            asked = client.admin.build_family(family, STANDIN_TARGET, OPTIONS)
            assert asked.queued == 1024
            time.sleep(0.5)  # the worker is into the family
            for rows in (2000, 3000):  # sizes outside the family: misses
                started = time.monotonic()
                plan = client.compile(decode_step(rows), STANDIN_TARGET, OPTIONS, timeout=30)
                took = time.monotonic() - started
                assert plan.source == "compiled" and took < 2.0, took  # one build (+ one warm piece at most)
            assert client.admin.family_status(asked.family_key).stored < 1024  # the family was still building
    finally:
        stop()


def test_a_family_builds_while_its_program_keeps_missing(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """GPU run 29: a program sweeping through a family's sizes misses every few hundred ms, and the worker
    took warming items only after an idle spell longer than that: the family it asked for was built after
    the program ended. Here a caller misses every 0.2 s for 4 s while a 40-member family is queued: the
    family is built meanwhile, and each miss is still built at once."""
    stack, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.02), pool_size=3, warm=True)
    try:
        family = derive(decode_step(8), decode_step(17), sizes={"d0": range(1, 41)})
        with stack.client() as client:
            asked = client.admin.build_family(family, STANDIN_TARGET, OPTIONS)
            assert asked.queued == 40
            slowest = 0.0
            ends = time.monotonic() + 4.0
            rows = 1000
            while time.monotonic() < ends:
                started = time.monotonic()
                client.compile(decode_step(rows), STANDIN_TARGET, OPTIONS, timeout=30)
                slowest = max(slowest, time.monotonic() - started)
                rows += 1
                time.sleep(max(0.0, 0.2 - (time.monotonic() - started)))
            during = client.admin.family_status(asked.family_key).stored
            assert during >= 20, f"{during} of 40 members built while the caller kept missing"
            assert slowest < 1.5, slowest  # the misses were not held behind the family
    finally:
        stop()


def sweep_back_to_back(redis_url: str, seconds: float, **settings: object) -> tuple[int, float, int]:
    """A 40-member family asked, then a caller missing without a pause for `seconds` (0.1 s builds, 5
    build threads): the members stored meanwhile, the slowest miss, and the members whose build started
    while one of the caller's misses was building (20 ms in: a thread's start is recorded a little late)."""
    compiler = StandInCompiler(build_seconds=0.1)
    stack, stop = start_stack(redis_url, compiler, pool_size=5, warm=True, **settings)
    try:
        with stack.client() as client:
            client.compile(decode_step(999), STANDIN_TARGET, OPTIONS, timeout=30)  # the worker is up
            family = derive(decode_step(8), decode_step(17), sizes={"d0": range(1, 41)})
            asked = client.admin.build_family(family, STANDIN_TARGET, OPTIONS)
            assert asked.queued == 40
            slowest = 0.0
            ends = time.monotonic() + seconds
            rows = 1000
            while time.monotonic() < ends:  # no pause between misses
                started = time.monotonic()
                client.compile(decode_step(rows), STANDIN_TARGET, OPTIONS, timeout=30)
                slowest = max(slowest, time.monotonic() - started)
                rows += 1
            stored = client.admin.family_status(asked.family_key).stored
        misses = {PlanQuery.of(decode_step(r), STANDIN_TARGET, OPTIONS).spec_hash for r in range(1000, rows)}
        members = {PlanQuery.of(spec, STANDIN_TARGET, OPTIONS).spec_hash for _, spec in family.instances()}
        missing = [(began, ended) for digest, began, ended in compiler.intervals if digest in misses]
        beside = sum(
            1
            for digest, began, _ in compiler.intervals
            if digest in members and any(start + 0.02 < began < end for start, end in missing)
        )
        return stored, slowest, beside
    finally:
        stop()


def test_a_family_builds_beside_a_program_that_misses_back_to_back(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """GPU run 30: a sweep missing back to back (each new size ~290 ms, one after another) left warming
    only the instants between misses, and its family was built mostly after it ended. With processes to
    spare (5: the first kept for callers, two of the others for warming's first plans by default,
    --warm-beside-callers), the family builds while the caller misses, at least half again as fast as
    when warming waits for callers (measured here: 24 members against 10; a loaded machine leaves more
    instants between misses, 25 against 18 once), and each miss is still built at once."""
    waiting, _, started_beside_waiting = sweep_back_to_back(redis_server.url, 1.5, warm_beside_callers=0)
    redis_client.flushdb()  # the same family again, from nothing
    beside, slowest, started_beside = sweep_back_to_back(redis_server.url, 1.5)
    # The rule itself: with 0, no member starts while a miss builds (members still fill the instants between
    # misses: on this 2-core machine 10-18 of them); by default members start beside the misses.
    assert started_beside_waiting <= 1, f"{started_beside_waiting} members started beside a miss with 0"
    assert started_beside >= 8, f"{started_beside} members started beside the caller's misses"
    assert beside >= 12 and beside > waiting, f"{beside} members beside callers, {waiting} waiting for them"
    assert slowest < 1.0, slowest  # the misses were not held behind the family

"""Warming (issue 23): a target's plans built before its nodes ask.

The stand-in worker serves an exact target E and its generic target G (as a
GPU worker serves both). G's plans, with a hit history, are the source; E is
warmed from them, as a GPU run warms the exact target from the generic one.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from plancache import Client, CompileOptions, InvalidRequest, Manifest, PermissionDenied, WarmStatus
from plancache.errors import StoreUnavailable
from plancache.graphspec.canonical import spec_hash
from plancache.graphspec.graph import GraphSpec
from plancache.keys.plankey import make_key
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.store.lifecycle import Janitor
from plancache_server.store.warming import Source, Warming
from tests.conftest import Stack, start_stack
from tests.support.processes import child_env, server_process, wait_for_workers, worker_process
from tests.support.specs import matmul_spec
from tests.support.standin import REJECTED_NAME, STANDIN_TARGET, StandInCompiler
from tests.support.waiting import wait_until

EXACT, GENERIC = STANDIN_TARGET, STANDIN_TARGET.generic()


def _specs(count: int) -> list[GraphSpec]:
    return [matmul_spec(m=16 * (i + 1), name=f"warm-{i}") for i in range(count)]


def _key(spec: GraphSpec, target: object = EXACT) -> str:
    return make_key(spec_hash(spec), target, CompileOptions())  # type: ignore[arg-type]


def _serve(client: Client, stack: Stack, specs: list[GraphSpec], hits: list[int]) -> None:
    """Build `specs` for G, then hit each plan hits[i] times; wait until the hits are counted."""
    keys_ = [client.compile(spec, GENERIC).key for spec in specs]
    for key, count in zip(keys_, hits, strict=True):
        for _ in range(count):
            client.get(key)
    hour = int(time.time() // 3600)
    deadline = time.monotonic() + 10
    while sum(float(s) for _, s in stack.redis.zrange(keys.plan_hits(hour), 0, -1, withscores=True)) < sum(hits):
        assert time.monotonic() < deadline, "the hits were not counted"
        time.sleep(0.1)


def _wait_done(client: Client, target: object = EXACT, timeout: float = 30) -> WarmStatus:
    deadline = time.monotonic() + timeout
    status: WarmStatus | None = None
    while True:
        try:
            (status,) = client.admin.warm_status(target)  # type: ignore[arg-type]
        except InvalidRequest:  # no plan yet (a worker plans its own when idle)
            status = None
        if status is not None and status.state == "done" and not status.in_flight:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


@pytest.fixture
def warm_stack(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Iterator[Stack]:
    """One warming worker, two build threads (one kept for heuristic plans: warm builds go one at a time)."""
    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=0.05), pool_size=2, warm=True)
    yield s
    stop()


def test_warming_builds_the_sources_specs_most_hit_first_and_skips_what_is_stored(warm_stack: Stack) -> None:
    specs = _specs(5)
    hits = [1, 5, 3, 0, 2]
    with warm_stack.client() as client:
        _serve(client, warm_stack, specs, hits)
        client.compile(specs[2], EXACT)  # already stored for E: skipped
        builds_before = len(warm_stack.compiler.builds)
        status = client.admin.warm(EXACT, from_target=GENERIC)
        assert (status.total, status.state, status.source) == (5, "active", f"target {GENERIC.id}")
        assert status.source_hits_24h == sum(hits)
        done = _wait_done(client)
    built = warm_stack.compiler.builds[builds_before:]
    by_hits = [specs[i].spec_hash() for i in sorted(range(5), key=lambda i: -hits[i]) if i != 2]
    assert built == by_hits, "warming did not build the most hit specs first"
    assert (done.built, done.skipped, done.failed, done.remaining) == (4, 1, 0, 0)
    assert done.coverage == pytest.approx(1.0) and done.covered_hits_24h == sum(hits)
    for spec in specs:
        meta = warm_stack.redis.hget(keys.plan(_key(spec)), "meta")
        assert meta is not None and not pb.PlanMetadata.FromString(meta).provisional  # type: ignore[arg-type]


def test_coverage_counts_only_what_is_stored_and_top_and_min_hits_bound_the_plan(warm_stack: Stack) -> None:
    specs = _specs(6)
    hits = [4, 0, 2, 8, 1, 0]
    with warm_stack.client() as client:
        _serve(client, warm_stack, specs, hits)
        status = client.admin.warm(EXACT, from_target=GENERIC, top=2, min_hits=1)
        assert status.total == 2 and status.source_hits_24h == sum(hits)
        done = _wait_done(client)
    assert done.built == 2 and done.covered_hits_24h == 8 + 4  # the two most hit
    assert done.coverage == pytest.approx(12 / 15)
    assert done.built + done.skipped + done.failed + done.remaining == done.total


def test_a_spec_that_fails_is_recorded_and_skipped(warm_stack: Stack) -> None:
    specs = _specs(3)
    with warm_stack.client() as client:
        _serve(client, warm_stack, specs, [3, 2, 1])
        # Anyone can write to Redis: the most hit spec's stored body is swapped for another spec.
        warm_stack.redis.set(
            keys.spec_body(specs[0].spec_hash()), warm_stack.redis.get(keys.spec_body(specs[1].spec_hash()))
        )  # type: ignore[arg-type]
        # And a spec cuDNN rejects, with a (forged) source plan that names it.
        rejected = matmul_spec(m=24, name=REJECTED_NAME)
        _forge_source_plan(warm_stack.redis, rejected)
        client.admin.warm(EXACT, from_target=GENERIC)
        done = _wait_done(client)
    assert (done.built, done.failed) == (2, 2), done
    reasons = dict(done.failures)
    assert "refused" in reasons[_key(specs[0])] and "make plan" in reasons[_key(specs[0])]
    assert "NOT_SUPPORTED" in reasons[_key(rejected)]


def _forge_source_plan(client: redis.Redis, spec: GraphSpec) -> None:
    from plancache.graphspec import spec_io
    from plancache.graphspec.validation import normalize

    normalized = normalize(spec)
    key = _key(spec, GENERIC)
    meta = pb.PlanMetadata(key=key, spec_hash=spec.spec_hash(), options=CompileOptions().to_proto())
    client.hset(keys.plan(key), mapping={"blob": b"x", "meta": meta.SerializeToString()})
    client.set(keys.spec_body(spec.spec_hash()), spec_io.to_proto(normalized).SerializeToString())


def test_a_real_miss_is_not_delayed_by_warming_beyond_one_candidate(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    build_s, tune_s, candidates = 0.2, 1.8, 19  # candidates of 0.1 s: warming's whole tune is 18 of them
    candidate_s = tune_s / (candidates - 1)
    stack, stop = start_stack(
        redis_server.url,
        StandInCompiler(build_seconds=build_s, tune_seconds=tune_s, candidates=candidates),
        pool_size=2,
        warm=True,
    )
    try:
        with stack.client(timeout=60) as client:
            specs = _specs(4)
            _serve(client, stack, specs, [1, 1, 1, 1])
            for spec in specs:  # their tuning done: the worker is idle
                _wait_tuned(stack.redis, _key(spec, GENERIC))
            client.admin.warm(EXACT, from_target=GENERIC)
            wait_until(
                lambda: (now := client.admin.warm_status(EXACT)[0]).built >= 1 and now.in_flight,
                30,
                "warming is building its second plan",
            )
            started = time.monotonic()
            miss = client.compile(matmul_spec(m=400, name="a-real-miss"), GENERIC)
            waited = time.monotonic() - started
            # Its own build and what is left of one warming candidate, and a loaded CI machine's slack (0.55 s
            # once for 0.4 s of work): far short of warming's tune (1.8 s), which a miss waiting behind it pays.
            bound = build_s + candidate_s + 0.45
            assert miss.provisional and waited <= bound, f"a real miss waited {waited:.2f} s during warming"
            _wait_done(client, timeout=60)
    finally:
        stop()


def _wait_tuned(client: redis.Redis, key: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        raw = client.hget(keys.plan(key), "meta")
        if raw and not pb.PlanMetadata.FromString(raw).provisional:  # type: ignore[arg-type]
            return
        assert time.monotonic() < deadline, key
        time.sleep(0.02)


def test_a_caller_asking_for_a_plan_being_warmed_is_served_at_its_priority(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """The warm build is promoted to the callers' lanes: one build, the caller not left behind warming's pace."""
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.3, tune_seconds=2.7), pool_size=2, warm=True
    )
    try:
        with stack.client(timeout=60) as client:
            specs = _specs(2)
            _serve(client, stack, specs, [2, 1])
            for spec in specs:
                _wait_tuned(stack.redis, _key(spec, GENERIC))
            builds_before = len(stack.compiler.builds)
            client.admin.warm(EXACT, from_target=GENERIC)
            deadline = time.monotonic() + 5
            while not redis_client.hget(
                keys.plan(_key(specs[0])), "meta"
            ):  # its provisional plan: the warm build is tuning
                assert time.monotonic() < deadline
                time.sleep(0.02)
            tuned = client.compile(specs[0], EXACT, tuned_only=True)
            assert not tuned.provisional
            _wait_done(client, timeout=60)
        assert stack.compiler.builds[builds_before:].count(specs[0].spec_hash()) == 1
    finally:
        stop()


def test_with_two_workers_a_caller_asking_for_a_plan_whose_warm_build_has_started_does_not_build_it_again(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """The caller hurries the warm build by queuing its job again; with two workers of the target that entry may
    reach the one not warming, which must leave the job to the worker that has started it (before: it built the
    plan a second time, nothing being stored yet to tell it)."""
    compiler = StandInCompiler(build_seconds=0.05)
    first, stop_first = start_stack(redis_server.url, compiler, pool_size=2, warm=True, worker_id="worker-a")
    second, stop_second = start_stack(redis_server.url, compiler, pool_size=2, warm=True, worker_id="worker-b")
    try:
        (spec,) = _specs(1)
        with first.client(timeout=60) as client, second.client(timeout=60) as caller:
            _serve(client, first, [spec], [1])
            compiler.build_seconds = 2.0  # the warm build's first plan: long enough to be asked for meanwhile
            client.admin.warm(EXACT, from_target=GENERIC)
            wait_until(lambda: compiler.builds.count(spec.spec_hash()) == 2, 20, "the warm build under way")
            plan = caller.compile(spec, EXACT)
            assert plan.key == _key(spec)
            done = _wait_done(client, timeout=60)
        time.sleep(0.5)  # a second build the hurry started would have begun
        assert compiler.builds.count(spec.spec_hash()) == 2  # one for the source target, one warm
        assert done.built == 1 and done.failed == 0, done
    finally:
        stop_second()
        stop_first()


def test_two_workers_race_to_warm_one_target_one_wins_and_nothing_is_built_twice(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    compilers = [StandInCompiler(build_seconds=0.05), StandInCompiler(build_seconds=0.05)]
    first, stop_first = start_stack(redis_server.url, compilers[0], pool_size=2, warm=True, worker_id="worker-a")
    _second, stop_second = start_stack(redis_server.url, compilers[1], pool_size=2, warm=True, worker_id="worker-b")
    try:
        with first.client() as client:
            specs = _specs(6)
            _serve(client, first, specs, [1] * 6)
            before = [len(c.builds) for c in compilers]
            client.admin.warm(EXACT, from_target=GENERIC)
            done = _wait_done(client)
        warmed = [c.builds[b:] for c, b in zip(compilers, before, strict=True)]
        assert done.built == 6 and sum(len(w) for w in warmed) == 6, warmed
        assert sorted(len(w) for w in warmed) == [0, 6], "both workers warmed the target"
    finally:
        stop_first()
        stop_second()


def test_warmed_plans_enter_the_store_as_least_recently_used(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """Under --store-max-mb, warming evicts warmed plans, never a hotter plan that was served."""
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.01), pool_size=2, warm=True, store_max_mb=1
    )
    try:
        with stack.client() as client:
            hot = _specs(10)  # 10 plans of 75 KB: 0.75 MB of the 1 MB bound
            _serve(client, stack, hot, [1] * 10)
            client.admin.warm(EXACT, from_target=GENERIC)
            _wait_done(client)
        usage = Janitor(redis_client).usage()
        assert sum(u.stored_bytes for u in usage.values()) <= 2**20
        assert all(redis_client.exists(keys.plan(_key(s, GENERIC))) for s in hot), (
            "warming evicted a plan that was served"
        )
        assert usage[EXACT.id].stored_plans >= 1
    finally:
        stop()


def test_a_worker_warms_a_sibling_target_on_its_own_when_idle(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    stack, stop = start_stack(
        redis_server.url, StandInCompiler(build_seconds=0.01), pool_size=2, warm=True, auto_warm_after_s=0.3
    )
    try:
        with stack.client() as client:
            specs = _specs(3)
            _serve(client, stack, specs, [2, 1, 0])  # the unhit one is not warmed on the worker's own initiative
            done = _wait_done(client, timeout=30)
        assert done.source == f"target {GENERIC.id}" and done.built == 2
        assert redis_client.exists(keys.plan(_key(specs[0]))) and not redis_client.exists(keys.plan(_key(specs[2])))
    finally:
        stop()


def test_warm_needs_an_admin_token_and_status_a_read_one(
    redis_server: EmbeddedRedis, redis_client: redis.Redis, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("read " + "r" * 20 + "\nadmin " + "a" * 20 + "\ncompile " + "c" * 20 + "\n")
    stack, stop = start_stack(redis_server.url, StandInCompiler(), pool_size=2, warm=True, tokens_file=tokens)
    try:
        with Client(stack.address, cache=False, token="c" * 20) as compiler_client:
            _serve(compiler_client, stack, _specs(1), [1])
            with pytest.raises(PermissionDenied):
                compiler_client.admin.warm(EXACT, from_target=GENERIC)
        with Client(stack.address, cache=False, token="a" * 20) as operator:
            assert operator.admin.warm(EXACT, from_target=GENERIC).total == 1
        with Client(stack.address, cache=False, token="r" * 20) as reader:
            assert [s.target_id for s in reader.admin.warm_status()] == [EXACT.id]
            with pytest.raises(PermissionDenied):
                reader.admin.cancel_warm(EXACT)
    finally:
        stop()


def test_hostile_warm_arguments_are_refused_with_the_reason(warm_stack: Stack) -> None:
    with warm_stack.client() as client:
        _serve(client, warm_stack, _specs(1), [1])
        unknown = EXACT.id.replace("sms-132", "sms-999")
        for call, match in [
            (lambda: client.admin.warm(unknown, from_target=GENERIC), "is unknown: no worker has advertised it"),
            (lambda: client.admin.warm(EXACT, from_target=GENERIC, top=10**9), "top must be between 1 and 10000"),
            (lambda: client.admin.warm(EXACT, from_target=GENERIC, min_hits=-1), "min_hits must not be negative"),
            (lambda: client.admin.warm(EXACT, from_target=EXACT), "cannot be warmed from itself|has no stored plans"),
            (lambda: client.admin.warm(EXACT, served_days=10**6), "days must be between 1 and 366"),
            (lambda: client.admin.warm(EXACT, from_target="sm_90/cudnn-1/fe-0.0.1"), "has no stored plans"),
            (lambda: client.admin.warm("not a target", from_target=GENERIC), "target"),
            (lambda: client.admin.cancel_warm(EXACT), "no warming plan to cancel"),
            (lambda: client.admin.warm_status(EXACT), "no warming plan"),
        ]:
            with pytest.raises(InvalidRequest, match=match):
                call()
        manifest = Manifest.from_specs(_specs(2), EXACT)
        assert client.admin.warm(EXACT, manifest=manifest).total == 2  # and a manifest is a source
        assert client.admin.warm_status()[0].source == "a manifest of 2 spec(s)"


def test_a_warming_plan_is_resumed_after_its_worker_dies(tmp_path: Path) -> None:
    """A worker process killed mid-warming: another worker takes the lease
    over, builds the item left in flight again (or finds its plan stored),
    and every item once."""
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    build_log = tmp_path / "builds.jsonl"
    env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS="0.4", PLANCACHE_STANDIN_BUILD_LOG=str(build_log))
    # A short build lease: the dead worker's lease on the item it was building runs out soon.
    flags = (
        "--device",
        "0",
        "--compiler",
        "tests.support.standin:factory",
        "--unsigned",
        "--build-processes",
        "2",
        "--no-warm",
        "--heartbeat-interval",
        "0.3",
        "--heartbeat-ttl",
        "1.5",
        "--claim-idle",
        "1",
        "--build-lease",
        "2",
    )
    try:
        with ExitStack() as stack:
            address = "127.0.0.1:" + str(_port())
            stack.enter_context(
                server_process(address, redis_server.url, tmp_path / "server.log", "--gpus", "none", "--unsigned")
            )
            first = stack.enter_context(worker_process(redis_server.url, tmp_path / "worker1.log", *flags, env=env))
            wait_for_workers(address)
            client = stack.enter_context(Client(address, cache=False, timeout=60))
            specs = _specs(6)
            for spec in specs:
                client.compile(spec, GENERIC)
            _plan(redis_server.url, 6)
            deadline = time.monotonic() + 30
            while _status(redis_server.url).built < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
            stack.enter_context(worker_process(redis_server.url, tmp_path / "worker2.log", *flags, env=env))
            done = _wait_done(client, timeout=60)
        warmed = [line for line in build_log.read_text().splitlines()][len(specs) :]
        # The item in flight when the first worker died is built again by the second, or found stored (the
        # first worker stored its plan and was killed before it recorded the item built: "already stored").
        assert done.built + done.skipped == 6 and done.skipped <= 1 and done.failed == 0, done
        # Every item once, but the one in flight when the first worker died, which may have been built twice.
        assert 6 <= len(warmed) <= 7, warmed
    finally:
        redis_server.stop()


def _port() -> int:
    from plancache_server.store.embedded_redis import free_port

    return free_port()


def _plan(redis_url: str, top: int) -> None:
    """Plan warming E from G as an operator's call would (the gateway's code, straight on Redis)."""
    Warming(redis.Redis.from_url(redis_url)).plan(EXACT, Source(target_id=GENERIC.id), top=top)


def _status(redis_url: str) -> object:
    return Warming(redis.Redis.from_url(redis_url)).status(EXACT.id)


def test_a_warmed_plan_is_evicted_first_but_kept_for_the_whole_retention(redis_client: redis.Redis) -> None:
    """Warmed and never served: first out under the bound, yet the retention
    counts from when it was warmed (not from the oldest served plan's use)."""
    day = 86400.0
    now = [1_000_000_000.0]
    janitor = Janitor(redis_client, clock=lambda: now[0])
    old, hot, warmed = (_key(s) for s in _specs(3))
    for key in (old, hot, warmed):
        redis_client.hset(keys.plan(key), mapping={"blob": b"x", "size": b"100"})
    janitor.record_put(old, 100, None)
    now[0] += 29.99 * day
    janitor.record_put(hot, 100, None)
    janitor.record_put(warmed, 100, None, warmed=True)
    now[0] += 900  # 15 minutes later: the old plan is past 30 days unused, the warmed one 15 minutes old
    assert janitor.expire(30 * day) == [old]
    assert redis_client.exists(keys.plan(warmed)) and redis_client.exists(keys.plan(hot))
    assert janitor.enforce_capacity(100) == [warmed]  # over the bound: the warmed plan goes before the served one
    assert redis_client.exists(keys.plan(hot))


def _queued_items(prefix: str, count: int) -> list[tuple[str, pb.PlanQuery]]:
    return [(f"{prefix}-{i}", pb.PlanQuery()) for i in range(count)]


def test_families_queued_together_are_built_in_turns_each_in_its_own_order(redis_client: redis.Redis) -> None:
    """GPU run 31: a sweep asks one family per function it calls (rms_norm, then linear); appended one after
    the other, the second family's members all waited for the first's, and no size had both its graphs.
    Appended in turns with the items not taken yet, each family keeps its own order (nearest sizes first);
    items already taken keep their places."""
    warming = Warming(redis_client)
    warming.extend(EXACT, _queued_items("norm", 4), "family norm")
    first = warming.next_item(EXACT.id, "w")
    assert first is not None and first.plan_key == "norm-0"
    warming.extend(EXACT, _queued_items("linear", 5), "family linear")
    taken = []
    while (item := warming.next_item(EXACT.id, "w")) is not None:
        taken.append(item.plan_key)
        warming.record(EXACT.id, item.index, "built", "", item.plan_key)
    assert taken == ["norm-1", "linear-0", "norm-2", "linear-1", "norm-3", "linear-2", "linear-3", "linear-4"]
    warming.record(EXACT.id, first.index, "built", "", first.plan_key)


def test_families_asked_at_the_same_instant_are_built_in_turns(redis_client: redis.Redis) -> None:
    """GPU run 33: a sweep's two families reached two gateway threads at the same instant; each read "no
    active plan" before either appended, so both were appended one after the other (458 rms_norm members
    before the first linear one). Deciding and appending in one step, they take turns however they race."""
    warming = Warming(redis_client)
    for attempt in range(12):
        target = dataclasses.replace(EXACT, sm_count=EXACT.sm_count + 1 + attempt)
        start = threading.Barrier(2)

        def ask(prefix: str, target: Target = target, start: threading.Barrier = start) -> None:
            start.wait()
            warming.extend(target, _queued_items(prefix, 40), f"family {prefix}")

        threads = [threading.Thread(target=ask, args=(prefix,)) for prefix in ("norm", "linear")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        taken = [item.plan_key for item in iter(lambda t=target: warming.next_item(t.id, "w"), None)]
        assert len(taken) == 80, (attempt, len(taken))
        firsts = {key.split("-")[0] for key in taken[:2]}
        assert firsts == {"norm", "linear"}, (attempt, taken[:6])
        assert warming.status(target.id).total == 80


def test_a_family_queued_while_the_last_items_build_loses_none_of_its_members(redis_client: redis.Redis) -> None:
    """A worker that looked for an item while the list's last ones were still building moved the plan's
    cursor past the list's end, once per look; the family appended next lost that many members (never
    built, counted as queued for ever)."""
    warming = Warming(redis_client)
    warming.extend(EXACT, _queued_items("a", 1), "family a")
    building = warming.next_item(EXACT.id, "w")
    assert building is not None
    for _ in range(5):  # looks while the last item builds
        assert warming.next_item(EXACT.id, "w") is None
    warming.extend(EXACT, _queued_items("b", 3), "family b")
    taken = [item.plan_key for item in iter(lambda: warming.next_item(EXACT.id, "w"), None)]
    assert taken == ["b-0", "b-1", "b-2"]


def test_a_family_past_the_lists_bound_is_refused_whole_and_nothing_is_appended(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound on a target's warming list is checked in the same step as the append: a family that would pass
    it is refused with the reason, and the list keeps what it had."""
    from plancache.errors import ResourceExhausted
    from plancache_server.store import warm_plans

    monkeypatch.setattr(warm_plans, "MAX_QUEUED_ITEMS", 10)
    warming = Warming(redis_client)
    warming.extend(EXACT, _queued_items("a", 6), "family a")
    with pytest.raises(ResourceExhausted, match="6 warming items queued; 5 more would pass 10"):
        warming.extend(EXACT, _queued_items("b", 5), "family b")
    warming.extend(EXACT, _queued_items("c", 4), "family c")  # within the bound: in turns as ever
    taken = [item.plan_key for item in iter(lambda: warming.next_item(EXACT.id, "w"), None)]
    assert sorted(taken) == sorted([f"a-{i}" for i in range(6)] + [f"c-{i}" for i in range(4)])
    assert warming.status(EXACT.id).total == 10


class _Dies:
    """A worker's Redis connection that dies after `commands` commands (its process killed there): every later
    command raises, as nothing of a killed process reaches Redis any more."""

    def __init__(self, client: redis.Redis, commands: int) -> None:
        self.left = commands
        self._execute = client.execute_command
        client.execute_command = self  # type: ignore[method-assign]

    def __call__(self, *args: object, **options: object) -> object:
        if self.left <= 0:
            raise redis.ConnectionError("the worker was killed")
        self.left -= 1
        return self._execute(*args, **options)


@pytest.mark.parametrize("commands", [0, 1, 2, 3])
def test_a_worker_killed_while_taking_an_item_loses_none_for_the_next_lease_holder(
    redis_server: EmbeddedRedis, redis_client: redis.Redis, commands: int
) -> None:
    """CI once saw a warming plan finish with 5 of its 6 items built and none skipped: its first worker was
    killed between taking an item (past the cursor) and marking it in flight, where no later lease holder
    looks. Taking and marking are one step now; wherever inside it a worker dies, the next holder builds
    every item once."""
    Warming(redis_client).extend(EXACT, _queued_items("a", 3), "family a")
    doomed_client = redis.Redis.from_url(redis_server.url)
    doomed = Warming(doomed_client)
    assert doomed.hold(EXACT.id, "doomed", lease_s=0.2)
    first = doomed.next_item(EXACT.id, "doomed")  # one item taken and recorded, as the test above kills after two
    assert first is not None
    doomed.record(EXACT.id, first.index, "built", "", first.plan_key)
    _Dies(doomed_client, commands)
    with pytest.raises(StoreUnavailable, match="the worker was killed"):
        for _ in range(4):  # more looks than items: it dies inside one of them
            doomed.next_item(EXACT.id, "doomed")
    time.sleep(0.3)  # its lease runs out
    survivor = Warming(redis_client)
    assert survivor.hold(EXACT.id, "survivor", lease_s=5)
    while (item := survivor.next_item(EXACT.id, "survivor")) is not None:
        survivor.record(EXACT.id, item.index, "built", "", item.plan_key)
    status = survivor.status(EXACT.id)
    assert (status.state, status.built, status.in_flight) == ("done", 3, 0), status


def test_retry_entries_that_are_no_items_index_are_dropped_and_end_nothing_early(redis_client: redis.Redis) -> None:
    """Anyone on the network can write to Redis: a word, a negative or past-the-end index, a fraction pushed on
    a plan's retry list is dropped as it is met (it neither finished the plan early, with items still queued,
    nor had the worker build another item again), and every item is built once."""
    warming = Warming(redis_client)
    warming.extend(EXACT, _queued_items("a", 3), "family a")
    redis_client.rpush(keys.warm_retry(EXACT.id), "x", "-1", "3", "99", "1.5")
    taken = []
    while (item := warming.next_item(EXACT.id, "w")) is not None:
        taken.append(item.plan_key)
        warming.record(EXACT.id, item.index, "built", "", item.plan_key)
    status = warming.status(EXACT.id)
    assert taken == ["a-0", "a-1", "a-2"] and (status.state, status.built) == ("done", 3), (taken, status)


class _MoveAtRead:
    """A Redis client on which another party makes one move on a key the first time the code under test reads it
    with GET: `before` (the read sees the move: a lease run out between a failed SET NX and the read of its holder)
    or after (the read sees the old value: a lease taken over between a read and the command that acts on it).
    `moved` says whether the code read at all; code that acts in one Lua step never gives the move a window."""

    def __init__(self, client: redis.Redis, move: Callable[[redis.Redis, str], object], *, before: bool) -> None:
        self._client, self._move, self._before = client, move, before
        self.moved = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)

    def get(self, name: str) -> object:
        if self.moved:
            return self._client.get(name)
        self.moved = True
        if self._before:
            self._move(self._client, name)
            return self._client.get(name)
        value = self._client.get(name)
        self._move(self._client, name)
        return value


def _runs_out(client: redis.Redis, name: str) -> object:
    return client.delete(name)


def _taken_by_worker_b(client: redis.Redis, name: str) -> object:
    return client.set(name, "worker-b", px=1000)


def test_a_warming_build_takes_a_lease_that_runs_out_as_it_asks(redis_client: redis.Redis) -> None:
    """A dead worker's lease on an item expiring between the next worker's SET NX and its read of the holder: the
    item is the next worker's to build, not skipped as "being built for a caller" (an empty holder read as a
    caller's build lost the item: CI, a warming plan done with 5 of its 6 items built)."""
    from plancache_server.store.build_records import BuildRecorder

    plan_key = _key(_specs(1)[0])
    redis_client.set(keys.build_lease(plan_key), "warm-the-dead-workers-job", px=30_000)
    proxy = _MoveAtRead(redis_client, _runs_out, before=True)
    recorder = BuildRecorder(proxy, lease_s=30)  # type: ignore[arg-type]
    assert recorder.take_lease(plan_key, "warm-the-next-job") is None
    assert proxy.moved
    assert redis_client.get(keys.build_lease(plan_key)) == b"warm-the-next-job"
    # A lease still held is named, as before.
    assert recorder.take_lease(plan_key, "warm-a-third-job") == "warm-the-next-job"


def test_a_warming_lease_taken_over_as_its_holder_renews_it_is_not_extended_as_its_own(
    redis_client: redis.Redis,
) -> None:
    from plancache_server.store.warm_queue import WarmItemQueue

    target_id = STANDIN_TARGET.id
    redis_client.set(keys.warm_lease(target_id), "worker-a", px=30_000)
    queue = WarmItemQueue(_MoveAtRead(redis_client, _taken_by_worker_b, before=False), time.time)  # type: ignore[arg-type]
    held = queue.hold(target_id, "worker-a", lease_s=30)
    holder = redis_client.get(keys.warm_lease(target_id))
    # Either a renewed its own lease before b could take it, or b holds it and a stops: never a warming on while
    # b holds the lease (two workers warming one target), nor b's lease stretched to a's 30 s.
    assert held == (holder == b"worker-a"), (held, holder)
    if not held:
        assert redis_client.pttl(keys.warm_lease(target_id)) <= 1000
    # Still held and renewed by its holder, as before.
    redis_client.set(keys.warm_lease(target_id), "worker-a", px=500)
    assert WarmItemQueue(redis_client, time.time).hold(target_id, "worker-a", lease_s=30)
    assert redis_client.pttl(keys.warm_lease(target_id)) > 1000


def test_a_worker_lets_go_of_its_own_warming_lease_only(redis_client: redis.Redis) -> None:
    """release() of a lease another worker took over (between a read and a delete, before) leaves it to that worker."""
    from plancache_server.store.warm_queue import WarmItemQueue

    target_id = STANDIN_TARGET.id
    redis_client.set(keys.warm_lease(target_id), "worker-a", px=30_000)
    proxy = _MoveAtRead(redis_client, _taken_by_worker_b, before=False)
    WarmItemQueue(proxy, time.time).release(target_id, "worker-a")  # type: ignore[arg-type]
    holder = redis_client.get(keys.warm_lease(target_id))
    # a's own lease let go, or, where b took it over in between, b's kept.
    assert holder == (b"worker-b" if proxy.moved else None), (proxy.moved, holder)
    redis_client.set(keys.warm_lease(target_id), "worker-b", px=30_000)
    WarmItemQueue(redis_client, time.time).release(target_id, "worker-a")
    assert redis_client.get(keys.warm_lease(target_id)) == b"worker-b"
    WarmItemQueue(redis_client, time.time).release(target_id, "worker-b")
    assert redis_client.get(keys.warm_lease(target_id)) is None

"""A build whose plan the gateway refuses fails its callers at once.

A gateway trusts --trusted-keys and the key of its own workers. A worker
signing with any other key (a remote worker given the wrong key, say)
stores plans the gateway will not serve: its callers get UntrustedBuild
naming the plan, the key that signed it and the trusted ones, within the
time of one build, the event is counted, and a rebuild that would be signed
the same way is not started again while the refusal is remembered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from plancache import Client, CompileOptions, Manifest, Unavailable, UntrustedBuild
from plancache.trust.signing import Signer, generate_keypair
from plancache_server import telemetry
from plancache_server.gateway import refusals
from plancache_server.store import keys
from plancache_server.store.build_records import DONE, finished_event, state_fields
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.worker.worker_queue import WorkerQueue
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler


@pytest.fixture
def keypairs(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    return {name: generate_keypair(tmp_path / name) for name in ("worker", "trusted")}


@pytest.fixture
def mismatched_stack(
    redis_server: EmbeddedRedis, redis_client: object, keypairs: dict[str, tuple[Path, Path]]
) -> Iterator[Stack]:
    """The worker signs with one key; the gateway trusts only another."""
    s, stop = start_stack(
        redis_server.url,
        StandInCompiler(build_seconds=0.2),
        signer=Signer.from_file(keypairs["worker"][0]),
        trusted_keys=(keypairs["trusted"][1],),
    )
    yield s
    stop()


def _key_id(public: Path) -> str:
    from plancache.trust.signing import key_id, load_public_key

    return key_id(load_public_key(public))


def _untrusted_count(stack: Stack) -> int:
    with Client(stack.address, cache=False) as c:
        deadline = time.monotonic() + 10
        while True:
            row = next((r for r in c.admin.stats() if r.target_id == TARGET.id), None)
            total = row.windows.get("total") if row else None
            if total is not None and total.untrusted_builds:
                return total.untrusted_builds
            if time.monotonic() > deadline:
                return 0
            time.sleep(0.2)


def _untrusted_metric() -> float:
    """plancache_untrusted_builds_total, every target label together."""
    return sum(s.value for m in telemetry.UNTRUSTED_BUILDS.collect() for s in m.samples if s.name.endswith("_total"))


def test_callers_of_a_build_signed_by_an_untrusted_key_fail_at_once_with_the_reason(
    mismatched_stack: Stack, keypairs: dict[str, tuple[Path, Path]]
) -> None:
    stack = mismatched_stack
    worker_key, trusted_key = _key_id(keypairs["worker"][1]), _key_id(keypairs["trusted"][1])
    refused_before = _untrusted_metric()
    errors: list[BaseException] = []

    def call() -> None:
        with Client(stack.address, cache=False, timeout=60) as c:
            try:
                c.compile(matmul_spec(), TARGET)
            except BaseException as e:
                errors.append(e)

    started = time.monotonic()
    callers = [threading.Thread(target=call) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=30)
    elapsed = time.monotonic() - started
    assert len(errors) == 3 and all(isinstance(e, UntrustedBuild) for e in errors), errors
    message = str(errors[0])
    plan_key = stack.redis.keys(keys.plan("*"))[0].decode()
    assert keys.plan_key_of(plan_key) in message and worker_key in message and trusted_key in message, message
    assert "--trusted-keys" in message and "--signing-key" in message
    # A 0.2 s build, refused as soon as it is stored; not the compile timeout.
    assert elapsed < 5, elapsed
    assert errors[0].code.name == "FAILED_PRECONDITION"
    assert _untrusted_count(stack) == 1
    assert _untrusted_metric() == refused_before + 1

    # Again: refused at once, and no second build signed the same way.
    builds_before = len(stack.compiler.builds)
    started = time.monotonic()
    with Client(stack.address, cache=False) as c, pytest.raises(UntrustedBuild, match="no rebuild is started"):
        c.compile(matmul_spec(), TARGET)
    assert time.monotonic() - started < 1.0
    time.sleep(0.5)
    assert len(stack.compiler.builds) == builds_before


def test_a_refused_provisional_plan_fails_its_waiters_before_the_tuning_ends(
    redis_server: EmbeddedRedis, redis_client: object, keypairs: dict[str, tuple[Path, Path]]
) -> None:
    stack, stop = start_stack(
        redis_server.url,
        StandInCompiler(build_seconds=0.1, tune_seconds=3),
        signer=Signer.from_file(keypairs["worker"][0]),
        trusted_keys=(keypairs["trusted"][1],),
    )
    try:
        started = time.monotonic()
        with Client(stack.address, cache=False, timeout=60) as c, pytest.raises(UntrustedBuild):
            c.compile(matmul_spec(), TARGET, tuned_only=True)
        assert time.monotonic() - started < 2  # the tuning takes 3 s more
    finally:
        stop()


def test_prefetch_items_of_an_untrusted_build_carry_the_error(mismatched_stack: Stack) -> None:
    with Client(mismatched_stack.address, cache=False, timeout=60) as c:
        result = c.prefetch(Manifest.from_specs([matmul_spec(), matmul_spec(m=48)], TARGET), compile_missing=True)
    assert len(result.errors) == 2 and all(isinstance(e, UntrustedBuild) for e in result.errors.values()), result


def test_a_rebuild_is_started_again_once_the_refusal_is_forgotten(mismatched_stack: Stack) -> None:
    stack = mismatched_stack
    with Client(stack.address, cache=False) as c, pytest.raises(UntrustedBuild):
        c.compile(matmul_spec(), TARGET)
    marker = stack.redis.keys(keys.untrusted_build("*"))
    assert len(marker) == 1 and stack.redis.ttl(marker[0]) <= refusals.UNTRUSTED_BUILD_TTL_S
    stack.redis.delete(*marker)  # as when it expires
    builds_before = len(stack.compiler.builds)
    with Client(stack.address, cache=False) as c, pytest.raises(UntrustedBuild):
        c.compile(matmul_spec(), TARGET)
    # The worker found a plan it trusts (its own) and took it as built, or built it again: either way the
    # callers were told.
    assert len(stack.compiler.builds) >= builds_before


def test_a_plan_gone_after_its_build_ends_the_wait_with_the_reason(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """A worker that announces a finished build whose plan is not stored
    (deleted or evicted at once): the waiters are told within a few
    re-reads, not at the compile timeout."""
    stack, stop = start_stack(redis_server.url, None)
    queue = WorkerQueue(redis_client)
    queue.heartbeat("silent-worker", [TARGET, TARGET.generic()], 30)
    try:
        outcome: list[BaseException] = []

        def call() -> None:
            with Client(stack.address, cache=False, timeout=60) as c:
                try:
                    c.compile(matmul_spec(), TARGET, CompileOptions())
                except BaseException as e:
                    outcome.append(e)

        caller = threading.Thread(target=call)
        started = time.monotonic()
        caller.start()
        deadline = time.monotonic() + 10
        while not redis_client.keys(keys.build_lease("*")):
            assert time.monotonic() < deadline, "no build was queued"
            time.sleep(0.05)
        lease = redis_client.keys(keys.build_lease("*"))[0].decode()
        plan_key = keys.plan_key_of(lease)
        job_id = redis_client.get(lease).decode()  # type: ignore[union-attr]
        # As a worker would: after the gateway has queued the job (its "queued" would overwrite an earlier "done").
        while redis_client.hget(keys.job_state(plan_key), "job_id") != job_id.encode():
            assert time.monotonic() < deadline, "the job was not queued"
            time.sleep(0.01)
        done = state_fields(job_id, DONE, worker="silent-worker")
        redis_client.hset(keys.job_state(plan_key), mapping=done)  # type: ignore[arg-type]
        redis_client.publish(keys.EVENTS_CHANNEL, finished_event(job_id, plan_key))
        caller.join(timeout=30)
        assert len(outcome) == 1 and isinstance(outcome[0], Unavailable) and "no longer stored" in str(outcome[0]), (
            outcome
        )
        assert time.monotonic() - started < 10
    finally:
        stop()

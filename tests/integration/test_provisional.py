"""Heuristic first, tuned later: a first build answers with cuDNN's heuristic
plan (provisional) as soon as it exists, then the autotuned plan replaces it
under the same key; `tuned_only` waits for the tuned one; clients move to the
tuned plan; a background prefetch readies plans while the node starts up.

The stand-in compiler plays the two phases (`tune_seconds` after the
provisional plan); the real phases are checked on the GPU (tests/gpu)."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plancache import Client, DiskCache, Manifest, NotFound, Unavailable
from plancache.trust.signing import Signer, generate_keypair
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway import memory_cache
from plancache_server.store import keys
from plancache_server.store.build_records import DONE
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import REJECTED_NAME, TUNE_FAILS_NAME, StandInCompiler
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.waiting import wait_until

BUILD_S, TUNE_S = 0.2, 1.5


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "worker")


@pytest.fixture
def tuning_stack(
    redis_server: EmbeddedRedis, redis_client: object, keypair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    """A signing worker whose builds take BUILD_S to the heuristic plan and
    TUNE_S more to the tuned one; the gateway checks signatures. The
    memory cache keeps provisional plans far longer than in production, so
    that only the replacement's event can make it serve the tuned plan."""
    monkeypatch.setattr(memory_cache, "PROVISIONAL_TTL_S", 600.0)
    compiler = StandInCompiler(build_seconds=BUILD_S, tune_seconds=TUNE_S)
    s, stop = start_stack(redis_server.url, compiler, signer=Signer.from_file(keypair[0]), trusted_keys=(keypair[1],))
    yield s
    stop()


def signed_client(stack: Stack, keypair: tuple[Path, Path], **kwargs: object) -> Client:
    return Client(stack.address, **{"cache": False, "trusted_keys": [keypair[1]], "allow_unsigned": False, **kwargs})  # type: ignore[arg-type]


def stored_metadata(stack: Stack, key: str) -> pb.PlanMetadata | None:
    raw = stack.redis.hget(keys.plan(key), "meta")
    return pb.PlanMetadata.FromString(raw) if raw else None  # type: ignore[arg-type]


def wait_until_tuned(stack: Stack, key: str, timeout: float = 10.0) -> float:
    """When Redis first held the tuned plan (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = stored_metadata(stack, key)
        if meta is not None and not meta.provisional:
            return time.monotonic()
        time.sleep(0.005)
    raise AssertionError(f"plan {key} was not tuned within {timeout} s")


def test_a_first_build_answers_with_the_heuristic_plan_then_serves_the_tuned_one(
    tuning_stack: Stack, keypair: tuple[Path, Path]
) -> None:
    spec = matmul_spec()
    with signed_client(tuning_stack, keypair) as client:
        started = time.monotonic()
        first = client.compile(spec, TARGET)
        first_s = time.monotonic() - started
        assert first.provisional and first.source == "provisional"
        assert first_s < BUILD_S + TUNE_S / 2, f"the provisional plan took {first_s:.2f} s"
        assert first.metadata.autotune_seconds == 0 and first.metadata.plan_name == "standin_eng0"
        # While tuning goes on, the stored plan is the provisional one, signed.
        again = client.get(key=first.key)
        assert again.provisional and again.blob == first.blob
        tuned_at = wait_until_tuned(tuning_stack, first.key)
        # The gateway's memory cache held the provisional plan: the
        # replacement's event drops it (its TTL here is 10 minutes).
        while (served := client.get(key=first.key)).provisional:
            assert time.monotonic() - tuned_at < 2.0, "the gateway kept serving the provisional plan"
            time.sleep(0.01)
        assert served.key == first.key and served.blob != first.blob
        # The candidates' builds (TUNE_S together, on the worker's build threads), then their timing.
        assert served.metadata.plan_name == "standin_eng7_k3" and served.metadata.build_seconds == pytest.approx(
            BUILD_S + TUNE_S
        )
        assert [c.median_ms for c in served.metadata.candidates] == pytest.approx([0.020] * 7 + [0.015] + [0.020] * 2)
        assert [c.index for c in served.metadata.candidates] == list(range(10))
        hit = client.compile(spec, TARGET)
        assert hit.source == "hit" and not hit.provisional and hit.blob == served.blob
    assert len(tuning_stack.compiler.builds) == 1  # one build, two phases
    state = tuning_stack.redis.hgetall(keys.job_state(first.key))
    assert state[b"state"] == DONE.encode()


def test_tuned_only_waits_for_the_tuned_plan_on_the_same_build(tuning_stack: Stack, keypair: tuple[Path, Path]) -> None:
    spec = matmul_spec(m=64)
    with signed_client(tuning_stack, keypair) as client, concurrent.futures.ThreadPoolExecutor(8) as pool:
        started = time.monotonic()
        patient = [pool.submit(client.compile, spec, TARGET, tuned_only=True) for _ in range(3)]
        eager = [pool.submit(client.compile, spec, TARGET) for _ in range(3)]
        eager_plans = [f.result() for f in eager]
        eager_s = time.monotonic() - started
        tuned_plans = [f.result() for f in patient]
        tuned_s = time.monotonic() - started
    assert all(p.provisional for p in eager_plans) and {p.source for p in eager_plans} <= {"provisional"}
    assert not any(p.provisional for p in tuned_plans)
    assert {p.source for p in tuned_plans} <= {"compiled", "joined"}
    assert len({p.blob for p in tuned_plans}) == 1 and tuned_plans[0].blob != eager_plans[0].blob
    # The tuning: 9 candidates of TUNE_S / 9 on the 3 build threads of 4 not kept for heuristic plans.
    assert eager_s < BUILD_S + TUNE_S / 6 and tuned_s >= BUILD_S + TUNE_S / 3 * 0.9
    assert len(tuning_stack.compiler.builds) == 1, "every caller shares one build"


def test_a_stored_provisional_plan_is_a_miss_for_tuned_only(tuning_stack: Stack, keypair: tuple[Path, Path]) -> None:
    spec = matmul_spec(m=32)
    with signed_client(tuning_stack, keypair) as client:
        first = client.compile(spec, TARGET)
        assert first.provisional
        manifest = Manifest.from_specs([spec], TARGET)
        # Without compile_missing, no tuned plan is stored yet: NotFound, not the provisional one.
        early = client.prefetch(manifest, tuned_only=True)
        assert isinstance(early.errors[0], NotFound) and "autotuned" in early.errors[0].message
        tuned = client.compile(spec, TARGET, tuned_only=True)
        assert not tuned.provisional and tuned.source in ("compiled", "joined")
        late = client.prefetch(manifest, tuned_only=True)
        assert late.plans[0].blob == tuned.blob and late.provisional == 0


def test_a_plan_invalidated_while_its_build_tunes_stays_invalidated(
    tuning_stack: Stack, keypair: tuple[Path, Path]
) -> None:
    # GPU run 43: an operator's Invalidate of a provisional plan was undone 6 ms later by its build's tuned plan.
    spec = matmul_spec(m=48)
    with signed_client(tuning_stack, keypair) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = client.compile(spec, TARGET)
        assert first.provisional
        patient = pool.submit(client.compile, spec, TARGET, tuned_only=True)  # waits for this build's tuned plan
        wait_until(lambda: tuning_stack.compiler.candidate_builds, 5.0, "the build to tune")
        assert client.admin.invalidate(first.key) == 1
        wait_until(
            lambda: (
                tuning_stack.redis.hget(keys.job_state(first.key), "state") == DONE.encode()
                and stored_metadata(tuning_stack, first.key) is None
            ),
            10.0,
            "the build to end",
        )
        time.sleep(0.3)  # nothing stored after its end either
        assert stored_metadata(tuning_stack, first.key) is None, "the tuned plan was stored over the invalidation"
        # The waiting caller is not given the plan of the build the invalidation stood against: its flight queues
        # the job again (it was told "no longer stored, call again" before), and it gets a build made after it.
        tuned = patient.result(timeout=30)
        assert not tuned.provisional and tuned.key == first.key
        assert len(tuning_stack.compiler.builds) == 2, "a second build, after the invalidation"
        assert client.compile(spec, TARGET).source == "hit"


def test_a_plan_invalidated_again_during_its_rebuilds_tune_is_said_to_its_waiting_caller(
    tuning_stack: Stack, keypair: tuple[Path, Path]
) -> None:
    # The flight queues its job again once; deleted again before it is read, the waiting caller is told.
    spec = matmul_spec(m=56)
    compiler = tuning_stack.compiler
    with signed_client(tuning_stack, keypair) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = client.compile(spec, TARGET)
        patient = pool.submit(client.compile, spec, TARGET, tuned_only=True)
        for build in (1, 2):
            wait_until(lambda b=build: len(compiler.builds) == b and compiler.candidate_builds, 10.0, f"build {build}")
            wait_until(lambda: stored_metadata(tuning_stack, first.key) is not None, 5.0, "its provisional plan")
            assert client.admin.invalidate(first.key) == 1
            compiler.candidate_builds.clear()
        with pytest.raises(Unavailable, match="no longer stored"):
            patient.result(timeout=30)
    assert len(compiler.builds) == 2 and stored_metadata(tuning_stack, first.key) is None


def test_prefetch_moves_a_nodes_disk_cache_to_the_tuned_plans(
    tuning_stack: Stack, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    specs = [matmul_spec(m=16 * (i + 1), name=f"layer{i}") for i in range(3)]
    manifest = Manifest.from_specs(specs, TARGET)
    cache = DiskCache(tmp_path / "node")
    with signed_client(tuning_stack, keypair, cache=cache) as node:
        first = node.prefetch(manifest, compile_missing=True)
        assert (first.compiled, first.provisional, first.failed) == (3, 3, 0)
        provisional_blobs = [first.plans[i].blob for i in range(3)]
        # The node restarts while tuning goes on and the server is down: it runs the provisional plans it holds.
        with Client(
            f"127.0.0.1:{free_port()}", cache=cache, timeout=1, trusted_keys=[keypair[1]], allow_unsigned=False
        ) as offline:
            held = offline.prefetch(manifest)
        assert (held.from_cache, held.provisional, held.failed) == (3, 3, 0)
        with signed_client(tuning_stack, keypair) as observer:
            for key in first.keys.values():
                wait_until_tuned(tuning_stack, key)
                # And the gateway heard of it (its memory cache drops the provisional plan on the worker's
                # announcement, which can come a moment after Redis holds the tuned plan: a flake under load).
                wait_until(lambda key=key: not observer.get(key).provisional, 10, "the gateway to serve the tuned plan")
        # The next start-up asks again for the provisional plans it holds, and keeps the tuned ones.
        later = node.prefetch(manifest)
        assert (later.provisional, later.failed, later.from_cache) == (0, 0, 0)
        assert all(later.plans[i].blob != provisional_blobs[i] for i in range(3))
        assert all(not cache.get(key).provisional for key in first.keys.values())  # type: ignore[union-attr]
        settled = node.prefetch(manifest)
        assert settled.from_cache == 3 and [settled.plans[i].blob for i in range(3)] == [
            later.plans[i].blob for i in range(3)
        ]


def test_a_client_moves_a_cached_provisional_plan_to_the_tuned_one_on_compile(
    tuning_stack: Stack, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    spec = matmul_spec(m=48)
    with signed_client(tuning_stack, keypair, cache=DiskCache(tmp_path)) as node:
        first = node.compile(spec, TARGET)
        assert first.provisional
        assert node.compile(spec, TARGET).provisional  # still tuning: the server has nothing better
        wait_until_tuned(tuning_stack, first.key)
        deadline = time.monotonic() + 2
        while (now := node.compile(spec, TARGET)).provisional and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not now.provisional
        assert node.compile(spec, TARGET).source == "cache"


def test_when_autotuning_fails_the_heuristic_plan_becomes_final(
    tuning_stack: Stack, keypair: tuple[Path, Path]
) -> None:
    spec = matmul_spec(m=24, name=TUNE_FAILS_NAME)
    with signed_client(tuning_stack, keypair) as client:
        first = client.compile(spec, TARGET)
        assert first.provisional
        final = client.compile(spec, TARGET, tuned_only=True)
    assert not final.provisional and final.blob == first.blob
    assert all("autotuning failed" in c.error and "fell off the bus" in c.error for c in final.metadata.candidates)
    # The worker stores the final plan, then records the job done: a caller can hold the plan a moment before the state says so.
    deadline = time.monotonic() + 5
    while tuning_stack.redis.hget(keys.job_state(first.key), "state") != DONE.encode() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tuning_stack.redis.hget(keys.job_state(first.key), "state") == DONE.encode()


def test_a_herd_joining_during_the_build_all_get_the_provisional_plan(
    tuning_stack: Stack, keypair: tuple[Path, Path]
) -> None:
    spec = matmul_spec(m=80)
    callers = 40
    with signed_client(tuning_stack, keypair) as client, concurrent.futures.ThreadPoolExecutor(callers) as pool:
        plans = list(pool.map(lambda _: client.compile(spec, TARGET), range(callers)))
        # Arriving while the tuning runs: the flight hands its provisional plan over at once.
        late = client.compile(spec, TARGET)
    assert all(p.provisional for p in [*plans, late]) and len({p.blob for p in plans}) == 1
    assert len(tuning_stack.compiler.builds) == 1


# ---- background prefetch ---------------------------------------------------------


def test_background_prefetch_returns_at_once_and_readies_plans_meanwhile(slow_stack: Stack, tmp_path: Path) -> None:
    """slow_stack builds take 1 s: the node's own 'start-up work' overlaps them."""
    specs = [matmul_spec(m=16 * (i + 1), name=f"layer{i}") for i in range(3)] + [matmul_spec(m=8, name=REJECTED_NAME)]
    with Client(slow_stack.address, cache=DiskCache(tmp_path)) as node:
        started = time.monotonic()
        pending = node.prefetch_in_background(Manifest.from_specs(specs, TARGET), compile_missing=True)
        returned_s = time.monotonic() - started
        assert returned_s < 0.5, f"prefetch_in_background blocked for {returned_s:.2f} s"
        assert pending.ready(0) is None and not pending.done()
        with pytest.raises(TimeoutError):
            pending.wait_for(0, timeout=0.05)
        first = pending.wait_for(0, timeout=30)
        assert first.key == Manifest.from_specs(specs, TARGET).key_of(
            Manifest.from_specs(specs, TARGET).entries[0], TARGET
        )
        with pytest.raises(Exception, match="cuDNN_STATUS_NOT_SUPPORTED"):
            pending.wait_for(3, timeout=30)
        result = pending.wait(timeout=30)
    assert pending.done() and result.failed == 1 and len(result.plans) == 3
    assert all(pending.ready(i) is result.plans[i] for i in range(3))


def test_background_prefetch_with_load_reports_plans_that_cannot_load(stack: Stack) -> None:
    """Without the GPU stack (CI), loading fails: each entry says why; nothing is raised on the node's thread until it asks."""
    cudnn_missing = True
    try:
        import cudnn  # noqa: F401
        import torch

        cudnn_missing = not torch.cuda.is_available()
    except ImportError:
        pass
    if not cudnn_missing:
        pytest.skip("a GPU is here: tests/gpu load plans for real")
    spec = matmul_spec(m=16)
    with stack.client() as client:
        client.compile(spec, TARGET)
        pending = client.prefetch_in_background(Manifest.from_specs([spec], TARGET), load=True)
        with pytest.raises(Exception, match="GPU"):
            pending.wait_for(0, timeout=10)
        result = pending.wait(timeout=10)
    assert 0 not in result.plans and "GPU" in result.errors[0].message


def test_background_prefetch_reports_a_failed_call_when_asked(tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    with Client(nobody, cache=DiskCache(tmp_path), timeout=0.5, compile_timeout=0.5) as node:
        pending = node.prefetch_in_background(Manifest.from_specs([matmul_spec()], TARGET), compile_missing=True)
        result = pending.wait(timeout=30)
    # An unreachable server is each entry's error, as with prefetch().
    assert result.failed == 1 and not result.plans
    with pytest.raises(type(result.errors[0])):
        pending.wait_for(0, timeout=1)


def test_background_prefetch_keeps_the_node_thread_free(stack: Stack) -> None:
    """The node's thread does its own work while plans arrive; afterwards every plan is there without waiting."""
    specs = [matmul_spec(m=16 * (i + 1), name=f"layer{i}") for i in range(8)]
    with stack.client() as client:
        for spec in specs:
            client.compile(spec, TARGET)
        pending = client.prefetch_in_background(Manifest.from_specs(specs, TARGET))
        time.sleep(0.5)  # the node's own start-up work
        assert all(pending.ready(i) is not None for i in range(len(specs)))
        assert pending.finished_at is not None and pending.finished_at - pending.started_at < 0.5
        assert len(pending.wait(timeout=0).plans) == len(specs)


def test_a_worker_builds_every_waiting_heuristic_plan_before_any_autotuning(
    tuning_stack: Stack, keypair: tuple[Path, Path]
) -> None:
    """The first node of a new model asks for all its plans at once: it gets
    every provisional plan after the heuristic builds (4 x 0.2 s here), not
    after the autotuning of the plans queued before them (1.5 s each)."""
    specs = [matmul_spec(m=16 * (i + 1), name=f"first-node-{i}") for i in range(4)]
    arrived: list[tuple[float, bool]] = []
    with signed_client(tuning_stack, keypair) as node:
        started = time.monotonic()
        result = node.prefetch(
            Manifest.from_specs(specs, TARGET),
            compile_missing=True,
            on_plan=lambda i, p: arrived.append((time.monotonic() - started, p.provisional)),
        )
        tuned_when_all_arrived = [
            not meta.provisional
            for key in result.keys.values()
            if (meta := stored_metadata(tuning_stack, key)) is not None
        ]
    assert result.provisional == 4 and len(arrived) == 4 and all(provisional for _, provisional in arrived)
    assert max(t for t, _ in arrived) < BUILD_S * 4 + TUNE_S, arrived
    assert sum(tuned_when_all_arrived) <= 1, "autotuning ran before the waiting heuristic builds"
    for key in result.keys.values():  # and every one is tuned afterwards
        wait_until_tuned(tuning_stack, key, timeout=4 * (BUILD_S + TUNE_S) + 5)


def test_autotuning_waits_for_a_pause_in_callers_misses(redis_server: EmbeddedRedis, redis_client: object) -> None:
    """A node asking for its graphs one after another (a first node, issue 41)
    gets each heuristic plan as fast as before, and no candidate is built
    beside its misses: autotuning starts --tune-after-quiet after the last."""
    quiet_s, gap_s = 0.6, 0.25
    compiler = StandInCompiler(build_seconds=0.05, tune_seconds=0.3)
    started: list[float] = []
    candidate = compiler.candidate

    def timed_candidate(*args: object) -> object:
        started.append(time.monotonic())
        return candidate(*args)  # type: ignore[arg-type]

    compiler.candidate = timed_candidate  # type: ignore[method-assign,assignment]
    s, stop = start_stack(redis_server.url, compiler, tune_after_quiet_s=quiet_s)
    try:
        with s.client(hedge=False) as client:
            plans, answered = [], []
            for i in range(4):
                begun = time.monotonic()
                plans.append(client.compile(matmul_spec(m=16 * (i + 1), name=f"layer{i}"), TARGET))
                answered.append(time.monotonic())
                assert plans[-1].provisional and answered[-1] - begun < quiet_s / 2  # as fast to come as before
                time.sleep(gap_s)
            for plan in plans:  # every plan is tuned all the same
                wait_until_tuned(s, plan.key, timeout=20)
        # No candidate was built while the misses came, nor before the pause after the last one.
        assert started and min(started) >= answered[-1] + quiet_s - 0.1
    finally:
        stop()

"""The service end to end on a real redis-server, an in-process gRPC server
and a worker with the stand-in compiler (tests/support/standin.py)."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from plancache import (
    Client,
    CompileFailed,
    CompileOptions,
    InvalidRequest,
    NotFound,
    Plan,
    SpecError,
    StoreUnavailable,
    Target,
    TargetUnavailable,
)
from plancache.graphspec import spec_io
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.store import keys
from tests.conftest import Stack, start_stack
from tests.support.specs import matmul_bias_relu_spec, matmul_spec
from tests.support.standin import REJECTED_NAME, STANDIN_TARGET

TARGET = STANDIN_TARGET


def test_miss_compiles_then_hits(stack: Stack) -> None:
    with stack.client() as client:
        first = client.compile(matmul_spec(), TARGET)
        second = client.compile(matmul_spec(), TARGET)
    assert (first.source, second.source) == ("compiled", "hit")
    assert first.blob == second.blob and len(first.blob) == 75_000
    assert stack.compiler.builds == [matmul_spec().spec_hash()]
    meta = second.metadata
    assert meta.key == first.key and meta.spec_hash == matmul_spec().spec_hash()
    assert meta.blob_sha256 == hashlib.sha256(second.blob).hexdigest() and meta.blob_size == 75_000
    assert (
        meta.plan_name == "standin_eng7_k3"
        and meta.engine_id == 7
        and [(k.name, k.value) for k in meta.knobs] == [("TILE_SIZE", 3)]
    )
    assert [c.median_ms for c in meta.candidates] == pytest.approx([0.020, 0.015])
    assert [(b.uid, b.name, tuple(b.dim), b.is_output) for b in meta.tensors] == [
        (1, "A", (8, 256, 512), False),
        (2, "B", (8, 512, 256), False),
        (3, "C", (8, 256, 256), True),
    ]
    assert meta.target.device_name == "StandIn GPU" and meta.built_by == "test-worker" and meta.created_at > 0


def test_options_and_targets_are_part_of_the_key(stack: Stack) -> None:
    with stack.client() as client:
        tuned = client.compile(matmul_spec(), TARGET)
        untuned = client.compile(matmul_spec(), TARGET, CompileOptions(autotune=False))
        generic = client.compile(matmul_spec(), TARGET.generic())
    assert len({tuned.key, untuned.key, generic.key}) == 3
    assert len(stack.compiler.builds) == 3


def test_get_by_key_and_by_spec_never_compiles(stack: Stack) -> None:
    with stack.client() as client:
        with pytest.raises(NotFound, match="GetPlan never compiles"):
            client.get(spec=matmul_spec(), target=TARGET)
        compiled = client.compile(matmul_spec(), TARGET)
        by_key = client.get(compiled.key)
        by_spec = client.get(spec=matmul_spec(), target=TARGET)
    assert by_key.blob == by_spec.blob == compiled.blob
    assert len(stack.compiler.builds) == 1


def test_concurrent_identical_compiles_build_once(slow_stack: Stack) -> None:
    callers = 16
    with slow_stack.client() as client, ThreadPoolExecutor(callers) as pool:
        plans = list(pool.map(lambda _: client.compile(matmul_spec(), TARGET), range(callers)))
    assert len(slow_stack.compiler.builds) == 1
    assert len({p.blob for p in plans}) == 1
    sources = sorted(p.source for p in plans)
    assert sources.count("compiled") == 1 and sources.count("joined") == callers - 1
    row = {r.target_id: r for r in Client(slow_stack.address).admin.stats()}[TARGET.id]
    assert (row.compiles, row.joined, row.misses, row.hits) == (1, callers - 1, callers, 0)


def test_corrupted_blob_is_never_served_and_is_rebuilt(uncached_stack: Stack) -> None:
    stack = uncached_stack
    with stack.client() as client:
        plan = client.compile(matmul_spec(), TARGET)
        stack.redis.hset(keys.plan(plan.key), "blob", b"X" + plan.blob[1:])
        with pytest.raises(NotFound):
            client.get(plan.key)
        again = client.compile(matmul_spec(), TARGET)
    assert again.source == "compiled" and again.blob == plan.blob
    assert len(stack.compiler.builds) == 2


def test_corrupted_metadata_is_never_served(uncached_stack: Stack) -> None:
    stack = uncached_stack
    with stack.client() as client:
        plan = client.compile(matmul_spec(), TARGET)
        stack.redis.hset(keys.plan(plan.key), "meta", b"\xff\xfe garbage")
        with pytest.raises(NotFound):
            client.get(plan.key)


def test_client_refuses_a_blob_that_does_not_match_its_sha256() -> None:
    meta = pb.PlanMetadata(key="k", blob_sha256=hashlib.sha256(b"good").hexdigest())
    from plancache import IntegrityError

    with pytest.raises(IntegrityError, match="does not match"):
        Plan(b"evil", meta)


def test_cudnn_rejection_is_failed_precondition_with_the_reason(stack: Stack) -> None:
    with stack.client() as client, pytest.raises(CompileFailed, match="cuDNN_STATUS_NOT_SUPPORTED") as info:
        client.compile(matmul_spec(name=REJECTED_NAME), TARGET)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    row = {r.target_id: r for r in Client(stack.address).admin.stats()}[TARGET.id]
    assert row.failures == 1


def test_no_worker_for_the_target_fails_fast(stack: Stack) -> None:
    other = Target("sm_100", 91900, "1.32.0")
    started = time.monotonic()
    with (
        stack.client() as client,
        pytest.raises(
            TargetUnavailable, match=re.escape("no live GPU worker can build for target sm_100/cudnn-91900/fe-1.32.0")
        ) as info,
    ):
        client.compile(matmul_spec(), other)
    assert time.monotonic() - started < 2
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert TARGET.id in info.value.message  # says which targets can be built


def test_a_worker_whose_beats_a_failover_held_back_still_builds_a_new_callers_plan(stack: Stack) -> None:
    """A Redis failover longer than a worker's --heartbeat-ttl lets its entry expire (its beats fail meanwhile):
    until its next beat renews it, the target has no live worker in Redis. A caller's miss then is queued for it,
    not refused as if the target had none (FAILED_PRECONDITION, not retryable, in the middle of a failover; a
    cluster test's caller met it). A worker that left (stopped, its GPU lost) takes its entry out: refused."""
    worker_keys = [keys.workers(TARGET.id), keys.workers(TARGET.generic().id)]
    lapsed = threading.Event()

    def expire_entries() -> None:  # as fast as the worker renews them (every 0.2 s here): expired, 1 s ago
        while not lapsed.is_set():
            now = float(stack.redis.time()[0])  # type: ignore[index]
            for name in worker_keys:
                members = stack.redis.zrange(name, 0, -1)
                if members:
                    stack.redis.zadd(name, {m: now - 1 for m in members})  # type: ignore[union-attr]
            lapsed.wait(0.001)

    expirer = threading.Thread(target=expire_entries)
    expirer.start()
    try:
        time.sleep(0.3)
        with stack.client() as client:
            assert not [t for t in client.admin.list_targets() if t.live_workers]  # none live, as Redis says
            started = time.monotonic()
            plan = client.compile(matmul_bias_relu_spec(), TARGET)
            waited = time.monotonic() - started
    finally:
        lapsed.set()
        expirer.join()
    assert plan.blob and waited < 10


def test_server_without_gpu_serves_stored_plans(stack: Stack, gpuless_stack: Stack) -> None:
    with stack.client() as gpu_side:
        stored = gpu_side.compile(matmul_spec(), TARGET)
    stack.worker.stop()  # type: ignore[union-attr]
    stack.redis.delete(keys.workers(TARGET.id), keys.workers(TARGET.generic().id))
    with gpuless_stack.client() as client:
        assert client.compile(matmul_spec(), TARGET).blob == stored.blob
        with pytest.raises(TargetUnavailable, match=TARGET.id):
            client.compile(matmul_bias_relu_spec(), TARGET)


def test_bad_specs_are_invalid_argument_naming_the_culprit(stack: Stack) -> None:
    spec = spec_io.to_proto(matmul_spec())
    spec.tensors[1].dim[1] = 500  # inner dims no longer agree
    channel = grpc.insecure_channel(stack.address)
    stub = pb_grpc.PlanCacheStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Compile(pb.CompileRequest(spec=spec, target=TARGET.to_proto()), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node 0 (matmul_0)" in info.value.details() and "inner dims differ" in info.value.details()
    spec.nodes[0].op = "conv3d"
    with pytest.raises(grpc.RpcError) as info:
        stub.Compile(pb.CompileRequest(spec=spec, target=TARGET.to_proto()), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown op 'conv3d'" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.Compile(pb.CompileRequest(spec=spec_io.to_proto(matmul_spec())), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "target is missing" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.GetPlan(pb.GetPlanRequest(ref=pb.PlanRef(key="../../etc/passwd")), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
    bad = matmul_spec()
    bad.tensors[1].dim = (8, 500, 256)
    with stack.client() as client, pytest.raises(SpecError, match="inner dims differ"):
        client.compile(bad, TARGET)  # caught by the client before sending
    assert stack.compiler.builds == []


def test_client_maps_codes_to_typed_errors(stack: Stack) -> None:
    with stack.client() as client:
        with pytest.raises(InvalidRequest):
            client.get("not-a-key")
        with pytest.raises(InvalidRequest):
            client.get()


def test_redis_down_is_unavailable(redis_server: object, tmp_path: object) -> None:
    from plancache_server.store.embedded_redis import EmbeddedRedis

    private = EmbeddedRedis(tmp_path, persist=False).start()  # type: ignore[arg-type]
    s, stop = start_stack(private.url, None)
    try:
        private.kill()
        with s.client() as client:
            with pytest.raises(StoreUnavailable) as info:
                client.compile(matmul_spec(), TARGET)
            assert info.value.code == grpc.StatusCode.UNAVAILABLE and "plan store unavailable" in info.value.message
            with pytest.raises(StoreUnavailable):
                client.admin.stats()
    finally:
        stop()
        private.stop()


def test_waiters_time_out_with_deadline_exceeded(redis_server: object, redis_client: object) -> None:
    from plancache import CompileTimeout
    from tests.support.standin import StandInCompiler

    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=2.0))  # type: ignore[attr-defined]
    try:
        with s.client() as client:
            with pytest.raises(CompileTimeout):
                client.compile(matmul_spec(), TARGET, timeout=0.5)
            # the build went on, and its plan was stored
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    assert client.get(spec=matmul_spec(), target=TARGET).metadata.built_by == "test-worker"
                    break
                except NotFound:
                    time.sleep(0.1)
            else:
                pytest.fail("the build did not finish after its caller gave up")
    finally:
        stop()


def test_stats_count_per_target(stack: Stack) -> None:
    with stack.client() as client:
        client.compile(matmul_spec(), TARGET)
        for _ in range(3):
            client.compile(matmul_spec(), TARGET)
        rows = {r.target_id: r for r in client.admin.stats()}
    row = rows[TARGET.id]
    assert (row.hits, row.misses, row.compiles, row.failures) == (3, 1, 1, 0)
    assert row.hit_rate == pytest.approx(0.75) and row.live_workers == 1
    assert rows[TARGET.generic().id].live_workers == 1


def test_many_clients_many_specs_no_mixups(stack: Stack) -> None:
    specs = [matmul_spec(m=16 * (i + 1)) for i in range(8)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with stack.client() as client:
                plan = client.compile(specs[i % len(specs)], TARGET)
                assert plan.metadata.spec_hash == specs[i % len(specs)].spec_hash()
        except BaseException as e:  # collected for the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(stack.compiler.builds) == sorted(s.spec_hash() for s in specs)


def test_memory_cache_serves_verified_plans_without_redis(stack: Stack, redis_server: object) -> None:
    with stack.client() as client:
        plan = client.compile(matmul_spec(), TARGET)
        # The build's completion event drops the gateway's copy (a provisional plan may have been replaced): arriving
        # after the corruption below, it left only the corrupt copy to read (CI once, -n 4 on two cores). Let it
        # arrive, and read the plan into the gateway's memory again, before corrupting Redis's copy.
        time.sleep(1.0)
        assert client.get(plan.key).blob == plan.blob
        # Corrupt the Redis copy: the gateway keeps serving the copy it verified.
        stack.redis.hset(keys.plan(plan.key), "blob", b"X" + plan.blob[1:])
        assert client.get(plan.key).blob == plan.blob
        assert client.compile(matmul_spec(), TARGET).source == "hit"


def test_memory_cache_forgets_deleted_plans_after_its_ttl(redis_server: object, redis_client: object) -> None:
    from tests.support.standin import StandInCompiler

    # A TTL long enough that the first get falls within it on a loaded machine (0.3 s failed once: the suite at
    # -n 4 on two cores).
    s, stop = start_stack(redis_server.url, StandInCompiler(), memory_cache_ttl_s=2.0)  # type: ignore[attr-defined]
    try:
        with s.client() as client:
            plan = client.compile(matmul_spec(), TARGET)
            # The build's completion event drops the gateway's copy (so that a replacement is read): arriving after
            # the delete below, under load, it left nothing to serve within the TTL (CI once). Let it arrive, and
            # read the plan into the cache again, before deleting it from Redis.
            time.sleep(1.0)
            assert client.get(plan.key).blob == plan.blob
            s.redis.delete(keys.plan(plan.key))
            assert client.get(plan.key).blob == plan.blob  # within the TTL
            time.sleep(2.1)
            with pytest.raises(NotFound):
                client.get(plan.key)
    finally:
        stop()


def test_stats_windows_bytes_seconds_saved_and_op_families(slow_stack: Stack) -> None:
    stack = slow_stack  # 1 s stand-in builds: every hit saves 1 s
    with stack.client() as client:
        plan = client.compile(matmul_spec(), TARGET)
        client.compile(matmul_spec(), TARGET)
        client.get(plan.key)
        client.compile(matmul_bias_relu_spec(), TARGET)
        (row,) = [r for r in client.admin.stats() if r.target_id == TARGET.id]
        families = client.admin.family_stats()
    # two hits (a Compile and a GetPlan), two misses
    assert (row.hits, row.misses) == (2, 2)
    assert row.bytes_served == 2 * len(plan.blob)
    assert plan.metadata.build_seconds == 1.0 and row.build_seconds_saved == pytest.approx(2.0)
    assert set(row.windows) == {"5m", "1h", "24h", "total"}
    for window in ("5m", "1h", "24h", "total"):
        assert (row.windows[window].hits, row.windows[window].misses) == (2, 2)
    # GetPlan by key carries no spec: its hit counts under the family the plan recorded.
    assert families["matmul"]["total"].hits == 2 and families["matmul"]["total"].misses == 2

"""Trust against anyone who can write to Redis, and against hostile callers:
each attack of issue 11 run against a real redis-server and real servers.
docs/reliability.md lists them with what happened before and now."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from plancache import Client, CompileOptions, Manifest, ManifestEntry, NotFound, UntrustedPlan
from plancache.graphspec import spec_io
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.validation import normalize
from plancache.keys.plankey import make_key
from plancache.keys.target import Target
from plancache.trust.signing import Signer, generate_keypair
from plancache.v1 import plancache_pb2 as pb
from plancache_server import telemetry
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from plancache_server.store.jobs import Job
from plancache_server.web.status import status_of
from tests.conftest import Stack, start_stack
from tests.support.processes import child_env, server_process, wait_for_workers
from tests.support.specs import matmul_bias_relu_spec, matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "keys")


@pytest.fixture
def signed_stack(redis_server: EmbeddedRedis, redis_client: redis.Redis, keypair: tuple[Path, Path]) -> Iterator[Stack]:
    """Signing worker; the gateway checks signatures; memory cache off (every read is Redis')."""
    private, public = keypair
    s, stop = start_stack(
        redis_server.url,
        StandInCompiler(),
        signer=Signer.from_file(private),
        trusted_keys=(public,),
        memory_cache_bytes=0,
    )
    yield s
    stop()


def strict(stack: Stack, public: Path, **kwargs: Any) -> Client:
    return stack.client(trusted_keys=[public], allow_unsigned=False, **kwargs)


def query_of(spec: Any, target: Target = TARGET) -> pb.PlanQuery:
    return pb.PlanQuery(
        spec=spec_io.to_proto(normalize(spec)), target=target.to_proto(), options=CompileOptions().to_proto()
    )


def key_of(spec: Any, target: Target = TARGET) -> str:
    return make_key(hash_normalized(normalize(spec)), target, CompileOptions())


# ---- 1. forged jobs -------------------------------------------------------------


def test_a_forged_job_is_refused_and_the_victim_gets_its_own_graph(
    signed_stack: Stack, keypair: tuple[Path, Path], redis_client: redis.Redis
) -> None:
    victim, other = matmul_spec(m=64), matmul_bias_relu_spec()
    sm80 = Target("sm_80", TARGET.cudnn_version, TARGET.frontend_version)
    stream = keys.job_stream(TARGET)
    forged = [
        Job("forged-1", key_of(victim), query_of(other)),  # the victim's key over another graph
        Job("forged-2", key_of(other, sm80), query_of(other, sm80)),  # a consistent key for a GPU this worker is not
    ]
    for job in forged:
        redis_client.xadd(stream, job.encode())  # type: ignore[arg-type]
    wait_until(lambda: redis_client.xlen(stream) == 0, 10, "the forged job was not taken and acknowledged")
    assert not redis_client.exists(keys.plan(key_of(victim))) and not redis_client.exists(
        keys.plan(key_of(other, sm80))
    )
    reasons = [r.decode() for r in redis_client.lrange(keys.RECENT_FAILURES, 0, -1)]
    assert any("refused job forged-1" in r and "but its spec, target and options make plan" in r for r in reasons), (
        reasons
    )
    assert any("refused job forged-2" in r and "which this worker does not build" in r for r in reasons), reasons
    with strict(signed_stack, keypair[1]) as client:
        plan = client.compile(victim, TARGET)
    assert plan.source == "compiled" and plan.metadata.spec_hash == victim.spec_hash()
    assert signed_stack.compiler.builds == [victim.spec_hash()]  # the forged graph was never built


# ---- 2. a rogue server ------------------------------------------------------------


class RogueServer:
    """Answers every GetPlan, Compile and Prefetch with one validly signed plan."""

    def __init__(self, plan: pb.Plan) -> None:
        def get_plan(request: bytes, context: Any) -> bytes:
            return pb.GetPlanResponse(plan=plan).SerializeToString()

        def compile_(request: bytes, context: Any) -> bytes:
            return pb.CompileResponse(plan=plan, source=pb.COMPILE_SOURCE_HIT).SerializeToString()

        def prefetch(request: bytes, context: Any) -> Iterator[bytes]:
            refs = pb.PrefetchRequest.FromString(request).refs
            for i, ref in enumerate(refs):
                yield pb.PrefetchItem(index=i, key=ref.key, plan=plan, source=pb.COMPILE_SOURCE_HIT).SerializeToString()

        raw = {"request_deserializer": lambda b: b, "response_serializer": lambda b: b}
        handlers = {
            "GetPlan": grpc.unary_unary_rpc_method_handler(get_plan, **raw),
            "Compile": grpc.unary_unary_rpc_method_handler(compile_, **raw),
            "Prefetch": grpc.unary_stream_rpc_method_handler(prefetch, **raw),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("plancache.v1.PlanCache", handlers)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_a_rogue_server_cannot_substitute_a_signed_plan(
    signed_stack: Stack, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    from plancache import DiskCache

    asked, substitute = matmul_spec(m=96), matmul_spec(m=112)
    with strict(signed_stack, keypair[1]) as client:
        plan_b = client.compile(substitute, TARGET)
    rogue = RogueServer(pb.Plan(metadata=plan_b.metadata, blob=plan_b.blob, signature=plan_b.signature))
    cache = DiskCache(tmp_path / "node-cache")
    try:
        with Client(f"127.0.0.1:{rogue.port}", cache=cache, trusted_keys=[keypair[1]], allow_unsigned=False) as node:
            with pytest.raises(
                UntrustedPlan, match=f"asked for plan {key_of(asked)} but was answered with plan {plan_b.key}"
            ):
                node.get(key_of(asked))
            with pytest.raises(UntrustedPlan, match="asked for plan"):
                node.compile(asked, TARGET)
            result = node.prefetch(Manifest(entries=[ManifestEntry(key=key_of(asked))]))
            assert isinstance(result.errors[0], UntrustedPlan) and not result.plans
            assert node.get(plan_b.key).blob == plan_b.blob  # the plan itself is fine when it is the one asked for
        assert cache.get(key_of(asked)) is None  # nothing substituted reached the node's cache
    finally:
        rogue.server.stop(None)


# ---- 4. a damaged signature ---------------------------------------------------------


def test_a_damaged_signature_reads_as_a_miss_and_is_rebuilt(
    signed_stack: Stack, keypair: tuple[Path, Path], redis_client: redis.Redis
) -> None:
    spec = matmul_spec(m=120)
    with strict(signed_stack, keypair[1]) as client:
        plan = client.compile(spec, TARGET)
        sig = bytearray(redis_client.hget(keys.plan(plan.key), "sig") or b"")
        sig[-1] ^= 0x01  # one flipped bit: AOF damage, or a forger
        redis_client.hset(keys.plan(plan.key), "sig", bytes(sig))
        refused_before = telemetry.child(telemetry.PLANS_REFUSED, "signature")._value.get()
        with pytest.raises(NotFound):
            client.get(plan.key)  # not served: a miss
        assert telemetry.child(telemetry.PLANS_REFUSED, "signature")._value.get() == refused_before + 1
        again = client.compile(spec, TARGET)  # rebuilt, not "joined" forever
    assert again.source == "compiled" and again.blob == plan.blob
    assert signed_stack.compiler.builds.count(spec.spec_hash()) == 2


# ---- 3. a tensor bomb ---------------------------------------------------------------


def _bomb(tensors: int) -> bytes:
    """A GraphSpec of `tensors` one-line tensors, as wire bytes (built without protobuf)."""
    one = pb.TensorSpec(uid=1, dim=[1, 2, 3]).SerializeToString()
    return (b"\x22" + bytes([len(one)]) + one) * tensors


def _len_field(number: int, payload: bytes) -> bytes:
    from google.protobuf.internal.encoder import _VarintBytes

    return _VarintBytes(number << 3 | 2) + _VarintBytes(len(payload)) + payload


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError


def test_a_tensor_bomb_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    try:
        address = f"127.0.0.1:{free_port()}"
        with server_process(address, redis_server.url, tmp_path / "server.log", "--gpus", "none") as server:
            options = [("grpc.max_send_message_length", 128 * 2**20)]
            with grpc.insecure_channel(address, options=options) as channel:
                compile_call = channel.unary_unary(
                    "/plancache.v1.PlanCache/Compile", request_serializer=lambda b: b, response_deserializer=lambda b: b
                )
                prefetch_call = channel.unary_stream(
                    "/plancache.v1.PlanCache/Prefetch",
                    request_serializer=lambda b: b,
                    response_deserializer=lambda b: b,
                )
                before = rss(server.pid)
                outcomes = {}
                for name, call, payload in (
                    # 60 MiB, 7 million tensors: the bomb (3.3 GiB and 59 s before)
                    ("compile 60 MiB", compile_call, _len_field(1, _bomb(7_000_000))),
                    # 15 MiB (under gRPC's bound): one Prefetch ref whose spec holds 1.7 million tensors
                    ("prefetch 15 MiB", prefetch_call, _len_field(1, _len_field(2, _len_field(1, _bomb(1_700_000))))),
                ):
                    started = time.perf_counter()
                    with pytest.raises(grpc.RpcError) as info:
                        response = call(payload, timeout=30)
                        if not isinstance(response, bytes):
                            list(response)  # a stream fails on reading
                    outcomes[name] = (info.value.code(), info.value.details(), time.perf_counter() - started)
                grown = rss(server.pid) - before
                assert pb_stats(channel)
        print(
            f"\ntensor bombs: { ({k: (c.name, f'{t:.2f} s') for k, (c, _, t) in outcomes.items()}) }; server RSS +{grown / 2**20:.0f} MiB"
        )
        assert outcomes["compile 60 MiB"][0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (
            outcomes["prefetch 15 MiB"][0] == grpc.StatusCode.INVALID_ARGUMENT
            and "more than 1024 tensors" in outcomes["prefetch 15 MiB"][1]
        )
        # Refused before parsing (59 s of CPU when parsed): the 60 MiB transfer is what is left, about a second on
        # the loaded 2-core CI machine (1.05 s seen).
        assert all(t < 2.0 for _, _, t in outcomes.values()), outcomes
        assert grown < 200 * 2**20
    finally:
        redis_server.stop()


def pb_stats(channel: grpc.Channel) -> bool:
    """The server still answers."""
    from plancache.v1 import plancache_pb2_grpc as pb_grpc

    return pb_grpc.PlanCacheStub(channel).GetStats(pb.GetStatsRequest(), timeout=10) is not None


# ---- 5. slow recovery --------------------------------------------------------------


def test_a_redis_blip_as_a_build_finishes_loses_nothing(tmp_path: Path) -> None:
    """Redis goes away just before the worker stores a finished plan and is
    back 1.5 s later: the plan is stored then, and its caller has it."""
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=True).start()
    port = redis_server.port
    s, stop = start_stack(redis_server.url, StandInCompiler(build_seconds=2.0))
    try:
        with s.client(timeout=60) as client, futures.ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            call = pool.submit(client.compile, matmul_spec(m=136), TARGET)
            time.sleep(1.5)
            redis_server.kill()
            time.sleep(1.5)  # the build ends meanwhile: storing it fails, and is retried
            redis_server = EmbeddedRedis(tmp_path / "redis", persist=True, port=port).start()
            plan = call.result(timeout=60)
            elapsed = time.monotonic() - started
    finally:
        stop()
        redis_server.stop()
    print(f"\nRedis down from 1.5 s to 3 s of a 2 s build: the caller had its plan after {elapsed:.1f} s")
    assert plan.source == "compiled" and elapsed < 10


def test_a_killed_workers_job_is_taken_over_when_its_heartbeat_expires(tmp_path: Path) -> None:
    """Default --claim-idle (60 s): the job moves as soon as the dead worker's
    heartbeat expires (--heartbeat-ttl 3 s), not after a minute."""
    from tests.integration.test_fleet import Fleet, _kill_worker_building, _running_worker

    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    spec = matmul_spec(m=144)
    try:
        with ExitStack() as stack:
            fleet = Fleet(
                stack, redis_server.url, tmp_path, 1, 2, 3.0, "--heartbeat-interval", "0.5", "--heartbeat-ttl", "3"
            )
            client = stack.enter_context(Client(fleet.addresses[0], cache=False, timeout=120))
            with futures.ThreadPoolExecutor(1) as pool:
                call = pool.submit(client.compile, spec, TARGET)
                victim = _running_worker(redis.Redis.from_url(redis_server.url), key_of(spec))
                time.sleep(0.5)
                _kill_worker_building(fleet, victim)
                killed = time.monotonic()
                plan = call.result(timeout=120)
                after_kill = time.monotonic() - killed
    finally:
        redis_server.stop()
    print(
        f"\nworker killed mid-build (3 s builds, 3 s heartbeat ttl, 60 s claim idle): its callers had the plan {after_kill:.1f} s later"
    )
    assert plan.metadata.built_by != victim
    assert after_kill < 3 + 3 + 1.5, f"{after_kill:.1f} s: the job waited past heartbeat-ttl + build time"


# ---- 6. small leaks -----------------------------------------------------------------


def test_the_redis_password_is_not_on_the_workers_command_line(tmp_path: Path) -> None:
    password = "s3cret-" + "x" * 20
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False, password=password).start()
    url = f"redis://:{password}@127.0.0.1:{redis_server.port}/0"
    try:
        address = f"127.0.0.1:{free_port()}"
        env = child_env(PLANCACHE_REDIS_URL=url)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "plancache_server.main",
                "--listen",
                address,
                "--gpus",
                "0",
                "--compiler",
                "tests.support.standin:factory",
                "--unsigned",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_workers(address, proc=proc)
            with Client(address, cache=False) as client:
                assert client.compile(matmul_spec(m=152), TARGET).source == "compiled"
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            assert children, "the server started its worker"
            for pid in [proc.pid, *map(int, children)]:
                assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), (
                    f"the password is in the argv of {pid}"
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    finally:
        redis_server.stop()


def test_a_bad_member_of_the_top_entries_does_not_break_the_status_page(
    stack: Stack, redis_client: redis.Redis
) -> None:
    with stack.client() as client:
        plan = client.compile(matmul_spec(m=160), TARGET)
        client.get(plan.key)
    redis_client.zadd(keys.TOP_HITS, {"not a plan key": 1e9})
    report = stack.gateway.run(status_of(stack.gateway.front).report())
    assert [e.plan_key for e in report.top_by_hits] == [plan.key]


def test_error_messages_are_bounded_and_do_not_echo_whole_inputs(stack: Stack) -> None:
    name = "n" * 60_000
    g = matmul_spec(m=168)
    g.tensors[0].name = name
    request = pb.CompileRequest(spec=spec_io.to_proto(g), target=TARGET.to_proto()).SerializeToString()
    with grpc.insecure_channel(stack.address) as channel:
        call = channel.unary_unary(
            "/plancache.v1.PlanCache/Compile", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=10)
        details = info.value.details() or ""
        trailers = sum(len(v) for _, v in info.value.trailing_metadata() or ())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "name longer than 256 characters" in details
    assert len(details) <= 4200 and trailers <= 8192


def test_an_unknown_callers_request_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """Issue 44, item 5: a caller with no token (or a wrong one) is refused from the call's metadata, before
    its request is read: ten 15 MiB requests (under gRPC's receive bound) and five of 60 MiB grow the
    gateway's RSS by at most a few MB (read whole first, ten 15 MiB requests grew it by ~170 MB), and
    each is answered UNAUTHENTICATED naming what is missing, or PERMISSION_DENIED for a token of a lesser role."""
    import secrets

    read_token, redis_server = secrets.token_hex(16), EmbeddedRedis(tmp_path / "redis", persist=False).start()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"read {read_token}\n")
    tokens.chmod(0o600)
    try:
        address = f"127.0.0.1:{free_port()}"
        with server_process(
            address,
            redis_server.url,
            tmp_path / "server.log",
            "--gpus",
            "none",
            "--tokens-file",
            str(tokens),
            token=read_token,
        ) as server:
            options = [("grpc.max_send_message_length", 128 * 2**20)]
            with grpc.insecure_channel(address, options=options) as channel:
                compile_call = channel.unary_unary(
                    "/plancache.v1.PlanCache/Compile", request_serializer=lambda b: b, response_deserializer=lambda b: b
                )
                time.sleep(0.5)
                before = rss(server.pid)
                answers = []
                for size_mb, metadata in ((15, ()), (15, (("authorization", "Bearer wrong"),)), (60, ())):
                    payload = b"\x0a" + b"\x80\x80\x80\x1e" + b"x" * (size_mb * 2**20 - 5)
                    for _ in range(5):
                        with pytest.raises(grpc.RpcError) as info:
                            compile_call(payload, metadata=metadata, timeout=30)
                        answers.append((info.value.code(), info.value.details()))
                time.sleep(1.0)
                grown = rss(server.pid) - before
                with pytest.raises(grpc.RpcError) as denied:  # a known token whose role may not compile
                    compile_call(b"", metadata=(("authorization", f"Bearer {read_token}"),), timeout=10)
        assert {code for code, _ in answers} == {grpc.StatusCode.UNAUTHENTICATED}
        assert "requires a bearer token" in answers[0][1]
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED and "needs a compile token" in (
            denied.value.details() or ""
        )
        assert grown < 8 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB"
    finally:
        redis_server.stop()

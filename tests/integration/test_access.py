"""Transport and access: TLS, mutual TLS, bearer tokens by role, Invalidate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from plancache import Client, NotFound, PermissionDenied, TLSConfig, Unauthenticated, Unavailable
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack
from tests.support.certs import make_pki
from tests.support.specs import matmul_bias_relu_spec, matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler

TOKENS = {"read": "r" * 20, "compile": "c" * 20, "admin": "a" * 20}


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text("# role token\n" + "".join(f"{role} {token}\n" for role, token in TOKENS.items()))
    return path


@pytest.fixture
def guarded_stack(redis_server: EmbeddedRedis, redis_client: object, tokens_file: Path) -> Iterator[Stack]:
    s, stop = start_stack(redis_server.url, StandInCompiler(), tokens_file=tokens_file, memory_cache_bytes=0)
    yield s
    stop()


def test_tokens_and_roles(guarded_stack: Stack) -> None:
    with guarded_stack.client() as anonymous, pytest.raises(Unauthenticated, match="requires a bearer token"):
        anonymous.compile(matmul_spec(), TARGET)
    with guarded_stack.client(token="x" * 20) as stranger, pytest.raises(Unauthenticated, match="unknown bearer token"):
        stranger.admin.stats()
    with guarded_stack.client(token=TOKENS["compile"]) as app:
        plan = app.compile(matmul_spec(), TARGET)
    with guarded_stack.client(token=TOKENS["read"]) as reader:
        assert reader.get(plan.key).blob == plan.blob and reader.admin.stats() and reader.admin.list_targets()
        with pytest.raises(PermissionDenied, match="Compile needs a compile token; this token's role is read"):
            reader.compile(matmul_bias_relu_spec(), TARGET)
        from plancache import Manifest

        fetched = reader.prefetch(Manifest.from_specs([matmul_spec()], TARGET))
        assert fetched.fetched == 1
        refused = reader.prefetch(Manifest.from_specs([matmul_bias_relu_spec()], TARGET), compile_missing=True)
        assert isinstance(refused.errors[0], PermissionDenied)
        with pytest.raises(PermissionDenied, match="Invalidate needs a admin token"):
            reader.admin.invalidate(plan.key)
    with guarded_stack.client(token=TOKENS["admin"]) as operator:
        assert operator.admin.invalidate(plan.key) == 1
        with pytest.raises(NotFound):
            operator.get(plan.key)


def test_invalidate_by_spec_and_by_target(stack: Stack) -> None:
    with stack.client() as client:
        tuned = client.compile(matmul_spec(), TARGET)
        client.compile(matmul_spec(), TARGET.generic())
        client.compile(matmul_bias_relu_spec(), TARGET)
        assert client.admin.invalidate(spec_hash=tuned.metadata.spec_hash) == 2
        with pytest.raises(NotFound):
            client.get(tuned.key)
        assert client.get(spec=matmul_bias_relu_spec(), target=TARGET) is not None
        assert client.admin.invalidate(target=TARGET) == 1
        with pytest.raises(NotFound):
            client.get(spec=matmul_bias_relu_spec(), target=TARGET)
        assert client.compile(matmul_spec(), TARGET).source == "compiled"  # rebuilt on demand


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    return make_pki(tmp_path)


def test_tls_and_mutual_tls(redis_server: EmbeddedRedis, redis_client: object, pki: dict[str, Path]) -> None:
    s, stop = start_stack(redis_server.url, StandInCompiler(), tls_cert=pki["server_cert"], tls_key=pki["server_key"])
    try:
        with Client(s.address, cache=False, tls=TLSConfig(ca=pki["ca"])) as secure:
            assert secure.compile(matmul_spec(), TARGET).source == "compiled"
        with Client(s.address, cache=False, timeout=3) as plaintext, pytest.raises(Unavailable):
            plaintext.admin.stats()
    finally:
        stop()
    s, stop = start_stack(
        redis_server.url, StandInCompiler(), tls_cert=pki["server_cert"], tls_key=pki["server_key"], tls_ca=pki["ca"]
    )
    try:
        with Client(
            s.address, cache=False, tls=TLSConfig(ca=pki["ca"], cert=pki["client_cert"], key=pki["client_key"])
        ) as mutual:
            assert mutual.compile(matmul_spec(), TARGET).source == "hit"
        with (
            Client(s.address, cache=False, timeout=3, tls=TLSConfig(ca=pki["ca"])) as no_cert,
            pytest.raises(Unavailable),
        ):
            no_cert.admin.stats()
    finally:
        stop()


def test_raw_stub_without_token_gets_unauthenticated_code(guarded_stack: Stack) -> None:
    with grpc.insecure_channel(guarded_stack.address) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.PlanCacheStub(channel).GetStats(pb.GetStatsRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_caller_without_a_valid_token_never_gets_its_body_parsed(guarded_stack: Stack) -> None:
    """Garbage from an anonymous or unknown caller is refused as unauthenticated,
    not reported as malformed: the token is checked before the body is read."""
    garbage = b"\xff" * 4096
    for metadata in ((), (("authorization", "Bearer " + "x" * 20),)):
        with grpc.insecure_channel(guarded_stack.address) as channel:
            call = channel.unary_unary(
                "/plancache.v1.PlanCache/Compile", request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            with pytest.raises(grpc.RpcError) as info:
                call(garbage, timeout=5, metadata=metadata)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value.details()
    with grpc.insecure_channel(
        guarded_stack.address
    ) as channel:  # with a valid token the same bytes are read, and refused as malformed
        call = channel.unary_unary(
            "/plancache.v1.PlanCache/Compile", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as info:
            call(
                garbage, timeout=5, metadata=(("authorization", "bearer " + TOKENS["compile"]),)
            )  # the scheme is case-insensitive
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed Compile request" in (
        info.value.details() or ""
    )


def test_drain_a_worker(stack: Stack) -> None:
    import time

    from plancache import TargetUnavailable

    with stack.client() as operator:
        assert operator.admin.drain_worker("no-such-worker") is False
        assert operator.admin.drain_worker("test-worker") is True
        deadline = time.monotonic() + 5
        while any(t.live_workers for t in operator.admin.list_targets()):
            assert time.monotonic() < deadline, "the worker did not leave"
            time.sleep(0.1)
        with pytest.raises(TargetUnavailable):
            operator.compile(matmul_spec(), TARGET)


def test_explain_says_which_part_of_the_key_differs(stack: Stack) -> None:
    from plancache import CompileOptions, Target

    with stack.client() as client:
        never = client.admin.explain(matmul_bias_relu_spec(), TARGET)
        assert not never.stored and not never.variants and "no plan of this spec" in never.summary
        client.compile(matmul_spec(), TARGET)
        client.compile(matmul_spec(), TARGET, CompileOptions(autotune=False))
        hit = client.admin.explain(matmul_spec(), TARGET)
        assert hit.stored and "hits" in hit.summary and len(hit.variants) == 1
        assert hit.variants[0].differences[0].startswith("options: stored opt-")
        newer = Target(TARGET.compute_capability, 92000, "1.33.0", TARGET.device_name, TARGET.sm_count)
        miss = client.admin.explain(matmul_spec(), newer)
        assert not miss.stored and len(miss.variants) == 2
        assert any("cuDNN version: stored 91900, asked 92000" in d for v in miss.variants for d in v.differences)
        assert any("frontend version: stored 1.32.0, asked 1.33.0" in d for v in miss.variants for d in v.differences)


def test_list_plans_is_an_admin_call_and_refuses_a_malformed_target(guarded_stack: Stack) -> None:
    import grpc

    from plancache import InvalidRequest
    from plancache.v1 import plancache_pb2 as pb

    with guarded_stack.client(token=TOKENS["compile"]) as app:
        key = app.compile(matmul_spec(), TARGET).key
        with pytest.raises(PermissionDenied, match=r"ListPlans needs a.* admin token"):
            app.admin.list_plans()
    with guarded_stack.client(token=TOKENS["admin"]) as operator:
        assert operator.admin.list_plans() == [key] and operator.admin.list_plans(TARGET) == [key]
        with pytest.raises(InvalidRequest, match="is not like"):
            operator.admin.list_plans("sm_90")  # a prefix is not a target id
    # A malformed target id sent raw (the client would refuse it first): INVALID_ARGUMENT with the reason.
    with grpc.insecure_channel(guarded_stack.address) as channel:
        call = channel.unary_unary(
            "/plancache.v1.PlanCache/ListPlans",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(
                pb.ListPlansRequest(target_id="*/../*" * 50),
                timeout=5,
                metadata=(("authorization", "Bearer " + TOKENS["admin"]),),
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "is not like" in (refused.value.details() or "")

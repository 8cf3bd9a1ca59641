"""The gRPC surface under malformed, truncated, oversized and wrong-type
messages: every answer is a status with a message (never a bare INTERNAL),
and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plancache.graphspec import spec_io
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack
from tests.support.processes import REPO
from tests.support.specs import matmul_bias_relu_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler

METHODS = ["Compile", "GetPlan", "GetStats", "ListTargets", "Invalidate", "Explain", "DrainWorker"]
VALID = pb.CompileRequest(spec=spec_io.to_proto(matmul_bias_relu_spec()), target=TARGET.to_proto()).SerializeToString()


@pytest.fixture(scope="module")
def hostile_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    redis_server = EmbeddedRedis(tmp_path_factory.mktemp("hostile-redis"), persist=False).start()
    s, stop = start_stack(redis_server.url, StandInCompiler(), max_message_bytes=256 * 1024, compile_timeout_s=5)
    yield s
    stop()
    redis_server.stop()


def _raw_call(channel: grpc.Channel, method: str, payload: bytes) -> grpc.StatusCode:
    call = channel.unary_unary(
        f"/plancache.v1.PlanCache/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    try:
        call(payload, timeout=10)
    except grpc.RpcError as e:
        code = e.code()
        assert code != grpc.StatusCode.UNKNOWN, e.details()
        assert code != grpc.StatusCode.INTERNAL or "incident" in (e.details() or ""), e.details()
        assert e.details(), f"{method}: {code} without a message"
        return code  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _still_serving(channel: grpc.Channel) -> None:
    assert _raw_call(channel, "GetStats", b"") == grpc.StatusCode.OK


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(METHODS), payload=st.binary(max_size=2000))
def test_random_bytes(hostile_stack: Stack, method: str, payload: bytes) -> None:
    with grpc.insecure_channel(hostile_stack.address) as channel:
        _raw_call(channel, method, payload)
        _still_serving(channel)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(VALID) - 1), flip=st.integers(0, len(VALID) - 1))
def test_truncated_and_bit_flipped_requests(hostile_stack: Stack, cut: int, flip: int) -> None:
    damaged = bytearray(VALID)
    damaged[flip] ^= 0x5A
    with grpc.insecure_channel(hostile_stack.address) as channel:
        for payload in (VALID[:cut], bytes(damaged)):
            assert _raw_call(channel, "Compile", payload) in {
                grpc.StatusCode.OK,
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            }
        _still_serving(channel)


def test_wrong_message_types(hostile_stack: Stack) -> None:
    others = [
        pb.GetPlanRequest(ref=pb.PlanRef(key="x" * 40)),
        pb.InvalidateRequest(target_id="sm_90/cudnn-1/fe-1.0.0"),
        pb.PrefetchRequest(),
    ]
    with grpc.insecure_channel(hostile_stack.address) as channel:
        for method in METHODS:
            for message in others:
                _raw_call(channel, method, message.SerializeToString())
        _still_serving(channel)


def test_oversized_messages_are_resource_exhausted(hostile_stack: Stack) -> None:
    options = [("grpc.max_send_message_length", 64 * 2**20)]
    with grpc.insecure_channel(hostile_stack.address, options=options) as channel:
        assert (
            _raw_call(channel, "Compile", b"\x0a" + b"\xff" * (5 * 2**20)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        )  # over 4 MiB: not parsed
        assert (
            _raw_call(channel, "GetPlan", b"\x0a" + b"\xff" * (100 * 1024)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        )  # over 64 KiB
        assert (
            _raw_call(channel, "Prefetch", b"\x0a" + b"\xff" * (20 * 2**20)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        )  # over gRPC's bound: not read
        _still_serving(channel)


def test_specs_over_the_limits_name_the_limit(hostile_stack: Stack) -> None:
    from plancache import GraphSpec

    g = GraphSpec(io_data_type="half")
    x = g.tensor([4, 8], name="x")
    for _ in range(600):
        x = g.relu(x)
    x.set_output(True)
    with grpc.insecure_channel(hostile_stack.address) as channel:
        call = channel.unary_unary(
            "/plancache.v1.PlanCache/Compile",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as info:
            call(pb.CompileRequest(spec=spec_io.to_proto(g), target=TARGET.to_proto()), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "graph: 600 nodes, over the limit of 512" in (
        info.value.details() or ""
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=2000))
def test_random_bytes_to_the_streaming_prefetch(hostile_stack: Stack, payload: bytes) -> None:
    with grpc.insecure_channel(hostile_stack.address) as channel:
        call = channel.unary_stream(
            "/plancache.v1.PlanCache/Prefetch", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            for _ in call(payload, timeout=10):
                pass
        except grpc.RpcError as e:
            assert e.code() in {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}, (
                e.code(),
                e.details(),
            )
            assert e.details()
        _still_serving(channel)


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        ("tensor", "spec.tensors[1]: unknown field number(s) 99 in TensorSpec"),
        ("attribute", "unknown field number(s) 99 in AttributeValue"),
        ("target", "target: unknown field number(s) 99 in Target"),
        ("options", "options: unknown field number(s) 99 in CompileOptions"),
    ],
)
def test_a_newer_clients_unknown_field_is_refused_not_dropped(hostile_stack: Stack, part: str, expected: str) -> None:
    """Field 99 stands for a field a newer client sets: dropping it would build
    (and key) the plan without it."""
    extra = b"\x98\x06\x01"  # field 99, varint 1
    request = pb.CompileRequest(
        spec=spec_io.to_proto(matmul_bias_relu_spec()), target=TARGET.to_proto(), options=pb.CompileOptions()
    )
    if part == "tensor":
        request.spec.tensors[1].MergeFromString(extra)
    elif part == "attribute":
        sdpa = spec_io.from_json((REPO / "examples" / "sdpa_causal_fp16.json").read_text())
        request.spec.CopyFrom(spec_io.to_proto(sdpa))
        node = next(n for n in request.spec.nodes if n.attributes)
        node.attributes[sorted(node.attributes)[0]].MergeFromString(extra)
    elif part == "target":
        request.target.MergeFromString(extra)
    else:
        request.options.MergeFromString(extra)
    with grpc.insecure_channel(hostile_stack.address) as channel:
        call = channel.unary_unary(
            "/plancache.v1.PlanCache/Compile",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (refused.value.details() or "")


@pytest.mark.parametrize(
    ("ragged_offset_uid", "expected"),
    [
        (99999, "ragged_offset_uid 99999 names no tensor of this graph"),
        (-5, "ragged_offset_uid -5 names no tensor of this graph"),
        (2**62, f"ragged_offset_uid {2**62} names no tensor of this graph"),
        ("self", "must be a GPU tensor the caller binds, not a node's result, a scalar or ragged itself"),
        ("o", "must be a GPU tensor the caller binds, not a node's result"),
    ],
)
def test_hostile_ragged_offsets_are_invalid_argument_naming_the_tensor(
    hostile_stack: Stack, ragged_offset_uid: int | str, expected: str
) -> None:
    """A ragged offset pointing nowhere, at the tensor itself or at a node's
    result is refused before any work, and the server keeps serving."""
    request = pb.CompileRequest(
        spec=spec_io.to_proto(spec_io.from_json((REPO / "examples" / "sdpa_ragged_prefill_bf16.json").read_text())),
        target=TARGET.to_proto(),
    )
    q = next(t for t in request.spec.tensors if t.name == "q")
    o = next(t for t in request.spec.tensors if t.name == "o")
    q.ragged_offset_uid = (
        q.uid if ragged_offset_uid == "self" else o.uid if ragged_offset_uid == "o" else int(ragged_offset_uid)
    )
    with grpc.insecure_channel(hostile_stack.address) as channel:
        call = channel.unary_unary(
            "/plancache.v1.PlanCache/Compile",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=10)
        _still_serving(channel)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (refused.value.details() or ""), refused.value.details()
    assert "tensor 'q' (uid 11)" in (refused.value.details() or "")

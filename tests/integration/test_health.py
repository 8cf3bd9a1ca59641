"""Standard gRPC health checking and server reflection, for generic tools."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack


def _status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        return (
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        )  # type: ignore[no-any-return]


def test_reflection_lists_the_service_and_health_is_open_to_all(
    redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("admin " + "a" * 20 + "\n")
    stack, stop = start_stack(redis_server.url, None, tokens_file=tokens)
    try:
        assert _status(stack.address) == health_pb2.HealthCheckResponse.SERVING  # no token needed
        assert _status(stack.address, "plancache.v1.PlanCache") == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(stack.address) as channel:
            services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
            assert {"plancache.v1.PlanCache", "grpc.health.v1.Health"} <= services
            method = ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol("plancache.v1.PlanCache")
            assert "Compile" in str(method)
    finally:
        stop()


def test_health_follows_redis(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    stack: Stack
    stack, stop = start_stack(redis_server.url, None)
    try:
        assert _status(stack.address) == health_pb2.HealthCheckResponse.SERVING
        redis_server.kill()
        deadline = time.monotonic() + 10
        while _status(stack.address) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "health did not notice Redis going away"
            time.sleep(0.2)
    finally:
        stop()


def test_list_watch_and_reflection_v1(redis_server: EmbeddedRedis, redis_client: object) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    stack, stop = start_stack(redis_server.url, None)
    try:
        with grpc.insecure_channel(stack.address) as channel:
            listed = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=5)
            assert {name: s.status for name, s in listed.statuses.items()} == {
                "": health_pb2.HealthCheckResponse.SERVING,
                "plancache.v1.PlanCache": health_pb2.HealthCheckResponse.SERVING,
            }
            # Watch: the status once, then only changes (the reporter checks Redis every 2 s).
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=5.5)
            seen = []
            try:
                for message in watch:
                    seen.append(message.status)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert seen == [health_pb2.HealthCheckResponse.SERVING]
            # Reflection v1 (what grpcurl asks first), with the v1alpha messages: same fields.
            call = channel.stream_stream(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
            )
            (answer,) = list(call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
            services = {s.name for s in answer.list_services_response.service}
            assert {
                "plancache.v1.PlanCache",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            } <= services
    finally:
        stop()

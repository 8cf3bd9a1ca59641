"""Standard gRPC health checking and server reflection, for generic tools."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from plancache_server.embedded_redis import EmbeddedRedis
from tests.conftest import Stack, start_stack


def _status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status  # type: ignore[no-any-return]


def test_reflection_lists_the_service_and_health_is_open_to_all(redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path) -> None:
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

"""Floors for the hit-path benchmark: bare gRPC servers that answer
PlanCache/GetPlan with fixed bytes (the serialized response of the stored
plan), with no Redis, hashing or parsing.

    python bench/echo_server.py PORT RESPONSE_FILE            # thread pool of 64 (grpc.server)
    python bench/echo_server.py PORT RESPONSE_FILE --aio      # asyncio (grpc.aio, uvloop when installed), as plancache's gateway
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

OPTIONS = [("grpc.max_send_message_length", 64 * 2**20), ("grpc.max_receive_message_length", 64 * 2**20)]


def threaded(port: int, payload: bytes) -> None:
    def get_plan(request: bytes, context: Any) -> bytes:
        return payload

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=OPTIONS)
    handler = grpc.unary_unary_rpc_method_handler(
        get_plan, request_deserializer=lambda b: b, response_serializer=lambda b: b
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("plancache.v1.PlanCache", {"GetPlan": handler})]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("echo server ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=None)


async def asynchronous(port: int, payload: bytes) -> None:
    async def get_plan(request: bytes, context: Any) -> bytes:
        return payload

    server = grpc.aio.server(options=OPTIONS)
    handler = grpc.unary_unary_rpc_method_handler(
        get_plan, request_deserializer=lambda b: b, response_serializer=lambda b: b
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("plancache.v1.PlanCache", {"GetPlan": handler})]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("echo server ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(grace=None)


def main() -> None:
    port, payload = int(sys.argv[1]), Path(sys.argv[2]).read_bytes()
    if "--aio" not in sys.argv[3:]:
        threaded(port, payload)
        return
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(asynchronous(port, payload))


if __name__ == "__main__":
    main()

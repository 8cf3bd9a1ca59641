"""Baseline for the hit-path benchmark: a bare gRPC server that answers
PlanCache/GetPlan with fixed bytes (the serialized response of the stored
plan), with no Redis, hashing or parsing. Same thread pool as plancache.

    python bench/echo_server.py PORT RESPONSE_FILE
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc


def main() -> None:
    port, payload = int(sys.argv[1]), Path(sys.argv[2]).read_bytes()

    def get_plan(request: bytes, context: Any) -> bytes:
        return payload

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=64),
        options=[("grpc.max_send_message_length", 64 * 2**20), ("grpc.max_receive_message_length", 64 * 2**20)],
    )
    handler = grpc.unary_unary_rpc_method_handler(get_plan, request_deserializer=lambda b: b, response_serializer=lambda b: b)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("plancache.v1.PlanCache", {"GetPlan": handler})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("echo server ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=None)


if __name__ == "__main__":
    main()

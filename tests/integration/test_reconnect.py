"""A client made after the server came back reaches it at once, whatever an
older client of the same process met. gRPC shares a process's connections
to one address between channels: a new client inherited the reconnect
backoff of an older one that had seen the server down, and its first call
failed UNAVAILABLE "Connection refused" against a server listening again
(seen in CI as a fixture's fresh gateway refusing its first call: its port
had been an earlier test's)."""

from __future__ import annotations

import redis

from plancache import Client, Unavailable
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.conftest import start_stack
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler


def test_a_new_client_reaches_a_restarted_server_while_an_old_one_backs_off(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    address = f"127.0.0.1:{free_port()}"
    first, stop_first = start_stack(redis_server.url, StandInCompiler(), listen=address)
    old = Client(first.address, cache=False, timeout=5)
    try:
        assert old.compile(matmul_spec(), TARGET).source == "compiled"
        stop_first()
        try:  # the old client meets the server down: its connection backs off
            old.compile(matmul_spec(m=64), TARGET)
        except Unavailable:
            pass
        second, stop_second = start_stack(redis_server.url, StandInCompiler(), listen=address)
        try:
            with Client(second.address, cache=False, timeout=5) as new:
                assert new.compile(matmul_spec(), TARGET).source == "hit"  # at once, not "Connection refused"
        finally:
            stop_second()
    finally:
        old.close()

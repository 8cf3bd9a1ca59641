"""A shared deployment's Redis with least-privilege users (keys.ACL_RULES,
documented in docs/operations.md): a gateway and a worker do all their work under
them on a real redis-server, and cannot do what their role must not."""

from __future__ import annotations

import hashlib
import secrets
import time

import pytest
import redis

from plancache import Manifest, ManifestEntry, NotFound
from plancache.graphspec import spec_proto
from plancache.graphspec.family import derive
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.store.plans import RedisPlanStore, StoredPlan
from plancache_server.web.status import status_of
from tests.conftest import start_stack
from tests.support.specs import matmul_bias_relu_spec, matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_front_end_and_worker_work_under_their_acl_users_and_no_further(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    passwords = {role: secrets.token_hex(16) for role in keys.ACL_RULES}
    for role, password in passwords.items():
        redis_client.execute_command("ACL", "SETUSER", *keys.acl_setuser(role, f"pc-{role}", password))
    url = {
        role: f"redis://pc-{role}:{password}@127.0.0.1:{redis_server.port}/0" for role, password in passwords.items()
    }
    s, stop = start_stack(
        url["gateway"],
        StandInCompiler(build_seconds=0.2),
        worker_redis_url=url["worker"],
        memory_cache_bytes=0,
        warm=True,
        # The worker's WAIT for replicas under its user (this Redis has none: each plan waits 50 ms, then counted).
        store_replicas=1,
        store_replicas_wait_ms=50,
    )
    try:
        with s.client(timeout=30) as client:
            built = client.compile(matmul_spec(), TARGET)
            assert built.source == "compiled" and client.compile(matmul_spec(), TARGET).source == "hit"
            assert client.get(built.key).blob == built.blob
            fetched = client.prefetch(
                Manifest(entries=[ManifestEntry(spec=matmul_bias_relu_spec())], target=TARGET), compile_missing=True
            )
            assert not fetched.errors and fetched.compiled == 1
            assert client.admin.explain(matmul_spec(), TARGET).stored
            assert {t.target_id for t in client.admin.list_targets()} >= {TARGET.id}
            # What a miss reads when its target has no live worker (its last worker's entry, expired or not).
            assert s.gateway.run(s.gateway.front.builds._crew.queue.seconds_since_expiry(TARGET)) == 0.0
            # A statistics flush (about once a second) under the gateway's user.
            row = wait_until(
                lambda: (r := {r.target_id: r for r in client.admin.stats()}[TARGET.id]).hits + r.compiles >= 4 and r,
                10,
                "statistics flushed",
            )
            assert (row.hits, row.compiles) == (2, 2)
            report = s.gateway.run(status_of(s.gateway.front).report())
            assert [t.target_id for t in report.targets if t.live_workers] and report.top_by_hits
            # Warming: planned under the gateway's user, built under the worker's.
            warmed = client.admin.warm(TARGET.generic(), from_target=TARGET)
            deadline = time.monotonic() + 20
            while (now := client.admin.warm_status(TARGET.generic())[0]).state != "done" or now.in_flight:
                assert time.monotonic() < deadline, now
                time.sleep(0.1)
            assert (warmed.total, now.built, now.failed) == (2, 2, 0) and now.coverage == 1.0
            assert s.gateway.run(status_of(s.gateway.front).report()).warming
            # A graph family: recorded and queued under the gateway's user (after a finished plan), built under the worker's.
            family = derive(matmul_spec(m=8), matmul_spec(m=24), sizes={"d0": [8, 24]})
            asked = client.admin.build_family(family, TARGET)
            assert (asked.total, asked.queued) == (2, 2)
            assert wait_until(lambda: client.admin.family_status(asked.family_key).complete, 20, "the family built")
            client.get(spec=matmul_spec(m=8), target=TARGET)  # a member fetched: counted once the stats flush
            assert wait_until(lambda: client.admin.family_status(asked.family_key).fetched == 1, 20, "fetched counted")
            assert client.admin.drain_worker("nobody") is False
            assert (
                client.admin.invalidate(built.key) == 1 and client.admin.invalidate(target=TARGET) == 3
            )  # DEL (and SCAN) of plans: the prefetched one, the family's two
            assert client.admin.invalidate(target=TARGET.generic()) == 2
            # A cancelled family (its budget spent under the gateway's user; the worker reads the cancelled set).
            other = derive(matmul_spec(m=9), matmul_spec(m=25), sizes={"d0": [9, 25]})
            asked_other = client.admin.build_family(other, TARGET, workload="acl-test")
            cancelled = client.admin.cancel_family(asked_other.family_key)
            assert cancelled.cancelled and cancelled.workload == "acl-test" and cancelled.queued == 0
            assert s.gateway.run(status_of(s.gateway.front).report()).graph_families
            with pytest.raises(NotFound):
                client.get(built.key)
            assert client.compile(matmul_spec(), TARGET).source == "compiled"  # the worker writes plans again
    finally:
        stop()
    front, worker = redis.Redis.from_url(url["gateway"]), redis.Redis.from_url(url["worker"])
    denied = [
        lambda: front.hset(keys.plan(built.key), "blob", b"forged"),  # a gateway never writes plans
        lambda: front.xreadgroup(keys.JOB_GROUP, "x", {keys.job_stream(TARGET): ">"}),  # nor takes jobs
        lambda: front.lpush(keys.RECENT_FAILURES, "x"),
        lambda: worker.hincrbyfloat(keys.stats("target:x"), "hits", 1),  # a worker does not count lookups
        lambda: worker.delete(keys.TOP_HITS),
        front.flushdb,
        lambda: worker.keys("*"),
    ]
    for attempt in denied:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()


def test_the_private_redis_listens_only_on_a_socket_of_the_servers_user(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`make run`'s Redis (no --redis-url) has no TCP port: a unix socket in a
    folder only the server's user can open."""
    import stat
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from plancache import Client
    from plancache_server.store.embedded_redis import free_port
    from tests.support.processes import child_env

    data = Path(tempfile.mkdtemp(prefix="pc-"))  # short: a unix socket path has at most 107 bytes
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "plancache_server.main", "--listen", address, "--data-dir", str(data), "--gpus", "none"],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with Client(address, cache=False, timeout=2) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.admin.stats()
                    break
                except Exception:
                    assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.2)
        folder = data / "redis"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        private = redis.Redis(unix_socket_path=str(folder / "redis.sock"))
        assert private.config_get("port")["port"] == "0" and private.ping()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_workers_user_evicts_a_plan_with_its_spec_index_and_body(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """A worker storing past --store-max-mb evicts under its own user: the plan, its spec's index entry and the
    spec's body (commands the worker's rules must allow: SREM, SCARD and DEL there)."""
    password = secrets.token_hex(16)
    redis_client.execute_command("ACL", "SETUSER", *keys.acl_setuser("worker", "pc-evicting-worker", password))
    worker = redis.Redis.from_url(f"redis://pc-evicting-worker:{password}@127.0.0.1:{redis_server.port}/0")
    store = RedisPlanStore(worker, max_bytes=1500)
    first, second = stored_plan(1), stored_plan(2)
    store.put(first, spec_proto.to_proto(matmul_spec(m=16)))
    store.put(second, spec_proto.to_proto(matmul_spec(m=32)))  # over the bound: the first is evicted
    spec_hash = first.metadata.spec_hash
    assert not redis_client.exists(keys.plan(first.metadata.key))
    assert not redis_client.exists(keys.spec_index(spec_hash)) and not redis_client.exists(keys.spec_body(spec_hash))
    assert redis_client.exists(keys.plan(second.metadata.key))


def stored_plan(n: int) -> StoredPlan:
    blob = bytes([n]) * 1000
    key = f"{hashlib.sha256(str(n).encode()).hexdigest()}/{TARGET.id}/opt-{'0' * 16}"
    return StoredPlan(
        blob=blob, metadata=pb.PlanMetadata(key=key, spec_hash=key[:64], blob_sha256=hashlib.sha256(blob).hexdigest())
    )

"""Redis Cluster: a 3-master cluster started from redis-server; the store and
the whole compile path (streams, leases, pub/sub, stats) run against it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from plancache import CompileFailed, Manifest, NotFound
from plancache.v1 import plancache_pb2 as pb
from plancache_server import telemetry
from plancache_server.store import keys
from plancache_server.store import plans as plans_module
from plancache_server.store.plans import RedisPlanStore, StoredPlan
from plancache_server.store.redis_conn import connect
from tests.conftest import Stack, start_stack
from tests.support.redis_cluster import LocalCluster
from tests.support.specs import matmul_spec
from tests.support.standin import REJECTED_NAME, StandInCompiler
from tests.support.standin import STANDIN_TARGET as TARGET

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    yield c
    c.stop()


@pytest.fixture
def cluster_client(cluster: LocalCluster) -> Iterator[redis.Redis]:
    client = connect(cluster.url)
    assert isinstance(client, redis.RedisCluster)
    client.flushall()
    yield client
    client.close()


def _plan(key: str, seed: str = "") -> StoredPlan:
    blob = hashlib.sha256((key + seed).encode()).digest() * 2000
    return StoredPlan(blob, pb.PlanMetadata(key=key, spec_hash="ab" * 32, blob_sha256=hashlib.sha256(blob).hexdigest()))


def test_store_put_get_corrupt_delete_on_a_cluster(cluster_client: redis.Redis) -> None:
    store = RedisPlanStore(cluster_client)
    plans = [_plan(f"{i:064x}/{TARGET.id}/opt-{i:016x}") for i in range(20)]
    for p in plans:
        store.put(p)
    slots = {cluster_client.keyslot(keys.plan(p.metadata.key)) for p in plans}  # type: ignore[attr-defined]
    assert len(slots) > 1  # the plans are spread over the shards
    assert all(store.get(p.metadata.key) == p for p in plans)
    victim = plans[0].metadata.key
    cluster_client.hset(keys.plan(victim), "blob", b"corrupt")
    assert store.get(victim) is None
    store.delete(plans[1].metadata.key)
    assert store.get(plans[1].metadata.key) is None
    for key in (keys.plan(victim), keys.build_lease(victim), keys.job_state(victim), keys.failure(victim)):
        assert cluster_client.keyslot(key) == cluster_client.keyslot(keys.plan(victim))  # type: ignore[attr-defined]


@pytest.mark.parametrize("replicas", [0, 1], ids=["no WAIT", "--store-replicas 1 (the WAIT's path)"])
def test_a_tuned_plan_replaces_its_provisional_plan_only_while_that_is_stored_on_a_cluster(
    cluster_client: redis.Redis, replicas: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This cluster has no replicas: with --store-replicas 1 each WAIT times out (50 ms) and the write is counted
    # unreplicated, through the same pipeline (the conditional write on the slot's master, then WAIT); every write
    # waits again (no late period), so each one takes that path.
    monkeypatch.setattr(plans_module, "REPLICAS_LATE_S", 0.0)
    store = RedisPlanStore(cluster_client, replicas=replicas, replicas_wait_ms=50)
    key = f"{7:064x}/{TARGET.id}/opt-{7:016x}"
    provisional, tuned = _plan(key, "provisional"), _plan(key, "tuned")
    unreplicated = telemetry.UNREPLICATED._value.get()
    assert store.put(provisional) and store.put(tuned, replacing=True)
    assert store.get(key) == tuned
    store.delete(key)  # an operator's Invalidate while a build tunes
    assert not store.put(tuned, replacing=True)
    assert store.get(key) is None and not cluster_client.exists(keys.plan(key))
    assert telemetry.UNREPLICATED._value.get() - unreplicated == 2 * replicas  # both writes went through the WAIT


@pytest.fixture
def cluster_stack(cluster: LocalCluster, cluster_client: redis.Redis) -> Iterator[Stack]:
    s, stop = start_stack(cluster.url, StandInCompiler(build_seconds=0.5))
    yield s
    stop()


def test_compile_path_on_a_cluster(cluster_stack: Stack) -> None:
    with cluster_stack.client() as client, ThreadPoolExecutor(16) as pool:
        plans = list(pool.map(lambda _: client.compile(matmul_spec(), TARGET), range(16)))
        assert len(cluster_stack.compiler.builds) == 1 and len({p.blob for p in plans}) == 1
        assert client.compile(matmul_spec(), TARGET).source == "hit"
        with pytest.raises(CompileFailed):
            client.compile(matmul_spec(m=8, name=REJECTED_NAME), TARGET)
        with pytest.raises(NotFound):
            client.get(spec=matmul_spec(m=32), target=TARGET)
        prefetched = client.prefetch(
            Manifest.from_specs([matmul_spec(), matmul_spec(m=32)], TARGET), compile_missing=True
        )
        assert (prefetched.fetched, prefetched.compiled, prefetched.failed) == (1, 1, 0)
        row = {r.target_id: r for r in client.admin.stats()}[TARGET.id]
        assert row.compiles == 3 and row.live_workers == 1
        assert {t.target_id for t in client.admin.list_targets()} == {TARGET.id, TARGET.generic().id}


def test_warming_items_are_appended_in_turns_and_taken_on_a_cluster(cluster_client: redis.Redis) -> None:
    """The warming queue's scripts (items appended in turns, taken at the cursor) on a cluster: a target's
    plan, items and records share one hash slot."""
    from plancache.v1 import plancache_pb2 as pb
    from plancache_server.store.warming import Warming
    from tests.support.standin import STANDIN_TARGET

    warming = Warming(cluster_client)  # type: ignore[arg-type]
    warming.extend(STANDIN_TARGET, [(f"a-{i}", pb.PlanQuery()) for i in range(2)], "family a")
    warming.extend(STANDIN_TARGET, [(f"b-{i}", pb.PlanQuery()) for i in range(2)], "family b")
    taken = [item.plan_key for item in iter(lambda: warming.next_item(STANDIN_TARGET.id, "w"), None)]
    assert taken == ["a-0", "b-0", "a-1", "b-1"]

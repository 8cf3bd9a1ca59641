"""What a stored plan costs Redis beyond its blob (issue 15), on a real redis-server.

For blob sizes of the plans measured on the H200 (a matmul 2.6 KB, a
convolution 4.8 KB, SDPA forward 75 KB and backward 120 KB) and a large
5 MiB one: N signed plans with metadata like a real build's (13 candidates'
timings, 4 tensor bindings, knobs) are written through the worker's store
(plan hash, spec index, last-use index, counters); Redis' used_memory before
and after, median of 3 fresh servers. Overhead per plan = (memory growth -
blob bytes) / N; ratio = memory growth / blob bytes.

    python bench/store_overhead.py --out bench/results
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, table, write_json  # noqa: E402

SIZES = {
    "matmul 2.6 KB": 2_600,
    "conv 4.8 KB": 4_800,
    "sdpa fwd 75 KB": 75_000,
    "sdpa bwd 120 KB": 120_000,
    "large 5 MiB": 5 * 2**20,
}
TARGET_ID = "sm_90/cudnn-91900/fe-1.32.0/dev-nvidia-h200/sms-132"


def metadata(n: int, blob: bytes) -> Any:
    from plancache.v1 import plancache_pb2 as pb

    spec_hash = hashlib.sha256(f"spec {n}".encode()).hexdigest()
    return pb.PlanMetadata(
        key=f"{spec_hash}/{TARGET_ID}/opt-5cf3546c435fee19",
        spec_hash=spec_hash,
        blob_sha256=hashlib.sha256(blob).hexdigest(),
        blob_size=len(blob),
        plan_name="eng0_k2=1_k3=0",
        engine_id=0,
        workspace_size=1 << 20,
        op_family="matmul",
        built_by="bench-worker",
        tensors=[
            pb.TensorBinding(
                uid=u, name=f"T{u}", dim=[8, 256, 512], stride=[131072, 512, 1], data_type=pb.DATA_TYPE_HALF
            )
            for u in range(1, 5)
        ],
        knobs=[pb.Knob(name=f"k{i}", value=i) for i in range(4)],
        candidates=[
            pb.CandidateTiming(index=i, plan_name=f"eng{i}", engine_id=i, median_ms=0.1 + i / 100, timing="cuda-graph")
            for i in range(13)
        ],
        build_seconds=1.2,
        autotune_seconds=0.4,
        created_at=1.8e9,
    )


def measure(size: int, count: int) -> dict[str, float]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from plancache.trust.signing import Signer
    from plancache_server.store.embedded_redis import EmbeddedRedis
    from plancache_server.store.plans import RedisPlanStore, StoredPlan
    from plancache_server.store.redis_conn import connect

    signer = Signer(Ed25519PrivateKey.generate())
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = EmbeddedRedis(Path(tmp), persist=False).start()
        try:
            client = connect(redis_server.url)
            store = RedisPlanStore(client)
            before = int(client.info("memory")["used_memory"])
            blob_bytes = 0
            for n in range(count):
                blob = hashlib.sha256(str(n).encode()).digest() * (size // 32 + 1)
                blob = blob[:size]
                meta = metadata(n, blob)
                store.put(StoredPlan(blob=blob, metadata=meta, signature=signer.sign(meta)))
                blob_bytes += len(blob)
            after = int(client.info("memory")["used_memory"])
            one = int(client.memory_usage(f"plancache:{{{meta.key}}}:plan") or 0)
        finally:
            redis_server.stop()
    growth = after - before
    return {
        "growth_bytes": growth,
        "blob_bytes": blob_bytes,
        "overhead_per_plan": (growth - blob_bytes) / count,
        "ratio": growth / blob_bytes,
        "memory_usage_of_one_plan_hash": one,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for label, size in SIZES.items():
        count = 2000 if size < 200_000 else 20
        runs = [measure(size, count) for _ in range(args.repeats)]
        rows.append(
            {
                "plan": label,
                "blob_bytes_each": size,
                "plans": count,
                **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
            }
        )
    print(
        table(
            ["plan", "plans", "overhead per plan (bytes)", "memory / blob bytes", "MEMORY USAGE of one plan hash"],
            [
                [r["plan"], r["plans"], r["overhead_per_plan"], r["ratio"], r["memory_usage_of_one_plan_hash"]]
                for r in rows
            ],
        )
    )
    import redis as redis_py

    from plancache_server.store.embedded_redis import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp), persist=False).start()
        version = redis_py.Redis.from_url(server.url).info("server")["redis_version"]
        server.stop()
    write_json(args.out / "store_overhead.json", {"rows": rows, "redis_version": version, "repeats": args.repeats})
    fig, (a,) = figure(1)
    a.bar(range(len(rows)), [r["overhead_per_plan"] / 1024 for r in rows])
    a.set_xticks(range(len(rows)), [r["plan"] for r in rows], rotation=15, fontsize=8)
    (
        a.set_ylabel("KiB of Redis memory per plan beyond its blob"),
        a.set_title(f"Store overhead per plan (Redis {version})"),
    )
    save(fig, args.out / "store_overhead.png")


if __name__ == "__main__":
    main()

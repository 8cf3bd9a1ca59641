"""A bounded load test with a fault injected midway (CPU; stand-in compiler).

64 clients send 50,000 requests on loopback (GetPlan of stored plans, and
Compile of stored specs: hits that also count statistics in Redis) to a
plancache-server process; when half are done, Redis is killed and restarted
3 s later on the same port and data. Every answer is checked against the plan
it must be: a wrong plan or an unanswered request is a failure of the test.

    python bench/load_test.py [--requests 50000] [--clients 64] [--out bench/results]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_bench import TARGET, spec_for, store_plans
from bench.report import percentile, table, write_json
from plancache import Client, PlanCacheError
from plancache.trust.signing import Signer, generate_keypair
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from plancache_server.store.plans import RedisPlanStore
from plancache_server.store.redis_conn import connect
from tests.support.processes import REPO, server_process


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--plans", type=int, default=100)
    parser.add_argument("--outage", type=float, default=3.0, help="seconds Redis stays down")
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument(
        "--no-memory-cache", action="store_true", help="every hit reads Redis (the gateway's memory cache off)"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="plancache-load-"))
    redis_server = EmbeddedRedis(tmp / "redis", persist=True).start()
    port = redis_server.port
    address = f"127.0.0.1:{free_port()}"
    # Signed plans, verified by every client: the cost of trust is part of the load.
    private_key, public_key = generate_keypair(tmp / "keys")
    plans = store_plans(RedisPlanStore(connect(redis_server.url)), args.plans, signer=Signer.from_file(private_key))
    expected = {p.metadata.key: hashlib.sha256(p.blob).hexdigest() for p in plans}
    specs = [spec_for(i) for i in range(args.plans)]
    lock = threading.Lock()
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    wrong = lost = 0
    issued = 0
    fault: dict[str, Any] = {}
    deadline = time.monotonic() + args.time_limit

    def take() -> int | None:
        nonlocal issued
        with lock:
            if issued >= args.requests or time.monotonic() > deadline:
                return None
            issued += 1
            return issued

    def client_loop(worker: int) -> None:
        nonlocal wrong, lost
        with Client(address, cache=False, timeout=10, trusted_keys=[public_key], allow_unsigned=False) as client:
            while (n := take()) is not None:
                i = (n * 7 + worker) % args.plans
                started = time.perf_counter()
                try:
                    plan = client.compile(specs[i], TARGET) if n % 10 == 0 else client.get(plans[i].metadata.key)
                    ok = (
                        plan.key == plans[i].metadata.key
                        and hashlib.sha256(plan.blob).hexdigest() == expected[plan.key]
                    )
                    with lock:
                        outcomes["ok"] += 1
                        wrong += not ok
                        latencies.append(time.perf_counter() - started)
                except PlanCacheError as e:
                    with lock:
                        outcomes[type(e).__name__] += 1
                except Exception as e:  # an unanswered request: counted as lost
                    with lock:
                        lost += 1
                        outcomes[f"lost:{type(e).__name__}"] += 1

    try:
        extra = ["--memory-cache-mb", "0"] if args.no_memory_cache else []
        with server_process(address, redis_server.url, tmp / "server.log", "--gpus", "none", *extra):
            threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(args.clients)]
            started = time.perf_counter()
            for t in threads:
                t.start()
            while issued < args.requests // 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            fault["killed_at_request"] = issued
            redis_server.kill()
            time.sleep(args.outage)
            redis_server = EmbeddedRedis(tmp / "redis", persist=True, port=port).start()
            fault["restarted_at_request"] = issued
            for t in threads:
                t.join()
            wall = time.perf_counter() - started
    finally:
        redis_server.stop()
    answered = sum(outcomes.values())
    result = {
        "requests": issued,
        "clients": args.clients,
        "wall_s": wall,
        "rps": issued / wall,
        "succeeded": outcomes["ok"],
        "failed": {k: v for k, v in outcomes.items() if k != "ok"},
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "memory_cache": not args.no_memory_cache,
        "wrong_plans": wrong,
        "lost": lost + (issued - answered - lost),
        "fault": {**fault, "outage_s": args.outage},
    }
    print(table(["measure", "value"], [[k, str(v)] for k, v in result.items()]))
    write_json(args.out / ("load_test_no_memory_cache.json" if args.no_memory_cache else "load_test.json"), result)
    if result["wrong_plans"] or result["lost"]:
        raise SystemExit("wrong or lost plans")


if __name__ == "__main__":
    main()

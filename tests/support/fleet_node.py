"""A STAND-IN fleet node for the fleet coverage tests (never used by the
product): a frontend program run through `plancache.cudnn` against a real
server, in a process of its own, whose graphs the real client gets served,
from its disk cache, or builds locally for the reasons its scenario
provokes. The cuDNN frontend's GPU-only calls are recorded instead of run
(as tests/unit/test_frontend_shim.py does) and a served plan loads into a
stand-in graph. It prints its own `plancache.cudnn.stats()` and graphs as
JSON and exits without closing its client, as programs do: what is left to
report goes at exit.

    python -m tests.support.fleet_node ADDRESS SCENARIO [CACHE_DIR]
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import cudnn as frontend

import plancache.cudnn as shim
import plancache.cudnn._serving as serving
from plancache import Client, Target
from plancache.trust.disk_cache import DiskCache
from plancache_server.store.embedded_redis import free_port
from tests.support.frontdoor_standins import StandInServedGraph
from tests.support.standin import REJECTED_NAME, STANDIN_TARGET

HALF, FLOAT = frontend.data_type.HALF, frontend.data_type.FLOAT
# A target no worker builds: its graphs build locally (no_worker).
NO_WORKER_TARGET = Target("sm_80", 91900, "1.32.0", "Nobody's GPU", 108)


def _stand_in_gpu() -> None:
    cls = frontend.pygraph
    cls.validate = lambda g, *a, **k: setattr(g, "_is_validated", True)
    for name in (
        "build_operation_graph",
        "create_execution_plans",
        "check_support",
        "build_plans",
        "build_plan_at_index",
        "execute_plan_at_index",
        "execute",
    ):
        setattr(cls, name, lambda g, *a, **k: None)
    serving._load = lambda graph, plan: StandInServedGraph(plan.blob)  # type: ignore[assignment]


def matmul(m: int, name: str = "mm") -> Any:
    g = shim.pygraph(name=name, io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    dims_a, dims_b = [1, m, 64], [1, 64, 32]
    a = g.tensor(name="A", dim=dims_a, stride=[math.prod(dims_a[i + 1 :]) for i in range(3)], data_type=HALF)
    b = g.tensor(name="B", dim=dims_b, stride=[math.prod(dims_b[i + 1 :]) for i in range(3)], data_type=HALF)
    g.matmul(A=a, B=b, compute_data_type=FLOAT).set_output(True).set_data_type(HALF)
    return g


def build(g: Any) -> None:
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(frontend.build_plan_policy.ALL)


def main(address: str, scenario: str, cache_dir: str | None) -> None:
    _stand_in_gpu()
    client = Client(
        address,
        cache=DiskCache(cache_dir) if cache_dir else False,
        allow_unsigned=True,
        hedge=False,
        timeout=10,
        compile_timeout=60,
    )
    shim.configure(client, target=STANDIN_TARGET)
    if scenario == "first":  # served (built by the worker), cuDNN's refusal, a program that drives its own candidates
        for m in (128, 256):
            build(matmul(m))
        build(matmul(192, name=REJECTED_NAME))  # a graph of its own: names do not change a plan key
        g = matmul(512)
        g.validate()
        g.build_plan_at_index(0)
    elif scenario == "cached":  # the same graphs from this node's disk cache; one for a target without a worker
        for m in (128, 256):
            build(matmul(m))
        shim.configure(client, target=NO_WORKER_TARGET)
        build(matmul(128))
        shim.configure(client, target=STANDIN_TARGET)
    elif scenario == "down":  # a hit; then the server unreachable for a while
        build(matmul(128))
        dead = Client(f"127.0.0.1:{free_port()}", cache=False, hedge=False, timeout=2, compile_timeout=2)
        shim.configure(dead, target=STANDIN_TARGET)
        build(matmul(1024))
        shim.configure(client, target=STANDIN_TARGET)
        build(matmul(256))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    stats = shim.stats()
    print(
        json.dumps({"served": stats.served, "local": stats.local, "sources": [b.source for b in shim.graphs()]}),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)

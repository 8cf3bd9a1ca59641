"""What the hedge costs a hit, on the CPU (issue 29): `client.compile(spec)`
of stored plans with the hedge off (one unary Compile, the hit path as it
was) and on (CompileStream: the server answers the plan as the stream's
only event, and no local build starts), interleaved round by round in one
process against one server (a real plancache-server process, its Redis,
a stand-in worker that stored the plans first). The node's own build is
the stand-in (tests/support/standin_local.py): on a hit it must never run,
and the benchmark fails if it does.

Per round and mode: `--calls` compiles, each of one of `--plans` stored
plans (75 KB, as a real SDPA plan), no disk cache (every call asks the
server); median of the per-call latencies. The two modes run back to back
in each round (the order alternating): the figure is the median over
`--rounds` of the rounds' ratios (hedge on / off).
Floors beside them: a bare gRPC echo of the same bytes and a raw Redis GET
are bench/cpu_bench.py's (docs/performance.md, CPU section).

    python3 bench/hedge_hits.py --out DIR     # DIR/hedge_hits.json, DIR/hedge_hits.png
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import figure, paired_panel, paired_rounds_main, save, table, write_json
from plancache import Client, GraphSpec, race_stats
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support import hermetic
from tests.support.processes import REPO, child_env, server_process, wait_for_workers, worker_process
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET
from tests.support.standin_local import StandInLocalBuilder

MODES = ("hedge off", "hedge on")
TARGET_RATIO = 1.05  # hedge on / hedge off, p50: "hits no slower" within the noise of one machine


@contextlib.contextmanager
def stored_plans(prefix: str, plans: int) -> Iterator[tuple[str, Path, list[GraphSpec]]]:
    """(address, a scratch folder, the specs): a real plancache-server, its Redis and a stand-in
    worker that has stored `plans` plans (75 KB each) tuned; stopped on leaving."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    redis = EmbeddedRedis(tmp / "redis", binary=hermetic.redis_server_bin(), persist=False).start()
    address = f"127.0.0.1:{free_port()}"
    specs = [matmul_spec(m=64 * (i + 1), name=f"hit-{i}") for i in range(plans)]
    try:
        env = child_env(PLANCACHE_ALLOW_UNSIGNED="1")
        with (
            server_process(address, redis.url, tmp / "server.log", "--gpus", "none", "--unsigned", env=env),
            worker_process(
                redis.url,
                tmp / "worker.log",
                "--device",
                "0",
                "--compiler",
                "tests.support.standin:factory",
                "--unsigned",
                env=env,
            ),
        ):
            wait_for_workers(address)
            with Client(address, cache=False, hedge=False, allow_unsigned=True) as seed:
                for spec in specs:
                    seed.compile(spec, STANDIN_TARGET, tuned_only=True)
            yield address, tmp, specs
    finally:
        redis.stop()


def run(rounds: int, calls: int, plans: int) -> dict[str, Any]:
    builder = StandInLocalBuilder(seconds=0.5)  # a hit that started it would cost half a second: unmissable
    with stored_plans("plancache-hedge-hits-", plans) as (address, _, specs):
        clients = {
            "hedge off": Client(address, cache=False, hedge=False, allow_unsigned=True, local_builder=builder),
            "hedge on": Client(address, cache=False, hedge=True, allow_unsigned=True, local_builder=builder),
        }
        per_round: dict[str, list[float]] = {m: [] for m in MODES}
        sources: dict[str, set[str]] = {m: set() for m in MODES}
        for _ in range(3):  # warm both paths (channels, the server's resolved-query memo)
            for mode in MODES:
                for spec in specs:
                    clients[mode].compile(spec, STANDIN_TARGET)
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                latencies = []
                for i in range(calls):
                    started = time.perf_counter()
                    plan = clients[mode].compile(specs[i % plans], STANDIN_TARGET)
                    latencies.append(time.perf_counter() - started)
                    sources[mode].add(plan.source)
                per_round[mode].append(statistics.median(latencies) * 1e3)
        for c in clients.values():
            c.close()
    if builder.built:
        raise RuntimeError(f"a hit started {len(builder.built)} local build(s)")
    medians = {m: statistics.median(v) for m, v in per_round.items()}
    # Rounds are pairs (the two modes back to back, the order alternating): the median of the pairs' ratios
    # is the figure; the ratio of the two medians beside it.
    ratio = statistics.median(on / off for on, off in zip(per_round["hedge on"], per_round["hedge off"], strict=True))
    return {
        "machine": {"python": platform.python_version(), "cpus": len(__import__("os").sched_getaffinity(0))},
        "config": {"rounds": rounds, "calls": calls, "plans": plans},
        "p50_ms": {m: {"median": medians[m], "min": min(v), "max": max(v), "rounds": v} for m, v in per_round.items()},
        "sources": {m: sorted(s) for m, s in sources.items()},
        "local_builds": len(builder.built),
        "races": {path: vars(c) for path, c in race_stats().items()},
        "hedge_on_over_off": ratio,
        "ratio_of_medians": medians["hedge on"] / medians["hedge off"],
        "target": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO and not builder.built,
    }


def report(result: dict[str, Any], out: Path) -> None:
    write_json(out / "hedge_hits.json", result)
    rows = [[m, v["median"], v["min"], v["max"]] for m, v in result["p50_ms"].items()]
    print(table(["mode", "p50 ms (median of rounds)", "min", "max"], rows))
    print(
        f"hedge on / off: {result['hedge_on_over_off']:.3f} (target ≤ {TARGET_RATIO}); local builds on hits: {result['local_builds']}"
    )
    fig, (a,) = figure(1)
    paired_panel(
        a,
        result["p50_ms"],
        lambda ms: f"{ms:.3f} ms",
        "compile() of a stored plan, p50 ms per round",
        f"The hedge on the hit path (CPU): on / off = {result['hedge_on_over_off']:.3f}",
    )
    save(fig, out / "hedge_hits.png")


def main() -> None:
    paired_rounds_main(run, report, REPO / "bench" / "results")


if __name__ == "__main__":
    main()

"""What a workload-name collision costs a fresh process's graphs, before and after the stream's rules (issue 41).

Two programs run under one workload name (`python train.py` with two configurations, say: one default name).
The service's record for that name lists program A's plans first (200), then program B's (12): a fresh process
of B streams the record from the start. Before this session's rules a listed graph waited for the stream to bring
its plan, however far back in the stream it was, and the stream deserialized every plan it listed (A's beside
B's graphs, holding the interpreter each time). Now a graph waits
only when the stream is about to bring its plan (its next 2, or within 50 ms at the stream's pace so far); one
further back asks the service itself, and a stream that brought none of the first 4 graphs a process asked
stops (plancache.transport.workload); and (the session after) the stream deserializes nothing until a graph of
the process is found listed, then the plans already fetched and the rest as they come.

Measured on the CPU against a real Redis, gateway and stand-in worker (in-process), each arm a fresh client
(a fresh process's start-up stream) running B's 12 graphs one after another (each asked, deserialized where the
stream has not, then --work-ms of the program's own work), `--rounds` interleaved rounds, the time until the last
graph ran, medians:

  own             B under its own name: the record lists B's 12 (what naming each program gives)
  own_unheld      the same, the stream deserializing from its start (before the hold)
  mixed           B under the shared name (A's uses and B's), today's rules
  mixed_old       the same with the old rules (every listed graph waits; no stop; no hold)
  foreign         B under A's name (a record of A's plans alone: B's first run under a name A used), today's rules
  foreign_unheld  the same, the stream deserializing from its start (before the hold)
  foreign_old     the same with the old rules
  none         no start-up stream (PLANCACHE_WORKLOAD_PREFETCH=0): every graph asks the service

STAND-IN: deserializing a plan takes --plan-ms (a sleep): in the stream's thread for the plans it brings, on
the program's thread for the others (~20 ms a plan on the H200, GPU run 24); the program's own work between
graphs is a sleep too; the stand-in compiler's plans are 75 KB. The record's order interleaves the processes
that wrote it (each process's first use first), so B's plans are not all behind A's.

    python3 bench/workload_collision.py --out DIR    # DIR/workload_collision.{json,png}
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import bar_chart, table, write_json  # noqa: E402

# The stream deserializes only once a graph of the process is found listed (start_loading); the old rules
# deserialized every plan it brought from the start.
HOLD = True
ARMS = ("own", "own_unheld", "mixed", "mixed_old", "foreign", "foreign_unheld", "foreign_old", "none")
NAMES = {
    "own": "b",
    "own_unheld": "b",
    "mixed": "shared",
    "mixed_old": "shared",
    "foreign": "a",
    "foreign_unheld": "a",
    "foreign_old": "a",
    "none": "b",
}


def holding_the_interpreter(seconds: float) -> Callable[[], None]:
    """STAND-IN for a plan's deserialization: one C call that holds the interpreter lock `seconds` (the cuDNN
    frontend's deserialize releases it nowhere: its Python bindings have no gil_scoped_release), calibrated here."""
    n = 200_000
    while True:
        started = time.perf_counter()
        sum(range(n))
        took = time.perf_counter() - started
        if took > 0.002:
            break
        n *= 4
    count = max(1, int(n * seconds / took))

    def deserialize() -> None:
        sum(range(count))

    return deserialize


@contextmanager
def rules(old: bool, hold: bool) -> Iterator[None]:
    """The stream's rules as they were two sessions ago (old: no bounded waits, no stop, no hold), or as they
    are, with or without the hold (deserializing only once a graph of the process is found listed)."""
    from plancache.transport import background, workload

    global HOLD
    kept = background.STREAM_FREE_AHEAD, workload.COLLISION_ASKS
    if old:
        background.STREAM_FREE_AHEAD, workload.COLLISION_ASKS = 10**9, 10**9
    HOLD = hold and not old
    try:
        yield
    finally:
        background.STREAM_FREE_AHEAD, workload.COLLISION_ASKS = kept
        HOLD = True


def slow_stream(deserialize: Callable[[], None]) -> None:
    """STAND-IN: the stream's thread deserializes each plan it brings (`deserialize()`), as on a GPU."""
    from plancache.transport.background import BackgroundPrefetch

    original = BackgroundPrefetch._arrived

    def arrived(self: BackgroundPrefetch, index: int, plan: Any) -> None:
        if (self.loading or not HOLD) and not (self.cancelled or index in self._skipped):
            deserialize()
            plan.standin_loaded = True
        original(self, index, plan)

    def load_backlog(self: BackgroundPrefetch, indices: list[int]) -> None:
        """The plans fetched before a listed graph turned loading on (start_loading), in order."""
        for index in indices:
            plan = self.ready(index)
            if not self.loading or self.cancelled:
                return
            if plan is not None and not getattr(plan, "standin_loaded", False):
                deserialize()
                plan.standin_loaded = True

    BackgroundPrefetch._arrived = arrived  # type: ignore[method-assign]
    BackgroundPrefetch._load_backlog = load_backlog  # type: ignore[method-assign]


def run_b(
    make_client: Callable[..., Any],
    specs: list[Any],
    target: Any,
    name: str,
    prefetch: bool,
    deserialize: Callable[[], None],
    work_s: float,
) -> dict[str, Any]:
    """A fresh process of program B: each graph asked, deserialized here unless the stream did (STAND-IN), then the
    program's own work; the time until the last graph ran."""
    started = time.perf_counter()
    keys = []
    from tests.support.standin_local import StandInLocalBuilder

    # A node that runs plans (the stand-in local builder: the stream's thread deserializes, as on a GPU).
    with make_client(
        hedge=False, workload=name, workload_prefetch=prefetch, report=False, local_builder=StandInLocalBuilder()
    ) as client:
        for spec in specs:
            plan = client.compile(spec, target)
            if not getattr(plan, "standin_loaded", False):
                deserialize()
            time.sleep(work_s)  # the program's GPU work: the interpreter free meanwhile
            keys.append(plan.key)
        elapsed = time.perf_counter() - started
        stats = client.workload_stats()
    return {
        "seconds": elapsed,
        "keys": keys,
        "state": stats.state,
        "prefetched": stats.prefetched,
        "used": stats.used,
        "asked_ahead": stats.asked_ahead,
        "stopped": stats.stopped,
    }


def measure(rounds: int, plan_ms: float, work_ms: float, a_graphs: int) -> dict[str, Any]:
    from plancache.keys.query import PlanQuery
    from plancache.run import execution
    from plancache_server.store.embedded_redis import EmbeddedRedis
    from tests.conftest import start_stack
    from tests.support.fake_gpu import FakeRuntime
    from tests.support.specs import matmul_spec
    from tests.support.standin import STANDIN_TARGET as TARGET
    from tests.support.standin import StandInCompiler

    execution.use_runtime(FakeRuntime())  # Plan.load() on no GPU: instant; the stand-in's time is deserialize()
    os.environ["PLANCACHE_ALLOW_UNSIGNED"] = "1"  # the in-process stand-in worker signs nothing (as the tests run it)
    tmp = Path(tempfile.mkdtemp(prefix="plancache-collision-"))
    redis = EmbeddedRedis(tmp / "redis", persist=False).start()
    stack, stop = start_stack(redis.url, StandInCompiler(build_seconds=0.0))
    try:
        program_a = [matmul_spec(m=64 + 16 * i, name=f"a{i}") for i in range(a_graphs)]
        program_b = [matmul_spec(m=8192 + 16 * i, name=f"b{i}") for i in range(12)]
        # The shared name's record: A's first uses and B's; A's name: A's alone; B's own name: B's alone.
        for name, programs in (("shared", (program_a, program_b)), ("a", (program_a,)), ("b", (program_b,))):
            for program in programs:
                with stack.client(hedge=False, workload=name, workload_prefetch=False) as client:
                    for spec in program:
                        client.compile(spec, TARGET)
        expected = [PlanQuery.of(spec, TARGET).key for spec in program_b]
        deserialize = holding_the_interpreter(plan_ms / 1000)
        slow_stream(deserialize)
        os.environ["PLANCACHE_REPORT"] = "0"  # the measured processes leave the records as they are
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        for _ in range(rounds):
            for arm in ARMS:
                with rules(old=arm.endswith("_old"), hold=not arm.endswith("_unheld")):
                    row = run_b(stack.client, program_b, TARGET, NAMES[arm], arm != "none", deserialize, work_ms / 1000)
                assert row.pop("keys") == expected, f"{arm}: a graph got another graph's plan"
                print(arm, {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
                runs[arm].append(row)
        return runs
    finally:
        stop()
        redis.stop()


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    median = {arm: statistics.median(r["seconds"] for r in rows) for arm, rows in runs.items()}
    last = {arm: {k: v for k, v in rows[-1].items() if k != "seconds"} for arm, rows in runs.items()}
    return {
        "seconds": median,
        "mixed_old_over_mixed": median["mixed_old"] / median["mixed"],
        "foreign_old_over_foreign": median["foreign_old"] / median["foreign"],
        "foreign_unheld_over_foreign": median["foreign_unheld"] / median["foreign"],
        "own_unheld_over_own": median["own_unheld"] / median["own"],
        # Round by round (the arms of one round ran back to back): the machine's drift cancels.
        "paired": {
            f"{a}_over_{b}": statistics.median(
                x["seconds"] / y["seconds"] for x, y in zip(runs[a], runs[b], strict=True)
            )
            for a, b in (("own", "own_unheld"), ("foreign", "foreign_unheld"), ("foreign", "none"), ("own", "none"))
        },
        "last_run": last,
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    colors = ["#55a868", "#dd8452", "#4c72b0", "#c44e52", "#4c72b0", "#dd8452", "#c44e52", "#888888"]
    title = "A fresh process under a shared workload name (CPU, stand-in stream)"
    bar_chart(path, summary["seconds"], colors, "{:.2f} s", "seconds until B's 12 graphs ran (median)", title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plan-ms", type=float, default=20.0)
    parser.add_argument("--work-ms", type=float, default=10.0)
    parser.add_argument("--a-graphs", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    runs = measure(args.rounds, args.plan_ms, args.work_ms, args.a_graphs)
    summary = summarize(runs)
    print(table(["arm", "seconds"], [[arm, summary["seconds"][arm]] for arm in ARMS]))
    write_json(
        args.out / "workload_collision.json",
        {"summary": summary, "config": {**vars(args), "out": str(args.out)}, "runs": runs},
    )
    plot(summary, args.out / "workload_collision.png")


if __name__ == "__main__":
    main()

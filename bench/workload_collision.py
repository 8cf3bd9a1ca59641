"""What a workload-name collision costs a fresh process's graphs, before and after the stream's rules (issue 41).

Two programs run under one workload name (`python train.py` with two configurations, say: one default name).
The service's record for that name lists program A's plans first (200), then program B's (12): a fresh process
of B streams the record from the start. Before this session's rules a listed graph waited for the stream to bring
its plan, however far back in the stream it was, and the stream deserialized every plan it listed (A's beside
B's graphs, holding the interpreter each time). Now a graph waits
only when the stream is about to bring its plan (its next 2, or within 50 ms at the stream's pace so far); one
further back asks the service itself, and a stream that brought none of the first 4 graphs a process asked
stops (plancache.transport.workload); and (the session after) the stream deserializes nothing until a graph of
the process is found listed, then the plans already fetched and the rest as they come; and (the session after
that) not where the record is settled (its last processes said the stream served them): there it deserializes
from its start, while the program sets up.

Measured on the CPU against a real Redis, gateway and stand-in worker (in-process), each arm a fresh client
(a fresh process's start-up stream) that touches plancache first (as configure() does: its stream begins), sets
up for --setup-ms (its model built, the interpreter free: a sleep), then runs B's 12 graphs one after another
(each asked, deserialized where the stream has not, then --work-ms of the program's own work), `--rounds`
interleaved rounds, the time from its touch until the last graph ran, medians:

  own              B under its own name, the record not settled (no process said how its stream went): held
  own_settled      B under its own name, the record settled (a process of B said its stream served it)
  mixed            B under the shared name (A's uses and B's), today's rules
  mixed_old        the same with the old rules (every listed graph waits; no stop; no hold)
  foreign          B under A's name (a record of A's plans alone: B's first run under a name A used), not settled
  foreign_settled  the same, A's record settled: the first collision with it (its verdict unsettles it for the
                   next process; reports are off here, so every round meets it settled)
  foreign_old      the same with the old rules
  none             no start-up stream (PLANCACHE_WORKLOAD_PREFETCH=0): every graph asks the service

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
ARMS = ("own", "own_settled", "mixed", "mixed_old", "foreign", "foreign_settled", "foreign_old", "none")
NAMES = {
    "own": "b",
    "own_settled": "b-settled",
    "mixed": "shared",
    "mixed_old": "shared",
    "foreign": "a",
    "foreign_settled": "a-settled",
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
def rules(old: bool) -> Iterator[None]:
    """The stream's rules as they were three sessions ago (old: no bounded waits, no stop, no hold), or as they
    are (a record not settled held until a graph of the process is found listed)."""
    from plancache.transport import background, workload

    global HOLD
    kept = background.STREAM_FREE_AHEAD, workload.COLLISION_ASKS
    if old:
        background.STREAM_FREE_AHEAD, workload.COLLISION_ASKS = 10**9, 10**9
    HOLD = not old
    try:
        yield
    finally:
        background.STREAM_FREE_AHEAD, workload.COLLISION_ASKS = kept
        HOLD = True


def slow_stream(deserialize: Callable[[], None]) -> None:
    """STAND-IN: each plan the stream deserializes (on its thread as it arrives, or its loader's) takes
    `deserialize()`, as on a GPU; under the old rules (HOLD False) every plan, from the stream's start."""
    from plancache.transport.background import BackgroundPrefetch

    original_arrived = BackgroundPrefetch._arrived

    def load_plan(self: BackgroundPrefetch, plan: Any) -> None:
        if not getattr(plan, "standin_loaded", False):
            deserialize()
            plan.standin_loaded = True

    def arrived(self: BackgroundPrefetch, index: int, plan: Any) -> None:
        if not HOLD and not self.loading and not (self.cancelled or index in self._skipped):
            load_plan(self, plan)  # the old rules: no hold
        original_arrived(self, index, plan)

    BackgroundPrefetch._load_plan = load_plan  # type: ignore[method-assign]
    BackgroundPrefetch._arrived = arrived  # type: ignore[method-assign]


def run_b(
    make_client: Callable[..., Any],
    specs: list[Any],
    target: Any,
    name: str,
    prefetch: bool,
    deserialize: Callable[[], None],
    work_s: float,
    setup_s: float,
) -> dict[str, Any]:
    """A fresh process of program B: plancache touched (its stream begun), its set-up, then each graph asked,
    deserialized here unless the stream did (STAND-IN), then the program's own work; the time until the last
    graph ran."""
    keys = []
    from tests.support.standin_local import StandInLocalBuilder

    # A node that runs plans (the stand-in local builder: the stream's thread deserializes, as on a GPU).
    with make_client(
        hedge=False, workload=name, workload_prefetch=prefetch, report=False, local_builder=StandInLocalBuilder()
    ) as client:
        started = time.perf_counter()
        client.workload.begin(target)  # what plancache.functional.configure() does: the stream begins
        time.sleep(setup_s)  # the program builds its model meanwhile (the interpreter free)
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
        "settled": stats.settled,
    }


def measure(rounds: int, plan_ms: float, work_ms: float, setup_ms: float, a_graphs: int) -> dict[str, Any]:
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
        records = (
            ("shared", (program_a, program_b)),
            ("a", (program_a,)),
            ("b", (program_b,)),
            ("a-settled", (program_a,)),
            ("b-settled", (program_b,)),
        )
        for name, programs in records:
            for program in programs:
                with stack.client(hedge=False, workload=name, workload_prefetch=False) as client:
                    for spec in program:
                        client.compile(spec, TARGET)
        for name, program in (("a-settled", program_a), ("b-settled", program_b)):
            # A second process of the program, its record streamed: its verdict (served) settles the record.
            with stack.client(hedge=False, workload=name, workload_prefetch=True) as client:
                for spec in program:
                    client.compile(spec, TARGET)
                while client.workload_stats().state in ("idle", "listing", "streaming"):
                    time.sleep(0.01)
        expected = [PlanQuery.of(spec, TARGET).key for spec in program_b]
        deserialize = holding_the_interpreter(plan_ms / 1000)
        slow_stream(deserialize)
        os.environ["PLANCACHE_REPORT"] = "0"  # the measured processes leave the records as they are
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        for _ in range(rounds):
            for arm in ARMS:
                with rules(old=arm.endswith("_old")):
                    row = run_b(
                        stack.client,
                        program_b,
                        TARGET,
                        NAMES[arm],
                        arm != "none",
                        deserialize,
                        work_ms / 1000,
                        setup_ms / 1000,
                    )
                assert row.pop("keys") == expected, f"{arm}: a graph got another graph's plan"
                assert row["settled"] == arm.endswith("_settled"), f"{arm}: settled {row['settled']}"
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
        "foreign_settled_over_foreign": median["foreign_settled"] / median["foreign"],
        "own_settled_over_own": median["own_settled"] / median["own"],
        # Round by round (the arms of one round ran back to back): the machine's drift cancels.
        "paired": {
            f"{a}_over_{b}": statistics.median(
                x["seconds"] / y["seconds"] for x, y in zip(runs[a], runs[b], strict=True)
            )
            for a, b in (
                ("own_settled", "own"),
                ("foreign_settled", "foreign"),
                ("foreign", "none"),
                ("own", "none"),
                ("own_settled", "none"),
                ("mixed", "none"),
            )
        },
        "last_run": last,
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    colors = ["#55a868", "#dd8452", "#4c72b0", "#c44e52", "#4c72b0", "#dd8452", "#c44e52", "#888888"]
    title = "A fresh process of B: touch, set-up, 12 graphs (CPU, stand-in stream)"
    bar_chart(path, summary["seconds"], colors, "{:.2f} s", "seconds until B's 12 graphs ran (median)", title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plan-ms", type=float, default=20.0)
    parser.add_argument("--work-ms", type=float, default=10.0)
    parser.add_argument("--setup-ms", type=float, default=300.0, help="the program's set-up after its touch")
    parser.add_argument("--a-graphs", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    runs = measure(args.rounds, args.plan_ms, args.work_ms, args.setup_ms, args.a_graphs)
    summary = summarize(runs)
    print(table(["arm", "seconds"], [[arm, summary["seconds"][arm]] for arm in ARMS]))
    write_json(
        args.out / "workload_collision.json",
        {"summary": summary, "config": {**vars(args), "out": str(args.out)}, "runs": runs},
    )
    plot(summary, args.out / "workload_collision.png")


if __name__ == "__main__":
    main()

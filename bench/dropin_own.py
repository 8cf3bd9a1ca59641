"""plancache.cudnn's own time in a hedged miss's build step, on the CPU machine, one version against another
(issue 41, item 1: a miss's fixed cost over the node's own build, ≤ 1 ms asked).

A GPU host measures it inside a real first node (bench/miss_phases.py's `dropin_build` less `race_build`); this
is the same step with no GPU, so a change can be weighed before a GPU run: the real frontend's IR (its Python
package, version 1.32) builds the 13 start-up graphs (bench/startup_graphs.py) through `plancache.cudnn`'s
pygraph, as the local program writes them; the frontend's GPU calls are replaced (validate and the plan calls do
nothing, `build_plans` holds the interpreter for --build-ms in one C call, as the frontend's build does:
its bindings never release it; --build-gil loop, a Python loop instead, lets other threads in every 5 ms),
and a real client races that build against a real gateway and stand-in worker (tests/support: Redis, gateway
and worker in a child process, the worker's builds slower than the node's so every graph is a hedged miss the
node's build wins). Per graph past the first two of a process:

  own      the build step less the node's build inside it (bench/miss_phases.py's dropin_build less race_build:
           what GPU runs read inside real first nodes as plancache's own time, bench/hedge_arms.py's own_ms)
  capture  the program's graph read and normalized (dropin_capture; proven inside the step until this session's
           change, later only where the service's plan takes over)
  race     Client.race less the node's build (keying, disk cache, the Compile sent, the race settled)
  rest     the build step's own time around those two (the plan calls' options, counting the graph)

(Results of this benchmark before it read bench/miss_phases.py's clocks, dropin_own_stop70_cpu.json and GPU run
45's, split the own time at the node's build instead: before_build and after_build.)

Arms are source trees of the client (`--arm NAME=PATH`, PATH a `client/src`), run in alternating fresh processes
(`--processes` each), so both see the same machine; medians over every graph of every process of an arm.
`--pause-ms P` (repeatable: every arm at each) sleeps after each graph, as a lazy node's layer does (GPU runs 46-47
read `Client.compile`'s own time lazily 1.04-1.19 ms a graph, back to back 0.69-0.93). `--door compile` measures one
`Client.compile` per graph instead of the drop-in's build step (own: compile less the node's build; capture: its
query, the spec validated and normalized; race: the rest). `--door stored` measures a fresh process's first run of
the 13 graphs through the drop-in with every plan stored by an earlier run of its workload (one run a process, every
graph measured: own is the whole build step, the frontend's deserialize replaced; race is Client.race, the plan
looked up, checked and taken; rest the proof of the plan's graph, loading and counting; its workload's plans streamed
as on a GPU node, `--pause-ms` before each graph, the first included: the stream's lead).

    python3 bench/dropin_own.py --arm before=/tmp/before/client/src --arm after=client/src --out bench/results
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))  # after a child's PYTHONPATH: the arm's client comes first

from bench.report import arm_child  # noqa: E402

PHASES = ("own", "capture", "race", "rest")


def _serve(ready: Any, build_seconds: float = 60.0) -> None:
    """The service, in a child process: Redis, gateway and a stand-in worker whose builds take `build_seconds` (60 s:
    every graph a miss the node's build wins; --door stored: quick, its plans stored before the clocked part)."""
    from plancache_server.store.embedded_redis import EmbeddedRedis
    from tests.conftest import start_stack
    from tests.support import hermetic
    from tests.support.standin import StandInCompiler

    redis_server = EmbeddedRedis(Path(tempfile.mkdtemp()), binary=hermetic.redis_server_bin(), persist=False).start()
    stack, _ = start_stack(redis_server.url, StandInCompiler(build_seconds=build_seconds))
    ready.put(stack.address)
    time.sleep(3600)


def _held_for(ms: float) -> Callable[[], None]:
    """One C call that holds the interpreter about `ms` long (builtin sum over a range never lets another thread
    in), as the frontend's build_plans does: its bindings never release the GIL."""
    probe = 200_000
    took = min(_timed(lambda: sum(range(probe))) for _ in range(5))
    count = max(1, int(probe * (ms / 1000) / took))

    def hold() -> None:
        sum(range(count))

    return hold


def _timed(fn: Callable[[], object]) -> float:
    begun = time.perf_counter()
    fn()
    return time.perf_counter() - begun


def measure(
    rounds: int, build_ms: float, gil: str = "held", door: str = "cudnn", pause_ms: float = 0.0
) -> dict[str, list[float]]:
    """In this process: every graph's phases (ms), past the first two."""
    import multiprocessing

    os.environ["PLANCACHE_ALLOW_UNSIGNED"] = "1"
    os.environ["PLANCACHE_BENCH_PHASES"] = "1"
    os.environ["PLANCACHE_CONFIG_DIR"] = tempfile.mkdtemp()
    os.environ["PLANCACHE_CACHE_DIR"] = tempfile.mkdtemp()
    context = multiprocessing.get_context("fork")
    ready = context.Queue()
    service = context.Process(target=_serve, args=(ready, 0.01 if door == "stored" else 60.0), daemon=True)
    service.start()
    try:
        address = ready.get(timeout=60)
        if door == "compile":
            return _compiles(address, rounds, build_ms, pause_ms / 1000)
        if door == "stored":
            return _stored(address, pause_ms / 1000)
        return _graphs(address, rounds, build_ms, gil, pause_ms / 1000)
    finally:
        service.kill()


def _compiles(address: str, rounds: int, build_ms: float, pause_s: float) -> dict[str, list[float]]:
    """--door compile: one Client.compile per graph, hedged, the node's own build the held stand-in; a fresh client
    each round (a round's graphs are the same keys: each round its first two ask first, as a process's do).
    Phases: own (Client.compile less the node's build), capture (its query: the spec validated and normalized,
    bench/miss_phases.py's `query`), race (the rest)."""
    from bench import miss_phases
    from bench.startup_graphs import startup_graphs
    from plancache import Client
    from plancache.keys.query import PlanQuery
    from plancache.run.plan import Plan
    from tests.support.standin import STANDIN_TARGET
    from tests.support.standin_local import StandInLocalBuilder

    hold = _held_for(build_ms)
    built: list[float] = []

    class HeldBuild(StandInLocalBuilder):
        """STAND-IN: the node's own build holds the interpreter `build_ms`, as the frontend's does."""

        def build(self, query: PlanQuery) -> Plan:
            begun = time.perf_counter()
            hold()
            plan = super().build(query)
            built.append(time.perf_counter() - begun)
            return plan

    if not miss_phases.install():
        raise RuntimeError("bench.miss_phases did not install (PLANCACHE_BENCH_PHASES=1 is set by measure())")
    found: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(rounds):
        with Client(address, cache=False, hedge=True, allow_unsigned=True, local_builder=HeldBuild()) as client:
            miss_phases.take()
            for index, spec in enumerate(startup_graphs()):
                built.clear()
                plan = client.compile(spec, STANDIN_TARGET)
                clocks = miss_phases.take()
                if plan.source != "local" or len(built) != 1:
                    raise RuntimeError(f"graph {spec.name}: not a hedged miss the node's build won: {plan.source}")
                if pause_s:
                    time.sleep(pause_s)  # the program's own work between graphs (a lazy node's layer)
                if index < 2:
                    continue  # a client's first two graphs ask the service first, synchronously
                (step,), (query,) = clocks["compile"], clocks["query"]
                own = step - built[0]
                found["own"].append(own * 1000)
                found["capture"].append(query * 1000)
                found["race"].append((own - query) * 1000)
                found["rest"].append(0.0)
    return found


def _replace_gpu_calls(doing: dict[str, Callable[[], None]]) -> None:
    """STAND-IN: the frontend's calls that need a GPU (a graph's validation, plan making and building, and those named
    in `doing`) do nothing but what `doing` says for them; validate marks the graph validated, as the real one does."""
    import cudnn

    def replaced(name: str) -> Callable[..., None]:
        def call(graph: Any, *args: Any, **kwargs: Any) -> None:
            if name == "validate":
                graph._is_validated = True
            if name in doing:
                doing[name]()

        return call

    stages = ("validate", "build_operation_graph", "create_execution_plans", "check_support", "build_plans")
    for name in dict.fromkeys((*stages, *doing)):
        setattr(cudnn.pygraph, name, replaced(name))


def _program_graph(spec: Any, before_build: Callable[[], None]) -> Any:
    """`spec` as the local program builds it, through plancache.cudnn's pygraph (the frontend's GPU calls replaced
    by the caller); `before_build` runs just before its build step."""
    import cudnn

    import plancache.cudnn as dropin
    from plancache.frontend_graph import build_pygraph

    graph = build_pygraph(spec, dropin)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A])
    graph.check_support()
    before_build()
    graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
    return graph


def _stored(address: str, pause_s: float) -> dict[str, list[float]]:
    """--door stored: a fresh process's first run of the 13 graphs through plancache.cudnn with every plan stored and
    its workload's record listing them (a node of a model the fleet runs already): each graph's build step serves the
    stored plan, the frontend's deserialize replaced (the floor pays it alike). Stored first by another client of the
    same workload, its node's own build off (the service builds, quickly). Every graph is measured, the first two
    included (a fresh process's first graph is where plancache's first use falls): own (the whole build step),
    capture (the program's graph read and normalized), race (Client.race: the plan looked up, checked and taken) and
    rest (the proof that the plan's graph is the program's, loading, counting)."""

    import plancache.cudnn as dropin
    import plancache.run.gpu
    from bench import miss_phases
    from bench.startup_graphs import startup_graphs
    from plancache import Client
    from plancache.graphspec.validation import normalize
    from tests.support.standin import STANDIN_TARGET

    specs = [normalize(spec) for spec in startup_graphs()]
    loaded: list[float] = []

    _replace_gpu_calls({"deserialize": lambda: loaded.append(0.0)})
    plancache.run.gpu.cudnn_handle = lambda device=None: object()  # STAND-IN: no GPU, no handle
    if not miss_phases.install(dropin=True):
        raise RuntimeError("bench.miss_phases did not install (PLANCACHE_BENCH_PHASES=1 is set by measure())")

    def build(spec: Any) -> Any:
        return _program_graph(spec, loaded.clear)

    # Stored by an earlier process of the workload: the same program through the drop-in, waiting for each plan
    # (no disk cache: the measured client finds nothing on its disk), its use reported to the workload's record.
    seeding = Client(address, hedge=False, cache=False, workload="dropin-own-stored")
    dropin.configure(seeding, target=STANDIN_TARGET)
    for spec in specs:
        build(spec)
    seeding.close()
    # The workload's plans stream as on a GPU node (there the default; here, without a GPU, it is off).
    os.environ["PLANCACHE_WORKLOAD_PREFETCH"] = "1"
    dropin.configure(Client(address, hedge=True, workload="dropin-own-stored"), target=STANDIN_TARGET)
    miss_phases.take()
    found: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for spec in specs:
        if pause_s:
            time.sleep(pause_s)  # the program's work before each graph (set-up, before the first): the stream's lead
        graph = build(spec)
        clocks = miss_phases.take()
        if graph.plancache.plan is None or len(loaded) != 1:
            raise RuntimeError(f"graph {spec.name}: not served by a stored plan: {graph.plancache}")
        (step,), (capture,) = clocks["dropin_build"], clocks["dropin_capture"]
        race = sum(clocks.get("dropin_race", []))
        found["own"].append(step * 1000)
        found["capture"].append(capture * 1000)
        found["race"].append(race * 1000)
        found["rest"].append((step - capture - race) * 1000)
    return found


def _graphs(address: str, rounds: int, build_ms: float, gil: str, pause_s: float) -> dict[str, list[float]]:

    import plancache.cudnn as dropin
    from bench import miss_phases
    from bench.startup_graphs import startup_graphs
    from plancache import Client
    from plancache.cudnn import _serving
    from plancache.graphspec.validation import normalize
    from tests.support.standin import STANDIN_TARGET

    built: list[float] = []
    hold = _held_for(build_ms)

    def build_plans() -> None:
        begun = time.perf_counter()
        if gil == "held":
            hold()
        else:  # a Python loop: other threads run every switch interval (5 ms), as they cannot beside the frontend
            while time.perf_counter() - begun < build_ms / 1000:
                sum(range(200))
        built.append(time.perf_counter() - begun)

    _replace_gpu_calls({"build_plans": build_plans})
    # The same clocks as a GPU node's (bench/miss_phases.py): what is measured here is what GPU runs call own_ms.
    if not miss_phases.install(dropin=True):
        raise RuntimeError("bench.miss_phases did not install (PLANCACHE_BENCH_PHASES=1 is set by measure())")
    dropin.configure(Client(address, hedge=True, workload="dropin-own"), target=STANDIN_TARGET)
    miss_phases.take()  # the first use (touch), not a graph's
    found: dict[str, list[float]] = {phase: [] for phase in PHASES}
    specs = [normalize(spec) for spec in startup_graphs()]
    for round_ in range(rounds):
        for index, spec in enumerate(specs):
            graph = _program_graph(spec, built.clear)
            clocks = miss_phases.take()
            if graph.plancache.reason != _serving.HEDGED or len(built) != 1:
                raise RuntimeError(f"graph {spec.name}: not a hedged miss the node's build won: {graph.plancache}")
            if pause_s:
                time.sleep(pause_s)  # the program's own work between graphs (a lazy node's layer)
            if round_ == 0 and index < 2:
                continue  # a process's first two graphs ask the service first, synchronously
            (step,), (node_build,), (capture,), (race,) = (
                clocks[name] for name in ("dropin_build", "race_build", "dropin_capture", "dropin_race")
            )
            own, race_own = step - node_build, race - node_build
            found["own"].append(own * 1000)
            found["capture"].append(capture * 1000)
            found["race"].append(race_own * 1000)
            found["rest"].append((own - capture - race_own) * 1000)
    return found


def run(
    arms: dict[str, str],
    processes: int,
    rounds: int,
    build_ms: float,
    gil: str = "held",
    door: str = "cudnn",
    pauses_ms: tuple[float, ...] = (0.0,),
) -> dict[str, Any]:
    """Each arm at each pause, in alternating fresh processes; an arm at several pauses is named "ARM +P ms"."""
    runs = {
        (name if len(pauses_ms) == 1 else f"{name} +{pause_ms:g} ms"): (source, pause_ms)
        for name, source in arms.items()
        for pause_ms in pauses_ms
    }
    per_arm: dict[str, dict[str, list[float]]] = {name: {phase: [] for phase in PHASES} for name in runs}
    process_medians: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(processes):
        for name, (source, pause_ms) in runs.items():
            arguments = ["--rounds", str(rounds), "--build-ms", str(build_ms), "--build-gil", gil]
            arguments += ["--door", door, "--pause-ms", str(pause_ms)]
            found = arm_child(__file__, name, source, arguments, extra_path=[str(REPO)])
            for phase in PHASES:
                per_arm[name][phase] += found[phase]
            process_medians[name].append(statistics.median(found["own"]))
            print(f"{name}: own {process_medians[name][-1]:.3f} ms a graph (median of {len(found['own'])})")
    return {
        "arms": arms,
        "processes": processes,
        "rounds": rounds,
        "build_ms": build_ms,
        "build_gil": gil,
        "door": door,
        "pauses_ms": list(pauses_ms),
        "python": sys.version.split()[0],
        "median_ms": {name: {p: statistics.median(v) for p, v in phases.items()} for name, phases in per_arm.items()},
        "process_medians_own_ms": process_medians,
        "graphs_per_arm": {name: len(phases["own"]) for name, phases in per_arm.items()},
    }


def report(results: dict[str, Any], out: Path, tag: str) -> None:
    from bench.report import figure, save, table, write_json

    suffix = f"_{tag}" if tag else ""
    write_json(out / f"dropin_own{suffix}.json", results)
    medians = results["median_ms"]
    print(table(["arm (ms a graph)", *PHASES], [[name, *(medians[name][p] for p in PHASES)] for name in medians]))
    fig, (ax,) = figure(1)
    names = list(medians)
    bottom = [0.0] * len(names)
    for phase in PHASES[1:]:
        values = [medians[name][phase] for name in names]
        ax.bar(names, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.scatter(names, [medians[name]["own"] for name in names], color="black", zorder=3, label="own (median)")
    stored = results.get("door") == "stored"
    if not stored:  # a miss's bound (a hit's is the floor's: docs/performance.md)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8, label="issue 41's bound")
    ax.set_ylabel("ms a graph, every graph (medians)" if stored else "ms a graph, past a process's first two (medians)")
    door = {
        "compile": "Client.compile's own time in a hedged miss",
        "stored": "plancache.cudnn's own time in a build step its stored plan serves",
    }.get(results.get("door", ""), "plancache.cudnn's own time in a hedged miss's build step")
    ax.set_title(f"{door}, CPU" + ("" if stored else f", {results['build_ms']:.0f} ms builds"), fontsize=9)
    ax.legend(fontsize=7)
    save(fig, out / f"dropin_own{suffix}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", default=[], help="NAME=PATH of a client/src (repeatable)")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per arm, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="times each process builds the 13 graphs")
    parser.add_argument("--build-ms", type=float, default=30.0, help="the node's own build of each graph")
    parser.add_argument(
        "--build-gil",
        choices=("held", "loop"),
        default="held",
        help="the stand-in build holds the interpreter throughout, as the frontend's does (held), or is a Python loop "
        "that lets other threads in every 5 ms (loop: every result of this benchmark before stop 71)",
    )
    parser.add_argument(
        "--door",
        choices=("cudnn", "compile", "stored"),
        default="cudnn",
        help="plancache.cudnn's build step (cudnn), or one Client.compile per graph (compile), both hedged misses; or "
        "plancache.cudnn's build step with every plan stored (stored: each process's one run of the 13 graphs)",
    )
    parser.add_argument(
        "--pause-ms",
        type=float,
        action="append",
        help="a sleep after each graph, the program's work between them (repeatable: each arm at each; default 0)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--tag", default="")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import plancache

        found = measure(args.rounds, args.build_ms, args.build_gil, args.door, (args.pause_ms or [0.0])[0])
        print(json.dumps({**found, "client": plancache.__file__}))
        return
    arms = dict(arm.split("=", 1) for arm in args.arm) or {"shipped": str(REPO / "client" / "src")}
    pauses = tuple(args.pause_ms or [0.0])
    results = run(arms, args.processes, args.rounds, args.build_ms, args.build_gil, args.door, pauses)
    report(results, args.out, args.tag)


if __name__ == "__main__":
    main()

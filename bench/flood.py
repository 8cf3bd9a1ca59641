"""One client floods, the others must not notice (issue 44; CPU, stand-in compiler).

One plancache-server (gateway, one stand-in worker of --build-seconds per
build, a private Redis) with a tokens file: the honest nodes share one
compile token (one caller: one token on one host) unless --honest-tokens
gives them several (node n uses token n mod N: N callers, as N hosts of a
fleet would be), the flooder has its own. Honest nodes (--honest coroutines on
grpc.aio, each its own channel, in a child process of their own) read
stored plans (GetPlan of --plans plans, one call after another) and, every
--compile-every seconds each, compile a new graph (Compile, waited for). After
--idle-s of that alone, a flooder (another child process, which made every
request before the honest nodes started) does, all at once:

- split prefetch: 11 parallel Prefetch(compile_missing) calls of 3,000 new specs each, read to the end;
- abandoned compiles: 70 Compiles of distinct new specs with a 0.5 s deadline;
- unread streams: 70 Prefetch(compile_missing) calls of 200 new specs, never read, held open;
- a 1e5-key prefetch: 10 Prefetch calls of 10,000 plan keys (not stored);
- 1,000 distinct compiles at once (10 s deadline).

on one connection, or dealt among --flood-connections of them (the service bounds the calls under way per
connection; a caller's shares, per token, hold above that).

Measured per phase (idle, flood, after): the honest GetPlan latency
(p50/p99/max), calls a second, and every honest error; the flooder's
outcomes by status code; after the flood: the jobs left in the queue, the
jobs dropped as abandoned, what the worker built, the server's RSS; and the
CPU each process used (cores: gateway, worker, Redis, the honest nodes, the
flooder), since on one machine a flooder's own process takes CPU from every
other one whatever the service does.

With --burn-cores C --burn-seconds S the flooder sends nothing: a process
burns C cores for S seconds instead (the flooder's own CPU, measured by a
flood run). What the honest nodes lose to that is the machine's share of a
flood; what they lose beyond it in a flood run is the service's.

    python bench/flood.py [--out bench/results] [--honest 50] [--quick]
    python bench/flood.py --burn-cores 0.6 --burn-seconds 60

Writes flood.json and flood.png to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import multiprocessing
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import redis as redis_py

from bench.cpu_bench import TARGET, spec_for
from bench.procs import children, cpu_seconds, tree_cpu_seconds
from bench.report import percentile, write_json
from plancache.keys.query import PlanQuery
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache_server.store import keys as store_keys
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.processes import REPO, STANDIN_SERVER_ARGS, child_env, server_process

TEMPLATE = PlanQuery.of(spec_for(0), TARGET).to_proto()
OPTIONS = [("grpc.max_receive_message_length", 64 * 2**20), ("grpc.max_send_message_length", 64 * 2**20)]


def query(i: int) -> pb.PlanQuery:
    """A distinct matmul query (A's rows = 64 + i), made by patching one template (cheap for 1e5 of them)."""
    q = pb.PlanQuery()
    q.CopyFrom(TEMPLATE)
    rows = 64 + i
    for t in q.spec.tensors:
        if t.uid in (1, 3):
            t.dim[1] = rows
            t.stride[0] = rows * t.dim[2]
    return q


def compile_request(i: int) -> pb.CompileRequest:
    q = query(i)
    return pb.CompileRequest(spec=q.spec, target=q.target, options=q.options)


def status_of(e: BaseException) -> str:
    if not isinstance(e, grpc.aio.AioRpcError):
        return type(e).__name__
    if e.code() == grpc.StatusCode.UNAVAILABLE:  # which: the service's answer, or HTTP/2 refusing a stream
        return f"UNAVAILABLE ({(e.details() or '')[:120]})"
    return str(e.code().name)


# ---- the honest nodes (a child process) ----------------------------------------------------------


async def honest_child(cfg: dict[str, Any]) -> dict[str, Any]:
    tokens: list[str] = cfg["tokens"]
    keys: list[str] = cfg["keys"]
    samples: list[tuple[float, float, str]] = []  # (wall time, latency s, status) per GetPlan
    compiles: list[tuple[float, float, str]] = []
    stop_file = Path(cfg["stop_file"])
    stopped = asyncio.Event()

    async def watch() -> None:
        while not stop_file.exists():
            await asyncio.sleep(0.2)
        stopped.set()

    async def node(n: int) -> None:
        """A node reads stored plans, one call after another; beside that, it compiles a new graph every
        compile_every seconds (waited for, as a program's first use of a graph is)."""
        metadata = (("authorization", f"Bearer {tokens[n % len(tokens)]}"),)
        async with grpc.aio.insecure_channel(cfg["address"], options=OPTIONS) as channel:
            stub = pb_grpc.PlanCacheStub(channel)

            async def reads() -> None:
                i = n
                while not stopped.is_set():
                    key = keys[i % len(keys)]
                    i += 1
                    started = time.time()
                    try:
                        await stub.GetPlan(pb.GetPlanRequest(ref=pb.PlanRef(key=key)), timeout=10, metadata=metadata)
                        status = "OK"
                    except grpc.aio.AioRpcError as e:
                        status = status_of(e)
                    samples.append((started, time.time() - started, status))

            async def compiles_() -> None:
                await asyncio.sleep(cfg["compile_every"] * n / cfg["honest"])
                made = 0
                while not stopped.is_set():
                    spec_index = cfg["compile_base"] + n * 10_000 + made
                    made += 1
                    started = time.time()
                    try:
                        await stub.Compile(compile_request(spec_index), timeout=30, metadata=metadata)
                        status = "OK"
                    except grpc.aio.AioRpcError as e:
                        status = status_of(e)
                    compiles.append((started, time.time() - started, status))
                    await asyncio.sleep(max(0.0, started + cfg["compile_every"] - time.time()))

            await asyncio.gather(reads(), compiles_())

    await asyncio.gather(watch(), *(node(n) for n in range(cfg["honest"])))
    return {"samples": samples, "compiles": compiles}


# ---- the flooder (a child process) ------------------------------------------------------------------


async def flood_child(cfg: dict[str, Any]) -> dict[str, Any]:
    metadata = (("authorization", f"Bearer {cfg['token']}"),)
    outcomes: dict[str, Counter[str]] = {}
    base = cfg["flood_base"]
    scale = cfg["scale"]

    def count(what: str, status: str, n: int = 1) -> None:
        outcomes.setdefault(what, Counter())[status] += n

    # Every request is made before the flood starts: building ~150,000 protobuf refs is ~1-2 s of this process's
    # CPU, which on a machine shared with the service would land in the flood's first second as the client's own
    # burst, not the service's answer to it (a flooder elsewhere spends it on its own CPUs).
    prepare_started = time.process_time()
    split_n, key_n, unread_n = int(3000 * scale), int(10_000 * scale), int(200 * scale)
    split_requests = [
        pb.PrefetchRequest(
            refs=[pb.PlanRef(query=query(base + p * split_n + j)) for j in range(split_n)], compile_missing=True
        )
        for p in range(11)
    ]
    abandoned_requests = [compile_request(base + 50_000 + j) for j in range(70)]
    unread_requests = [
        pb.PrefetchRequest(
            refs=[pb.PlanRef(query=query(base + 60_000 + j * 200 + k)) for k in range(unread_n)], compile_missing=True
        )
        for j in range(70)
    ]
    key_requests = [
        pb.PrefetchRequest(refs=[pb.PlanRef(key=f"sm_90/bogus/{p}/{j}") for j in range(key_n)]) for p in range(10)
    ]
    distinct_requests = [compile_request(base + 80_000 + j) for j in range(int(1000 * scale))]
    prepare_cpu_s = time.process_time() - prepare_started
    cpu_started = time.process_time()

    # --flood-connections: each its own TCP connection (a local subchannel pool: channels with equal arguments
    # would otherwise share one), the calls dealt round robin.
    connections = int(cfg.get("connections", 1))
    async with contextlib.AsyncExitStack() as channels:
        stubs = [
            pb_grpc.PlanCacheStub(
                await channels.enter_async_context(
                    grpc.aio.insecure_channel(
                        cfg["address"], options=[*OPTIONS, ("grpc.use_local_subchannel_pool", 1), ("flood.c", c)]
                    )
                )
            )
            for c in range(connections)
        ]
        dealt = itertools.count()

        def next_stub() -> pb_grpc.PlanCacheStub:
            return stubs[next(dealt) % connections]

        async def split_prefetch(request: pb.PrefetchRequest) -> None:
            try:
                async for item in next_stub().Prefetch(request, timeout=60, metadata=metadata):
                    count("split prefetch refs", item.error.code if item.HasField("error") else "OK")
            except grpc.aio.AioRpcError as e:
                count("split prefetch calls", status_of(e))

        async def abandoned(request: pb.CompileRequest) -> None:
            try:
                await next_stub().Compile(request, timeout=0.5, metadata=metadata)
                count("abandoned compiles", "OK")
            except grpc.aio.AioRpcError as e:
                count("abandoned compiles", status_of(e))

        async def unread(request: pb.PrefetchRequest, hold_s: float) -> None:
            call = next_stub().Prefetch(request, timeout=60, metadata=metadata)
            await asyncio.sleep(hold_s)  # never read
            call.cancel()
            count("unread streams", "held, then cancelled")

        async def key_prefetch(request: pb.PrefetchRequest) -> None:
            try:
                async for item in next_stub().Prefetch(request, timeout=60, metadata=metadata):
                    count("1e5-key prefetch refs", item.error.code if item.HasField("error") else "OK")
            except grpc.aio.AioRpcError as e:
                count("1e5-key prefetch calls", status_of(e))

        async def distinct(request: pb.CompileRequest) -> None:
            try:
                await next_stub().Compile(request, timeout=10, metadata=metadata)
                count("distinct compiles", "OK")
            except grpc.aio.AioRpcError as e:
                count("distinct compiles", status_of(e))

        # Connected first: its client has the server's settings (100 streams a connection) and queues the calls
        # past them itself, so every call reaches the service in turn (before the settings arrive, the calls past
        # the bound are refused by HTTP/2 at once, UNAVAILABLE, and the service never sees them).
        for stub in stubs:
            await stub.GetPlan(pb.GetPlanRequest(ref=pb.PlanRef(key=cfg["keys"][0])), timeout=10, metadata=metadata)
        await ready_then_go(cfg)
        started = time.time()
        await asyncio.gather(
            *(split_prefetch(r) for r in split_requests),
            *(abandoned(r) for r in abandoned_requests),
            *(unread(r, cfg["hold_s"]) for r in unread_requests),
            *(key_prefetch(r) for r in key_requests),
            *(distinct(r) for r in distinct_requests),
        )
    return {
        "outcomes": {k: dict(v) for k, v in outcomes.items()},
        "started": started,
        "ended": time.time(),
        "cpu_s": time.process_time() - cpu_started,
        "prepare_cpu_s": prepare_cpu_s,
    }


def _burn(duty: float, seconds: float) -> None:
    """Busy for `duty` of every 10 ms, for `seconds`."""
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        busy_until = now + 0.01 * duty
        while time.perf_counter() < busy_until:
            pass
        time.sleep(0.01 * (1 - duty))


async def burn_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """The flooder's CPU without its calls: cfg["burn_cores"] cores for cfg["burn_seconds"]."""
    cores, seconds = cfg["burn_cores"], cfg["burn_seconds"]
    n = max(1, math.ceil(cores))
    await ready_then_go(cfg)
    started = time.time()
    burners = [multiprocessing.Process(target=_burn, args=(cores / n, seconds)) for _ in range(n)]
    for b in burners:
        b.start()
    for b in burners:
        await asyncio.to_thread(b.join)
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "outcomes": {},
        "started": started,
        "ended": time.time(),
        "cpu_s": used.ru_utime + used.ru_stime,
    }


async def ready_then_go(cfg: dict[str, Any]) -> None:
    """The flooder is started before the honest nodes and prepares its requests; it says so, then waits for the
    flood's moment (the parent's go file)."""
    Path(cfg["ready_file"]).touch()
    go = Path(cfg["go_file"])
    while not go.exists():
        await asyncio.sleep(0.005)


def child_main() -> None:
    cfg = json.loads(sys.stdin.readline())
    run = {"honest": honest_child, "flood": flood_child, "burn": burn_child}[cfg["role"]]
    result = asyncio.run(run(cfg))
    Path(cfg["out"]).write_text(json.dumps(result))


# ---- the parent --------------------------------------------------------------------------------------


def spawn(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child"], stdin=subprocess.PIPE, env=child_env(), cwd=REPO, text=True
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(cfg) + "\n")
    proc.stdin.close()
    return proc


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class CpuLedger:
    """CPU used by the gateway, its worker(s), Redis and the honest nodes, read at each phase's edges."""

    def __init__(self, gateway: int, redis: int, honest: int) -> None:
        self.pids = {"gateway": gateway, "redis": redis, "honest": honest}
        self.marks: list[tuple[float, dict[str, float]]] = []

    def mark(self) -> None:
        used = {role: cpu_seconds(pid) for role, pid in self.pids.items()}
        used["honest"] = tree_cpu_seconds(self.pids["honest"])
        used["worker"] = sum(tree_cpu_seconds(pid) for pid in children(self.pids["gateway"]))
        self.marks.append((time.time(), used))

    def cores(self, flooder_cpu_s: float) -> dict[str, dict[str, float]]:
        """Cores per role in each phase between marks (idle, flood, after); the flooder's from its own count."""
        out: dict[str, dict[str, float]] = {}
        for phase, ((t0, a), (t1, b)) in zip(("idle", "flood", "after"), itertools.pairwise(self.marks), strict=False):
            span = t1 - t0
            out[phase] = {role: round((b[role] - a[role]) / span, 3) for role in a}
            out[phase]["flooder"] = round(flooder_cpu_s / span, 3) if phase == "flood" else 0.0
        return out


def phase_of(t: float, flood: tuple[float, float]) -> str:
    return "idle" if t < flood[0] else "flood" if t <= flood[1] else "after"


def summarize(samples: list[list[Any]], flood: tuple[float, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase in ("idle", "flood", "after"):
        rows = [s for s in samples if phase_of(s[0], flood) == phase]
        ok = [s[1] * 1000 for s in rows if s[2] == "OK"]
        span = (max(s[0] for s in rows) - min(s[0] for s in rows)) if len(rows) > 1 else 0.0
        out[phase] = {
            "calls": len(rows),
            "errors": dict(Counter(s[2] for s in rows if s[2] != "OK")),
            "p50_ms": percentile(ok, 50) if ok else None,
            "p99_ms": percentile(ok, 99) if ok else None,
            "max_ms": max(ok) if ok else None,
            "calls_per_s": len(rows) / span if span else None,
        }
    return out


def series(samples: list[list[Any]], start: float) -> list[dict[str, Any]]:
    """Per second from `start` (by when each call started): calls, their p50 and p99 (ms), errors."""
    by_second: dict[int, list[list[Any]]] = {}
    for row in samples:
        by_second.setdefault(int(row[0] - start), []).append(row)
    out = []
    for second in sorted(by_second):
        rows = by_second[second]
        ok = [r[1] * 1000 for r in rows if r[2] == "OK"]
        out.append(
            {
                "t_s": second,
                "calls": len(rows),
                "p50_ms": percentile(ok, 50) if ok else None,
                "p99_ms": percentile(ok, 99) if ok else None,
                "errors": sum(1 for r in rows if r[2] != "OK"),
            }
        )
    return out


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """Honest GetPlan p99 and calls a second over time, one line per run, the flood shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for name, run in runs.items():
        rows = run.get("honest_series") or []
        t = [r["t_s"] for r in rows]
        top.plot(t, [r["p99_ms"] or float("nan") for r in rows], label=name)
        bottom.plot(t, [r["calls"] for r in rows], label=name)
        compiles = run.get("honest_compile_series") or []
        middle.plot([r["t_s"] for r in compiles], [r["p50_ms"] or float("nan") for r in compiles], label=name)
        start = run["series_start"]
        window = run["flood_window"]
        for ax in (top, middle):
            ax.axvspan(window[0] - start, window[1] - start, alpha=0.08)
    top.set_yscale("log")
    top.set_ylabel("honest GetPlan p99 (ms)")
    middle.set_yscale("log")
    middle.set_ylabel("honest Compile p50 (ms)")
    bottom.set_ylabel("honest GetPlan calls / s")
    bottom.set_xlabel("seconds (the flood shaded)")
    top.legend(fontsize=8)
    fig.suptitle("One client floods while 50 honest nodes read stored plans (2-core CPU machine)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--honest", type=int, default=50)
    parser.add_argument("--honest-tokens", type=int, default=1, help="distinct callers among the honest nodes")
    parser.add_argument("--plans", type=int, default=20)
    parser.add_argument("--build-seconds", type=float, default=0.02)
    parser.add_argument("--compile-every", type=float, default=2.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--after-s", type=float, default=10.0)
    parser.add_argument("--hold-s", type=float, default=15.0, help="how long the unread streams stay open")
    parser.add_argument("--server-arg", action="append", default=[], help="one more plancache-server argument")
    parser.add_argument("--quick", action="store_true", help="a tenth of the flood, short phases (the smoke test)")
    parser.add_argument(
        "--flood-connections", type=int, default=1, help="the flooder's TCP connections, its calls dealt among them"
    )
    parser.add_argument("--burn-cores", type=float, default=0.0, help="no flood: burn this many cores instead")
    parser.add_argument("--burn-seconds", type=float, default=60.0, help="how long --burn-cores burns")
    args = parser.parse_args()
    if args.child:
        child_main()
        return
    scale = 0.1 if args.quick else 1.0
    if args.quick:
        args.idle_s, args.after_s, args.hold_s, args.honest = 3.0, 3.0, 3.0, min(args.honest, 10)
    tmp = Path(tempfile.mkdtemp(prefix="plancache-flood-"))
    flood_token, admin_token = (secrets.token_hex(16) for _ in range(2))
    honest_tokens = [secrets.token_hex(16) for _ in range(max(1, args.honest_tokens))]
    tokens = tmp / "tokens"
    tokens.write_text(
        "".join(f"compile {t}\n" for t in honest_tokens) + f"compile {flood_token}\nadmin {admin_token}\n"
    )
    tokens.chmod(0o600)
    redis_server = EmbeddedRedis(tmp / "redis", persist=False).start()
    address = f"127.0.0.1:{free_port()}"
    env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS=str(args.build_seconds))
    try:
        with server_process(
            address,
            redis_server.url,
            tmp / "server.log",
            *STANDIN_SERVER_ARGS,
            "--tokens-file",
            str(tokens),
            "--targets",
            TARGET.id,
            *args.server_arg,
            env=env,
            token=admin_token,
        ) as server:
            admin = (("authorization", f"Bearer {admin_token}"),)
            channel = grpc.insecure_channel(address, options=OPTIONS)
            stub = pb_grpc.PlanCacheStub(channel)
            deadline = time.time() + 60
            while True:  # the worker is up when a compile is answered
                try:
                    keys = [
                        stub.Compile(compile_request(i), timeout=30, metadata=admin).plan.metadata.key
                        for i in range(args.plans)
                    ]
                    break
                except grpc.RpcError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.5)
            rss_before = rss_mb(server.pid)
            common = {"address": address, "keys": keys, "scale": scale}
            # The flooder first: it makes its requests, says it is ready, and floods when told (go file).
            flooder = spawn(
                {
                    **common,
                    "role": "burn" if args.burn_cores else "flood",
                    "token": flood_token,
                    "hold_s": args.hold_s,
                    "flood_base": 2_000_000,
                    "burn_cores": args.burn_cores,
                    "burn_seconds": args.burn_seconds,
                    "connections": args.flood_connections,
                    "ready_file": str(tmp / "flooder-ready"),
                    "go_file": str(tmp / "flood-now"),
                    "out": str(tmp / "flood.json"),
                }
            )
            while not (tmp / "flooder-ready").exists():
                if flooder.poll() is not None:
                    raise RuntimeError("the flooder ended before it was ready")
                time.sleep(0.05)
            flood_at = time.time() + 2 + args.idle_s
            honest = spawn(
                {
                    **common,
                    "role": "honest",
                    "tokens": honest_tokens,
                    "honest": args.honest,
                    "compile_every": args.compile_every,
                    "compile_base": 1_000_000,
                    "stop_file": str(tmp / "stop"),
                    "out": str(tmp / "honest.json"),
                }
            )
            store = redis_py.Redis.from_url(redis_server.url)
            ledger = CpuLedger(server.pid, int(store.info("server")["process_id"]), honest.pid)
            time.sleep(2)  # the honest nodes connected
            ledger.mark()
            time.sleep(max(0.0, flood_at - time.time()))
            ledger.mark()
            (tmp / "flood-now").touch()
            peak_rss = rss_before
            while flooder.poll() is None:
                peak_rss = max(peak_rss, rss_mb(server.pid))
                time.sleep(0.5)
            flood_end = time.time()
            ledger.mark()
            time.sleep(args.after_s)
            ledger.mark()
            (tmp / "stop").touch()
            honest.wait(timeout=60)
            flood = json.loads((tmp / "flood.json").read_text())
            nodes = json.loads((tmp / "honest.json").read_text())
            stats = stub.GetStats(pb.GetStatsRequest(), timeout=10, metadata=admin)
            row = next((t for t in stats.targets if t.target_id == TARGET.id), None)
            queue_after = int(store.xlen(store_keys.job_stream(TARGET)))
            rss_after = rss_mb(server.pid)
        results = {
            "config": {k: v for k, v in vars(args).items() if k != "out"} | {"scale": scale},
            "flooder": flood,
            "queue_after": queue_after,
            "abandoned": row.abandoned if row else 0,
            "compiles": row.compiles if row else 0,
            "rss_mb": {"before": rss_before, "peak": peak_rss, "after": rss_after},
            "cpu_cores": ledger.cores(flood["cpu_s"]),
            "flood_window": [flood["started"], flood_end],
            "honest_getplan": summarize(nodes["samples"], (flood["started"], flood_end)),
            "series_start": min(row[0] for row in nodes["samples"]),
            "honest_series": series(nodes["samples"], min(row[0] for row in nodes["samples"])),
            "honest_compile": summarize(nodes["compiles"], (flood["started"], flood_end)),
            "honest_compile_series": series(nodes["compiles"], min(row[0] for row in nodes["samples"])),
        }
    finally:
        redis_server.stop()
    write_json(args.out / "flood.json", results)
    before = args.out / "flood_before.json"  # the same run on main before issue 44, when kept beside it
    runs = {"now": results} | ({"before (main at 3d4e5fc)": json.loads(before.read_text())} if before.exists() else {})
    plot(runs, args.out / "flood.png")
    print(json.dumps(results, indent=1)[:4000])


if __name__ == "__main__":
    main()

"""Rollout herd (CPU; plans from the STAND-IN compiler, signed): N fleet nodes
start a new model at once and each needs the same K plans, none stored yet.

One gateway (plancache-server), ONE compile worker (stand-in builds of
--build-seconds each) and a private Redis, on loopback. The nodes are
coroutines on grpc.aio in --processes child processes (at --client-nice),
each node with its own channel (its own TCP connection), all starting at one
wall-clock instant. A node does with each plan what plancache.Client does:
decodes it, checks the blob's sha256 and the worker's signature, and asks
again for refs the server refused for now (RESOURCE_EXHAUSTED with a retry
delay, after the client's jittered pause). Coroutines rather than threads
running the blocking Client: 250 threads a process spent the machine's CPU
on the GIL rather than on the plans (measured: 0.47 ms of client CPU per
plan against 0.11 ms on the server), and on one 2-core machine that CPU is
the server's. Variants, each with its own K new specs:

- prefetch: every node makes one Prefetch call (compile_missing) for the K plans;
- compile:  every node calls Compile once per plan, sequentially, in its own
            random order;
- burst:    --burst simultaneous Compile calls (grpc.aio) of ONE new spec;
- compile-hedged: compile as a hedged client asks (issue 29): each miss answered
            at once (answer_miss_at_once), then a second Compile (counted) that
            waits for the same build: two calls per miss, one build per key.

Measured: builds per key (the stand-in's build log, PLANCACHE_STANDIN_BUILD_LOG),
errors by status code, each node's time to all its plans against the end of the
last build, and the latency of a probe process that fetches an already stored
plan every --probe-interval seconds (open loop), idle (before the herd) and
during it: a herd must not stall readers of stored plans.

    make herd                                  # writes bench/results/herd.{json,png}
    python bench/herd.py --quick --out DIR     # a short run (the smoke test)
    python bench/herd.py --nodes 300 --variants prefetch
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from bench.cpu_bench import TARGET, spec_for
from bench.report import figure, percentile, save, table, write_json
from plancache import Client, CompileOptions, Plan, PlanCacheError
from plancache.graphspec import spec_io
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.validation import normalize
from plancache.run.plan import SOURCE_NAMES
from plancache.transport.calls import retry_pause as _retry_pause
from plancache.trust.signing import TrustPolicy
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc
from plancache.wire.rich_status import error_of, seconds_of
from tests.support.processes import REPO, child_env, server_process, wait_for_workers, worker_process

VARIANTS = ("prefetch", "compile", "burst", "compile-hedged")
DEFAULT_VARIANTS = ("prefetch", "compile", "burst")  # compile-hedged on request: `--variants compile,compile-hedged`
# Spec shapes per variant (bench.cpu_bench.spec_for(offset + i)): disjoint, so
# nothing a variant needs is stored before it starts.
SPEC_OFFSETS = {"prefetch": 1000, "compile": 2000, "burst": 3000, "compile-hedged": 4000}
PROBE_SPEC = 900
# Every node its own TCP connection: no subchannel shared between channels.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 * 2**20)]
BURST_CALLS_PER_CHANNEL = 20
PROBE_THREADS = 256  # the probe is open loop: a stalled probe does not delay the next one
TAIL_S = 1.0  # probing after the herd ends
FULL = {"nodes": 1000, "plans": 13, "build_seconds": 1.0, "processes": 4, "burst": 2000, "idle_seconds": 5.0}
QUICK = {"nodes": 20, "plans": 3, "build_seconds": 0.2, "processes": 2, "burst": 100, "idle_seconds": 2.0}
PROBE_P99_MAX_MS = 20.0


# ---- common -----------------------------------------------------------------


def raise_nofile() -> None:
    """Open-file limit to the hard limit: many channels, many sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


def spec_hash(offset: int) -> str:
    return hash_normalized(normalize(spec_for(offset)))


def error_name(e: BaseException) -> tuple[str, str]:
    """(gRPC status code name, error class) of a failure."""
    if isinstance(e, PlanCacheError):
        return e.code.name, type(e).__name__
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        return e.code().name, type(e).__name__
    return "CLIENT_ERROR", type(e).__name__


def remaining(deadline: float) -> float:
    """Seconds to a wall-clock deadline, at least 0.1 (a call still gets a deadline)."""
    return max(0.1, deadline - time.time())


def wait_for_start(start: float) -> None:
    while (left := start - time.time()) > 0:
        time.sleep(min(left, 0.05))


# ---- child processes (run as `herd.py --child CONFIG`) ----------------------


def child_main(config_path: Path) -> None:
    cfg = json.loads(config_path.read_text())
    raise_nofile()
    if cfg.get("nice"):
        os.nice(cfg["nice"])
    role = cfg["role"]
    if role == "probe":
        probe_child(cfg)
    elif role == "burst":
        asyncio.run(burst_child(cfg))
    else:
        node_child(cfg)


def ready_then_start() -> float:
    """Tell the parent this process is ready; block until it sends the start time."""
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("parent went away before the start")
    return float(json.loads(line)["start"])


def node_child(cfg: dict[str, Any]) -> None:
    asyncio.run(nodes_child(cfg))


class Node:
    """One fleet node: its own channel, the client's checks on every plan."""

    def __init__(self, node_id: int, channel: grpc.aio.Channel, trust: TrustPolicy) -> None:
        self.node_id = node_id
        self.stub = pb_grpc.PlanCacheStub(channel)
        self.trust = trust
        self.plans = 0
        self.codes: Counter[str] = Counter()
        self.classes: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def accept(self, plan: pb.Plan, source: int) -> None:
        checked = Plan.from_proto(plan, SOURCE_NAMES.get(source, "stored"))  # the blob's sha256
        self.trust.check(checked.metadata, checked.signature)  # the worker's signature
        self.plans += 1

    def failed(self, code: str, cls: str, message: str) -> None:
        self.codes[code] += 1
        self.classes[cls] += 1
        self.examples.setdefault(code, message)

    async def prefetch(self, refs: list[pb.PlanRef], deadline: float) -> None:
        attempt = 0
        while refs:
            refused: list[pb.PlanRef] = []
            delay = 0.0
            call = self.stub.Prefetch(pb.PrefetchRequest(refs=refs, compile_missing=True), timeout=remaining(deadline))
            async for item in call:
                if item.WhichOneof("result") == "plan":
                    self.accept(item.plan, item.source)
                elif item.error.HasField("retry_delay"):
                    refused.append(refs[item.index])
                    delay = max(delay, seconds_of(item.error.retry_delay))
                else:
                    self.failed(item.error.code, item.error.error_class, item.error.message)
            pause = _retry_pause(delay, attempt, time.monotonic() + remaining(deadline)) if refused else None
            if refused and pause is None:
                for _ in refused:
                    self.failed("RESOURCE_EXHAUSTED", "ResourceExhausted", "refused until the deadline")
                return
            if pause is not None:
                await asyncio.sleep(pause)
            refs, attempt = refused, attempt + 1

    async def compile(self, request: pb.CompileRequest, deadline: float, hedged: bool = False) -> None:
        """As Client.compile; `hedged`: as a hedged Client asks (plancache.transport.hedge): a miss
        answered at once (answer_miss_at_once), then a second Compile (counted) waits for that build
        (the node's own build, meanwhile in a real node, is not played: the server's load is measured)."""
        attempt = 0
        if hedged:
            request.answer_miss_at_once = True
        while True:
            try:
                response = await self.stub.Compile(request, timeout=remaining(deadline))
                if response.source == pb.COMPILE_SOURCE_BUILDING:
                    request.answer_miss_at_once, request.counted = False, True
                    continue
            except grpc.aio.AioRpcError as e:
                error = error_of(e.code(), e.details() or "", e.trailing_metadata())
                pause = _retry_pause(error.retry_after, attempt, time.monotonic() + remaining(deadline))
                if pause is None:
                    self.failed(e.code().name, type(error).__name__, error.message)
                    return
                await asyncio.sleep(pause)
                attempt += 1
                continue
            self.accept(response.plan, response.source)
            return


async def nodes_child(cfg: dict[str, Any]) -> None:
    """`cfg["nodes"]` nodes, one coroutine and one channel each; prefetch or compile."""
    deadline, variant = cfg["deadline"], cfg["role"]
    trust = TrustPolicy.create([cfg["public_key"]], allow_unsigned=False)
    queries = [
        pb.PlanQuery(
            spec=spec_io.to_proto(normalize(spec_for(cfg["spec_offset"] + i))),
            target=TARGET.to_proto(),
            options=CompileOptions().to_proto(),
        )
        for i in range(cfg["plans"])
    ]
    channels = [grpc.aio.insecure_channel(cfg["address"], options=CHANNEL_OPTIONS) for _ in range(cfg["nodes"])]
    try:
        await asyncio.wait_for(asyncio.gather(*(ch.channel_ready() for ch in channels)), timeout=remaining(deadline))
        nodes = [Node(cfg["first_node"] + i, ch, trust) for i, ch in enumerate(channels)]
        start = await asyncio.get_running_loop().run_in_executor(None, ready_then_start)
        await asyncio.sleep(max(0.0, start - time.time()))
        results: list[dict[str, Any]] = []

        async def run(node: Node) -> None:
            try:
                if variant == "prefetch":
                    await node.prefetch([pb.PlanRef(query=q) for q in queries], deadline)
                else:
                    order = list(range(len(queries)))
                    random.Random(cfg["seed"] * 1_000_003 + node.node_id).shuffle(order)
                    for i in order:
                        q = queries[i]
                        await node.compile(
                            pb.CompileRequest(spec=q.spec, target=q.target, options=q.options),
                            deadline,
                            hedged=variant == "compile-hedged",
                        )
            except grpc.aio.AioRpcError as e:
                node.failed(e.code().name, "AioRpcError", e.details() or "")
            except Exception as e:
                node.failed("CLIENT_ERROR", type(e).__name__, str(e))
            results.append(
                {
                    "node": node.node_id,
                    "done": time.time(),
                    "plans": node.plans,
                    "codes": dict(node.codes),
                    "classes": dict(node.classes),
                }
            )

        await asyncio.gather(*(run(node) for node in nodes))
        examples: dict[str, str] = {}
        for node in nodes:
            for code, message in node.examples.items():
                examples.setdefault(code, message)
        Path(cfg["out"]).write_text(json.dumps({"start": start, "nodes": results, "examples": examples}))
    finally:
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)


async def burst_child(cfg: dict[str, Any]) -> None:
    """`cfg["calls"]` Compile calls of one spec, all fired at the start time."""
    deadline = cfg["deadline"]
    request = pb.CompileRequest(
        spec=spec_io.to_proto(normalize(spec_for(cfg["spec_offset"]))), target=TARGET.to_proto()
    )
    count = cfg["calls"]
    channels = [
        grpc.aio.insecure_channel(cfg["address"], options=CHANNEL_OPTIONS)
        for _ in range(max(1, -(-count // BURST_CALLS_PER_CHANNEL)))
    ]
    stubs = [pb_grpc.PlanCacheStub(ch) for ch in channels]
    try:
        await asyncio.wait_for(asyncio.gather(*(ch.channel_ready() for ch in channels)), timeout=remaining(deadline))
        start = await asyncio.get_running_loop().run_in_executor(None, ready_then_start)
        await asyncio.sleep(max(0.0, start - time.time()))

        async def call(i: int) -> tuple[str, float]:
            try:
                await stubs[i % len(stubs)].Compile(request, timeout=remaining(deadline))
                code = "OK"
            except grpc.aio.AioRpcError as e:
                code = e.code().name
                examples.setdefault(code, e.details() or "")
            except Exception as e:
                code = f"CLIENT_ERROR:{type(e).__name__}"
                examples.setdefault(code, str(e))
            return code, time.time()

        examples: dict[str, str] = {}
        outcomes = await asyncio.gather(*(call(i) for i in range(count)))
        calls = [{"code": c, "done": d} for c, d in outcomes]
        Path(cfg["out"]).write_text(json.dumps({"start": start, "calls": calls, "examples": examples}))
    finally:
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)


def probe_child(cfg: dict[str, Any]) -> None:
    """GetPlan of a stored plan every `interval` s (open loop) from "go" until
    stdin closes; writes (scheduled wall time, latency s, status) per probe."""
    deadline, interval, key = cfg["deadline"], cfg["interval"], cfg["key"]
    channel = grpc.insecure_channel(cfg["address"], options=CHANNEL_OPTIONS)
    client = Client(channel, cache=False, trusted_keys=[cfg["public_key"]], allow_unsigned=False)
    client.get(key, timeout=30)  # connected, and the plan is there
    samples: list[tuple[float, float, str]] = []
    lock = threading.Lock()
    stop = threading.Event()
    ready_then_start()  # "go": the idle phase starts now

    def watch_stdin() -> None:
        sys.stdin.read()  # until the parent closes it
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    def probe(scheduled: float) -> None:
        try:
            client.get(key, timeout=min(cfg["call_timeout"], remaining(deadline)))
            status = "OK"
        except Exception as e:
            status = error_name(e)[0]
        with lock:
            samples.append((scheduled, time.time() - scheduled, status))

    pool = ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="probe")
    pending: list[tuple[float, Future[None]]] = []
    tick = time.time()
    while not stop.is_set() and time.time() < deadline:
        pending.append((tick, pool.submit(probe, tick)))
        tick += interval
        if tick < time.time() - interval:  # this process was not scheduled: skip the ticks it missed
            tick = time.time()
        stop.wait(max(0.0, tick - time.time()))
    # Wait for probes still in flight, bounded; those left count as unfinished.
    wait_futures([f for _, f in pending], timeout=min(cfg["call_timeout"], max(0.0, deadline - time.time())))
    now = time.time()
    with lock:
        rows = list(samples) + [(t, now - t, "UNFINISHED") for t, f in pending if not f.done()]
    Path(cfg["out"]).write_text(json.dumps({"samples": sorted(rows)}))
    sys.stdout.flush()
    os._exit(0)  # in-flight probes (if any) need not be joined


# ---- the parent ---------------------------------------------------------------


class Children:
    """Child processes of one variant; every one is killed on exit."""

    def __init__(self, tmp: Path, variant: str) -> None:
        self.tmp, self.variant = tmp, variant
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def spawn(self, name: str, cfg: dict[str, Any]) -> subprocess.Popen[bytes]:
        out = self.tmp / f"{self.variant}-{name}.json"
        config = self.tmp / f"{self.variant}-{name}.config.json"
        config.write_text(json.dumps({**cfg, "out": str(out)}))
        with open(self.tmp / f"{self.variant}-{name}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--child", str(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=child_env(),
                cwd=REPO,
            )
        self.procs.append((name, proc, out))
        return proc

    def wait_ready(self, deadline: float) -> None:
        for name, proc, _ in self.procs:
            assert proc.stdout is not None
            readable, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))
            line = proc.stdout.readline().decode().strip() if readable else ""
            if line != "ready":
                raise RuntimeError(
                    f"{self.variant}: child {name} did not get ready; see {self.tmp / f'{self.variant}-{name}.log'}"
                )

    def send(self, proc: subprocess.Popen[bytes], message: dict[str, Any] | None) -> None:
        """A line to the child's stdin; None closes it."""
        assert proc.stdin is not None
        try:
            if message is None:
                proc.stdin.close()
            else:
                proc.stdin.write((json.dumps(message) + "\n").encode())
                proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def join(self, procs: list[subprocess.Popen[bytes]], deadline: float) -> bool:
        """Wait for `procs` to exit, until the wall-clock deadline; False if it passed."""
        while any(p.poll() is None for p in procs):
            if time.time() > deadline:
                return False
            time.sleep(0.05)
        return True

    def output(self, name: str) -> dict[str, Any] | None:
        path = next(out for n, _, out in self.procs if n == name)
        return json.loads(path.read_text()) if path.exists() else None

    def kill_all(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except (BrokenPipeError, OSError):
                        pass


def read_builds(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def share(total: int, parts: int) -> list[int]:
    """`total` split into `parts` near-equal counts (none empty)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_variant(variant: str, args: argparse.Namespace, ctx: dict[str, Any], deadline: float) -> dict[str, Any]:
    """One herd; deadline is wall clock (time.time())."""
    tmp = ctx["tmp"]
    offset = SPEC_OFFSETS[variant]
    plans = 1 if variant == "burst" else args.plans
    hashes = [spec_hash(offset + i) for i in range(plans)]
    common = {"address": ctx["address"], "public_key": ctx["public_key"], "deadline": deadline, "seed": args.seed}
    children = Children(tmp, variant)
    load_before = os.getloadavg()[0]
    try:
        probe = children.spawn(
            "probe",
            {
                **common,
                "role": "probe",
                "key": ctx["probe_key"],
                "interval": args.probe_interval,
                "call_timeout": args.call_timeout,
            },
        )
        workers: list[subprocess.Popen[bytes]] = []
        first = 0
        for i, n in enumerate(share(args.burst if variant == "burst" else args.nodes, args.processes)):
            cfg = {**common, "role": variant, "spec_offset": offset, "plans": plans, "nice": args.client_nice}
            cfg.update({"calls": n} if variant == "burst" else {"nodes": n, "first_node": first})
            workers.append(children.spawn(f"nodes{i}", cfg))
            first += n
        children.wait_ready(min(deadline, time.time() + 180))
        probe_started = time.time()
        children.send(probe, {"start": probe_started})
        time.sleep(args.idle_seconds)
        start = time.time() + 0.3  # every process has it before it comes
        for w in workers:
            children.send(w, {"start": start})
        finished = children.join(workers, deadline + 15)
        herd_done = time.time()
        time.sleep(TAIL_S)
        children.send(probe, None)
        children.join([probe], max(deadline, time.time()) + args.call_timeout + 15)
        outputs = [children.output(f"nodes{i}") for i in range(len(workers))]
        probe_out = children.output("probe")
    finally:
        children.kill_all()
    builds = [b for b in read_builds(ctx["build_log"]) if b["spec_hash"] in set(hashes)]
    result = analyse(variant, args, start, herd_done, outputs, probe_out, builds, hashes)
    result.update(
        {
            "timed_out": not finished,
            "load_avg_1m_before": load_before,
            "probe_started_s": probe_started - start,
            "server_alive": ctx["server"].poll() is None,
            "worker_alive": ctx["worker"].poll() is None,
        }
    )
    return result


def latency_summary(samples: list[list[Any]]) -> dict[str, Any]:
    ms = [s[1] * 1e3 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms) if ms else float("nan"),
        "failed": dict(Counter(s[2] for s in samples if s[2] != "OK")),
    }


def analyse(
    variant: str,
    args: argparse.Namespace,
    start: float,
    herd_done: float,
    outputs: list[dict[str, Any] | None],
    probe_out: dict[str, Any] | None,
    builds: list[dict[str, Any]],
    hashes: list[str],
) -> dict[str, Any]:
    """Times relative to the common start (s)."""
    plans = len(hashes)
    codes: Counter[str] = Counter()
    classes: Counter[str] = Counter()
    done_times: list[float] = []
    complete = 0
    expected = args.burst if variant == "burst" else args.nodes
    answered = 0
    examples: dict[str, str] = {}
    for out in outputs:
        if out is None:
            continue
        examples = {**out.get("examples", {}), **examples}
        if variant == "burst":
            for call in out["calls"]:
                answered += 1
                codes[call["code"]] += 1
                done_times.append(call["done"] - start)
                complete += call["code"] == "OK"
        else:
            for node in out["nodes"]:
                answered += 1
                codes.update(node["codes"])
                classes.update(node["classes"])
                done_times.append(node["done"] - start)
                complete += node["plans"] == plans
    if answered < expected:
        codes["NO_ANSWER"] += expected - answered  # a child that failed or ran out of time
    herd_end = max(done_times) if done_times else herd_done - start
    per_key = Counter(b["spec_hash"] for b in builds)
    builds_per_key = [per_key[h] for h in hashes]
    last_build_end = max((b["ended"] for b in builds), default=float("nan")) - start
    samples = [[s[0] - start, s[1], s[2]] for s in (probe_out or {"samples": []})["samples"]]
    idle = [s for s in samples if s[0] < 0]
    during = [s for s in samples if 0 <= s[0] <= herd_end]
    errors = {k: v for k, v in codes.items() if k != "OK"}
    result: dict[str, Any] = {
        "nodes": expected if variant != "burst" else 0,
        "calls": expected
        if variant == "burst"
        else expected * (plans if variant in ("compile", "compile-hedged") else 1),
        "plans_per_node": plans,
        "processes": len(outputs),
        "builds_per_key": builds_per_key,
        "builds_per_key_min": min(builds_per_key),
        "builds_per_key_max": max(builds_per_key),
        "builds_total_s": sum(b["ended"] - b["started"] for b in builds),
        "builds_span_s": (max(b["ended"] for b in builds) - min(b["started"] for b in builds))
        if builds
        else float("nan"),
        "first_build_start_s": min((b["started"] for b in builds), default=float("nan")) - start,
        "last_build_end_s": last_build_end,
        "errors_by_code": errors,
        "errors_by_class": dict(classes),
        "errors_total": sum(errors.values()),
        "error_examples": examples,  # one message per status code
        "complete": complete,
        "time_to_all_s": {"p50": percentile(done_times, 50), "max": max(done_times, default=float("nan"))},
        "herd_end_s": herd_end,
        "last_done_minus_last_build_s": herd_end - last_build_end,
        "probe": {"idle": latency_summary(idle), "during": latency_summary(during)},
        "done_times_s": sorted(round(t, 4) for t in done_times),
        "probe_samples": [[round(t, 4), round(lat * 1e3, 3), status] for t, lat, status in samples],
    }
    if variant == "burst":
        result["codes"] = dict(codes)
    return result


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def targets(name: str, v: dict[str, Any]) -> list[list[Any]]:
    """[measure, value, target, met] rows of one variant."""
    idle99, during99 = v["probe"]["idle"]["p99_ms"], v["probe"]["during"]["p99_ms"]
    gap_target = 1.0 if (v["nodes"] or v["calls"]) <= 300 else 2.0
    who = f"{v['calls']} calls" if name == "burst" else f"{v['nodes']} nodes x {v['plans_per_node']} plans"
    rows = [
        ["herd", who, "-", "-"],
        [
            "builds per key (min-max)",
            f"{v['builds_per_key_min']}-{v['builds_per_key_max']}",
            "1",
            v["builds_per_key_min"] == v["builds_per_key_max"] == 1,
        ],
        ["build time total / wall span (s)", f"{v['builds_total_s']:.2f} / {v['builds_span_s']:.2f}", "-", "-"],
        [
            "errors by status code",
            ", ".join(f"{k} {n}" for k, n in sorted(v["errors_by_code"].items())) or "0",
            "0",
            v["errors_total"] == 0,
        ],
        [
            "call time p50 / max (s)" if name == "burst" else "node time to all plans p50 / max (s)",
            f"{v['time_to_all_s']['p50']:.2f} / {v['time_to_all_s']['max']:.2f}",
            "-",
            "-",
        ],
        [
            "last done - last build end (s)",
            v["last_done_minus_last_build_s"],
            f"<= {gap_target:g}",
            v["last_done_minus_last_build_s"] <= gap_target,
        ],
        [
            "probe p50 / p99 / max idle (ms)",
            " / ".join(_ms(v["probe"]["idle"][k]) for k in ("p50_ms", "p99_ms", "max_ms")),
            "-",
            "-",
        ],
        [
            "probe p50 / p99 / max during (ms)",
            " / ".join(_ms(v["probe"]["during"][k]) for k in ("p50_ms", "p99_ms", "max_ms")),
            f"p99 <= 2x idle, <= {PROBE_P99_MAX_MS:g}",
            during99 <= 2 * idle99 and during99 <= PROBE_P99_MAX_MS,
        ],
    ]
    failed = {**v["probe"]["idle"]["failed"], **{f"{k} (during)": n for k, n in v["probe"]["during"]["failed"].items()}}
    if failed:
        rows.append(["probes failed", ", ".join(f"{k} {n}" for k, n in failed.items()), "0", False])
    if name == "burst":
        codes = v["codes"]
        rows.append(
            [
                "burst codes",
                ", ".join(f"{k} {n}" for k, n in sorted(codes.items())),
                "CANCELLED 0",
                codes.get("CANCELLED", 0) == 0,
            ]
        )
    if v.get("timed_out"):
        rows.append(["finished within its time", "no", "yes", False])
    if not (v.get("server_alive") and v.get("worker_alive")):
        rows.append(["server and worker alive after", "no", "yes", False])
    return rows


def print_report(results: dict[str, Any]) -> None:
    rows = [
        [name if i == 0 else "", *row] for name, v in results["variants"].items() for i, row in enumerate(v["summary"])
    ]
    print(table(["variant", "measure", "value", "target", "met"], rows))


def plot(results: dict[str, Any], path: Path) -> None:
    variants = results["variants"]
    fig, axes = figure(len(variants) + 1)
    from matplotlib.ticker import FuncFormatter

    for ax, (name, v) in zip(axes, variants.items(), strict=False):
        samples = v["probe_samples"]
        ok = [(t, ms) for t, ms, status in samples if status == "OK"]
        bad = [(t, ms) for t, ms, status in samples if status != "OK"]
        ax.scatter([t for t, _ in ok], [ms for _, ms in ok], s=4, label="GetPlan of a stored plan")
        if bad:
            ax.scatter([t for t, _ in bad], [ms for _, ms in bad], s=12, marker="x", color="red", label="failed probe")
        ax.axvline(0, color="green", linestyle="--", label="herd start")
        ax.axvline(v["herd_end_s"], color="black", linestyle="--", label="herd end (last node done)")
        ax.axvline(v["last_build_end_s"], color="orange", linestyle=":", label="last build end")
        ax.axhline(PROBE_P99_MAX_MS, color="red", linewidth=0.8, label=f"{PROBE_P99_MAX_MS:g} ms (p99 target)")
        idle99 = v["probe"]["idle"]["p99_ms"]
        if not math.isnan(idle99):
            ax.axhline(2 * idle99, color="grey", linewidth=0.8, linestyle="--", label="2x idle p99 (target)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.set_xlabel("s from herd start")
        ax.set_ylabel("probe latency (ms)")
        who = (
            f"{v['calls']} Compile calls, 1 spec"
            if name == "burst"
            else f"{v['nodes']} nodes x {v['plans_per_node']} plans"
        )
        ax.set_title(
            f"{name}: {who}; probe p99 idle {_ms(v['probe']['idle']['p99_ms'])} ms, during {_ms(v['probe']['during']['p99_ms'])} ms",
            fontsize=9,
        )
        ax.legend(fontsize=6, loc="upper right")
    ax = axes[len(variants)]
    for name, v in variants.items():
        times = v["done_times_s"]
        if times:
            ax.plot(
                times,
                [(i + 1) / len(times) for i in range(len(times))],
                label=f"{name} (last build end {v['last_build_end_s']:.1f} s)",
            )
    ax.set_xlabel("s from herd start")
    ax.set_ylabel("fraction of nodes (burst: calls) done")
    ax.set_title("time to all plans", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(
        f"rollout herd: {results['config']['build_seconds']} s builds, one worker, {results['machine']['cpus']} cores",
        fontsize=10,
    )
    save(fig, path)


def store_probe_plan(address: str, public_key: str) -> str:
    """A stored plan for the probe: one Compile (one build) before any herd."""
    with Client(address, cache=False, trusted_keys=[public_key], allow_unsigned=False) as client:
        return client.compile(spec_for(PROBE_SPEC), TARGET, timeout=120).key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, help=f"fleet nodes (default {FULL['nodes']})")
    parser.add_argument("--plans", type=int, help=f"plans every node needs (default {FULL['plans']})")
    parser.add_argument(
        "--build-seconds", type=float, help=f"seconds one stand-in build takes (default {FULL['build_seconds']})"
    )
    parser.add_argument(
        "--processes", type=int, help=f"client processes the nodes are spread over (default {FULL['processes']})"
    )
    parser.add_argument(
        "--burst",
        type=int,
        help=f"simultaneous Compile calls of one spec in the burst variant (default {FULL['burst']})",
    )
    parser.add_argument("--idle-seconds", type=float, help=f"probing before the herd (default {FULL['idle_seconds']})")
    parser.add_argument("--probe-interval", type=float, default=0.02)
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument("--call-timeout", type=float, default=60.0, help="deadline of one probe call (s)")
    parser.add_argument(
        "--time-limit", type=float, default=900.0, help="the whole run (s); variants share what is left"
    )
    parser.add_argument(
        "--client-nice",
        type=int,
        default=10,
        help="niceness of the node processes (default 10): the simulated nodes stand for other machines, so on one small machine "
        "they yield the CPU to the server and the probe rather than take it from them; 0 measures them as equals",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--note", default="", help="stored in the JSON")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="a short run (the smoke test)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
        return
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := set(variants) - set(VARIANTS):
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    # SIGTERM, and a backstop past the time limit, unwind through the `finally`s that stop every child.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGALRM, _interrupted)
    signal.alarm(int(args.time_limit) + 60)
    results = run(args, variants)
    for name, v in results["variants"].items():
        v["summary"] = targets(name, v)
    print_report(results)
    write_json(args.out / "herd.json", results)
    plot(results, args.out / "herd.png")
    signal.alarm(0)


def _interrupted(signum: int, frame: Any) -> None:
    raise SystemExit(f"herd: stopped by {signal.Signals(signum).name}")


def run(args: argparse.Namespace, variants: list[str]) -> dict[str, Any]:
    started = time.time()
    deadline = started + args.time_limit - 20  # the report needs a few seconds
    raise_nofile()
    from plancache.trust.signing import generate_keypair
    from plancache_server.store.embedded_redis import EmbeddedRedis, free_port

    tmp = Path(tempfile.mkdtemp(prefix="plancache-herd-"))
    private_key, public_key = generate_keypair(tmp / "keys")
    build_log = tmp / "builds.jsonl"
    address = f"127.0.0.1:{free_port()}"
    env = child_env(PLANCACHE_STANDIN_BUILD_SECONDS=str(args.build_seconds), PLANCACHE_STANDIN_BUILD_LOG=str(build_log))
    results: dict[str, Any] = {
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0], "grpcio": grpc.__version__},
        "config": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("child", "out")
        },
        "note": args.note,
        "logs": str(tmp),
        "variants": {},
        "skipped": [],  # variants the time limit left no time for
    }
    redis_server = EmbeddedRedis(tmp / "redis", persist=False).start()
    try:
        with (
            server_process(address, redis_server.url, tmp / "server.log", "--gpus", "none") as server,
            worker_process(
                redis_server.url,
                tmp / "worker.log",
                "--device",
                "0",
                "--compiler",
                "tests.support.standin:factory",
                "--signing-key",
                str(private_key),
                env=env,
            ) as worker,
        ):
            wait_for_workers(address, proc=worker, timeout=max(1.0, min(180, deadline - time.time())))
            ctx = {
                "tmp": tmp,
                "address": address,
                "public_key": str(public_key),
                "build_log": build_log,
                "server": server,
                "worker": worker,
                "probe_key": store_probe_plan(address, str(public_key)),
            }
            for i, variant in enumerate(variants):
                budget = (deadline - time.time()) / (len(variants) - i)  # time a variant does not use goes to the next
                if budget < 10:
                    results["skipped"].append(variant)
                    continue
                print(f"herd: {variant} ...", file=sys.stderr, flush=True)
                results["variants"][variant] = run_variant(variant, args, ctx, time.time() + budget)
    finally:
        redis_server.stop()
    results["wall_s"] = time.time() - started
    return results


if __name__ == "__main__":
    main()

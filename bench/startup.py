"""Start-up benchmark on the GPU: how long a fresh node takes to run its
graphs, with plancache and without it (scripts/gpu-check.sh runs it).

Every path runs in fresh processes (bench/startup_node.py says what each
does and where its clock starts and stops), with an empty CUDA JIT cache
(CUDA_CACHE_DISABLE=1, as in a fresh container) and with a warm one:

  local-heuristic, local-autotuned   the node builds the graphs itself (no plancache)
  local-heuristic-4proc              4 processes of one node build their shares (graphs i, i+4, ...)
  local-program                      the frontend program local-heuristic's build is, with the real cudnn
  local-functional                   one decode step of examples/decoder_step.py, plancache.functional's
                                     every geometry built by the node itself (plancache.run.local)
  torch-step                         the same step in torch eager (for reference, no target)
  local-functional-train             one training step of examples/train_transformer_block.py (its
                                     backward and an AdamW step included), built as local-functional's
  torch-train-step                   the same training step in torch eager (for reference, no target)
  fetch, prefetch, background        plancache, every plan stored
  floor                              the frontend's own deserialize of the same blobs
  floor-program                      local-program's calls up to its build step, then each plan deserialized
                                     from the same blobs instead of built: the least a cache under an
                                     unchanged frontend program can cost (the drop-in's floor)
  hit-compile                        plancache, every plan stored: one compile() per graph, each a hit
  first-compile, first-lazy          plancache, nothing stored: one compile per graph in order
                                     (first-lazy: a 50 ms sleep, the model's layer, after each graph)
  first-compile-4proc                4 processes of one node, one compile per graph of their shares
  first-dropin                       local-program with `import plancache.cudnn as cudnn`, nothing stored
  first-functional                   local-functional's step against the service, nothing stored
  first-functional-train             local-functional-train's step against the service, nothing stored
  first-prefetch                     one Prefetch with compile_missing

Hedged misses (issue 29): PATH+hedge is PATH with the hedge on: its node
processes run with PLANCACHE_HEDGE=1 (on a miss the node builds the plan
itself too, on the caller's thread, and runs whichever is ready first);
every other run has PLANCACHE_HEDGE=0, the client as it was before. Hedged:
first-compile, first-dropin, first-compile-4proc, first-lazy,
first-functional, first-functional-train (each against its local
equivalent, VERSUS_LOCAL: the node building the same graphs itself) and
hit-compile (against itself unhedged:
a hit must cost the hedge nothing). Every node process reports its CPU
seconds during the clock, the GPU memory it holds at its end, its
race_stats() (how its hedged misses ended) and, per graph, where the plan
that ran came from ("local": its own build won).

Per JIT state: one Redis and one gateway (`--gpus none`, trusting the
benchmark's signing key); each first-* path invalidates its plans (the 13,
or its step's: the keys that step's earlier runs reported) and any job left
of them, starts a fresh worker process (so fresh build processes: no CUDA
module state carries over) and its node processes side by side, and lets
the nodes go (a common wall-clock start written to a "go" file) once every
node has done its set-up and the worker's every build process is ready. Its
time is max(end) - go. In the `all` study this process then reads Redis
until each of the 13 stored plans is the tuned one (`tuned_s` per graph,
`tuned_all_s`; not for the steps' plans); then the worker is
stopped, and the tuned plans serve the stored-plan paths. In the `hedge`
study nobody waits for tuned plans: the worker is killed once its nodes are
done, and the stored-plan paths run on what the first nodes left stored
(their heuristic, provisional plans; one missing is built by a worker
started for it; each such row's `stored_plans` says which).

Studies (--study):

  all    today's runs: local-autotuned, local-heuristic (--repeats), first-compile, first-lazy,
         local-heuristic-4proc beside first-compile-4proc, first-prefetch, then fetch,
         prefetch, background, floor (--repeats) on the tuned plans; then issue 29's
         runs (ISSUE_29, then hit-compile+hedge and hit-compile) as far as --time-limit lets them
  hedge  issue 29's runs alone (HEDGE_STUDY), most important first, each group whole or
         not at all: local-heuristic; first-compile+hedge, first-compile; local-program,
         first-dropin+hedge, first-dropin; local-heuristic-4proc, first-compile-4proc+hedge,
         first-compile-4proc; first-lazy+hedge, first-lazy; local-functional, torch-step,
         first-functional+hedge, first-functional; then hit-compile+hedge, hit-compile,
         fetch and floor once each; then local-heuristic, local-program and
         local-functional again (--repeats in all). Hedged first in each pair: the
         unhedged node waits for every plan, so it leaves all 13 stored for the hits.

  workload  issue 41's start-up with nothing configured: local-program and first-dropin, then
         local-functional, torch-step and first-functional (unhedged first nodes: every plan stored,
         and their uses written to their workload's record: PLANCACHE_WORKLOAD bench-dropin,
         bench-decode-step); then --repeats pairs of local-program, stored-dropin (the drop-in program
         in a fresh process, its plans streamed by the record: PLANCACHE_WORKLOAD_PREFETCH=1, no
         manifest) and torch-step, stored-functional (the decode step the same way). Ratios:
         stored_dropin_over_local_program, stored_functional_over_torch_step, medians of adjacent pairs.
         Then --repeats pairs of the same stored starts under the OTHER program's workload name
         (PATH+collided: a name collision, its record listing none of the program's graphs; reports off,
         so each such run meets the other program's record alone): *_collided, what a collision costs
         with the stream's cut-off (plancache.transport.workload: COLLISION_ASKS). And PATH+no-stream:
         the same stored starts with PLANCACHE_WORKLOAD_PREFETCH=0 (each graph one hit): *_no_stream.
         And stored-functional+listed (PLANCACHE_WORKLOAD_DESERIALIZE=listed: nothing deserialized before a
         process's graphs took its record in order, even where the record is settled): *_listed, run
         before the default's pairs so that its verdict settles the record for them.

Every study's summary also has `paired`: each hedged first node over the local run just before it
(medians of adjacent pairs; hedge-paired runs them so: the pairs of PAIRED, --pairs naming which, e.g.
--pairs first-functional-train: local-functional-train, then first-functional-train+hedge). Processes
that go together (a first node's, a 4-process node's, and in hedge-paired every pair's local side too)
are let go only once the machine is quiet (startup_deploy.wait_quiet: a first node's fresh worker has
loaded torch and cuDNN in 9 processes just before; GPU run 46 found nodes started into that 1.5x
slower), each row saying how long that took (`quiet_at_go`).

Local builds and stored-plan paths of the `all` study repeat `--repeats`
times; the rest run once. The warm cache (CUDA_CACHE_PATH=--warm-cache) is
filled by the cold local-autotuned run (`all`), which reads an empty cache
as with CUDA_CACHE_DISABLE but writes it, with unrecorded local-functional
and local-functional-train runs beside it (the steps' kernels); or, when the
warm state runs on an empty one, by unrecorded runs of them all first:
before anything that reads it starts (CUDA reads the cache index once per
process: a worker started before the fill builds as if cold, GPU run 12). The `hedge` study's cold
state fills it at its end when time is left (for a warm call on the same
machine, --warm-cache shared). A run that would end past --time-limit (its
estimate below) is skipped and listed.

    python3 bench/startup.py --out DIR [--jit cold|warm|both] [--study all|hedge] [--time-limit S] [--warm-cache DIR]
    python3 bench/startup.py --merge A.json B.json --out DIR   # one report from two runs

Imports neither torch nor cudnn: only the node processes do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import startup_deploy as deploy
from bench.procs import physical_cores, split_by_core
from bench.report import figure, save, table, write_json
from plancache_server.store.embedded_redis import free_port
from tests.support.processes import REPO, child_env, server_process, trusting_env, worker_process

REPEATED = ("local-heuristic", "fetch", "prefetch", "background", "floor")
ONCE = ("local-autotuned", "local-heuristic-4proc")
FIRST = ("first-compile", "first-lazy", "first-compile-4proc", "first-prefetch")
HEDGE = "+hedge"  # PATH+HEDGE: PATH with PLANCACHE_HEDGE=1
FIRST_USE = "+first-use"  # PATH+FIRST_USE: a workload path with PLANCACHE_WORKLOAD_DESERIALIZE=first-use
COLLIDED = "+collided"  # PATH+COLLIDED: a workload path under the other program's workload name
NO_STREAM = "+no-stream"  # PATH+NO_STREAM: a workload path with PLANCACHE_WORKLOAD_PREFETCH=0 (each graph asks)
# PATH+IMPORTED: a local path whose process has imported what a drop-in node imports (grpc, plancache.cudnn) before
# its clock, uses none of it: whether the drop-in's first graph's own build, +115-164 ms over the local program's in
# GPU run 46, is the libraries loaded beside the frontend (PLANCACHE_BENCH_PREIMPORT=1; a diagnosis: --pairs
# local-program+imported runs it beside the drop-in's pair).
IMPORTED = "+imported"
LOCAL_IMPORTED = "local-program" + IMPORTED
# PATH+QUIET+HEDGE: a hedged first node whose fresh worker holds autotuning back while misses come
# (--tune-after-quiet 1: no candidate timed on the GPU beside the node's own builds); --pairs first-dropin+quiet.
QUIET = "+quiet"
# PATH+EAGER+HEDGE: a hedged first node whose fresh worker builds for it at once (--hedged-quiet 0: as every worker
# did before GPU run 41), beside the node's own builds; --pairs first-compile+eager,first-dropin+eager.
EAGER = "+eager"
LISTED = "+listed"  # PATH+LISTED: PLANCACHE_WORKLOAD_DESERIALIZE=listed (nothing before the graphs took the record)
HEDGED = (
    "first-compile",
    "first-dropin",
    "first-compile-4proc",
    "first-lazy",
    "first-functional",
    "first-functional-train",
)  # the first nodes run with the hedge too
# The step paths, by step: examples/decoder_step.py's decode step, examples/train_transformer_block.py's training
# step. Each step's plans are its own (Bench.step_keys), none of the 13.
STEP_OF = {
    "local-functional": "decode",
    "torch-step": "decode",
    "first-functional": "decode",
    "local-functional-train": "train",
    "torch-train-step": "train",
    "first-functional-train": "train",
}
STEP_FILLS = ("local-functional", "local-functional-train")  # each step's kernels, for the warm JIT cache
FIRST_NODES = (
    *FIRST,
    "first-dropin",
    "first-functional",
    "first-functional-train",
)  # nothing stored: a fresh worker each (with or without the hedge)
STORED = ("fetch", "prefetch", "background", "floor", "floor-program", "hit-compile")  # every plan stored
# Issue 41: a fresh process with every plan stored and no manifest written by anyone: the workload's
# start-up record (plancache.transport.workload) streams them. Their workloads' records are written by the
# first node of the same program (first-dropin, first-functional: PLANCACHE_WORKLOAD below).
WORKLOAD_PATHS = ("stored-dropin", "stored-functional")
WORKLOAD_OF = {
    "first-dropin": "bench-dropin",
    "stored-dropin": "bench-dropin",
    "first-functional": "bench-decode-step",
    "stored-functional": "bench-decode-step",
    "first-functional-train": "bench-train-step",  # never the decode step's record: another program
}
# A collision: each workload path's program under the other's name (its record lists none of the program's graphs).
WORKLOAD_COLLIDES_WITH = {"stored-dropin": "bench-decode-step", "stored-functional": "bench-dropin"}
# Each stored start against what the node does without plancache (ratio, median of adjacent pairs).
WORKLOAD_VERSUS = {
    "stored-dropin": ("local-program", "stored_dropin_over_local_program"),
    "stored-functional": ("torch-step", "stored_functional_over_torch_step"),
}
# --study workload: the first nodes that write the records (unhedged: every plan stored), then the pairs.
WORKLOAD_STUDY_FIRST = (("local-program", "first-dropin"), ("local-functional", "torch-step", "first-functional"))
# Each stored start twice: plans deserialized on the stream's own thread and CUDA stream (the default) and at
# their first use (PLANCACHE_WORKLOAD_DESERIALIZE=first-use), each beside its own run of the local equivalent.
# The decode step's +listed first: its process's verdict settles the record (no process before it streamed),
# so every default run after it deserializes the record's plans before the step asks.
WORKLOAD_PAIRS = (
    ("local-program", "stored-dropin"),
    ("local-program", "stored-dropin" + FIRST_USE),
    ("torch-step", "stored-functional" + LISTED),
    ("torch-step", "stored-functional"),
    ("torch-step", "stored-functional" + FIRST_USE),
    # Without the stream (each graph one hit): GPU run 37's collided drop-in start beat its own stream.
    ("local-program", "stored-dropin" + NO_STREAM),
    ("torch-step", "stored-functional" + NO_STREAM),
)
# The drop-in's floor beside its local program, after the pairs above (on the blobs they left stored).
FLOOR_PROGRAM_PAIRS = (("local-program", "floor-program"),)
# After every pair above (a collided run reports nothing, but runs last all the same).
COLLIDED_PAIRS = (("local-program", "stored-dropin" + COLLIDED), ("torch-step", "stored-functional" + COLLIDED))
HITS = ("hit-compile+hedge", "hit-compile")
PATHS = (
    "local-heuristic",
    "local-heuristic-4proc",
    "local-autotuned",
    "local-program",
    "local-functional",
    "torch-step",
    "local-functional-train",
    "torch-train-step",
    "first-compile",
    "first-compile+hedge",
    "first-lazy",
    "first-lazy+hedge",
    "first-compile-4proc",
    "first-compile-4proc+hedge",
    "first-prefetch",
    "first-dropin",
    "first-dropin+hedge",
    "first-dropin" + QUIET + HEDGE,
    "first-compile" + EAGER + HEDGE,
    "first-dropin" + EAGER + HEDGE,
    "first-functional",
    "first-functional+hedge",
    "first-functional-train",
    "first-functional-train+hedge",
    "fetch",
    "prefetch",
    "background",
    "floor",
    "floor-program",
    "hit-compile",
    "hit-compile+hedge",
    *WORKLOAD_PATHS,
    *(path + FIRST_USE for path in WORKLOAD_PATHS),
    *(path + COLLIDED for path in WORKLOAD_PATHS),
    *(path + NO_STREAM for path in WORKLOAD_PATHS),
    *(path + LISTED for path in WORKLOAD_PATHS),
)
GROUPS = {
    "first-compile-4proc": ("first-compile", 4),
    "local-heuristic-4proc": ("local-heuristic", 4),
}  # path: (node path, processes)
# Each hedged path's local equivalent (local-lazy: the local build plus the same sleeps) and its ratios' names: without the hedge, with it.
VERSUS_LOCAL = {
    "first-compile": ("local-heuristic", "first_compile_over_local", "first_compile_hedge_over_local"),
    "first-dropin": ("local-program", "first_dropin_over_local_program", "first_dropin_hedge_over_local_program"),
    "first-compile-4proc": (
        "local-heuristic-4proc",
        "first_4proc_over_local_4proc",
        "first_4proc_hedge_over_local_4proc",
    ),
    "first-lazy": ("local-lazy", "first_lazy_over_local_lazy", "first_lazy_hedge_over_local_lazy"),
    "first-functional": (
        "local-functional",
        "first_functional_over_local_functional",
        "first_functional_hedge_over_local_functional",
    ),
    "first-functional-train": (
        "local-functional-train",
        "first_functional_train_over_local_functional_train",
        "first_functional_train_hedge_over_local_functional_train",
    ),
}
RACE_PATH = {
    "first-dropin": "cudnn",
    "first-functional": "functional",
    "first-functional-train": "functional",
}  # race_stats()'s path of a path's races (else "compile")
# --study hedge: groups that run whole or not at all, most important first (the local-heuristic of each JIT state runs before them).
HEDGE_STUDY = (
    ("first-compile+hedge", "first-compile"),
    ("local-program", "first-dropin+hedge", "first-dropin"),
    ("local-heuristic-4proc", "first-compile-4proc+hedge", "first-compile-4proc"),
    ("first-lazy+hedge", "first-lazy"),
    ("local-functional", "torch-step", "first-functional+hedge", "first-functional"),
)
# --study hedge-paired: each hedged first node right after its local equivalent, the pairs --repeats times (medians of
# adjacent runs: the machine drifts by more than the 5 % asked for between runs minutes apart, GPU run 21 call 2).
PAIRED = (
    ("local-heuristic", "first-compile+hedge"),
    ("local-program", "first-dropin+hedge"),
    ("local-heuristic-4proc", "first-compile-4proc+hedge"),
    ("local-heuristic", "first-lazy+hedge"),
    ("local-functional", "first-functional+hedge"),
    ("local-functional-train", "first-functional-train+hedge"),
)
# hedge-paired runs these through together(), as the hedged
PAIRED_LOCAL = frozenset({*(local for local, _ in PAIRED), LOCAL_IMPORTED})
# Selected by name only (--pairs first-dropin+quiet): a diagnosis, beside the drop-in's own pair.
PAIRED_BY_NAME = (
    ("local-program", "first-dropin" + QUIET + HEDGE),
    ("local-heuristic", "first-compile" + EAGER + HEDGE),
    ("local-program", "first-dropin" + EAGER + HEDGE),
    ("local-program", "first-dropin" + NO_STREAM + HEDGE),  # a diagnosis: the drop-in with no workload stream
)
# What --pairs names: a pair by its first node's path (Bench.paired_groups), or the imports' local run.
PAIR_NAMES = (*dict.fromkeys(first.removesuffix(HEDGE) for _, first in (*PAIRED, *PAIRED_BY_NAME)), LOCAL_IMPORTED)
# --study all: issue 29's runs after today's (their unhedged first-compile, first-lazy and first-compile-4proc ran already).
ISSUE_29 = (
    ("first-compile+hedge",),
    ("local-program", "first-dropin+hedge", "first-dropin"),
    ("first-compile-4proc+hedge",),
    ("first-lazy+hedge",),
    ("local-functional", "torch-step", "first-functional+hedge", "first-functional"),
)
LAZY_S = 0.05
TARGETS = {
    "stored_vs_local_cold": 15.0,  # fetch/prefetch at least this much faster than local heuristic, empty JIT cache
    "stored_vs_local_warm": 5.0,
    "stored_vs_floor": 1.3,  # at most this much slower than the raw deserialize floor
    "first_compile_vs_local": 1.2,  # every graph run once, at most this times the local heuristic build
    "first_lazy_vs_local_lazy": 1.2,  # the same with the 13 sleeps on both sides
    "first_4proc_vs_local_4proc": 1.2,
    "first_prefetch_vs_local": 0.6,
    "tuned_vs_local_autotune": 0.5,  # every plan tuned and stored, at most this times a plain local autotune
    "background_critical_path_s": 0.05,  # what plans add after a 2 s foreground
    "hedged_vs_local": 1.05,  # issue 29: every hedged first-node path, at most this times its local equivalent (VERSUS_LOCAL)
    "stored_dropin_over_local_program": 0.3,  # issue 41: every graph of the drop-in program runnable, no manifest
    "stored_functional_over_torch_step": 0.6,  # issue 41: the decode step, every plan stored, no manifest
}
# Seconds a run takes on an H200 (cold, warm JIT cache), its processes' start included: what it needs of --time-limit.
# A first node's: its worker's start and its nodes; TUNED_WAIT_S more where it waits for the tuned plans (study all).
# fill: the unrecorded runs that fill the warm cache (local-autotuned and the steps' local runs, on an empty cache).
ESTIMATE_S = {
    "local-autotuned": (45, 15),
    "local-heuristic": (12, 7),
    "local-heuristic-4proc": (15, 10),
    "local-program": (12, 7),
    "local-functional": (15, 10),
    "torch-step": (10, 8),
    "local-functional-train": (18, 12),  # not yet measured: local-functional's plus the backward's graphs
    "torch-train-step": (10, 8),
    "fetch": (6, 6),
    "prefetch": (6, 6),
    "background": (8, 8),
    "floor": (6, 6),
    "floor-program": (7, 7),
    "hit-compile": (6, 6),
    **dict.fromkeys(FIRST_NODES, (25, 20)),
    "first-compile-4proc": (20, 16),
    "first-functional": (28, 22),
    "first-functional-train": (35, 28),  # not yet measured (as local-functional-train)
    "stored-dropin": (8, 8),
    "stored-functional": (12, 10),
    "fill": (75, 75),
}
TUNED_WAIT_S = (25, 10)


def base(path: str) -> str:
    """The path without its hedge, deserialization or collision: what its node processes run."""
    for suffix in (HEDGE, QUIET, EAGER, FIRST_USE, COLLIDED, NO_STREAM, LISTED, IMPORTED):
        path = path.removesuffix(suffix)
    return path


def hedged(path: str) -> bool:
    return path.endswith(HEDGE)


class Bench:
    def __init__(
        self,
        out: Path,
        time_limit: float,
        repeats: int,
        foreground_s: float,
        warm_cache: Path | None,
        build_processes: int,
        study: str = "all",
    ) -> None:
        from plancache.trust.signing import generate_keypair

        self.out, self.time_limit, self.repeats, self.foreground_s, self.study = (
            out,
            time_limit,
            repeats,
            foreground_s,
            study,
        )
        self.deadline = time.monotonic() + time_limit
        self.tmp = Path(tempfile.mkdtemp(prefix="plancache-startup-"))
        self.warm_cache = warm_cache or self.tmp / "jit-cache"
        self.private_key, self.public_key = generate_keypair(self.tmp / "keys")
        self.build_processes = build_processes
        self.worker_device = 0  # --worker-device: the service's GPU (another than the nodes': a diagnosis)
        self.worker_flags = [
            "--device",
            "0",
            "--signing-key",
            str(self.private_key),
            "--no-warm",
            *(["--build-processes", str(build_processes)] if build_processes else []),
        ]
        self.target_id = ""  # the worker's exact target (its log says), and the 13 plan keys on it
        self.keys: list[str] = []
        self.step_keys: dict[str, set[str]] = {}  # per step (STEP_OF): its plan keys, as its first nodes reported them
        self.more_keys: set[str] = (
            set()
        )  # plan keys of the drop-in's that are not the 13 (none expected: its captured specs are the same)
        self.stored_plans: dict[str, Any] = {}  # what the stored-plan paths run on (stored_blobs)
        self.node_cpus: set[int] | None = None  # --split-cpus or --node-cpus: the node processes' CPUs
        self.pool_measured = False  # this JIT state's first first node measures the worker's pool
        self.runs: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.server_pid: int | None = None  # the server and the first node's worker (`beside` records their CPU)
        self.worker_pid: int | None = None
        self.pairs: tuple[str, ...] = ()  # --pairs: hedge-paired's first-node paths to run (empty: all of PAIRED)
        self.pause_worker = False  # --pause-worker: hedged first nodes run with the worker stopped (a diagnosis)
        self.worker_own_jit_cache = False  # --worker-own-jit-cache: the worker's JIT cache a copy (a diagnosis)

    def cache_env(self, jit: str, fill: bool = False) -> dict[str, str]:
        if jit == "cold" and not fill:
            return {"CUDA_CACHE_DISABLE": "1"}
        return {"CUDA_CACHE_PATH": str(self.warm_cache), "CUDA_CACHE_DISABLE": "0"}

    def worker_cache_env(self, jit: str) -> dict[str, str]:
        """A first node's worker's JIT cache: the nodes' (a host where both run as one user shares
        ~/.nv/ComputeCache), or with --worker-own-jit-cache a copy of it made now (as warm, never the same files)."""
        env = self.cache_env(jit)
        if not self.worker_own_jit_cache or "CUDA_CACHE_PATH" not in env:
            return env
        copy = self.tmp / "worker-jit-cache"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.warm_cache, copy)
        return {**env, "CUDA_CACHE_PATH": str(copy)}

    def cache_filled(self) -> bool:
        return any(p.is_file() for p in self.warm_cache.glob("**/*"))

    def node_env(
        self, path: str, jit: str, env: dict[str, str], server: str = "", fill: bool = False
    ) -> dict[str, str]:
        """A node process's environment: the hedge as its path says, an empty disk cache of its own
        (the drop-in's client has one), first-dropin's service, the JIT cache of `jit`."""
        extra = {
            "PLANCACHE_HEDGE": "1" if hedged(path) else "0",
            "PLANCACHE_CACHE_DIR": tempfile.mkdtemp(prefix="disk-cache-", dir=self.tmp),
            # The workload start-up prefetch (issue 41) where a path measures it, and in first nodes as a user has
            # it (unset: on where the process runs plans); off in the stored-plan paths, which measure one way in.
            "PLANCACHE_WORKLOAD_PREFETCH": "1" if base(path) in WORKLOAD_PATHS else "0",
            "PLANCACHE_WORKLOAD": WORKLOAD_OF.get(base(path), f"bench-{base(path)}"),
        }
        if base(path) in FIRST_NODES:
            del extra["PLANCACHE_WORKLOAD_PREFETCH"]
        if path.endswith(FIRST_USE):
            extra["PLANCACHE_WORKLOAD_DESERIALIZE"] = "first-use"
        if path.endswith(LISTED):
            extra["PLANCACHE_WORKLOAD_DESERIALIZE"] = "listed"
        if IMPORTED in path:
            extra["PLANCACHE_BENCH_PREIMPORT"] = "1"
        if NO_STREAM in path:  # the record is still written (reports on); this process streams nothing
            extra["PLANCACHE_WORKLOAD_PREFETCH"] = "0"
        if path.endswith(COLLIDED):  # another program's record; its own uses not reported (each run meets it alone)
            extra["PLANCACHE_WORKLOAD"] = WORKLOAD_COLLIDES_WITH[base(path)]
            extra["PLANCACHE_REPORT"] = "0"
        if base(path) in ("first-dropin", "stored-dropin"):
            extra["PLANCACHE_SERVER"] = server
        if os.environ.get("BENCH_MISS_PHASES") == "1":  # bench/miss_phases.py: each step's time
            extra["PLANCACHE_BENCH_PHASES"] = "1"
        if os.environ.get("BENCH_NODE_GC_FREEZE") == "1":  # a diagnosis: set-up's objects out of collections
            extra["PLANCACHE_BENCH_GC_FREEZE"] = "1"
        if os.environ.get("BENCH_MISS_PROFILE") == "1":  # and a cProfile (3.12: every thread; it slows Python code)
            (self.out / "profiles").mkdir(exist_ok=True)
            extra["PLANCACHE_BENCH_PROFILE"] = str(self.out / "profiles" / f"{jit}-{path}.txt")
        return {**env, **extra, **self.cache_env(jit, fill)}

    def watches(self, path: str) -> bool:
        """Whether a first node's run waits until its plans are tuned (the `all` study; not a step's plans)."""
        return self.study == "all" and base(path) not in STEP_OF

    def estimate(self, jit: str, path: str) -> float:
        seconds = ESTIMATE_S[base(path)][jit == "warm"]
        if base(path) in FIRST_NODES and self.watches(path):
            seconds += TUNED_WAIT_S[jit == "warm"]
        return seconds

    def fits(self, jit: str, *paths: str) -> bool:
        """Whether the runs of `paths` would end by the deadline; if not, they are skipped (listed)."""
        if time.monotonic() + sum(self.estimate(jit, p) for p in paths) <= self.deadline:
            return True
        self.skipped += [f"{jit}/{path}" for path in paths]
        return False

    def record(self, row: dict[str, Any]) -> None:
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list | dict)})[:400], flush=True)
        self.runs.append(row)
        self.save()

    def node(
        self,
        path: str,
        jit: str,
        env: dict[str, str],
        server: str = "",
        blobs: str = "",
        fill: bool = False,
        record: bool = True,
    ) -> None:
        if record and not self.fits(jit, path):
            return
        args = [
            sys.executable,
            "-m",
            "bench.startup_node",
            "--path",
            base(path),
            "--foreground-s",
            str(self.foreground_s),
        ]
        args += ["--server", server] if server else []
        args += ["--blobs", blobs] if blobs else []
        started = time.monotonic()
        child = self.pinned(
            subprocess.Popen(
                args,
                env=self.node_env(path, jit, env, server, fill),
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        try:
            stdout, stderr = child.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
        proc = subprocess.CompletedProcess(args, child.returncode, stdout, stderr)
        row: dict[str, Any] = {"jit": jit, "path": path, "hedge": hedged(path), "wall_s": time.monotonic() - started}
        if base(path) in STORED:
            row["stored_plans"] = dict(self.stored_plans)
        if proc.returncode != 0:
            row["error"] = proc.stderr[-2000:]
        else:
            row.update(
                {k: v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items() if k != "path"}
            )  # its node path: base(path)
        if record:
            self.record(row)

    def together(self, path: str, jit: str, env: dict[str, str], server: str = "", on_go: Any = None) -> dict[str, Any]:
        """The node processes of `path`, started now, let go together once set up and the machine is quiet
        (`on_go(go)` is called then): their merged row."""
        node_path, count = GROUPS.get(base(path), (base(path), 1))
        barrier = Path(tempfile.mkdtemp(prefix=f"{jit}-{path}-", dir=self.tmp))
        procs = []
        for share in range(count):
            args = [
                sys.executable,
                "-m",
                "bench.startup_node",
                "--path",
                node_path,
                "--share",
                f"{share}/{count}",
                "--barrier",
                str(barrier),
                "--lazy-s",
                str(LAZY_S),
                *(["--server", server] if server else []),
            ]
            with open(barrier / f"out-{share}", "w") as out, open(barrier / f"err-{share}", "w") as err:
                procs.append(
                    self.pinned(
                        subprocess.Popen(
                            args, env=self.node_env(path, jit, env, server), cwd=REPO, stdout=out, stderr=err
                        )
                    )
                )
        try:
            deploy.wait_until(
                lambda: all((barrier / f"ready-{i}").exists() for i in range(count)), procs, 300, "node set-up"
            )
            quiet = deploy.wait_quiet()  # whatever started before (a fresh worker's pool) has settled: see there
            beside = deploy.BesideNode(self.beside_node())
            go = time.time()
            (barrier / ".go").write_text(repr(go))
            os.replace(barrier / ".go", barrier / "go")
            beside.start()
            if on_go is not None:
                on_go(go)
            for proc in procs:
                proc.wait(timeout=600)
            besides = beside.stop()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        failed = [
            f"node {i} (exit {p.returncode}): {(barrier / f'err-{i}').read_text()[-1500:]}"
            for i, p in enumerate(procs)
            if p.returncode
        ]
        if failed:
            raise RuntimeError("; ".join(failed))
        merged = merge_shares(
            [json.loads((barrier / f"out-{i}").read_text().strip().splitlines()[-1]) for i in range(count)]
        )
        return {**merged, "beside": besides, "quiet_at_go": quiet}

    def beside_node(self) -> dict[str, int]:
        """The service's processes whose CPU time a node's run records (`beside`): the server, the worker and
        its build processes, where they run."""
        return {
            name: pid for name, pid in (("server", self.server_pid), ("worker", self.worker_pid)) if pid is not None
        }

    def local_group(self, path: str, jit: str, env: dict[str, str]) -> None:
        if not self.fits(jit, path):
            return
        row: dict[str, Any] = {"jit": jit, "path": path, "hedge": hedged(path)}
        started = time.monotonic()
        try:
            row.update(self.together(path, jit, env))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[-2000:]
        self.record({**row, "wall_s": time.monotonic() - started})

    def first(self, path: str, jit: str, env: dict[str, str], address: str, redis_url: str) -> None:
        """A first node: nothing stored (its plans invalidated), a fresh worker whose pool is ready before
        the node's processes start (the JIT state's first also measures the pool: the GPU's memory then holds
        only the worker's). Not watched (watches()), the worker is killed once the nodes are done."""
        if not self.fits(jit, path):
            return
        measure_pool, self.pool_measured = not self.pool_measured, True
        step = STEP_OF.get(base(path))
        row: dict[str, Any] = {"jit": jit, "path": path, "hedge": hedged(path)}
        started = time.monotonic()
        if self.target_id:
            deploy.forget_jobs(
                redis_url, self.target_id, [*self.keys, *sorted(self.more_keys.union(*self.step_keys.values()))]
            )  # nothing left for the new worker to reclaim
            # And their plans, before the nodes start: a node's workload stream may begin during its set-up
            # (plancache.functional.configure starts it), before pool_ready forgets them again.
            deploy.forget_plans(address, self.own_keys(path))
        baseline = deploy.gpu_memory_used() if measure_pool else None
        log = self.out / f"startup-worker-{jit}-{path}.log"
        watcher = deploy.TunedWatcher(redis_url) if self.watches(path) else None
        try:
            quiet = ["--tune-after-quiet", "1"] if QUIET in path else []
            quiet += ["--hedged-quiet", "0"] if EAGER in path else []
            with worker_process(
                redis_url, log, *self.worker_flags, *quiet, env=child_env(**self.worker_cache_env(jit))
            ) as worker:
                self.worker_pid = worker.pid

                def pool_ready() -> None:
                    target_id, size = deploy.wait_for_pool(log, worker, address)
                    row["pool"] = deploy.pool_memory(worker.pid, size, baseline)
                    self.learn(target_id)
                    deploy.forget_plans(address, self.own_keys(path))

                # The pool ready before the node's processes start (their set-up then lets the machine settle, and
                # the go waits for it to be quiet): a user's service started long before its first node. Until GPU
                # run 46 only each JIT state's first first node did so, the rest set up beside the pool's start
                # and went as it was ready: their builds ran up to 1.5x slower than the same node's first pair's.
                pool_ready()
                # --pause-worker (a diagnosis, not a user's path): the worker and its build processes stopped
                # while a hedged first node runs, so nothing of the service's builds shares the machine with it.
                paused = self.pause_worker and hedged(path)
                row["worker_paused"] = paused

                def on_go(go: float) -> None:
                    if watcher is not None:
                        watcher.start(go, self.keys)
                    if paused:
                        deploy.signal_tree(worker.pid, signal.SIGSTOP)

                try:
                    row.update(self.together(path, jit, env, address, on_go))
                finally:
                    if paused:
                        deploy.signal_tree(worker.pid, signal.SIGCONT)
                if row.get("keys") != self.keys:
                    raise RuntimeError(f"the nodes' plan keys are not those of the worker's target {self.target_id}")
                if step:
                    self.step_keys.setdefault(step, set()).update(row.get("plan_keys") or ())
                more = {k for k in row.get("plan_key") or () if k and k not in self.keys}
                if more:  # forgotten before every first node from now on
                    self.more_keys |= more
                    row["warning"] = f"plan keys other than the 13: {sorted(more)}"
                if watcher is not None:
                    row.update(watcher.wait(timeout=max(30.0, min(300.0, self.deadline - time.monotonic()))))
                if "tuned_all_s" not in row:
                    worker.kill()  # it would finish its autotunings before it stopped; the next path forgets their jobs
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[-2000:]
        finally:
            self.worker_pid = None
            if watcher is not None:
                watcher.stop()
        joined = [i for i, source in enumerate(row.get("source") or ()) if source == "joined"]
        if joined:  # a build left over from an earlier path answered: this node was not first
            row["warning"] = f"{row.get('warning', '')}; graphs {joined} joined a build under way".lstrip("; ")
        self.record({**row, "wall_s": time.monotonic() - started})

    def own_keys(self, path: str) -> list[str]:
        """The plans a first node of `path` starts without: its step's, or the 13 and the drop-in's others."""
        step = STEP_OF.get(base(path))
        return sorted(self.step_keys.get(step, ())) if step else [*self.keys, *sorted(self.more_keys)]

    def run(self, path: str, jit: str, env: dict[str, str], address: str, redis_url: str, blobs: str = "") -> None:
        if base(path) in FIRST_NODES:
            self.first(path, jit, env, address, redis_url)
        elif base(path) in GROUPS or (self.study == "hedge-paired" and path in PAIRED_LOCAL):
            # A pair's local side starts as its hedged side does (a barrier, a quiet machine, the go): GPU run 46.
            self.local_group(path, jit, env)
        elif base(path) in STORED or base(path) in WORKLOAD_PATHS:
            self.node(path, jit, env, server=address, blobs=blobs)
        else:
            self.node(path, jit, env)

    def groups(self, jit: str, env: dict[str, str], address: str, redis_url: str, groups: Any, blobs: str = "") -> None:
        """Each group's runs in order, the group whole or not at all (--time-limit)."""
        for group in groups:
            if self.fits(jit, *group):
                for path in group:
                    self.run(path, jit, env, address, redis_url, blobs)

    def learn(self, target_id: str) -> None:
        if target_id != self.target_id:
            from bench.startup_graphs import startup_graphs
            from plancache import Manifest
            from plancache.keys.target import Target

            self.target_id = target_id
            self.keys = [e.key or "" for e in Manifest.from_specs(startup_graphs(), Target.parse(target_id)).entries]

    def plan_states(self, redis_url: str) -> list[str]:
        client = deploy.redis_client(redis_url)
        try:
            return deploy.plan_states(client, self.keys)
        finally:
            client.close()

    def stored_blobs(self, jit: str, address: str, redis_url: str, tuned_only: bool = True) -> str:
        """The 13 plans' blobs, for the floor: the tuned ones, or with `tuned_only=False` whatever the
        first nodes left stored (provisional or tuned); built by a worker started for it if the first
        nodes did not get that far (with `tuned_only=False` it is killed once they are stored)."""
        path = str(self.tmp / f"blobs-{jit}.bin")
        wanted = ("tuned",) if tuned_only else ("tuned", "provisional")
        states = self.plan_states(redis_url)
        if self.keys and all(s in wanted for s in states):
            deploy.save_blobs(address, path, self.target_id, tuned_only)
            self.stored_plans = {state: states.count(state) for state in wanted} | {"built_for_them": 0}
            return path
        if self.target_id:  # tuning left unfinished: built again from nothing
            deploy.forget_jobs(redis_url, self.target_id, self.keys)
            deploy.forget_plans(address, [k for k, state in zip(self.keys, states, strict=True) if state not in wanted])
        log = self.out / f"startup-worker-{jit}-blobs.log"
        with worker_process(redis_url, log, *self.worker_flags, env=child_env(**self.cache_env(jit))) as worker:
            self.learn(deploy.wait_for_pool(log, worker, address)[0])
            deploy.save_blobs(address, path, self.target_id, tuned_only)
            if not tuned_only:
                worker.kill()  # it would tune what it built before it stopped
        after = self.plan_states(redis_url)
        self.stored_plans = {state: after.count(state) for state in wanted} | {
            "built_for_them": sum(1 for s in states if s not in wanted)
        }
        return path

    def stored(
        self, jit: str, env: dict[str, str], address: str, redis_url: str, groups: Any, tuned_only: bool
    ) -> None:
        """The stored-plan paths (groups, as groups() runs them) on the blobs stored_blobs() gives."""
        paths = [path for group in groups for path in group]
        if time.monotonic() + ESTIMATE_S["fetch"][jit == "warm"] > self.deadline:
            self.skipped += [f"{jit}/{path}" for path in paths]
            return
        try:
            blobs = self.stored_blobs(jit, address, redis_url, tuned_only)
        except Exception as e:
            what = "tuned plans" if tuned_only else "plans"
            self.skipped += [f"{jit}/{path} (no {what}: {type(e).__name__}: {str(e)[:200]})" for path in paths]
            return
        self.groups(jit, env, address, redis_url, groups, blobs)

    def fill_cache(self, jit: str) -> None:
        """Unrecorded runs that fill the warm cache: every candidate's kernels (local-autotuned) and the steps'."""
        self.node("local-autotuned", jit, child_env(), fill=True, record=False)
        for path in STEP_FILLS:
            self.node(path, jit, child_env(), fill=True, record=False)

    def block(self, jit: str, redis_url: str) -> None:
        """One JIT state: the local baselines, the first nodes (each with a fresh worker), then the stored-plan paths (module doc)."""
        self.deadline = time.monotonic() + self.time_limit
        self.pool_measured = False
        env = trusting_env(self.public_key)
        os.environ.update(env)  # this process's clients (saving the blobs) trust the same key
        filling = jit == "cold" and not self.cache_filled()
        if jit == "warm" and not self.cache_filled():
            self.fill_cache(jit)  # see the module doc
        if self.study == "all":
            self.node("local-autotuned", jit, env, fill=filling)
            if filling:
                for path in STEP_FILLS:  # the steps' kernels, for the warm state
                    self.node(path, jit, child_env(), fill=True, record=False)
        self.node("local-heuristic", jit, env)
        address = f"127.0.0.1:{free_port()}"
        server_args = ("--gpus", "none", "--signing-key", str(self.private_key))
        with server_process(
            address, redis_url, self.out / f"startup-server-{jit}.log", *server_args, env=child_env()
        ) as server:
            self.server_pid = server.pid
            if self.study == "workload":
                self.groups(jit, env, address, redis_url, WORKLOAD_STUDY_FIRST)
                self.groups(jit, env, address, redis_url, [p for _ in range(self.repeats) for p in WORKLOAD_PAIRS])
                self.stored(
                    jit, env, address, redis_url, [p for _ in range(self.repeats) for p in FLOOR_PROGRAM_PAIRS], False
                )
                self.groups(jit, env, address, redis_url, [p for _ in range(self.repeats) for p in COLLIDED_PAIRS])
            elif self.study == "hedge-paired":
                pairs = self.paired_groups()
                self.groups(jit, env, address, redis_url, [pair for _ in range(self.repeats) for pair in pairs])
                self.stored(
                    jit, env, address, redis_url, (HITS, ("fetch",), ("floor",), *FLOOR_PROGRAM_PAIRS), tuned_only=False
                )
            elif self.study == "hedge":
                self.groups(jit, env, address, redis_url, HEDGE_STUDY)
                self.stored(jit, env, address, redis_url, (HITS, ("fetch",), ("floor",)), tuned_only=False)
                self.groups(
                    jit,
                    env,
                    address,
                    redis_url,
                    [
                        (p,)
                        for _ in range(self.repeats - 1)
                        for p in ("local-heuristic", "local-program", "local-functional")
                    ],
                )
            else:
                self.groups(
                    jit,
                    env,
                    address,
                    redis_url,
                    (
                        ("first-compile",),
                        ("first-lazy",),
                        ("local-heuristic-4proc", "first-compile-4proc"),
                        ("first-prefetch",),
                    ),
                )
                stored = [
                    path for repeat in range(self.repeats) for path in REPEATED[1 if repeat == 0 else 0 :]
                ]  # the first local-heuristic ran already
                self.stored(jit, env, address, redis_url, [(path,) for path in stored], tuned_only=True)
                self.groups(jit, env, address, redis_url, ISSUE_29)
                self.stored(jit, env, address, redis_url, (HITS,), tuned_only=False)
        if filling and self.study == "hedge" and time.monotonic() + ESTIMATE_S["fill"][0] <= self.deadline:
            self.fill_cache(jit)  # for a warm call on this machine (--warm-cache)

    def paired_groups(self) -> list[tuple[str, ...]]:
        """hedge-paired's groups, as --pairs selects them; with local-program+imported the drop-in's pair runs once,
        the imports' local run before it (not a second drop-in pair beside the plain one)."""
        pairs: list[tuple[str, ...]] = [pair for pair in PAIRED if not self.pairs or base(pair[1]) in self.pairs]
        pairs += [pair for pair in PAIRED_BY_NAME if pair[1].removesuffix(HEDGE) in self.pairs]
        if LOCAL_IMPORTED in self.pairs:
            dropin: tuple[str, ...] = ("local-program", "first-dropin" + HEDGE)
            pairs = [pair for pair in pairs if pair != dropin] + [(LOCAL_IMPORTED, *dropin)]
        return pairs

    def save(self) -> dict[str, Any]:
        summary = summarize(self.runs)
        write_json(
            self.out / "startup.json",
            {
                "summary": summary,
                "targets": TARGETS,
                "skipped": self.skipped,
                "config": self.config(),
                "graph_names": graph_names(),
                "runs": self.runs,
            },
        )
        return summary

    def split_cpus(self) -> None:
        """Node processes on half of this process's physical cores; this process, and so Redis, the server and
        its workers (its children), on the other half: as if the service had a host of its own. Whole cores
        (bench.procs.split_by_core): until GPU run 40 the halves were by CPU number, which on a machine numbering a
        core's threads n and n + 8 puts every node CPU on a core with a service CPU (not known for the GPU
        machines of those runs: the config now records the cores)."""
        node, service = split_by_core(sorted(os.sched_getaffinity(0)))
        self.node_cpus = set(node)
        os.sched_setaffinity(0, set(service))

    def pinned(self, proc: subprocess.Popen[str]) -> subprocess.Popen[str]:
        """A node process just started, on the nodes' CPUs (--split-cpus, --node-cpus; its clock starts long after, at
        the go)."""
        if self.node_cpus:
            os.sched_setaffinity(proc.pid, self.node_cpus)
        return proc

    def config(self) -> dict[str, Any]:
        return {
            "node_cpus": sorted(self.node_cpus) if self.node_cpus else "all (shared with the service)",
            "service_cpus": sorted(os.sched_getaffinity(0)) if self.node_cpus else "all (shared with the nodes)",
            "cpu_cores": physical_cores(sorted(os.sched_getaffinity(0) | (self.node_cpus or set()))),
            "study": self.study,
            "repeats": self.repeats,
            "foreground_s": self.foreground_s,
            "lazy_s": LAZY_S,
            "time_limit_s": self.time_limit,
            "build_processes": self.build_processes or "the worker's default",
            "pairs": list(self.pairs) or "all",
            "worker_paused_during_hedged_first_nodes": self.pause_worker,
            "worker_own_jit_cache": self.worker_own_jit_cache,
            "worker_device": self.worker_device,
        }


def merge_shares(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the node processes that went together (their costs summed)."""
    row: dict[str, Any] = {k: parts[0][k] for k in ("graphs", "target", "keys") if k in parts[0]}
    # Each process's clock counts from `go` (bench/startup_node.py Clock): the last to stop ends the node. Not
    # `end_wall - go`: GPU run 45's processes stamped end_wall after the work that follows their clock (110-220 ms
    # added to every row of processes that went together: each hedged first node, the local 4-process node).
    row.update(processes=len(parts), total_s=max(p["total_s"] for p in parts), setup_s=max(p["setup_s"] for p in parts))
    row["per_process"] = [
        {
            k: p.get(k)
            for k in (
                "share",
                "imports_s",
                "setup_s",
                "total_s",
                "cpu_s",
                "thread_cpu_s",
                "ended_threads",
                "gc",
                "pace_ms",
                "gpu_mib",
            )
        }
        for p in parts
    ]
    row.update(
        {
            k: parts[0][k]
            for k in (
                "lazy_s",
                "hedge_env",
                "gpu_apps_listed",
                "geometries",
                "plan_keys",
                "functional_stats",
                "workload",
                "thread_cpu_s",  # the first process's (every process's in per_process)
                "ended_threads",  # the same
                "gc",  # the same (GPU runs 42-43 left it out of every hedged run: only the local runs had it)
                "steps",  # the same (GPU run 44 left it out of its hedged drop-in runs)
                "pace_ms",  # the first process's (every process's in per_process)
            )
            if k in parts[0]
        }
    )
    for name in ("cpu_s", "torch_reserved_mib", "torch_max_reserved_mib"):
        if all(name in p for p in parts):
            row[name] = sum(p[name] for p in parts)
    if all("gpu_mib" in p for p in parts):
        row["gpu_mib"] = sum(p["gpu_mib"] for p in parts) if all(p["gpu_mib"] is not None for p in parts) else None
    if any(p.get("races") for p in parts):
        row["races"] = _sum_races([p["races"] for p in parts if p.get("races")])
    if any(p.get("phases") for p in parts):  # BENCH_MISS_PHASES: each process's own
        row["phases"] = parts[0]["phases"] if len(parts) == 1 else [p.get("phases") for p in parts]
    for name in ("runnable_s", "output_s", "provisional", "source", "reason", "taken_over", "plan_key"):
        if any(name in p for p in parts):
            merged = [None] * row.get("graphs", 13)
            for p in parts:
                for i in p["indices"] if name in p else ():
                    merged[i] = p[name][i]
            row[name] = merged
    return row


def _sum_races(each: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    total: dict[str, dict[str, int]] = {}
    for races in each:
        for path, counts in races.items():
            mine = total.setdefault(path, {})
            for name, count in counts.items():
                mine[name] = mine.get(name, 0) + count
    return total


def _median(runs: list[dict[str, Any]], jit: str, path: str, field: str = "total_s") -> float | None:
    values = [
        r[field]
        for r in runs
        if r["jit"] == jit and r["path"] == path and r.get(field) is not None and "error" not in r
    ]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    runs = [
        {**r, "path": "first-prefetch"} if r["path"] == "first-node" else r for r in runs
    ]  # its name before issue 22
    summary: dict[str, Any] = {}
    for jit in ("cold", "warm"):
        m = {p: _median(runs, jit, p) for p in PATHS}
        s: dict[str, Any] = {
            "median_s": m,
            "n": {
                p: sum(1 for r in runs if r["jit"] == jit and r["path"] == p and "total_s" in r and "error" not in r)
                for p in m
            },
        }
        local, autotuned = m["local-heuristic"], m["local-autotuned"]
        for path in ("fetch", "prefetch"):
            s[f"local_over_{path}"] = _ratio(local, m[path])
            s[f"{path}_over_floor"] = _ratio(m[path], m["floor"])
        lazy = next(
            (r for r in runs if r["jit"] == jit and base(r["path"]) == "first-lazy" and "lazy_s" in r),
            {"graphs": 13, "lazy_s": LAZY_S},
        )
        s["local_lazy_s"] = (
            local + lazy.get("graphs", 13) * lazy["lazy_s"] if local else None
        )  # the local build with the same sleeps
        for path, (equivalent, unhedged, with_hedge) in VERSUS_LOCAL.items():
            local_s = s["local_lazy_s"] if equivalent == "local-lazy" else m[equivalent]
            s[unhedged], s[with_hedge] = _ratio(m[path], local_s), _ratio(m[path + HEDGE], local_s)
        s["first_prefetch_over_local"] = _ratio(m["first-prefetch"], local)
        s["tuned_all_s"] = {p: _median(runs, jit, p, "tuned_all_s") for p in FIRST}
        s["tuned_over_local_autotune"] = {p: _ratio(t, autotuned) for p, t in s["tuned_all_s"].items()}
        s["background_after_foreground_s"] = _median(runs, jit, "background", "after_foreground_s")
        s["hit_hedge_over_no_hedge"] = _ratio(m["hit-compile+hedge"], m["hit-compile"])
        s["hit_hedge_builds_nothing"] = _hits_raced_nothing(runs, jit)
        s["costs"] = costs(runs, jit)
        s["hedge_costs"] = hedge_costs(s["costs"])
        s["races"] = race_totals(runs, jit)
        s["sources"] = source_counts(runs, jit)
        pools = [r["pool"] for r in runs if r["jit"] == jit and "pool" in r]
        s["pool"] = max(pools, key=lambda p: "device_growth_mib" in p) if pools else None
        for path, (equivalent, name) in WORKLOAD_VERSUS.items():
            s[name] = paired_ratio(runs, jit, path, equivalent)
            s[name + "_first_use"] = paired_ratio(runs, jit, path + FIRST_USE, equivalent)
            s[name + "_collided"] = paired_ratio(runs, jit, path + COLLIDED, equivalent)
            s[name + "_no_stream"] = paired_ratio(runs, jit, path + NO_STREAM, equivalent)
            s[name + "_listed"] = paired_ratio(runs, jit, path + LISTED, equivalent)
            # The same with each run's set-up added: what a settled stream's deserializing during set-up costs.
            s[name + "_with_setup"] = paired_ratio(runs, jit, path, equivalent, with_setup=True)
            s[name + "_listed_with_setup"] = paired_ratio(runs, jit, path + LISTED, equivalent, with_setup=True)
        # The drop-in's floor (floor-program: the program's own calls, each plan deserialized from a file).
        s["floor_program_over_local_program"] = paired_ratio(runs, jit, "floor-program", "local-program")
        s["stored_dropin_over_floor_program"] = _ratio(m["stored-dropin"], m["floor-program"])
        s["first_dropin_quiet_hedge_over_local_program"] = paired_ratio(
            runs, jit, "first-dropin" + QUIET + HEDGE, "local-program"
        )
        # The same hedged first nodes with the worker building for them at once (before GPU run 41).
        s["eager_paired"] = {
            "first_compile_eager_hedge_over_local": paired_ratio(
                runs, jit, "first-compile" + EAGER + HEDGE, "local-heuristic"
            ),
            "first_dropin_eager_hedge_over_local_program": paired_ratio(
                runs, jit, "first-dropin" + EAGER + HEDGE, "local-program"
            ),
        }
        s["paired"] = {
            name: paired_ratio(runs, jit, path + HEDGE, equivalent if equivalent != "local-lazy" else "local-heuristic")
            for path, (equivalent, _, name) in VERSUS_LOCAL.items()
        }
        s["met"] = met(s, jit)
        summary[jit] = s
    summary["errors"] = [f"{r['jit']}/{r['path']}: {r['error'][-300:]}" for r in runs if "error" in r]
    return summary


def paired_ratio(
    runs: list[dict[str, Any]], jit: str, path: str, equivalent: str, with_setup: bool = False
) -> float | None:
    """The median over `path`'s runs of its total over the run of `equivalent` just before it (adjacent
    runs: the machine drifts between runs minutes apart); None without such a pair. For first-lazy the
    equivalent is local-heuristic plus the same sleeps (its `lazy_s` after each graph). `with_setup`: each
    run's set-up added to its total (a stream that deserializes during the program's set-up may lengthen it)."""
    ratios, last = [], None
    for r in runs:
        if r["jit"] != jit or "error" in r or "total_s" not in r:
            continue
        took = r["total_s"] + (r.get("setup_s", 0.0) if with_setup else 0.0)
        if r["path"] == equivalent:
            last = took
        elif r["path"] == path and last:
            slept = r.get("lazy_s", LAZY_S) * r.get("graphs", 13) if base(path) == "first-lazy" else 0.0
            ratios.append(took / (last + slept))
            last = None
    return statistics.median(ratios) if ratios else None


def costs(runs: list[dict[str, Any]], jit: str) -> dict[str, dict[str, float | None]]:
    """Per path (medians of its runs): the CPU seconds of its node processes during the clock
    (summed over a node's processes), the GPU memory they held at its end (nvidia-smi) and torch's share of it."""
    out = {}
    for path in PATHS:
        found = {name: _median(runs, jit, path, name) for name in ("cpu_s", "gpu_mib", "torch_reserved_mib")}
        if any(v is not None for v in found.values()):
            out[path] = found
    return out


def hedge_costs(by_path: dict[str, dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """Per hedged path: what the hedge added to the node (hedged minus unhedged), and its local equivalent's costs."""
    out = {}
    for path, (equivalent, _, _) in VERSUS_LOCAL.items():
        on, off, alone = (
            by_path.get(path + HEDGE, {}),
            by_path.get(path, {}),
            by_path.get("local-heuristic" if equivalent == "local-lazy" else equivalent, {}),
        )
        if on or off:
            out[path] = {
                "cpu_s_added": _minus(on.get("cpu_s"), off.get("cpu_s")),
                "gpu_mib_added": _minus(on.get("gpu_mib"), off.get("gpu_mib")),
                "torch_mib_added": _minus(on.get("torch_reserved_mib"), off.get("torch_reserved_mib")),
                "cpu_s_local": alone.get("cpu_s"),
                "gpu_mib_local": alone.get("gpu_mib"),
            }
    for path in ("hit-compile",):
        on, off = by_path.get(path + HEDGE, {}), by_path.get(path, {})
        if on or off:
            out[path] = {
                "cpu_s_added": _minus(on.get("cpu_s"), off.get("cpu_s")),
                "gpu_mib_added": _minus(on.get("gpu_mib"), off.get("gpu_mib")),
                "torch_mib_added": _minus(on.get("torch_reserved_mib"), off.get("torch_reserved_mib")),
            }
    return out


def race_totals(runs: list[dict[str, Any]], jit: str) -> dict[str, dict[str, int]]:
    """Per path: how its node processes' hedged misses ended, summed over its runs (race_stats() of its front door: RACE_PATH)."""
    out: dict[str, dict[str, int]] = {}
    for r in runs:
        if r["jit"] != jit or "error" in r or not r.get("races"):
            continue
        mine = out.setdefault(r["path"], {"runs": 0})
        mine["runs"] += 1
        for name, count in (r["races"].get(RACE_PATH.get(base(r["path"]), "compile")) or {}).items():
            mine[name] = mine.get(name, 0) + count
    return out


def source_counts(runs: list[dict[str, Any]], jit: str) -> dict[str, dict[str, int]]:
    """Per path: where the plans that ran came from (per graph, or per geometry of the decode step), over its runs."""
    out: dict[str, dict[str, int]] = {}
    for r in runs:
        if r["jit"] != jit or "error" in r:
            continue
        found = [s for s in r.get("source") or () if s is not None] + [g["source"] for g in r.get("geometries") or ()]
        for source in found:
            mine = out.setdefault(r["path"], {})
            mine[source] = mine.get(source, 0) + 1
    return out


def _hits_raced_nothing(runs: list[dict[str, Any]], jit: str) -> bool | None:
    """Whether every hit-compile+hedge run had only hits and no race (a hit never starts the node's own build)."""
    hits = [
        r for r in runs if r["jit"] == jit and r["path"] == "hit-compile+hedge" and "error" not in r and r.get("source")
    ]
    if not hits:
        return None
    return all(
        all(s == "hit" for s in r["source"] if s is not None)
        and not any(any(c.values()) for c in (r.get("races") or {}).values())
        for r in hits
    )


def met(s: dict[str, Any], jit: str) -> dict[str, bool]:
    """Each ratio against its target (a measure absent: not listed)."""
    at_least = {f"local_over_{p}": TARGETS[f"stored_vs_local_{jit}"] for p in ("fetch", "prefetch")}
    at_most = {
        "fetch_over_floor": TARGETS["stored_vs_floor"],
        "prefetch_over_floor": TARGETS["stored_vs_floor"],
        "first_compile_over_local": TARGETS["first_compile_vs_local"],
        "first_lazy_over_local_lazy": TARGETS["first_lazy_vs_local_lazy"],
        "first_4proc_over_local_4proc": TARGETS["first_4proc_vs_local_4proc"],
        "first_prefetch_over_local": TARGETS["first_prefetch_vs_local"],
        "background_after_foreground_s": TARGETS["background_critical_path_s"],
        **{with_hedge: TARGETS["hedged_vs_local"] for _, _, with_hedge in VERSUS_LOCAL.values()},
        **{name: TARGETS[name] for _, name in WORKLOAD_VERSUS.values()},
    }
    result = {k: s[k] >= bound for k, bound in at_least.items() if s.get(k) is not None}
    result |= {k: s[k] <= bound for k, bound in at_most.items() if s.get(k) is not None}
    result |= {
        f"tuned_over_local_autotune/{p}": v <= TARGETS["tuned_vs_local_autotune"]
        for p, v in s["tuned_over_local_autotune"].items()
        if v is not None
    }
    if s.get("hit_hedge_builds_nothing") is not None:
        result["hit_hedge_builds_nothing"] = s["hit_hedge_builds_nothing"]
    return result


def report(runs: list[dict[str, Any]], out: Path, extra: dict[str, Any]) -> None:
    summary = summarize(runs)
    write_json(
        out / "startup.json",
        {"summary": summary, "targets": TARGETS, **extra, "graph_names": graph_names(), "runs": runs},
    )
    rows = []
    for jit in ("cold", "warm"):
        for path, value in summary[jit]["median_s"].items():
            if not summary[jit]["n"][path]:
                continue
            tuned = summary[jit]["tuned_all_s"].get(path)
            cost = summary[jit]["costs"].get(path, {})
            rows.append(
                [
                    jit,
                    path,
                    summary[jit]["n"][path],
                    value * 1e3 if value else float("nan"),
                    tuned * 1e3 if tuned else float("nan"),
                    _or_nan(cost.get("cpu_s")),
                    _or_nan(cost.get("gpu_mib")),
                ]
            )
    print(table(["JIT cache", "path", "runs", "median ms", "tuned all ms", "CPU s", "GPU MiB"], rows))
    shown = ("median_s", "n", "costs", "sources")
    print(
        json.dumps(
            {k: {f: v for f, v in summary[k].items() if f not in shown} for k in ("cold", "warm")},
            indent=1,
            default=str,
        )
    )
    plot(summary, out / "startup.png")
    plot_timeline(runs, out / "startup_timeline.png")


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def plot(summary: dict[str, Any], path: Path) -> None:
    shown = [p for p in PATHS if any(summary[jit]["median_s"].get(p) for jit in ("cold", "warm"))] or list(PATHS)
    fig, (a,) = figure(1)
    fig.set_size_inches(max(7.0, 0.45 * len(shown) + 2), 4.8)
    width = 0.4
    for offset, jit in ((-width / 2, "cold"), (width / 2, "warm")):
        values = [(summary[jit]["median_s"].get(p) or 0) * 1e3 for p in shown]
        a.bar([i + offset for i in range(len(shown))], values, width=width, label=f"{jit} JIT cache")
    a.set_yscale("log"), a.set_xticks(range(len(shown)), shown, rotation=35, ha="right", fontsize=7)
    a.set_ylabel("ms until every graph ran once (median)")
    a.set_title(
        "13 graphs (the step paths: one step), fresh processes: with and without plancache, with and without the hedge",
        fontsize=9,
    )
    a.legend()
    save(fig, path)


def graph_names() -> list[str]:
    from bench.startup_graphs import startup_graphs

    return [g.name or "" for g in startup_graphs()]


# The timeline's paths: the hedge's points should lie on the local build's.
TIMELINE = (
    "local-heuristic",
    "local-program",  # the drop-in's local equivalent (the frontend program it is)
    "first-compile",
    "first-compile+hedge",
    "first-dropin+hedge",
    "first-lazy",
    "first-compile-4proc",
    "first-prefetch",
)
MARKERS = "os^DvPX*"


def plot_timeline(runs: list[dict[str, Any]], path: Path) -> None:
    """When each graph became runnable, per path (a marker and a color each; filled: the plan that ran was the
    node's own build, hollow: the service's), and when its tuned plan was stored (|); one panel per JIT state."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter

    names = graph_names()
    fig, axes = figure(2)
    fig.set_size_inches(15, 7.5)
    for a, jit in zip(axes, ("cold", "warm"), strict=True):
        for k, name in enumerate(TIMELINE):
            run = next((r for r in runs if r["jit"] == jit and r["path"] == name and r.get("runnable_s")), None)
            if run is None:
                continue
            y = [i + (k - (len(TIMELINE) - 1) / 2) * 0.11 for i in range(len(names))]
            own = _own(run)
            label = f"{name} (all run: {run['total_s']:.2f} s)"
            style = {"s": 20, "marker": MARKERS[k]}
            mine = _points([x if o else None for x, o in zip(run["runnable_s"], own, strict=False)], y)
            theirs = _points([None if o else x for x, o in zip(run["runnable_s"], own, strict=False)], y)
            a.scatter(*mine, color=f"C{k}", label=label if mine[0] else "_", **style)
            a.scatter(*theirs, facecolors="none", edgecolors=f"C{k}", label="_" if mine[0] else label, **style)
            if run.get("tuned_s"):
                a.scatter(*_points(run["tuned_s"], y), s=40, marker="|", color=f"C{k}", label="_")
        a.set_xscale("log"), a.set_yticks(range(len(names)), names, fontsize=7), a.invert_yaxis()
        a.xaxis.set_minor_formatter(NullFormatter())
        (
            a.set_xlabel("seconds from the clock's start (log)"),
            a.set_title(f"{jit} JIT cache: when each graph became runnable"),
        )
        handles, _ = a.get_legend_handles_labels()
        if handles:
            keys = [
                Line2D([], [], marker="o", linestyle="", color="gray", label="filled: the node's own build ran"),
                Line2D(
                    [],
                    [],
                    marker="o",
                    linestyle="",
                    markerfacecolor="none",
                    color="gray",
                    label="hollow: the service's plan ran",
                ),
                Line2D([], [], marker="|", linestyle="", color="gray", markersize=9, label="its tuned plan stored"),
            ]
            a.legend(handles=[*handles, *keys], fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    save(fig, path)


def _own(run: dict[str, Any]) -> list[bool]:
    """Per graph: whether the plan that ran was the node's own build (a local path's; "local": a hedged miss it won, a drop-in's own build)."""
    count = len(run["runnable_s"])
    if run["path"].startswith("local-"):
        return [True] * count
    return [source == "local" for source in (run.get("source") or [None] * count)]


def _points(xs: list[float | None], ys: list[float]) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for x, y in zip(xs, ys, strict=False) if x is not None and x > 0]
    return [x for x, _ in pairs], [y for _, y in pairs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--jit", choices=("cold", "warm", "both"), default="both")
    parser.add_argument(
        "--study",
        choices=("all", "hedge", "hedge-paired", "workload"),
        default="all",
        help="all: every path; hedge: issue 29's hedged misses alone; hedge-paired: each hedged first node beside its local equivalent (module doc)",
    )
    parser.add_argument(
        "--split-cpus",
        action="store_true",
        help="node processes on the first half of this machine's CPUs, Redis, the server and its workers on the other: a service on a host of its own",
    )
    parser.add_argument(
        "--node-cpus",
        default="",
        help="CPU numbers (e.g. 3 or 2,3) every node process is pinned to, both sides of a pair alike, the service "
        "left on all CPUs (bench/cpu_speed_map.py measures each CPU's pace; on GPU run 44's hosts the pace was "
        "the time's, not the CPU's, and pinning did not steady it)",
    )
    parser.add_argument("--warm-cache", type=Path, help="CUDA_CACHE_PATH of the warm runs (default: a new directory)")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=390.0,
        help="seconds per JIT state; runs that would end past it are skipped and listed",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--pairs",
        default="",
        help=f"hedge-paired: a comma list of the pairs to run, by their first node's path ({', '.join(PAIR_NAMES)}); "
        "default: every pair of PAIRED",
    )
    parser.add_argument(
        "--pause-worker",
        action="store_true",
        help="a diagnosis: the worker and its build processes stopped while each hedged first node runs (what the "
        "service's own builds on the same machine cost the node)",
    )
    parser.add_argument(
        "--worker-own-jit-cache",
        action="store_true",
        help="a diagnosis: each first node's worker on a copy of the warm JIT cache, not the nodes' own files (whether "
        "the CUDA JIT cache the two share on one host is what slows a hedged node's own builds)",
    )
    parser.add_argument(
        "--worker-device",
        type=int,
        default=0,
        help="a diagnosis: the service's worker on this GPU, the nodes on GPU 0 (a machine of two GPUs of one kind: "
        "what sharing the node's GPU with the service's builds and tuning costs a hedged first node; the pool's GPU "
        "memory figures still read GPU 0)",
    )
    parser.add_argument("--foreground-s", type=float, default=2.0)
    parser.add_argument(
        "--build-processes", type=int, default=0, help="the workers' --build-processes (0: their default)"
    )
    parser.add_argument(
        "--merge", type=Path, nargs="*", help="startup.json files of earlier runs: one report of all their runs"
    )
    args = parser.parse_args()
    unknown = [p for p in args.pairs.split(",") if p and p not in PAIR_NAMES]
    if unknown:  # a misspelt pair would run nothing of it, silently
        parser.error(f"--pairs: no pair {', '.join(unknown)}; one of {', '.join(PAIR_NAMES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        loaded = [json.loads(p.read_text()) for p in args.merge]
        extra = {
            "skipped": [s for d in loaded for s in d.get("skipped", [])],
            "config": loaded[0].get("config", {}),
            "merged_from": [str(p) for p in args.merge],
        }
        report([r for d in loaded for r in d["runs"]], args.out, extra)
        return
    from plancache_server.store.embedded_redis import EmbeddedRedis

    bench = Bench(
        args.out, args.time_limit, args.repeats, args.foreground_s, args.warm_cache, args.build_processes, args.study
    )
    bench.pairs = tuple(p for p in args.pairs.split(",") if p)
    bench.pause_worker = args.pause_worker
    bench.worker_own_jit_cache = args.worker_own_jit_cache
    if args.worker_device:
        bench.worker_device = args.worker_device
        bench.worker_flags[bench.worker_flags.index("--device") + 1] = str(args.worker_device)
    if args.node_cpus:
        if args.split_cpus:
            parser.error("--node-cpus and --split-cpus both choose the nodes' CPUs: pass one")
        bench.node_cpus = {int(c) for c in args.node_cpus.split(",")}
    if args.split_cpus:
        bench.split_cpus()  # before Redis starts: it and every service process inherit the service's half
    redis = EmbeddedRedis(
        bench.tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    try:
        for jit in ("cold", "warm") if args.jit == "both" else (args.jit,):
            bench.block(jit, redis.url)
    finally:
        redis.stop()
        report(bench.runs, args.out, {"skipped": bench.skipped, "config": bench.config()})


if __name__ == "__main__":
    main()

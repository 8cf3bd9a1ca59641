"""Start-up benchmark on the GPU: how long a fresh node takes to run its
graphs, with plancache and without it (scripts/gpu-check.sh runs it).

Every path runs in fresh processes (bench/startup_node.py says what each
does and where its clock starts and stops), with an empty CUDA JIT cache
(CUDA_CACHE_DISABLE=1, as in a fresh container) and with a warm one:

  local-heuristic, local-autotuned   the node builds the graphs itself (no plancache)
  local-heuristic-4proc              4 processes of one node build their shares (graphs i, i+4, ...)
  fetch, prefetch, background        plancache, every plan stored
  floor                              the frontend's own deserialize of the same blobs
  first-compile, first-lazy          plancache, nothing stored: one compile per graph in order
                                     (first-lazy: a 50 ms sleep, the model's layer, after each graph)
  first-compile-4proc                4 processes of one node, one compile per graph of their shares
  first-prefetch                     one Prefetch with compile_missing

Per JIT state: one Redis and one front end (`--gpus none`, trusting the
benchmark's signing key); each first-* path invalidates the 13 plans (and
any job left of them), starts a fresh worker process (so fresh build
processes: no CUDA module state carries over) and its node processes side
by side, and lets the nodes go (a common wall-clock start written to a "go"
file) once every node has done its set-up and the worker's every build
process is ready. Its time is max(end) - go; meanwhile this process reads
Redis until each of the 13 stored plans is the tuned one (`tuned_s` per
graph, `tuned_all_s`); then the worker is stopped. The tuned plans then
serve the stored-plan paths. Local builds and stored-plan paths repeat
`--repeats` times; local-autotuned, local-heuristic-4proc and the first-*
paths run once. The warm cache (CUDA_CACHE_PATH=--warm-cache) is filled by
the cold local-autotuned run, which reads an empty cache as with
CUDA_CACHE_DISABLE but writes it, or, when the warm state runs on an empty
one, by an unrecorded run first: before anything that reads it starts (CUDA
reads the cache index once per process: a worker started before the fill
builds as if cold, GPU run 12). A run that would end past --time-limit (its
estimate below) is skipped and listed.

    python3 bench/startup.py --out DIR [--jit cold|warm|both] [--time-limit S]
    python3 bench/startup.py --merge A.json B.json --out DIR   # one report from two runs

Imports neither torch nor cudnn: only the node processes do.
"""

from __future__ import annotations

import argparse
import json
import os
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
from bench.report import figure, save, table, write_json
from plancache_server.store.embedded_redis import free_port
from tests.support.processes import REPO, child_env, server_process, trusting_env, worker_process

REPEATED = ("local-heuristic", "fetch", "prefetch", "background", "floor")
ONCE = ("local-autotuned", "local-heuristic-4proc")
FIRST = ("first-compile", "first-lazy", "first-compile-4proc", "first-prefetch")
PATHS = ("local-heuristic", "local-heuristic-4proc", "local-autotuned", *FIRST, "fetch", "prefetch", "background", "floor")
GROUPS = {"first-compile-4proc": ("first-compile", 4), "local-heuristic-4proc": ("local-heuristic", 4)}  # path: (node path, processes)
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
}
# Seconds a run takes on an H200 (cold, warm JIT cache), its processes' start included: what it needs of --time-limit.
ESTIMATE_S = {"local-autotuned": (45, 15), "local-heuristic": (12, 7), "local-heuristic-4proc": (15, 10), "fetch": (6, 6), "prefetch": (6, 6),
              "background": (8, 8), "floor": (6, 6), **dict.fromkeys(FIRST, (50, 30))}  # fmt: skip


class Bench:
    def __init__(self, out: Path, time_limit: float, repeats: int, foreground_s: float, warm_cache: Path | None, build_processes: int) -> None:
        from plancache.trust.signing import generate_keypair

        self.out, self.time_limit, self.repeats, self.foreground_s = out, time_limit, repeats, foreground_s
        self.deadline = time.monotonic() + time_limit
        self.tmp = Path(tempfile.mkdtemp(prefix="plancache-startup-"))
        self.warm_cache = warm_cache or self.tmp / "jit-cache"
        self.private_key, self.public_key = generate_keypair(self.tmp / "keys")
        self.build_processes = build_processes
        self.worker_flags = ["--device", "0", "--signing-key", str(self.private_key), "--no-warm", *(["--build-processes", str(build_processes)] if build_processes else [])]
        self.target_id = ""  # the worker's exact target (its log says), and the 13 plan keys on it
        self.keys: list[str] = []
        self.runs: list[dict[str, Any]] = []
        self.skipped: list[str] = []

    def cache_env(self, jit: str, fill: bool = False) -> dict[str, str]:
        if jit == "cold" and not fill:
            return {"CUDA_CACHE_DISABLE": "1"}
        return {"CUDA_CACHE_PATH": str(self.warm_cache), "CUDA_CACHE_DISABLE": "0"}

    def cache_filled(self) -> bool:
        return any(p.is_file() for p in self.warm_cache.glob("**/*"))

    def fits(self, jit: str, path: str) -> bool:
        if time.monotonic() + ESTIMATE_S[path][jit == "warm"] <= self.deadline:
            return True
        self.skipped.append(f"{jit}/{path}")
        return False

    def record(self, row: dict[str, Any]) -> None:
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list | dict)})[:400], flush=True)
        self.runs.append(row)
        self.save()

    def node(self, path: str, jit: str, env: dict[str, str], server: str = "", blobs: str = "", fill: bool = False, record: bool = True) -> None:
        if record and not self.fits(jit, path):
            return
        args = [sys.executable, "-m", "bench.startup_node", "--path", path, "--foreground-s", str(self.foreground_s)]
        args += ["--server", server] if server else []
        args += ["--blobs", blobs] if blobs else []
        started = time.monotonic()
        proc = subprocess.run(args, env={**env, **self.cache_env(jit, fill)}, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
        row: dict[str, Any] = {"jit": jit, "path": path, "wall_s": time.monotonic() - started}
        if proc.returncode != 0:
            row["error"] = proc.stderr[-2000:]
        else:
            row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        if record:
            self.record(row)

    def together(self, path: str, jit: str, env: dict[str, str], server: str = "", before_go: Any = None, on_go: Any = None) -> dict[str, Any]:
        """The node processes of `path`, started now, let go together once set up and `before_go()`
        has returned (`on_go(go)` is called then): their merged row."""
        node_path, count = GROUPS.get(path, (path, 1))
        barrier = Path(tempfile.mkdtemp(prefix=f"{jit}-{path}-", dir=self.tmp))
        procs = []
        for share in range(count):
            args = [sys.executable, "-m", "bench.startup_node", "--path", node_path, "--share", f"{share}/{count}", "--barrier", str(barrier),
                    "--lazy-s", str(LAZY_S), *(["--server", server] if server else [])]  # fmt: skip
            with open(barrier / f"out-{share}", "w") as out, open(barrier / f"err-{share}", "w") as err:
                procs.append(subprocess.Popen(args, env={**env, **self.cache_env(jit)}, cwd=REPO, stdout=out, stderr=err))
        try:
            if before_go is not None:
                before_go()
            deploy.wait_until(lambda: all((barrier / f"ready-{i}").exists() for i in range(count)), procs, 300, "node set-up")
            go = time.time()
            (barrier / ".go").write_text(repr(go))
            os.replace(barrier / ".go", barrier / "go")
            if on_go is not None:
                on_go(go)
            for proc in procs:
                proc.wait(timeout=600)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        failed = [f"node {i} (exit {p.returncode}): {(barrier / f'err-{i}').read_text()[-1500:]}" for i, p in enumerate(procs) if p.returncode]
        if failed:
            raise RuntimeError("; ".join(failed))
        return merge_shares([json.loads((barrier / f"out-{i}").read_text().strip().splitlines()[-1]) for i in range(count)], go)

    def local_group(self, path: str, jit: str, env: dict[str, str]) -> None:
        if not self.fits(jit, path):
            return
        row: dict[str, Any] = {"jit": jit, "path": path}
        started = time.monotonic()
        try:
            row.update(self.together(path, jit, env))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[-2000:]
        self.record({**row, "wall_s": time.monotonic() - started})

    def first(self, path: str, jit: str, env: dict[str, str], address: str, redis_url: str, measure_pool: bool) -> None:
        """A first node: nothing stored, a fresh worker; with `measure_pool`, the nodes start after
        the pool is ready and measured (the GPU's memory then holds only the worker's)."""
        if not self.fits(jit, path):
            return
        row: dict[str, Any] = {"jit": jit, "path": path}
        started = time.monotonic()
        if self.target_id:
            deploy.forget_jobs(redis_url, self.target_id, self.keys)  # nothing left for the new worker to reclaim
        baseline = deploy.gpu_memory_used() if measure_pool else None
        log = self.out / f"startup-worker-{jit}-{path}.log"
        watcher = deploy.TunedWatcher(redis_url)
        try:
            with worker_process(redis_url, log, *self.worker_flags, env=child_env(**self.cache_env(jit))) as worker:

                def pool_ready() -> None:
                    target_id, size = deploy.wait_for_pool(log, worker, address)
                    row["pool"] = deploy.pool_memory(worker.pid, size, baseline)
                    self.learn(target_id)
                    deploy.forget_plans(address, self.keys)

                if measure_pool:
                    pool_ready()
                row.update(self.together(path, jit, env, address, None if measure_pool else pool_ready, lambda go: watcher.start(go, self.keys)))
                if row.get("keys") != self.keys:
                    raise RuntimeError(f"the nodes' plan keys are not those of the worker's target {self.target_id}")
                row.update(watcher.wait(timeout=max(30.0, min(300.0, self.deadline - time.monotonic()))))
                if "tuned_all_s" not in row:
                    worker.kill()  # it would finish its autotunings before it stopped; the next path forgets their jobs
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[-2000:]
        finally:
            watcher.stop()
        self.record({**row, "wall_s": time.monotonic() - started})

    def learn(self, target_id: str) -> None:
        if target_id != self.target_id:
            from bench.startup_graphs import startup_graphs
            from plancache import Manifest
            from plancache.keys.target import Target

            self.target_id = target_id
            self.keys = [e.key or "" for e in Manifest.from_specs(startup_graphs(), Target.parse(target_id)).entries]

    def stored_blobs(self, jit: str, address: str, redis_url: str) -> str:
        """The tuned plans' blobs, for the floor (built by a worker started for it if the first nodes did not get that far)."""
        path = str(self.tmp / f"blobs-{jit}.bin")
        client = deploy.redis_client(redis_url)
        try:
            states = deploy.plan_states(client, self.keys)
        finally:
            client.close()
        if self.keys and all(s == "tuned" for s in states):
            deploy.save_blobs(address, path, self.target_id)
            return path
        if self.target_id:  # tuning left unfinished: built again from nothing
            deploy.forget_jobs(redis_url, self.target_id, self.keys)
            deploy.forget_plans(address, [k for k, state in zip(self.keys, states, strict=True) if state != "tuned"])
        log = self.out / f"startup-worker-{jit}-blobs.log"
        with worker_process(redis_url, log, *self.worker_flags, env=child_env(**self.cache_env(jit))) as worker:
            self.learn(deploy.wait_for_pool(log, worker, address)[0])
            deploy.save_blobs(address, path, self.target_id)
        return path

    def block(self, jit: str, redis_url: str) -> None:
        """One JIT state: the local baselines, the first nodes (each with a fresh worker), then the stored-plan paths."""
        self.deadline = time.monotonic() + self.time_limit
        env = trusting_env(self.public_key)
        os.environ.update(env)  # this process's clients (saving the blobs) trust the same key
        if jit == "warm" and not self.cache_filled():
            self.node("local-autotuned", jit, child_env(), record=False)  # fills it (see the module doc)
        self.node("local-autotuned", jit, env, fill=jit == "cold" and not self.cache_filled())
        self.node("local-heuristic", jit, env)
        address = f"127.0.0.1:{free_port()}"
        server_args = ("--gpus", "none", "--signing-key", str(self.private_key))
        with server_process(address, redis_url, self.out / f"startup-server-{jit}.log", *server_args, env=child_env()):
            for path in FIRST:
                if path == "first-compile-4proc":
                    self.local_group("local-heuristic-4proc", jit, env)  # its baseline, beside it
                self.first(path, jit, env, address, redis_url, measure_pool=path == FIRST[0])
            stored = [path for repeat in range(self.repeats) for path in REPEATED[1 if repeat == 0 else 0 :]]  # the first local-heuristic ran already
            if time.monotonic() + ESTIMATE_S["fetch"][jit == "warm"] > self.deadline:
                self.skipped += [f"{jit}/{path}" for path in stored]
                return
            try:
                blobs = self.stored_blobs(jit, address, redis_url)
            except Exception as e:
                self.skipped += [f"{jit}/{path} (no tuned plans: {type(e).__name__}: {str(e)[:200]})" for path in stored]
                return
            for path in stored:
                self.node(path, jit, env, server=address, blobs=blobs)

    def save(self) -> dict[str, Any]:
        summary = summarize(self.runs)
        write_json(self.out / "startup.json", {"summary": summary, "targets": TARGETS, "skipped": self.skipped, "config": self.config(),
                                               "graph_names": graph_names(), "runs": self.runs})  # fmt: skip
        return summary

    def config(self) -> dict[str, Any]:
        return {
            "repeats": self.repeats,
            "foreground_s": self.foreground_s,
            "lazy_s": LAZY_S,
            "time_limit_s": self.time_limit,
            "build_processes": self.build_processes or "the worker's default",
        }


def merge_shares(parts: list[dict[str, Any]], go: float) -> dict[str, Any]:
    """One row from the node processes that went together at `go`."""
    row: dict[str, Any] = {k: parts[0][k] for k in ("graphs", "target", "keys") if k in parts[0]}
    row.update(processes=len(parts), total_s=max(p["end_wall"] for p in parts) - go, setup_s=max(p["setup_s"] for p in parts))
    row["per_process"] = [{k: p.get(k) for k in ("share", "imports_s", "setup_s", "total_s")} for p in parts]
    row.update({k: parts[0][k] for k in ("lazy_s",) if k in parts[0]})
    for name in ("runnable_s", "output_s", "provisional", "source"):
        if any(name in p for p in parts):
            merged = [None] * row.get("graphs", 13)
            for p in parts:
                for i in p["indices"] if name in p else ():
                    merged[i] = p[name][i]
            row[name] = merged
    return row


def _median(runs: list[dict[str, Any]], jit: str, path: str, field: str = "total_s") -> float | None:
    values = [r[field] for r in runs if r["jit"] == jit and r["path"] == path and field in r and "error" not in r]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    runs = [{**r, "path": "first-prefetch"} if r["path"] == "first-node" else r for r in runs]  # its name before issue 22
    summary: dict[str, Any] = {}
    for jit in ("cold", "warm"):
        m = {p: _median(runs, jit, p) for p in PATHS}
        s: dict[str, Any] = {
            "median_s": m,
            "n": {p: sum(1 for r in runs if r["jit"] == jit and r["path"] == p and "total_s" in r and "error" not in r) for p in m},
        }
        local, autotuned = m["local-heuristic"], m["local-autotuned"]
        for path in ("fetch", "prefetch"):
            s[f"local_over_{path}"] = _ratio(local, m[path])
            s[f"{path}_over_floor"] = _ratio(m[path], m["floor"])
        lazy = next((r for r in runs if r["jit"] == jit and r["path"] == "first-lazy" and "lazy_s" in r), {"graphs": 13, "lazy_s": LAZY_S})
        s["local_lazy_s"] = local + lazy.get("graphs", 13) * lazy["lazy_s"] if local else None  # the local build with the same sleeps
        s["first_compile_over_local"] = _ratio(m["first-compile"], local)
        s["first_lazy_over_local_lazy"] = _ratio(m["first-lazy"], s["local_lazy_s"])
        s["first_4proc_over_local_4proc"] = _ratio(m["first-compile-4proc"], m["local-heuristic-4proc"])
        s["first_prefetch_over_local"] = _ratio(m["first-prefetch"], local)
        s["tuned_all_s"] = {p: _median(runs, jit, p, "tuned_all_s") for p in FIRST}
        s["tuned_over_local_autotune"] = {p: _ratio(t, autotuned) for p, t in s["tuned_all_s"].items()}
        s["background_after_foreground_s"] = _median(runs, jit, "background", "after_foreground_s")
        pools = [r["pool"] for r in runs if r["jit"] == jit and "pool" in r]
        s["pool"] = max(pools, key=lambda p: "device_growth_mib" in p) if pools else None
        s["met"] = met(s, jit)
        summary[jit] = s
    summary["errors"] = [f"{r['jit']}/{r['path']}: {r['error'][-300:]}" for r in runs if "error" in r]
    return summary


def met(s: dict[str, Any], jit: str) -> dict[str, bool]:
    """Each ratio against its target (a measure absent: not listed)."""
    at_least = {f"local_over_{p}": TARGETS[f"stored_vs_local_{jit}"] for p in ("fetch", "prefetch")}
    at_most = {"fetch_over_floor": TARGETS["stored_vs_floor"], "prefetch_over_floor": TARGETS["stored_vs_floor"],
               "first_compile_over_local": TARGETS["first_compile_vs_local"], "first_lazy_over_local_lazy": TARGETS["first_lazy_vs_local_lazy"],
               "first_4proc_over_local_4proc": TARGETS["first_4proc_vs_local_4proc"], "first_prefetch_over_local": TARGETS["first_prefetch_vs_local"],
               "background_after_foreground_s": TARGETS["background_critical_path_s"]}  # fmt: skip
    result = {k: s[k] >= bound for k, bound in at_least.items() if s.get(k) is not None}
    result |= {k: s[k] <= bound for k, bound in at_most.items() if s.get(k) is not None}
    result |= {f"tuned_over_local_autotune/{p}": v <= TARGETS["tuned_vs_local_autotune"] for p, v in s["tuned_over_local_autotune"].items() if v is not None}
    return result


def report(runs: list[dict[str, Any]], out: Path, extra: dict[str, Any]) -> None:
    summary = summarize(runs)
    write_json(out / "startup.json", {"summary": summary, "targets": TARGETS, **extra, "graph_names": graph_names(), "runs": runs})
    rows = []
    for jit in ("cold", "warm"):
        for path, value in summary[jit]["median_s"].items():
            tuned = summary[jit]["tuned_all_s"].get(path)
            rows.append([jit, path, summary[jit]["n"][path], value * 1e3 if value else float("nan"), tuned * 1e3 if tuned else float("nan")])
    print(table(["JIT cache", "path", "runs", "median ms", "tuned all ms"], rows))
    print(json.dumps({k: {f: v for f, v in summary[k].items() if f not in ("median_s", "n")} for k in ("cold", "warm")}, indent=1, default=str))
    plot(summary, out / "startup.png")
    plot_timeline(runs, out / "startup_timeline.png")


def plot(summary: dict[str, Any], path: Path) -> None:
    fig, (a,) = figure(1)
    width = 0.4
    for offset, jit in ((-width / 2, "cold"), (width / 2, "warm")):
        values = [(summary[jit]["median_s"].get(p) or 0) * 1e3 for p in PATHS]
        a.bar([i + offset for i in range(len(PATHS))], values, width=width, label=f"{jit} JIT cache")
    a.set_yscale("log"), a.set_xticks(range(len(PATHS)), PATHS, rotation=30, ha="right", fontsize=7)
    a.set_ylabel("ms until every graph ran once (median)"), a.set_title("13 graphs, fresh processes: with and without plancache"), a.legend()
    save(fig, path)


def graph_names() -> list[str]:
    from bench.startup_graphs import startup_graphs

    return [g.name or "" for g in startup_graphs()]


def plot_timeline(runs: list[dict[str, Any]], path: Path) -> None:
    """When each graph became runnable (filled) and its tuned plan was stored (hollow), per path; one panel per JIT state."""
    names = graph_names()
    shown = ("local-heuristic", "first-compile", "first-lazy", "first-compile-4proc", "first-prefetch")
    fig, axes = figure(2)
    fig.set_size_inches(14, 7)
    for a, jit in zip(axes, ("cold", "warm"), strict=True):
        for k, name in enumerate(shown):
            run = next((r for r in runs if r["jit"] == jit and r["path"] == name and r.get("runnable_s")), None)
            if run is None:
                continue
            y = [i + (k - 2) * 0.15 for i in range(len(names))]
            dots = a.scatter(*_points(run["runnable_s"], y), s=18, label=f"{name} runnable (all run: {run['total_s']:.2f} s)")
            if run.get("tuned_s"):
                a.scatter(*_points(run["tuned_s"], y), s=22, facecolors="none", edgecolors=dots.get_facecolor(), label=f"{name} tuned stored")
        a.set_xscale("log"), a.set_yticks(range(len(names)), names, fontsize=7), a.invert_yaxis()
        a.set_xlabel("seconds from the clock's start (log)"), a.set_title(f"{jit} JIT cache: when each graph became runnable")
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    save(fig, path)


def _points(xs: list[float | None], ys: list[float]) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for x, y in zip(xs, ys, strict=False) if x is not None and x > 0]
    return [x for x, _ in pairs], [y for _, y in pairs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--jit", choices=("cold", "warm", "both"), default="both")
    parser.add_argument("--warm-cache", type=Path, help="CUDA_CACHE_PATH of the warm runs (default: a new directory)")
    parser.add_argument("--time-limit", type=float, default=390.0, help="seconds per JIT state; runs that would end past it are skipped and listed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--foreground-s", type=float, default=2.0)
    parser.add_argument("--build-processes", type=int, default=0, help="the workers' --build-processes (0: their default)")
    parser.add_argument("--merge", type=Path, nargs="*", help="startup.json files of earlier runs: one report of all their runs")
    args = parser.parse_args()
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

    bench = Bench(args.out, args.time_limit, args.repeats, args.foreground_s, args.warm_cache, args.build_processes)
    redis = EmbeddedRedis(bench.tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False).start()
    try:
        for jit in ("cold", "warm") if args.jit == "both" else (args.jit,):
            bench.block(jit, redis.url)
    finally:
        redis.stop()
        report(bench.runs, args.out, {"skipped": bench.skipped, "config": bench.config()})


if __name__ == "__main__":
    main()

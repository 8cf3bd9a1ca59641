"""Start-up benchmark on the GPU: how long a fresh node takes to run its
graphs, with plancache and without it (scripts/gpu-check.sh runs it).

Every path runs in a fresh process (bench/startup_node.py says what each
does and where its clock starts and stops), with an empty CUDA JIT cache
(CUDA_CACHE_DISABLE=1, as in a fresh container) and with a warm one:

  local-heuristic, local-autotuned   the node builds the graphs itself (no plancache)
  fetch, prefetch, background        plancache, every plan stored
  floor                              the frontend's own deserialize of the same blobs
  first-node                         plancache, nothing stored: provisional plans, then tuned

Per JIT state: the server starts fresh (its worker process too) with that
cache state, the first node runs against an empty store (the provisional
plans, then every plan tuned), and the stored-plan paths and the local
builds follow, interleaved, `--repeats` times each (local-autotuned and
first-node once: they take tens of seconds). The warm cache
(CUDA_CACHE_PATH=--warm-cache) is filled by the cold local-autotuned run,
which reads an empty cache as with CUDA_CACHE_DISABLE but writes it, or,
when the warm state runs alone on an empty one, by an unrecorded run first.

    python3 bench/startup.py --out DIR [--jit cold|warm|both] [--time-limit S]
    python3 bench/startup.py --merge A.json B.json --out DIR   # one report from two runs
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

from bench.report import figure, save, table, write_json
from tests.support.processes import REPO, child_env, server_process, signing_public_key, trusting_env, wait_for_workers

REPEATED = ("local-heuristic", "fetch", "prefetch", "background", "floor")
ONCE = ("local-autotuned",)
TARGETS = {
    "stored_vs_local_cold": 15.0,  # fetch/prefetch at least this much faster than local heuristic, empty JIT cache
    "stored_vs_local_warm": 5.0,
    "stored_vs_floor": 1.3,  # at most this much slower than the raw deserialize floor
    "first_node_vs_local": 1.2,  # provisional plans ready, at most this times the local heuristic build
    "tuned_vs_local_autotune": 2.0,  # every plan tuned and stored, at most this times a plain local autotune
    "background_critical_path_s": 0.05,  # what plans add after a 2 s foreground
}


class Bench:
    def __init__(self, out: Path, time_limit: float, repeats: int, foreground_s: float, warm_cache: Path | None) -> None:
        self.out = out
        self.deadline = time.monotonic() + time_limit
        self.repeats = repeats
        self.foreground_s = foreground_s
        self.tmp = Path(tempfile.mkdtemp(prefix="plancache-startup-"))
        self.warm_cache = warm_cache or self.tmp / "jit-cache"
        self.runs: list[dict[str, Any]] = []
        self.skipped: list[str] = []

    def cache_env(self, jit: str, fill: bool = False) -> dict[str, str]:
        if jit == "cold" and not fill:
            return {"CUDA_CACHE_DISABLE": "1"}
        return {"CUDA_CACHE_PATH": str(self.warm_cache), "CUDA_CACHE_DISABLE": "0"}

    def node(
        self, path: str, jit: str, env: dict[str, str], server: str = "", blobs: str = "", fill: bool = False, record: bool = True
    ) -> dict[str, Any] | None:
        label = f"{jit}/{path}"
        if time.monotonic() > self.deadline:
            self.skipped.append(label)
            return None
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
        print(json.dumps({k: v for k, v in row.items() if k != "arrivals"})[:400], flush=True)
        if record:
            self.runs.append(row)
            self.save()
        return row

    def block(self, jit: str, redis_url: str, data_dir: Path) -> None:
        """One JIT state: a fresh server, the first node, then the rest."""
        address = f"127.0.0.1:{_free_port()}"
        if jit == "warm" and not any(self.warm_cache.glob("**/*")):
            # Fill it first: a server started before the fill built as if the cache were
            # empty (GPU run 12, fourth call), while nodes started after it read it warm.
            self.node("local-autotuned", jit, child_env(), record=False)
        server_env = {**child_env(), **self.cache_env(jit)}
        with server_process(address, redis_url, self.out / f"startup-server-{jit}.log", "--gpus", "0", "--data-dir", str(data_dir), env=server_env) as server:
            wait_for_workers(address, proc=server, timeout=300)
            env = trusting_env(signing_public_key(data_dir))
            os.environ.update(env)  # this process's clients (saving the blobs) trust the same key
            forget_plans(address)  # nothing stored: this block's first node builds everything
            if jit == "cold":
                # Fills the warm cache while reading an empty one (see the module doc).
                self.node("local-autotuned", jit, env, fill=True)
            self.node("first-node", jit, env, server=address)
            blobs = str(self.tmp / "blobs.bin")
            save_blobs(address, blobs)
            if jit == "warm":
                self.node("local-autotuned", jit, env)
            for _ in range(self.repeats):
                for path in REPEATED:
                    self.node(path, jit, env, server=address, blobs=blobs)

    def save(self) -> dict[str, Any]:
        summary = summarize(self.runs)
        write_json(self.out / "startup.json", {"summary": summary, "targets": TARGETS, "skipped": self.skipped, "runs": self.runs,
                                               "config": {"repeats": self.repeats, "foreground_s": self.foreground_s}})  # fmt: skip
        return summary


def _free_port() -> int:
    from plancache_server.embedded_redis import free_port

    return free_port()


def manifest_keys() -> list[str]:
    from bench.startup_graphs import startup_graphs
    from plancache import Manifest
    from plancache.gpu import detect_target

    return [e.key or "" for e in Manifest.from_specs(startup_graphs(), detect_target()).entries]


def forget_plans(address: str) -> None:
    from plancache import Client

    with Client(address, cache=False) as client:
        for key in manifest_keys():
            client.invalidate(key)


def save_blobs(address: str, path: str) -> None:
    """The tuned plans' blobs, for the floor (built here if the first node did not get that far)."""
    from bench.startup_graphs import startup_graphs, write_blobs
    from plancache import Client, Manifest
    from plancache.gpu import detect_target

    with Client(address, cache=False) as client:
        result = client.prefetch(Manifest.from_specs(startup_graphs(), detect_target()), compile_missing=True, tuned_only=True, timeout=600)
        if result.errors:
            raise RuntimeError(f"the tuned plans could not be had: {result.errors}")
        write_blobs(path, [result.plans[i].blob for i in range(result.total)])


def _median(runs: list[dict[str, Any]], jit: str, path: str, field: str = "total_s") -> float | None:
    values = [r[field] for r in runs if r["jit"] == jit and r["path"] == path and field in r]
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for jit in ("cold", "warm"):
        m = {p: _median(runs, jit, p) for p in (*REPEATED, *ONCE, "first-node")}
        s: dict[str, Any] = {"median_s": m, "n": {p: sum(1 for r in runs if r["jit"] == jit and r["path"] == p and "total_s" in r) for p in m}}
        local = m["local-heuristic"]
        for path in ("fetch", "prefetch"):
            if local and m[path]:
                s[f"local_over_{path}"] = local / m[path]
            if m["floor"] and m[path]:
                s[f"{path}_over_floor"] = m[path] / m["floor"]
        if local and m["first-node"]:
            s["first_node_over_local"] = m["first-node"] / local
        tuned = _median(runs, jit, "first-node", "tuned_all_s")
        if tuned and m["local-autotuned"]:
            s["tuned_all_s"] = tuned
            s["tuned_over_local_autotune"] = tuned / m["local-autotuned"]
        s["background_after_foreground_s"] = _median(runs, jit, "background", "after_foreground_s")
        summary[jit] = s
    summary["errors"] = [f"{r['jit']}/{r['path']}: {r['error'][-300:]}" for r in runs if "error" in r]
    return summary


def report(runs: list[dict[str, Any]], out: Path, extra: dict[str, Any]) -> None:
    summary = summarize(runs)
    write_json(out / "startup.json", {"summary": summary, "targets": TARGETS, **extra, "runs": runs})
    rows = []
    for jit in ("cold", "warm"):
        for path, value in summary[jit]["median_s"].items():
            rows.append([jit, path, summary[jit]["n"][path], value * 1e3 if value else float("nan")])
    print(table(["JIT cache", "path", "runs", "median ms"], rows))
    print(json.dumps({k: v for k, v in summary.items() if k in ("cold", "warm")}, indent=1, default=str))
    plot(summary, out / "startup.png")


def plot(summary: dict[str, Any], path: Path) -> None:
    fig, (a,) = figure(1)
    paths = [p for p in ("local-heuristic", "local-autotuned", "first-node", "fetch", "prefetch", "background", "floor")]
    width = 0.4
    for offset, jit in ((-width / 2, "cold"), (width / 2, "warm")):
        values = [(summary[jit]["median_s"].get(p) or 0) * 1e3 for p in paths]
        a.bar([i + offset for i in range(len(paths))], values, width=width, label=f"{jit} JIT cache")
    a.set_yscale("log"), a.set_xticks(range(len(paths)), paths, rotation=20, fontsize=8)
    a.set_ylabel("ms until every graph ran once (median)"), a.set_title("13 graphs, fresh process: with and without plancache"), a.legend()
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--jit", choices=("cold", "warm", "both"), default="both")
    parser.add_argument("--warm-cache", type=Path, help="CUDA_CACHE_PATH of the warm runs (default: a new directory)")
    parser.add_argument("--time-limit", type=float, default=540.0, help="seconds; runs past it are skipped and listed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--foreground-s", type=float, default=2.0)
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
    from plancache_server.embedded_redis import EmbeddedRedis

    bench = Bench(args.out, args.time_limit, args.repeats, args.foreground_s, args.warm_cache)
    redis = EmbeddedRedis(bench.tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False).start()
    try:
        for jit in ("cold", "warm") if args.jit == "both" else (args.jit,):
            bench.block(jit, redis.url, bench.tmp / "server-data")
    finally:
        redis.stop()
        report(bench.runs, args.out, {"skipped": bench.skipped, "config": {"repeats": bench.repeats, "foreground_s": bench.foreground_s}})


if __name__ == "__main__":
    main()

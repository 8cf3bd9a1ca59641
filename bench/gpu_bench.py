"""GPU benchmark (H200): warm start vs build, autotune gain, plan vs torch,
plan size and deserialize time. One server with a real cuDNN worker; every
case fetched by a fresh client process; all timings of one case interleaved
in that process.

    python3 bench/gpu_bench.py --out DIR     # (scripts/gpu-check.sh runs it)
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

from bench.gpu_cases import CASES
from bench.report import figure, save, table, write_json
from plancache import Client, CompileOptions, PlanCacheError
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.processes import REPO, child_env, server_process, signing_public_key, trusting_env, wait_for_workers

NOISE = 1.05


def compile_all(address: str, names: list[str]) -> dict[str, dict[str, Any]]:
    from plancache.gpu.target import detect_target

    target = detect_target()
    rows: dict[str, dict[str, Any]] = {}
    with Client(address, cache=False) as client:
        for name in names:
            spec = CASES[name].spec()
            row: dict[str, Any] = {"case": name, "family": CASES[name].family}
            try:
                started = time.perf_counter()
                plan = client.compile(spec, target)
                row.update(
                    key=plan.key,
                    wall_s=time.perf_counter() - started,
                    build_s=plan.metadata.build_seconds,
                    autotune_s=plan.metadata.autotune_seconds,
                    plans=len(plan.metadata.candidates),
                    chosen=plan.metadata.plan_name,
                )
                plan0 = client.compile(spec, target, CompileOptions(autotune=False))
                row.update(key0=plan0.key, plan0_name=plan0.metadata.plan_name)
            except PlanCacheError as e:
                row["error"] = f"{type(e).__name__}: {e.message}"
            print(json.dumps(row)[:300], flush=True)
            rows[name] = row
    return rows


def measure(address: str, row: dict[str, Any]) -> dict[str, Any]:
    args = [sys.executable, "-m", "bench.gpu_client", "--server", address, "--case", row["case"], "--key", row["key"]]
    if row.get("key0"):
        args += ["--key0", row["key0"]]
    proc = subprocess.run(args, env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="plancache-bench-"))
    redis = EmbeddedRedis(
        tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    address = f"127.0.0.1:{free_port()}"
    try:
        with server_process(
            address, redis.url, args.out / "bench-server.log", "--gpus", "0", "--data-dir", str(tmp / "server-data")
        ) as server:
            # Clients here (and the per-case processes) accept only plans signed by this server's worker.
            os.environ.update(trusting_env(signing_public_key(tmp / "server-data")))
            wait_for_workers(address, proc=server)
            rows = compile_all(address, args.cases)
            for row in rows.values():
                if "key" in row:
                    row.update(measure(address, row))
    finally:
        redis.stop()
    report(list(rows.values()), args.out)


def report(rows: list[dict[str, Any]], out: Path) -> None:
    ok = [r for r in rows if "ready_s" in r and "tuned_ms" in r]
    for r in ok:
        r["build_over_ready"] = (r["build_s"] + r["autotune_s"]) / r["ready_s"]
        r["autotune_gain"] = r["plan0_ms"] / r["tuned_ms"] if r.get("plan0_ms") else float("nan")
        r["plan_over_torch"] = r["tuned_ms"] / r["torch_ms"] if r.get("torch_ms") else float("nan")
    headers = [
        "case",
        "plans",
        "build+tune s",
        "ready ms",
        "build/ready",
        "tuned ms",
        "plan0 ms",
        "gain",
        "torch ms",
        "plan/torch",
        "blob KB",
        "deser ms",
        "deser again ms",
    ]
    body = [
        [
            r["case"],
            r["plans"],
            r["build_s"] + r["autotune_s"],
            r["ready_s"] * 1e3,
            r["build_over_ready"],
            r["tuned_ms"],
            r.get("plan0_ms", float("nan")),
            r["autotune_gain"],
            r.get("torch_ms", float("nan")),
            r["plan_over_torch"],
            r["blob_bytes"] / 1024,
            r["deserialize_s"] * 1e3,
            r["deserialize_again_s"] * 1e3,
        ]
        for r in ok
    ]
    print(table(headers, body))
    failed = [r for r in rows if r not in ok]
    for r in failed:
        print(f"FAILED {r['case']}: {str(r.get('error'))[:300]}")
    ratios = [r["build_over_ready"] for r in ok]
    gains = [r["autotune_gain"] for r in ok if r["autotune_gain"] == r["autotune_gain"]]
    vs_torch = [r["plan_over_torch"] for r in ok if r["plan_over_torch"] == r["plan_over_torch"]]
    summary = {
        "cases": len(rows),
        "measured": len(ok),
        "build_over_ready_median": statistics.median(ratios) if ratios else None,
        "build_over_ready_min": min(ratios, default=None),
        "target_build_over_ready": 100,
        "autotune_gain_median": statistics.median(gains) if gains else None,
        "autotune_gain_max": max(gains, default=None),
        "slower_than_plan0_beyond_noise": [r["case"] for r in ok if r["autotune_gain"] < 1 / NOISE],
        "plan_over_torch_median": statistics.median(vs_torch) if vs_torch else None,
        "above_1_1_vs_torch": {r["case"]: round(r["plan_over_torch"], 2) for r in ok if r["plan_over_torch"] > 1.1},
    }
    print(json.dumps(summary, indent=1))
    write_json(out / "gpu_bench.json", {"summary": summary, "rows": rows})
    plot(ok, out / "gpu_bench.png")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    if not rows:
        return
    fig, (a, b, c, d) = figure(4)
    names = [r["case"] for r in rows]
    y = range(len(rows))
    a.barh(y, [r["build_over_ready"] for r in rows])
    a.axvline(100, color="red", linestyle="--", label="target 100x")
    (
        a.set_xscale("log"),
        a.set_yticks(list(y), names, fontsize=7),
        a.set_title("build+autotune / fetch+deserialize (fresh process)"),
        a.legend(),
    )
    b.barh(y, [r["autotune_gain"] for r in rows])
    b.axvline(1.0, color="black")
    b.set_yticks(list(y), names, fontsize=7), b.set_title("autotune gain: plan 0 time / chosen time")
    c.barh(y, [r["plan_over_torch"] for r in rows])
    c.axvline(1.0, color="black"), c.axvline(1.1, color="red", linestyle="--")
    c.set_yticks(list(y), names, fontsize=7), c.set_title("plan time / torch time (lower is better)")
    d.scatter([r["blob_bytes"] / 1024 for r in rows], [r["deserialize_again_s"] * 1e3 for r in rows])
    d.set_xlabel("blob KB"), d.set_ylabel("deserialize ms (warm)"), d.set_title("plan size vs deserialize time")
    save(fig, path)


if __name__ == "__main__":
    main()

"""GPU session: a real redis-server, `plancache-server` as a subprocess with a
real cuDNN worker on GPU 0, every example compiled through it, and one
separate client process that fetches, deserializes, executes and checks.

Skipped (and reported as skipped) where there is no CUDA GPU or no cuDNN
frontend. scripts/gpu-check.sh runs it on the GPU machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.generate import EXAMPLES
from plancache import Client, CompileOptions, DiskCache, GraphSpec, PlanCacheError
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support import hermetic
from tests.support.processes import REPO, server_process, signing_public_key, trusting_env, wait_for_workers

# Cases whose heuristic plan 0 is also built, to compare with the autotuned one.
PLAN0_CASES = ("matmul_fp16", "matmul_bias_relu_bf16", "conv_bias_relu_fp16", "sdpa_causal_fp16")


def _gpu_ready() -> str | None:
    try:
        import cudnn  # noqa: F401
        import torch
    except ImportError as e:
        return f"needs torch and the cuDNN frontend ({e.name} missing)"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu_ready()
    if reason:
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
    # The examples' tests first, as when every test waited for gpu_session: their first compiles must be the
    # service's first sight of those graphs (a provisional plan, then the tuned one), before a plancache.functional
    # test can have stored the same graph. A run of only the others never starts gpu_session (gpu_server's tests).
    # Whole modules move, so a module's fixtures are set up once as before.
    first = {item.module for item in items if "gpu_session" in getattr(item, "fixturenames", ())}  # type: ignore[attr-defined]
    items.sort(key=lambda item: getattr(item, "module", None) not in first)


def _out_dir(tmp: Path) -> Path:
    out = Path(os.environ.get("PLANCACHE_TEST_GPU_OUT") or tmp)
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def pf(gpu_server: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """plancache.functional against the session's server (its disk cache this module's own; no hedge: the service's plans are under test)."""
    import plancache.functional

    plancache.functional.clear()
    client = Client(
        gpu_server["address"],
        trusted_keys=[gpu_server["public_key"]],
        allow_unsigned=False,
        cache=DiskCache(tmp_path_factory.mktemp("functional")),
        hedge=False,
    )
    plancache.functional.configure(client)
    # The plans are under test: a geometry torch's function won its race would run torch's function, which the
    # tests compare with (test_gpu_race.py turns the race on).
    plancache.functional.set_race_torch(False)
    yield plancache.functional
    plancache.functional.clear()
    client.close()


@pytest.fixture(scope="session")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A plancache-server with its GPU worker and its Redis, ready: what plancache.functional's and plancache.torch's
    tests need, started in seconds. The examples' builds and the client process are gpu_session's (over two
    minutes on an H100, GPU run 51): a call that runs only the former does not wait for them."""
    from plancache.gpu.target import detect_target

    tmp = tmp_path_factory.mktemp("gpu")
    out = _out_dir(tmp)
    redis = EmbeddedRedis(tmp / "redis", binary=hermetic.redis_server_bin(), persist=False).start()
    address, http_port = f"127.0.0.1:{free_port()}", free_port()
    data_dir = tmp / "server-data"
    try:
        # --no-warm: the worker does not warm the generic target on its own while the tests run (tests/gpu/test_gpu_warming.py warms on purpose).
        with server_process(
            address,
            redis.url,
            out / "server.log",
            "--gpus",
            "0",
            "--data-dir",
            str(data_dir),
            "--metrics-port",
            str(http_port),
            "--no-warm",
        ) as server:
            # The server generated a signing key for its worker: every client here trusts only it.
            public_key = signing_public_key(data_dir)
            wait_for_workers(address, proc=server)
            yield {
                "address": address,
                "http": f"http://127.0.0.1:{http_port}",
                "out": out,
                "tmp": tmp,
                "public_key": public_key,
                "target": detect_target().id,
                "server_pid": server.pid,
            }
    finally:
        redis.stop()


@pytest.fixture(scope="session")
def gpu_session(gpu_server: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """gpu_server with every example compiled and autotuned by the service alone, and a client process that fetched
    and ran them (the examples' tests read both)."""
    from plancache.gpu.target import detect_target

    out, tmp = gpu_server["out"], gpu_server["tmp"]
    public_key = gpu_server["public_key"]
    session: dict[str, Any] = {k: gpu_server[k] for k in ("address", "http", "public_key", "target")}
    session |= {"cases": {}, "out": out}
    target = detect_target()
    with Client(
        session["address"], cache=False, trusted_keys=[public_key], allow_unsigned=False, hedge=False
    ) as client:  # the service alone (tests/gpu/test_gpu_hedge.py races)
        for name, build in EXAMPLES.items():
            session["cases"][name] = _compile(client, name, build(), target, tmp)
    session["gpu_memory"] = _gpu_memory_by_process(gpu_server["server_pid"])
    session["client"] = _run_client_process(session["address"], session["cases"], out, trusting_env(public_key))
    # The status page after real builds, kept for docs/gpu-runs/ (scripts/gpu-check.sh packs it).
    for page in ("status.json", "status.html"):
        with urllib.request.urlopen(f"{session['http']}/{page.replace('.html', '')}", timeout=30) as response:
            (out / page).write_bytes(response.read())
    (out / "gpu_session.json").write_text(
        json.dumps({k: v for k, v in session.items() if k != "out"}, indent=1, default=str)
    )
    yield session


def _compile(client: Client, name: str, spec: GraphSpec, target: Any, scratch: Path) -> dict[str, Any]:
    case: dict[str, Any] = {"name": name}
    started = time.perf_counter()
    try:
        # A first build answers with cuDNN's heuristic plan while autotuning runs ...
        first = client.compile(spec, target)
        case.update(
            first_source=first.source, first_s=time.perf_counter() - started, first_provisional=first.provisional
        )
        if first.provisional:
            case["provisional_file"] = str(scratch / f"{name}.provisional.plan")
            Path(case["provisional_file"]).write_bytes(first.to_bytes())
        # ... and the autotuned plan replaces it.
        plan = client.compile(spec, target, tuned_only=True)
    except PlanCacheError as e:
        case["error"] = f"{type(e).__name__}: {e.message}"
        return case
    meta = plan.metadata
    case.update(
        key=plan.key,
        source=plan.source,
        wall_s=time.perf_counter() - started,
        build_s=meta.build_seconds,
        autotune_s=meta.autotune_seconds,
        candidates=len(meta.candidates),
        plan_name=meta.plan_name,
        blob_bytes=len(plan.blob),
        timings_ms=[c.median_ms if c.HasField("median_ms") else None for c in meta.candidates],
        engine_kind=meta.engine_kind,
        second_source=client.compile(spec, target).source,
        untimed=[c.timing for c in meta.candidates if c.timing.startswith("untimed")],
    )
    if name in PLAN0_CASES:
        try:
            case["untuned_key"] = client.compile(spec, target, CompileOptions(autotune=False)).key
        except PlanCacheError as e:
            case["untuned_error"] = f"{type(e).__name__}: {e.message}"
    return case


def _gpu_memory_by_process(server_pid: int) -> dict[str, Any]:
    """What the server's worker and its build processes hold on the GPU (MiB,
    nvidia-smi): the cost of the build pool, a CUDA context per process."""
    family = {server_pid}
    for _ in range(3):  # server -> worker -> build processes
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                pid, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid in family:
                family.add(pid)
    try:
        rows = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except OSError as e:
        return {"error": str(e)}
    used = {int(p): int(m) for p, m in (line.split(",") for line in rows.splitlines() if line.strip())}
    mine = {pid: mib for pid, mib in used.items() if pid in family}
    # In a container nvidia-smi may see other pids than /proc: every compute process on the GPU too.
    return {
        "processes": len(mine),
        "mib": mine,
        "total_mib": sum(mine.values()),
        "all_processes": len(used),
        "all_mib": sum(used.values()),
        "family": sorted(family),
    }


def _run_client_process(address: str, cases: dict[str, Any], out: Path, env: dict[str, str]) -> dict[str, Any]:
    todo = [
        {"name": n, "key": c["key"], "untuned_key": c.get("untuned_key"), "provisional_file": c.get("provisional_file")}
        for n, c in cases.items()
        if "key" in c
    ]
    cases_file = out / "client_cases.tmp"
    cases_file.write_text(json.dumps(todo))
    results = out / "client_results.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.gpu.client_check",
            "--server",
            address,
            "--cases",
            str(cases_file),
            "--out",
            str(results),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    with open(out / "client.log", "a") as log:
        log.write(f"--- client process\n{proc.stdout}{proc.stderr}")
    cases_file.unlink()
    if proc.returncode != 0:
        raise RuntimeError(f"client process failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return {r["name"]: r for r in json.loads(results.read_text())}

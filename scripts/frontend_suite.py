#!/usr/bin/env python3
"""The cuDNN frontend's own tests and samples, run unchanged and with one
line changed (`import plancache.cudnn as cudnn`), on a GPU machine
(scripts/frontend-suite.sh runs it there after `source scripts/gpu-env.sh`).

    python3 scripts/frontend_suite.py --out DIR [--tests FILE ...] [--samples [NAME ...]]
        [--phases native,plancache,again] [--time-limit S | native=S,plancache=S,again=S] [--budget S]
        [-k EXPR] [--dry-run] [-- MORE PYTEST ARGS]
    python3 scripts/frontend_suite.py --convert-notebooks NOTEBOOK_DIR SCRIPT_DIR

Phases, each in new processes with an empty CUDA JIT cache of its own, each
cut at its --time-limit, shortened where needed so that the whole run ends
within --budget (480 s: a device call has 10 minutes) with time left for
the phases after it:
  native     .frontend-suite/ (scripts/fetch-frontend-tests.sh) as it is;
  plancache  a copy whose cudnn imports are rewritten (rewrite_imports), against
             one fresh plancache-server (private Redis, one GPU worker, its signing
             key trusted), with an empty plan disk cache;
  again      once the plans served in "plancache" are stored tuned (a bounded
             wait), the same copy in a new process with a new empty disk cache:
             every graph served before should now be a "hit".
The tests run under `python -m pytest FILES -p no:cacheprovider -o addopts=`
with the frontend's own conftest.py, `-m L0` (its pytest.ini's default) and
scripts/frontend_suite_plugin.py, which records each test's outcome and the
graphs plancache.cudnn built during it. Samples run as `python NN_name.py`.

Writes DIR/frontend-suite.{json,md} (after every phase, so a cut-off run
keeps what it did), DIR/{plancache,again}-graphs.json, and its logs, junit
XML and event files under --logs. Exit status 1 when a test's outcome
differs between native and a plancache phase, 2 when the run could not be
set up (an import the rewrite does not cover, the server did not start).

Its parts: frontend_suite_sources.py (the one-line change, notebooks as
scripts), frontend_suite_report.py (outcomes, comparison, counts, the
report), frontend_suite_plugin.py (inside the test processes). At module
level only those and the standard library are imported (the notebook
conversion runs where plancache is not installed); the phases import the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from frontend_suite_report import (
    NOT_RUN,
    PHASES,
    PLANCACHE_PHASES,
    Outcome,
    PhaseRun,
    build_report,
    differences,
    graphs_by_test,
    is_served,
    phase_outcomes,
    read_events,
    render_markdown,
    summary_lines,
)
from frontend_suite_sources import (
    ImportRewriteError,
    Prepared,
    convert_notebooks,
    prepare,
    select_samples,
    select_tests,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"

# Test files of the frontend's test/python that build cuDNN graphs on sm_90 with
# torch + the frontend + looseversion (several skip on sm_90 by their own markers:
# cheap, and their skips must match too).
DEFAULT_TESTS = (
    "test_matmul_bias_relu.py",
    "test_conv_bias.py",
    "test_conv_fprop.py",
    "test_wgrads.py",
    "test_conv_genstats.py",
    "test_conv_reduction.py",
    "test_layernorm.py",
    "test_rmsnorm.py",
    "test_batchnorm.py",
    "test_instancenorm.py",
    "test_apply_rope.py",
    "test_silu_and_mul.py",
    "test_slice.py",
    "test_kernel_cache.py",
    "test_deviceless_aot_compilation.py",
    "test_sdpa_with_caching.py",
    "test_sdpa_chunked_prefill.py",
    "test_sdpa_thd.py",
    "test_flexible_sdpa.py",
    "test_flexible_sdpa_bprop.py",
    "test_mhas_v2.py",
    "test_block_scale_quantize.py",
    "test_low_precision_matmul.py",
    "test_moe_grouped_matmul.py",
    "test_moe_grouped_matmul_op.py",
)
# Left out of the default selection, and why (in the report).
EXCLUDED = {
    "test_cudnn_sdpa_op.py": "imports cudnn.experimental.ops.sdpa, which frontend 1.32 no longer has (collection error in every phase); its d=256 path needs nvidia-cutlass-dsl",
    "fe_api/": "CuTe-DSL APIs: need nvidia-cutlass-dsl (not extracted by scripts/fetch-frontend-tests.sh)",
    "test_sm90_prefill_oss_engine.py": "no L0 test; the open-source SDPA engine path",
    "test_sm100_*.py, test_sdpa_mxfp8.py, test_block_scale_quantize_dynamic_shape.py": "Blackwell (sm_100) only, or L1+ only",
    "test_mhas.py": "thousands of combinations, superseded by test_mhas_v2 (kept, capped)",
    "test_matmul_fuzzer.py, test_conv_fuzzer.py": "random fuzzers: long, and not one selection across phases unless seeded",
    "test_sdpa_fp8_serialization.py": "runs the SDPA test in a child process: its graphs are not seen by the recorder",
}
# The first N parametrized cases per test function (frontend_suite_plugin.capped).
DEFAULT_CAPS = ("test_mhas_v2.py=1",)
DEFAULT_LIMITS = {"native": 150.0, "plancache": 170.0, "again": 120.0}
# The whole run's seconds (a device call has 10 minutes, the wheels' install and
# the archive included); a phase's limit is cut so that the later ones keep these.
DEFAULT_BUDGET = 480.0
MIN_PHASE_S = 60.0
MIN_TUNED_WAIT_S = 20.0


# ---- running ------------------------------------------------------------------------------------------------


def stop(proc: subprocess.Popen[bytes], grace: float) -> int:
    """SIGINT to its process group first (pytest then ends its session: junit XML
    written, the plugin's last events), SIGKILL when it does not end in `grace` s."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def run_limited(cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path, limit: float) -> tuple[int, bool, float]:
    """(exit status, cut at `limit`, wall seconds)."""
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=max(limit, 1.0)), False, time.monotonic() - started
        except subprocess.TimeoutExpired:
            return stop(proc, grace=20.0), True, time.monotonic() - started


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return lines[-1].strip()[:300] if lines else ""


def run_samples(
    run: PhaseRun,
    samples_dir: Path,
    samples: list[str],
    env: dict[str, str],
    *,
    deadline: float,
    jobs: int,
    timeout: float,
    logs: Path,
    events_dir: Path | None,
) -> None:
    """Each sample in a process of its own (up to `jobs` at once): `python NN_name.py`,
    or through frontend_suite_plugin (its graphs recorded) when `events_dir` is given."""
    logs.mkdir(parents=True, exist_ok=True)
    pending = list(samples)
    running: list[tuple[str, subprocess.Popen[bytes], float, IO[str]]] = []  # name, process, started, its log
    started_all = time.monotonic()
    while pending or running:
        while pending and len(running) < jobs and time.monotonic() < deadline:
            name = pending.pop(0)
            cmd = [sys.executable, name]
            if events_dir is not None:
                events_dir.mkdir(parents=True, exist_ok=True)
                cmd = [
                    sys.executable,
                    str(SCRIPTS / "frontend_suite_plugin.py"),
                    name,
                    str(events_dir / f"{name}.jsonl"),
                    f"samples/{name}",
                ]
            output: IO[str] = (logs / f"{name}.log").open("w")
            proc = subprocess.Popen(
                cmd, cwd=samples_dir, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
            running.append((name, proc, time.monotonic(), output))
        if not running:
            for name in pending:
                run.outcomes[f"samples/{name}"] = Outcome(NOT_RUN, "the phase's time limit came first")
            break
        time.sleep(0.2)
        for item in list(running):
            name, proc, started, output = item
            rc = proc.poll()
            now = time.monotonic()
            if rc is None and now > min(started + timeout, deadline):
                stop(proc, grace=5.0)
                # Its own timeout is an outcome (a hang); the phase's limit only cuts the run short (compare: incomplete).
                run.outcomes[f"samples/{name}"] = (
                    Outcome("failed", f"no exit within {timeout:.0f} s")
                    if now > started + timeout
                    else Outcome("timeout", "cut at the phase's limit")
                )
            elif rc is not None:
                run.outcomes[f"samples/{name}"] = (
                    Outcome("passed")
                    if rc == 0
                    else Outcome("failed", f"exit {rc}: {_last_line(logs / f'{name}.log')}")
                )
            else:
                continue
            output.close()
            running.remove(item)
    run.samples_wall_s = time.monotonic() - started_all
    if events_dir is not None:
        for events in sorted(events_dir.glob("*.jsonl")):
            graphs, lost = graphs_by_test(read_events(events))
            for nodeid, gs in graphs.items():
                run.graphs.setdefault(nodeid, []).extend(gs)
            run.lost_graphs += lost


@dataclass
class Deployment:
    address: str
    public_key: Path


@contextmanager
def deployment(work: Path, logs: Path) -> Iterator[Deployment]:
    """One plancache-server (as tests/gpu/conftest.py starts it): a private Redis,
    one GPU worker (its own empty CUDA JIT cache), the signing key it generates."""
    from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
    from tests.support.processes import child_env, server_process, signing_public_key, wait_for_workers

    redis = EmbeddedRedis(
        work / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    try:
        address, data_dir = f"127.0.0.1:{free_port()}", work / "server-data"
        env = child_env(CUDA_CACHE_PATH=str(work / "server-cuda-cache"), CUDA_CACHE_DISABLE="0")
        # --no-warm: the worker builds what the tests ask for, nothing of its own.
        with server_process(
            address, redis.url, logs / "server.log", "--gpus", "0", "--data-dir", str(data_dir), "--no-warm", env=env
        ) as server:
            wait_for_workers(address, proc=server)
            yield Deployment(address, signing_public_key(data_dir))
    finally:
        redis.stop()


def wait_tuned(dep: Deployment, keys: set[str], limit: float) -> dict[str, Any]:
    """Until every plan in `keys` is stored tuned (not the provisional heuristic one), at most `limit` s."""
    from plancache import Client, PlanCacheError

    started, pending = time.monotonic(), set(keys)
    errors: dict[str, str] = {}
    with Client(dep.address, cache=False, trusted_keys=[dep.public_key], allow_unsigned=False, timeout=10) as client:
        while pending and time.monotonic() - started < limit:
            for key in sorted(pending):
                try:
                    if not client.get(key).provisional:
                        pending.discard(key)
                        errors.pop(key, None)
                except PlanCacheError as e:
                    errors[key] = f"{type(e).__name__}: {e}"
            if pending:
                time.sleep(1.0)
    return {
        "keys": len(keys),
        "tuned": len(keys) - len(pending),
        "still_provisional": sorted(pending),
        "waited_s": round(time.monotonic() - started, 1),
        "errors": errors,
    }


def server_stats(dep: Deployment) -> list[dict[str, Any]]:
    from plancache import Client, PlanCacheError

    try:
        with Client(dep.address, cache=False, timeout=10) as client:
            return [{k: v for k, v in asdict(t).items() if k != "windows"} for t in client.admin.stats()]
    except PlanCacheError as e:
        return [{"error": f"{type(e).__name__}: {e}"}]


@dataclass
class Config:
    out: Path
    logs: Path
    work: Path
    suite: Path
    tests: list[str]  # pytest arguments relative to test/python
    samples: list[str]  # sample file names
    phases: list[str]
    limits: dict[str, float]
    budget: float
    tuned_wait: float
    marker: str
    caps: dict[str, int]
    k: str | None
    pytest_args: list[str]
    sample_jobs: int
    sample_timeout: float
    dry_run: bool
    # native runs beside the plancache phases (one device call holds all three): each process has
    # its own CUDA JIT cache and plancache's server is the only one sharing its plans.
    parallel: bool = False


class Suite:
    def __init__(self, config: Config, prepared: Prepared, meta: dict[str, Any]) -> None:
        self.config, self.prepared, self.meta = config, prepared, meta
        self.runs: dict[str, PhaseRun] = {}
        self.deadline = time.monotonic() + config.budget
        self._saving = threading.Lock()

    def limit(self, phase: str) -> float:
        """The phase's --time-limit, shortened so that the phases after it keep their minimum within --budget."""
        if self.config.parallel and phase == "native":
            return max(MIN_PHASE_S / 2, min(self.config.limits[phase], self.deadline - time.monotonic()))
        later = [
            p
            for p in PHASES[PHASES.index(phase) + 1 :]
            if p in self.config.phases and not (self.config.parallel and p == "native")
        ]
        reserve = sum(min(self.config.limits[p], MIN_PHASE_S) for p in later)
        reserve += min(self.config.tuned_wait, MIN_TUNED_WAIT_S) if "again" in later else 0.0
        return max(MIN_PHASE_S / 2, min(self.config.limits[phase], self.deadline - time.monotonic() - reserve))

    def env(self, phase: str, dep: Deployment | None) -> dict[str, str]:
        from tests.support.processes import child_env, trusting_env

        base = trusting_env(dep.public_key) if dep is not None else child_env()
        fresh = self.state(phase)
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        env = {
            **base,
            "PYTHONPATH": os.pathsep.join([str(SCRIPTS), base.get("PYTHONPATH", "")]),
            "CUDA_CACHE_PATH": str(fresh / "cuda-cache"),
            "CUDA_CACHE_DISABLE": "0",  # an empty CUDA JIT cache, this phase's own
            "PYTHONHASHSEED": "0",  # a test that derives its case from hash() of a string gets the same one in every phase
            "TORCHINDUCTOR_CACHE_DIR": str(fresh / "inductor"),
            "TRITON_CACHE_DIR": str(fresh / "triton"),  # samples with torch.compile
            "FRONTEND_SUITE_EVENTS": str(self.config.logs / f"{phase}-events.jsonl"),
            "FRONTEND_SUITE_CAPS": json.dumps(self.config.caps),
        }
        if dep is not None:
            env.update(
                PLANCACHE_SERVER=dep.address, PLANCACHE_CACHE_DIR=str(fresh / "plan-cache"), FRONTEND_SUITE_GRAPHS="1"
            )
        return env

    def state(self, phase: str) -> Path:
        """The phase's own caches (CUDA JIT, plans, torch.compile) and sample events."""
        return self.config.work / f"{phase}-state"

    def copy(self, phase: str) -> Path:
        return self.config.work / ("native" if phase == "native" else "plancache")

    def pytest_command(self, phase: str) -> list[str]:
        c = self.config
        # --continue-on-collection-errors: a file that fails to import (a missing package) is one error, not the end of the phase.
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *c.tests,
            "-p",
            "no:cacheprovider",
            "-p",
            "frontend_suite_plugin",
            "-q",
            "--tb=short",
            "-o",
            "addopts=",
            f"--junitxml={c.logs / f'{phase}-junit.xml'}",
            "--continue-on-collection-errors",
        ]
        cmd += ["-m", c.marker] if c.marker else []
        cmd += ["-k", c.k] if c.k else []
        return cmd + c.pytest_args

    def phase(self, phase: str, dep: Deployment | None) -> PhaseRun:
        c = self.config
        env = self.env(phase, dep)
        run = PhaseRun(
            phase,
            limit_s=self.limit(phase),
            cuda_cache=env["CUDA_CACHE_PATH"],
            plan_cache=env.get("PLANCACHE_CACHE_DIR", ""),
        )
        self.runs[phase] = run
        started = time.monotonic()
        print(
            f"--- {phase}: {len(c.tests)} test files, {len(c.samples)} samples, limit {run.limit_s:.0f} s", flush=True
        )
        if c.tests:
            self.tests(run, env, run.limit_s)
        if c.samples:
            run_samples(
                run,
                self.copy(phase) / "samples",
                c.samples,
                env,
                deadline=started + run.limit_s,
                jobs=c.sample_jobs,
                timeout=c.sample_timeout,
                logs=c.logs / f"{phase}-samples",
                events_dir=self.state(phase) / "sample-events" if dep is not None else None,
            )
        run.wall_s = time.monotonic() - started
        print(f"--- {phase}: {run.wall_s:.0f} s, rc {run.rc}, {run.counts()}", flush=True)
        self.save()
        return run

    def tests(self, run: PhaseRun, env: dict[str, str], limit: float) -> None:
        events, junit = Path(env["FRONTEND_SUITE_EVENTS"]), self.config.logs / f"{run.phase}-junit.xml"
        events.unlink(missing_ok=True)
        junit.unlink(missing_ok=True)
        cwd, log = self.copy(run.phase) / "test" / "python", self.config.logs / f"{run.phase}-pytest.log"
        run.rc, run.timed_out, _ = run_limited(self.pytest_command(run.phase), cwd=cwd, env=env, log=log, limit=limit)
        run.junit = junit.exists()
        recorded = read_events(events)
        try:
            run.outcomes = phase_outcomes(junit.read_text() if run.junit else None, recorded, run.timed_out)
        except ET.ParseError as e:
            run.notes.append(f"junit XML unreadable ({e}): outcomes from the plugin's events")
            run.outcomes = phase_outcomes(None, recorded, run.timed_out)
        run.graphs, run.lost_graphs = graphs_by_test(recorded)
        if run.timed_out:
            run.notes.append(f"pytest was stopped at the phase's limit ({limit:.0f} s)")

    def save(self) -> dict[str, Any]:
        with self._saving:
            return self._save()

    def _save(self) -> dict[str, Any]:
        report = build_report(dict(self.runs), self.meta)
        out = self.config.out
        out.mkdir(parents=True, exist_ok=True)
        (out / "frontend-suite.json").write_text(json.dumps(report, indent=1, default=str))
        (out / "frontend-suite.md").write_text(render_markdown(report))
        for name in PLANCACHE_PHASES:
            if name in self.runs:
                (out / f"{name}-graphs.json").write_text(json.dumps(self.runs[name].graphs, indent=1))
        return report

    def run(self) -> dict[str, Any]:
        phases = self.config.phases
        # Imported here, before the native phase's thread starts: two threads importing one package from
        # different ends (plancache from the top, plancache_server.* through plancache.keys.target) deadlock on
        # Python's module locks (GPU run 26: the native phase died with _DeadlockError).
        import plancache_server.store.embedded_redis  # noqa: F401
        import tests.support.processes  # noqa: F401

        beside: threading.Thread | None = None
        if "native" in phases and self.config.parallel:
            beside = threading.Thread(target=self.native_beside, name="native")
            beside.start()
        elif "native" in phases:
            self.phase("native", None)
        if "plancache" in phases:
            try:
                self.plancache_phases()
            except Exception as e:  # the server did not start, say: what ran so far is still reported
                self.meta["error"] = f"{type(e).__name__}: {e}"
                print(f"--- plancache phases ended early: {self.meta['error']}", flush=True)
        if beside is not None:
            beside.join()
        return self.save()

    def native_beside(self) -> None:
        """The native phase in its thread: a crash is the report's error (and the exit status), not a
        traceback on stderr and a phase missing from the table."""
        try:
            self.phase("native", None)
        except Exception as e:
            self.meta["error"] = f"native phase: {type(e).__name__}: {e}"
            print(f"--- native phase ended early: {self.meta['error']}", flush=True)

    def plancache_phases(self) -> None:
        with deployment(self.config.work, self.config.logs) as dep:
            self.meta["server"] = dep.address
            first = self.phase("plancache", dep)
            if "again" in self.config.phases:
                keys = {g["key"] for gs in first.graphs.values() for g in gs if is_served(g) and g.get("key")}
                wait = max(
                    0.0,
                    min(
                        self.config.tuned_wait,
                        self.deadline - time.monotonic() - min(self.config.limits["again"], MIN_PHASE_S),
                    ),
                )
                print(f"--- waiting (at most {wait:.0f} s) for {len(keys)} plans to be stored tuned", flush=True)
                self.meta["tuned_wait"] = wait_tuned(dep, keys, wait)
                self.phase("again", dep)
            self.meta["server_stats"] = server_stats(dep)


# ---- the program -----------------------------------------------------------------------------------------


def parse_limits(text: str) -> dict[str, float]:
    """Seconds per phase: "300" (every phase) or "native=150,again=90" (the others keep their default)."""
    if "=" not in text:
        return dict.fromkeys(PHASES, float(text))
    limits = dict(DEFAULT_LIMITS)
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in PHASES:
            raise SystemExit(f"--time-limit: unknown phase {name!r}")
        limits[name.strip()] = float(value)
    return limits


def parse_caps(values: list[str]) -> dict[str, int]:
    """["test_mhas_v2.py=2", "10"] -> {"test_mhas_v2.py": 2, "*": 10}."""
    caps = {}
    for value in values:
        pattern, sep, number = value.rpartition("=")
        caps[pattern if sep else "*"] = int(number)
    return caps


def read_source(suite: Path) -> dict[str, str]:
    path = suite / "SOURCE"
    lines = path.read_text().splitlines() if path.exists() else []
    return {k.strip(): v.strip() for k, sep, v in (line.partition(":") for line in lines) if sep}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="where the report goes")
    p.add_argument("--logs", type=Path, help="logs, junit XML and events (default OUT/logs)")
    p.add_argument("--work", type=Path, help="the copies and each phase's caches (default: a new temporary folder)")
    p.add_argument(
        "--suite", type=Path, default=REPO / ".frontend-suite", help="what scripts/fetch-frontend-tests.sh extracted"
    )
    p.add_argument(
        "--tests",
        nargs="*",
        default=list(DEFAULT_TESTS),
        help="test files of test/python (FILE[::TEST]); none: samples only",
    )
    p.add_argument("--samples", nargs="*", help="run the converted samples too (all, or those named: 10_, 2*)")
    p.add_argument("--phases", default=",".join(PHASES), help="a comma list of native, plancache, again")
    p.add_argument(
        "--time-limit",
        default=",".join(f"{k}={v:.0f}" for k, v in DEFAULT_LIMITS.items()),
        help="seconds: one for every phase, or PHASE=S,...",
    )
    p.add_argument(
        "--budget", type=float, default=DEFAULT_BUDGET, help="seconds for the whole run: later phases keep a minimum"
    )
    p.add_argument(
        "--tuned-wait",
        type=float,
        default=45.0,
        help="seconds to wait for the plans of 'plancache' to be stored tuned before 'again'",
    )
    p.add_argument(
        "--marker",
        default="L0",
        help="pytest -m (the frontend's pytest.ini default, which -o addopts= drops); '' for all",
    )
    p.add_argument(
        "--max-per-function",
        action="append",
        help=f"[GLOB=]N: the first N cases of each test function (default {list(DEFAULT_CAPS)})",
    )
    p.add_argument("-k", help="pytest -k")
    p.add_argument("--sample-jobs", type=int, default=4, help="samples run side by side")
    p.add_argument("--sample-timeout", type=float, default=150.0, help="seconds per sample")
    p.add_argument("--dry-run", action="store_true", help="prepare the copies, print the commands, start nothing")
    p.add_argument(
        "--parallel", action="store_true", help="run native beside the plancache phases (one device call for all three)"
    )
    p.add_argument(
        "--convert-notebooks",
        nargs=2,
        type=Path,
        metavar=("NOTEBOOKS", "SCRIPTS"),
        help="convert NOTEBOOKS/*.ipynb into SCRIPTS/*.py and exit",
    )
    return p


def configure(argv: list[str]) -> Config | None:
    """The run's settings from the command line (what follows `--` goes to pytest); None when it only converted notebooks."""
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = parser()
    args = p.parse_args(ours)
    if args.convert_notebooks:
        for warning in convert_notebooks(*args.convert_notebooks):
            print(f"warning: {warning}", file=sys.stderr)
        return None
    phases = [name.strip() for name in args.phases.split(",") if name.strip()]
    if unknown := [name for name in phases if name not in PHASES]:
        p.error(f"unknown phases {unknown}")
    if "again" in phases and "plancache" not in phases:
        p.error("'again' needs 'plancache' (the plans it should find)")
    if args.out is None:
        p.error("--out is required")
    if not (args.suite / "test" / "python" / "conftest.py").is_file():
        p.error(
            f"{args.suite}: no test/python/conftest.py: run scripts/fetch-frontend-tests.sh (and carry .frontend-suite/)"
        )
    out = args.out.resolve()
    return Config(
        out=out,
        logs=(args.logs or out / "logs").resolve(),
        work=(args.work or Path(tempfile.mkdtemp(prefix="frontend-suite-"))).resolve(),
        suite=args.suite,
        tests=select_tests(args.suite, args.tests),
        samples=select_samples(args.suite, args.samples),
        phases=phases,
        limits=parse_limits(args.time_limit),
        budget=args.budget,
        tuned_wait=args.tuned_wait,
        marker=args.marker,
        caps=parse_caps(args.max_per_function or list(DEFAULT_CAPS)),
        k=args.k,
        pytest_args=pytest_args,
        sample_jobs=args.sample_jobs,
        sample_timeout=args.sample_timeout,
        dry_run=args.dry_run,
        parallel=args.parallel,
    )


def main(argv: list[str]) -> int:
    config = configure(argv)
    if config is None:
        return 0
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # tests.support.processes
    config.logs.mkdir(parents=True, exist_ok=True)
    try:
        prepared = prepare(config.suite, config.work, config.tests, config.samples)
    except ImportRewriteError as e:
        print(f"refusing to run: {e}", file=sys.stderr)
        return 2
    selection = {
        k: v
        for k, v in asdict(config).items()
        if k in ("tests", "samples", "marker", "k", "caps", "pytest_args", "limits", "budget", "tuned_wait")
    }
    versions = config.out / "versions.txt"
    meta: dict[str, Any] = {
        "source": read_source(config.suite),
        "versions": versions.read_text() if versions.exists() else "",
        "selection": selection,
        "excluded": EXCLUDED,
        "rewrites": prepared.rewrites,
        "not_rewritten_unselected": prepared.unrewritten,
        "work": str(config.work),
    }
    suite = Suite(config, prepared, meta)
    if config.dry_run:
        print(f"work: {config.work}")
        for name, r in prepared.rewrites.items():
            print(f"rewrote {name}: {r['rewritten']} line(s)" + (f"; kept {r['kept']}" if r["kept"] else ""))
        for phase in config.phases:
            print(
                f"{phase} (cwd {suite.copy(phase) / 'test' / 'python'}, limit {config.limits[phase]:.0f} s): {' '.join(suite.pytest_command(phase))}"
            )
        for sample in config.samples:
            print(f"sample {sample}: python {sample} (cwd {config.work}/<native|plancache>/samples)")
        return 0
    report = suite.run()
    print("\n".join(summary_lines(report)), flush=True)
    return 2 if "error" in report else 1 if differences(report) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

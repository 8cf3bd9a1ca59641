"""The deployment bench/startup.py's first nodes meet: a worker and its build
processes made ready, the GPU memory they hold (and a node process's own),
and the store read directly (what is stored and tuned; what is left of a
build) so that each path starts from nothing stored and nothing pending.
Imports neither torch nor cudnn.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.processes import wait_for_workers

# The worker's log lines (plancache_server.worker.worker, plancache_server.worker.build_pool).
SERVING = re.compile(r"serving targets ([^\s,]+)(?:, [^\s,]+)* with (\d+) build processes")
POOL_READY = re.compile(r"build process (\d+) \(pid (\d+)\) ready")


def wait_until(done: Callable[[], bool], procs: list[subprocess.Popen[Any]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process ended during the {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {what} took over {timeout:g} s")
        time.sleep(0.05)


def wait_for_pool(log: Path, worker: subprocess.Popen[bytes], address: str, timeout: float = 240) -> tuple[str, int]:
    """Until the worker heartbeats and its log shows every build process ready: (its exact target, pool size)."""
    found: list[tuple[str, int]] = []

    def ready() -> bool:
        text = log.read_text(errors="replace")
        serving = SERVING.search(text)
        if serving and len({slot for slot, _ in POOL_READY.findall(text[serving.end() :])}) >= int(serving.group(2)):
            found.append((serving.group(1), int(serving.group(2))))
        return bool(found)

    wait_until(ready, [worker], timeout, f"worker start (see {log})")
    wait_for_workers(address, proc=worker, timeout=timeout)
    return found[0]


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _cpu_s(pid: int) -> float | None:
    """A process's CPU seconds (user + system), None once it ended."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """Every CPU's busy seconds since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


# A node's clock starts once the machine is this quiet (busy CPUs, all processes, over QUIET_WINDOW_S): GPU run 46
# found hedged first nodes started right after their fresh worker's 9 processes had loaded torch and cuDNN (their
# processes polling the barrier meanwhile), and their own builds then ran up to 1.5x slower, the worker stopped or
# not, where their local runs started on an idle machine at once. Both sides of a pair now start alike
# (bench/startup.py together()).
QUIET_CPUS = 0.5
QUIET_WINDOW_S = 0.5
QUIET_MAX_S = 20.0


def wait_quiet(max_s: float = QUIET_MAX_S) -> dict[str, float]:
    """Until the machine's busy CPUs over the last QUIET_WINDOW_S are under QUIET_CPUS (at most `max_s`): how long
    it waited and the busy CPUs of the last window (a service that started long before a node, as a user's has)."""
    started = time.monotonic()
    while True:
        before, at = _machine_busy_s(), time.monotonic()
        time.sleep(QUIET_WINDOW_S)
        busy = (_machine_busy_s() - before) / (time.monotonic() - at)
        waited = time.monotonic() - started
        if busy < QUIET_CPUS or waited >= max_s:
            return {"waited_s": round(waited, 3), "busy_cpus": round(busy, 3), "quiet": busy < QUIET_CPUS}


class BesideNode:
    """What ran beside a node's processes from its go to its end (a diagnosis of GPU run 42: hedged nodes'
    builds at times 1.5x slower than the local ones with the node's CPU time equal to its wall time): the
    CPU seconds of the service's processes (`watched`: name -> pid, a worker's build processes summed into it),
    the whole machine's busy CPU seconds, and with BENCH_BESIDE_GPU=1 the GPU's utilization sampled by nvidia-smi
    every 50 ms. The sampler is off by default: it runs only beside the nodes that go through `together` (not the
    single local runs), so it would weigh on one side of a pair (GPU run 42's call 2 had it on)."""

    def __init__(self, watched: dict[str, int]) -> None:
        self._watched = watched
        self._before: dict[str, float] = {}
        self._busy = 0.0
        self._sampler: subprocess.Popen[str] | None = None
        self._started = 0.0

    def _tree_cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in self._watched.items():
            pids = {pid} | _children(pid)
            out[name] = sum(cpu for cpu in map(_cpu_s, pids) if cpu is not None)
        return out

    def start(self) -> None:
        self._started, self._busy, self._before = time.monotonic(), _machine_busy_s(), self._tree_cpu()
        if os.environ.get("BENCH_BESIDE_GPU") != "1":
            return
        try:
            self._sampler = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "50"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except OSError:
            self._sampler = None

    def stop(self) -> dict[str, Any]:
        span = time.monotonic() - self._started
        after = self._tree_cpu()
        record: dict[str, Any] = {
            "span_s": round(span, 3),
            "service_cpu_s": {k: round(after[k] - self._before.get(k, 0.0), 3) for k in after},
            "machine_busy_cpu_s": round(_machine_busy_s() - self._busy, 3),
        }
        if self._sampler is not None:
            self._sampler.terminate()
            out, _ = self._sampler.communicate(timeout=10)
            samples = [int(x) for x in out.split() if x.strip().isdigit()]
            if samples:
                record["gpu_util"] = {
                    "samples": len(samples),
                    "mean": round(sum(samples) / len(samples), 1),
                    "max": max(samples),
                    "busy_share": round(sum(1 for x in samples if x > 0) / len(samples), 3),
                }
        return record


def signal_tree(pid: int, sig: int) -> None:
    """`sig` to a process and its descendants (a worker and its build processes)."""
    pending, seen = [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            os.kill(current, sig)
        except ProcessLookupError:
            continue
        pending += _children(current)


def _nvidia_smi(*query: str) -> list[list[str]]:
    try:
        out = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_memory_used() -> float | None:
    rows = _nvidia_smi("--query-gpu=memory.used", "-i", "0")
    return float(rows[0][0]) if rows and rows[0][0].replace(".", "").isdigit() else None


def _apps() -> list[tuple[int, float]]:
    """(pid, MiB) of every process nvidia-smi lists on the GPUs."""
    return [
        (int(r[0]), float(r[1]))
        for r in _nvidia_smi("--query-compute-apps=pid,used_memory")
        if len(r) == 2 and r[0].isdigit() and r[1].isdigit()
    ]


def process_memory(pid: int) -> dict[str, Any]:
    """GPU memory one process holds (nvidia-smi's figure; None where it does not list the
    process, as in a container whose process ids it does not show) and how many it lists."""
    apps = _apps()
    mine = [mib for p, mib in apps if p == pid]
    return {"gpu_mib": sum(mine) if mine else None, "gpu_apps_listed": len(apps)}


def pool_memory(worker_pid: int, size: int, baseline_mib: float | None) -> dict[str, Any]:
    """GPU memory of the worker and its build processes (nvidia-smi's per-process figures; and the
    whole GPU's growth since `baseline_mib`, for a container whose process ids nvidia-smi does not show)."""
    pids = {worker_pid} | _children(worker_pid)
    apps = _apps()
    mine = sorted(mib for pid, mib in apps if pid in pids)
    record: dict[str, Any] = {
        "build_processes": size,
        "processes": len(mine),
        "mib": sum(mine),
        "per_process_mib": mine,
        "apps_listed": len(apps),
    }
    used = gpu_memory_used()
    if baseline_mib is not None and used is not None:
        record["device_growth_mib"] = used - baseline_mib
    return record


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def plan_states(client: Any, keys: list[str]) -> list[str]:
    """Each plan as stored in Redis now: "missing", "provisional" or "tuned"."""
    from plancache.v1 import plancache_pb2 as pb
    from plancache_server.store import keys as names

    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hget(names.plan(key), "meta")
    return [
        "missing" if m is None else "provisional" if pb.PlanMetadata.FromString(m).provisional else "tuned"
        for m in pipe.execute()
    ]


def wait_builds_settled(
    redis_url: str, timeout: float = 240.0, poll_s: float = 0.25, tuned: bool = False
) -> dict[str, Any]:
    """Until no build job in the store is queued or running (two looks in a row): the builds a process asked for
    and did not wait for (plancache.torch's stored-only asks) are stored before the worker is stopped. `tuned`:
    nor autotuning a stored provisional plan (whose tuned plan would be stored after the store was emptied). How
    long it took, and how many jobs were seen."""
    from plancache_server.store.build_records import PROVISIONAL, QUEUED, RUNNING

    unsettled = (QUEUED, RUNNING, PROVISIONAL) if tuned else (QUEUED, RUNNING)
    client = redis_client(redis_url)
    started = time.monotonic()
    settled_looks, jobs = 0, 0
    try:
        while time.monotonic() - started < timeout:
            names = list(client.scan_iter(match="plancache:{*}:job", count=1000))
            jobs = len(names)
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.hget(name, "state")
            busy = sum(1 for state in pipe.execute() if state is not None and state.decode() in unsettled)
            settled_looks = settled_looks + 1 if busy == 0 else 0
            if settled_looks >= 2:
                return {"settled_s": time.monotonic() - started, "jobs": jobs}
            time.sleep(poll_s)
    finally:
        client.close()
    return {"settled_s": None, "timeout_s": timeout, "jobs": jobs}


class TunedWatcher:
    """Reads Redis from the nodes' go until every plan is the tuned one: when each was first stored and when tuned."""

    def __init__(self, redis_url: str, poll_s: float = 0.02) -> None:
        self.redis_url, self.poll_s = redis_url, poll_s
        self.keys: list[str] = []
        self.stored: list[float | None] = []
        self.tuned: list[float | None] = []
        self.error = ""
        self._stop, self._done = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, go: float, keys: list[str]) -> None:
        self.keys, self.stored, self.tuned = list(keys), [None] * len(keys), [None] * len(keys)
        self._thread = threading.Thread(target=self._run, args=(go,), daemon=True)
        self._thread.start()

    def _run(self, go: float) -> None:
        client = redis_client(self.redis_url)
        try:
            while not self._stop.is_set():
                states, now = plan_states(client, self.keys), time.time() - go
                for i, state in enumerate(states):
                    if state != "missing" and self.stored[i] is None:
                        self.stored[i] = now
                    if state == "tuned" and self.tuned[i] is None:
                        self.tuned[i] = now
                if all(t is not None for t in self.tuned):
                    break
                time.sleep(self.poll_s)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            client.close()
            self._done.set()

    def wait(self, timeout: float) -> dict[str, Any]:
        self._done.wait(timeout)
        self.stop()
        tuned = [t for t in self.tuned if t is not None]
        result: dict[str, Any] = {"stored_s": self.stored, "tuned_s": self.tuned, "tuned_plans": len(tuned)}
        if len(tuned) == len(self.keys):
            result["tuned_all_s"] = max(tuned)
        else:
            result["tuned_timeout_s"] = timeout
        if self.error:
            result["error"] = f"watching the store: {self.error}"
        return result

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def forget_plans(address: str, keys: list[str]) -> None:
    from plancache import Client

    with Client(address, cache=False) as client:
        for key in keys:
            client.admin.invalidate(key)


def forget_jobs(redis_url: str, target_id: str, keys: list[str]) -> None:
    """No job, lease or remembered failure left of these plans (a worker stopped mid-tuning leaves
    jobs another would reclaim and build): a fresh worker then starts from nothing."""
    from plancache.keys.target import Target
    from plancache_server.store import keys as names

    target = Target.parse(target_id)
    client = redis_client(redis_url)
    try:
        client.delete(
            names.job_stream(target),
            names.job_stream(target.generic()),
            *(name(k) for k in keys for name in (names.build_lease, names.job_state, names.failure)),
        )
    finally:
        client.close()


def save_blobs(address: str, path: str, target_id: str, tuned_only: bool = True) -> None:
    """The 13 plans' blobs, in graph order: the tuned ones (waited for), or, with
    `tuned_only=False`, whatever is stored (a missing one built: its heuristic plan)."""
    from bench.startup_graphs import startup_graphs, write_blobs
    from plancache import Client, Manifest
    from plancache.keys.target import Target

    with Client(address, cache=False) as client:
        manifest = Manifest.from_specs(startup_graphs(), Target.parse(target_id))
        result = client.prefetch(manifest, compile_missing=True, tuned_only=tuned_only, timeout=600)
        if result.errors:
            raise RuntimeError(f"the {'tuned ' if tuned_only else ''}plans could not be had: {result.errors}")
        write_blobs(path, [result.plans[i].blob for i in range(result.total)])

"""Try plancache on a machine without a GPU: `make demo`.

    make demo                      # then open http://127.0.0.1:9464/ ; Ctrl-C stops the server
    make demo ARGS=--exit          # the same, and the server stops when the tour is done

It starts `plancache-server` with its private Redis (in a fresh temporary
folder) and one compile worker that builds with the CPU STAND-IN COMPILER
of the tests (tests/support/standin.py: `--compiler
tests.support.standin:demo_factory`, which the product never uses unless
told to). Its "plans" are made-up bytes: their target,
sm_00/cudnn-91900/fe-0.0.0-cpu-standin/dev-cpu-stand-in-not-a-gpu, is no
GPU's, so no real node ever asks for them. Everything else is the real
service: the gateway, Redis, the job queue, the worker, signatures, the
statistics and the status page.

Then, as a client (tour() below, the part to read):

1. compile a small matmul spec: a miss, so the worker builds it (the
   stand-in takes 1 s), signs it and stores it in Redis;
2. compile it again: a hit, served from the store in milliseconds;
3. print the server's counters and the status page's address.

The client trusts the demo server's signing key, read from the server's
data folder (the server is local); a client on another machine gets the
key as docs/deploying.md says. It exits 1 when the second call was not a hit.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from plancache import Client, GraphSpec, PlanCacheError

REPO = Path(__file__).resolve().parents[1]
STANDIN = "tests.support.standin:demo_factory"
# tests/support/standin.py CPU_DEMO_TARGET: what the stand-in builds for (no GPU has it).
DEMO_TARGET = "sm_00/cudnn-91900/fe-0.0.0-cpu-standin/dev-cpu-stand-in-not-a-gpu"
START_TIMEOUT_S = 60.0


def small_spec() -> GraphSpec:
    """C = A @ B, batched, in half precision (the README's spec)."""
    g = GraphSpec(io_data_type="half", compute_data_type="float")
    a = g.tensor([8, 256, 512], name="A", uid=1)
    b = g.tensor([8, 512, 256], name="B", uid=2)
    g.matmul(a, b).set_output(True).set_name("C").set_uid(3)
    return g


def tour(address: str, public_key: Path, status_url: str) -> bool:
    """The client's side: compile, compile again, read the counters. True when the second call was a hit."""
    spec = small_spec()
    # cache=False: no disk cache, so the second call goes to the server (a node keeps its plans on disk by default).
    with Client(address, trusted_keys=[public_key], allow_unsigned=False, cache=False, hedge=False) as client:
        started = time.perf_counter()
        first = client.compile(spec, target=DEMO_TARGET)
        took = time.perf_counter() - started
        print(f"demo: 1. compile  -> {first.source}: built by the stand-in worker, signed, stored ({took:.2f} s)")
        print(f"         key {first.key}")
        print(
            f"         {len(first.blob):,} bytes, plan {first.metadata.plan_name!r}, signature checked against {public_key}"
        )
        started = time.perf_counter()
        second = client.compile(spec, target=DEMO_TARGET)
        took = time.perf_counter() - started
        print(f"demo: 2. compile  -> {second.source}: the stored plan, served from the store ({took * 1000:.1f} ms)")
        deadline = time.monotonic() + 5  # the gateway writes its counters about once a second
        while True:
            counts = next((t for t in client.admin.stats() if t.target_id == DEMO_TARGET), None)
            if (counts is not None and counts.hits >= 1) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if counts is not None:
            print(
                f"demo: 3. counters -> target {DEMO_TARGET}: hits {counts.hits}, misses {counts.misses}, "
                f"compiles {counts.compiles}, live workers {counts.live_workers}"
            )
        print(f"demo:    status page {status_url}  (also /status.json and /metrics)")
    return second.source == "hit"


def start_server(data_dir: Path, port: int, metrics_port: int, verbose: bool) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "PLANCACHE_STANDIN_BUILD_SECONDS": os.environ.get("PLANCACHE_STANDIN_BUILD_SECONDS", "1.0"),
    }
    for name in ("PLANCACHE_REDIS_URL", "PLANCACHE_TOKENS_FILE", "PLANCACHE_TLS_CERT", "PLANCACHE_TLS_KEY"):
        env.pop(name, None)  # the demo is its own deployment, whatever the shell says
    args = [
        sys.executable,
        "-m",
        "plancache_server.main",
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-port",
        str(metrics_port),
        "--data-dir",
        str(data_dir),
        "--gpus",
        "0",  # one worker process, "GPU 0": the stand-in needs none
        "--compiler",
        STANDIN,
        "--build-processes",
        "1",
        "--log-level",
        "INFO" if verbose else "WARNING",
    ]
    # Its own session: Ctrl-C reaches this script, which stops the server in order (SIGTERM), rather
    # than every process at once (Redis before the worker that writes to it).
    return subprocess.Popen(args, env=env, cwd=REPO, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_until_ready(address: str, server: subprocess.Popen[bytes]) -> None:
    """Until the gateway answers and the stand-in worker heartbeats."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with Client(address, timeout=2, cache=False) as client:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"demo: the server exited ({server.returncode}); its lines above say why")
            try:
                if any(t.target_id == DEMO_TARGET and t.live_workers for t in client.admin.stats()):
                    return
            except PlanCacheError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"demo: no stand-in worker came up within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.2)


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="plancache without a GPU: a server with a CPU stand-in compiler")
    parser.add_argument("--port", type=int, default=50051, help="gRPC port on 127.0.0.1 (default 50051)")
    parser.add_argument("--metrics-port", type=int, default=9464, help="status page and /metrics (default 9464)")
    parser.add_argument(
        "--exit", action="store_true", help="stop the server after the tour (default: run until Ctrl-C)"
    )
    parser.add_argument("--verbose", action="store_true", help="the server's INFO lines too")
    args = parser.parse_args(argv)
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # each step as it happens, through make or a pipe too
    address = f"127.0.0.1:{args.port}"
    status_url = f"http://127.0.0.1:{args.metrics_port}/"
    # Ctrl-C or a SIGTERM (from a terminal, make, a test) stops the server in order and cleans up.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupted)
    data_dir = Path(tempfile.mkdtemp(prefix="plancache-demo-"))
    print(f"demo: starting plancache-server on {address} with a CPU STAND-IN compiler (not cuDNN), data in {data_dir}")
    server = start_server(data_dir, args.port, args.metrics_port, args.verbose)
    try:
        wait_until_ready(address, server)
        hit = tour(address, data_dir / "keys" / "plan-signing.pub.pem", status_url)
        if not hit:
            print("demo: the second compile was not a hit", file=sys.stderr)
            return 1
        if args.exit:
            return 0
        key = data_dir / "keys" / "plan-signing.pub.pem"
        print("demo: the server runs until Ctrl-C. Meanwhile, from another shell:")
        print(f"        .venv/bin/plancache stats --server {address}")
        print(
            f"        .venv/bin/plancache compile examples/matmul_fp16.json --server {address} "
            f"--target {DEMO_TARGET} --trusted-key {key} --no-cache"
        )
        try:
            server.wait()
        except KeyboardInterrupt:
            print("\ndemo: stopping the server")
            return 0
        print(f"demo: the server exited ({server.returncode})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndemo: stopping the server")
        return 130
    finally:
        stop(server)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

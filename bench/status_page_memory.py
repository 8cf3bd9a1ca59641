"""The gateway's memory under status page and /metrics reads alone (issue 44's soak left "~3 KB a read").

A real plancache-server (subprocess, `--gpus none`, its own Redis, nothing else calling it) read through
`--metrics-port` in turn at `/`, `/status.json` and `/metrics`, back to back for --seconds; its RSS sampled
every 300 reads. Reports the RSS growth per read over the whole run and over its second half (the first
reads warm caches and allocator pools).

    python3 bench/status_page_memory.py --out DIR [--seconds 150]   # DIR/status_page_memory.{json,png}
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import figure, save, write_json  # noqa: E402

PAGES = ("/", "/status.json", "/metrics")
SAMPLE_EVERY = 300


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def kib_per_read(samples: list[tuple[int, float]]) -> float:
    """RSS growth per read between the first and last sample (KiB)."""
    (reads0, rss0), (reads1, rss1) = samples[0], samples[-1]
    return (rss1 - rss0) * 1024 / max(1, reads1 - reads0)


def run(seconds: float) -> dict[str, Any]:
    from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
    from tests.support.processes import child_env, server_process

    tmp = Path(tempfile.mkdtemp(prefix="plancache-status-memory-"))
    redis = EmbeddedRedis(
        tmp / "redis", binary=os.environ.get("PLANCACHE_REDIS_SERVER_BIN", "redis-server"), persist=False
    ).start()
    address, port = f"127.0.0.1:{free_port()}", free_port()
    samples: list[tuple[int, float]] = []
    try:
        args = ("--gpus", "none", "--metrics-port", str(port))
        with server_process(address, redis.url, tmp / "server.log", *args, env=child_env()) as server:
            urls = [f"http://127.0.0.1:{port}{page}" for page in PAGES]
            reads = 0
            started = time.monotonic()
            # At least two samples whatever the machine's pace (a loaded CI machine read fewer than SAMPLE_EVERY
            # pages in a smoke test's 4 s, and the report had no first sample).
            while time.monotonic() - started < seconds or len(samples) < 2:
                for url in urls:
                    with urllib.request.urlopen(url, timeout=30) as answer:
                        answer.read()
                    reads += 1
                    if reads % SAMPLE_EVERY == 0:
                        samples.append((reads, rss_mib(server.pid)))
    finally:
        redis.stop()
    second_half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    return {
        "seconds": seconds,
        "reads": samples[-1][0] if samples else 0,
        "samples": samples,
        "rss_first_mib": samples[0][1],
        "rss_last_mib": samples[-1][1],
        "kib_per_read": kib_per_read(samples),
        "kib_per_read_second_half": kib_per_read(second_half),
    }


def report(result: dict[str, Any], out: Path) -> None:
    write_json(out / "status_page_memory.json", result)
    print(
        f"{result['reads']:,} reads in {result['seconds']:.0f} s: RSS {result['rss_first_mib']:.1f} -> "
        f"{result['rss_last_mib']:.1f} MiB, {result['kib_per_read']:.3f} KiB a read "
        f"({result['kib_per_read_second_half']:.3f} over the second half)"
    )
    fig, (ax,) = figure(1)
    reads, rss = zip(*result["samples"], strict=True)
    ax.plot(reads, rss)
    ax.set_xlabel("page reads (/, /status.json, /metrics in turn)")
    ax.set_ylabel("gateway RSS, MiB")
    ax.set_title("plancache-server under status page reads alone", fontsize=9)
    save(fig, out / "status_page_memory.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--seconds", type=float, default=150.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report(run(args.seconds), args.out)


if __name__ == "__main__":
    main()

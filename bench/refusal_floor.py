"""What one refused call costs a bare grpc.aio server: the floor under a flood's first seconds (issue 44).

A flooder's calls are refused by the gateway's per-caller bounds (RESOURCE_EXHAUSTED), yet each still costs
the event loop gRPC's own per-call work: the call's setup, the handler's task, the status written back. The
gateway's profile (bench/results/flood_first_seconds_profile.txt) put ~42 % of the loop's busy time in gRPC's
per-call code and ~28 % inside `context.abort`. This benchmark asks whether a cheaper way to refuse exists in
grpc.aio: a server with one unary method and nothing of plancache's, answering every call

  ok        with an empty response (status OK): what any call costs
  abort     with `await context.abort(RESOURCE_EXHAUSTED, ..., trailing_metadata)`: the gateway's way
  set_code  with `context.set_code/set_details/set_trailing_metadata` and an empty response: no exception

Calls come from a client subprocess over 10 channels, 500 in flight; the server process's CPU time (user +
system, getrusage) per call is the measure; modes interleaved, `--rounds` each, medians.

    python bench/refusal_floor.py [--calls 4000] [--rounds 5] [--out DIR]   # DIR/refusal_floor.{json,png}
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from bench.report import write_json
from plancache.v1 import plancache_pb2 as pb
from plancache.v1 import plancache_pb2_grpc as pb_grpc

MODES = ("ok", "abort", "set_code")
CHANNELS = 10
IN_FLIGHT = 500
DETAILS = "too many refs in flight for this caller: retry after its delay"
TRAILERS = (("grpc-retry-pushback-ms", "1000"),)

CLIENT = f"""
import asyncio, sys, grpc
from plancache.v1 import plancache_pb2 as pb, plancache_pb2_grpc as pb_grpc
port, calls = sys.argv[1], int(sys.argv[2])
async def main():
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{{port}}") for _ in range({CHANNELS})]
    stubs = [pb_grpc.PlanCacheStub(c) for c in channels]
    codes = {{}}
    async def one(i):
        try:
            await stubs[i % {CHANNELS}].GetPlan(pb.GetPlanRequest())
            code = "OK"
        except grpc.aio.AioRpcError as e:
            code = e.code().name
        codes[code] = codes.get(code, 0) + 1
    for start in range(0, calls, {IN_FLIGHT}):
        await asyncio.gather(*(one(i) for i in range(start, min(calls, start + {IN_FLIGHT}))))
    print(" ".join(f"{{k}}={{v}}" for k, v in sorted(codes.items())))
asyncio.run(main())
"""


class Refusing(pb_grpc.PlanCacheServicer):
    def __init__(self) -> None:
        self.mode = "ok"

    async def GetPlan(self, request: pb.GetPlanRequest, context: Any) -> pb.GetPlanResponse:
        if self.mode == "abort":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, DETAILS, trailing_metadata=TRAILERS)
        if self.mode == "set_code":
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details(DETAILS)
            context.set_trailing_metadata(TRAILERS)
        return pb.GetPlanResponse()


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(calls: int, rounds: int) -> list[dict[str, Any]]:
    servicer = Refusing()
    server = grpc.aio.server()
    pb_grpc.add_PlanCacheServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    rows = []
    try:
        for round_index in range(rounds):
            for mode in MODES:
                servicer.mode = mode
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", CLIENT, str(port), str(calls), stdout=asyncio.subprocess.PIPE
                )
                cpu0, wall0 = cpu_s(), time.perf_counter()
                out, _ = await proc.communicate()
                cpu, wall = cpu_s() - cpu0, time.perf_counter() - wall0
                row = {
                    "round": round_index,
                    "mode": mode,
                    "calls": calls,
                    "server_cpu_us_per_call": cpu / calls * 1e6,
                    "wall_s": wall,
                    "codes": out.decode().strip(),
                }
                print(row, flush=True)
                rows.append(row)
    finally:
        await server.stop(None)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_mode = {
        mode: statistics.median(r["server_cpu_us_per_call"] for r in rows if r["mode"] == mode) for mode in MODES
    }
    return {
        "server_cpu_us_per_call": per_mode,
        "abort_over_ok": per_mode["abort"] / per_mode["ok"],
        "set_code_over_abort": per_mode["set_code"] / per_mode["abort"],
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_mode = summary["server_cpu_us_per_call"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(list(per_mode), list(per_mode.values()), color=["#4c72b0", "#c44e52", "#dd8452"])
    ax.set_ylabel("server CPU per call (µs, median)")
    ax.set_title("A bare grpc.aio server: an answered call against a refused one")
    for i, value in enumerate(per_mode.values()):
        ax.text(i, value, f"{value:.0f}", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    rows = asyncio.run(measure(args.calls, args.rounds))
    summary = summarize(rows)
    print(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(
        args.out / "refusal_floor.json",
        {
            "summary": summary,
            "config": {"calls": args.calls, "rounds": args.rounds, "grpc": grpc.__version__},
            "rows": rows,
        },
    )
    plot(summary, args.out / "refusal_floor.png")


if __name__ == "__main__":
    main()

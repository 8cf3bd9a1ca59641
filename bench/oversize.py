"""What refused unauthenticated requests cost a gateway (issue 44, item 5): its RSS around batches of
five oversize requests from a caller with no token, and the hit path beside it.

A gateway with a tokens file (CPU only, no worker); a client with no token sends, in turn, five Compile
requests of 60 MiB, five of 15 MiB (under gRPC's receive bound: read whole before anything else, where
handlers registered by name are used), five Prefetch requests of 15 MiB and five GetPlan of 1 MiB,
twice each; after each batch, the gateway's VmRSS. With `--baseline TREE` (a checkout of an earlier
commit, e.g. a `git worktree`), the same against a gateway run from that tree, then, side by side in
alternating rounds, the median GetPlan round trip of a stored plan with a token against both (the
token gate, a generic handler, stands where handlers registered by name were).

    python3 bench/oversize.py [--baseline /tmp/old-tree] [--out bench/results]   # oversize.json, oversize.png
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from bench.report import figure, save, write_json  # noqa: E402

BATCHES = (
    (60, "Compile"),
    (60, "Compile"),
    (15, "Compile"),
    (15, "Compile"),
    (15, "Prefetch"),
    (15, "Prefetch"),
    (1, "GetPlan"),
)
PER_BATCH = 5
TARGET_MB_PER_BATCH = 2.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def env_of(tree: Path) -> dict[str, str]:
    from tests.support.processes import child_env

    return {**child_env(), "PYTHONPATH": f"{tree}:{tree}/client/src:{tree}/server/src"}


def batches(address: str, pid: int) -> list[dict[str, Any]]:
    """Each batch: five unauthenticated requests of its size, the codes answered, the RSS after."""
    rows = []
    options = [("grpc.max_send_message_length", 128 * 2**20)]
    for size_mb, method in BATCHES:
        with grpc.insecure_channel(address, options=options) as channel:
            streaming = method == "Prefetch"
            call = (channel.unary_stream if streaming else channel.unary_unary)(
                f"/plancache.v1.PlanCache/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            time.sleep(0.5)
            before = rss_mb(pid)
            codes = []
            # A field 1 whose length prefix says `size_mb`, then that many bytes: nothing a parser would accept.
            payload = b"\x0a" + b"\x80\x80\x80\x1e" + b"x" * (size_mb * 2**20 - 5)
            for _ in range(PER_BATCH):
                try:
                    response = call(payload, timeout=30)
                    if streaming:
                        list(response)
                    codes.append("OK")
                except grpc.RpcError as e:
                    codes.append(e.code().name)
            time.sleep(1.0)
            after = rss_mb(pid)
            rows.append(
                {"method": method, "size_mb": size_mb, "codes": codes, "rss_before_mb": before, "rss_after_mb": after}
            )
            print(f"  {size_mb} MiB {method} x{PER_BATCH}: {codes[0]}, RSS {before:.1f} -> {after:.1f} MB", flush=True)
    return rows


def hit_round_trips(
    addresses: dict[str, str], token: str, key: str, rounds: int = 10, calls: int = 500
) -> dict[str, Any]:
    from plancache.v1 import plancache_pb2 as pb
    from plancache.v1 import plancache_pb2_grpc as pb_grpc

    metadata = (("authorization", f"Bearer {token}"),)
    request = pb.GetPlanRequest(ref=pb.PlanRef(key=key))
    stubs = {name: pb_grpc.PlanCacheStub(grpc.insecure_channel(address)) for name, address in addresses.items()}
    for stub in stubs.values():
        for _ in range(200):
            stub.GetPlan(request, metadata=metadata)
    medians: dict[str, list[float]] = {name: [] for name in stubs}
    names = list(stubs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                stubs[name].GetPlan(request, metadata=metadata)
                times.append(time.perf_counter() - started)
            medians[name].append(statistics.median(times) * 1e6)
    out: dict[str, Any] = {f"{name}_us": statistics.median(v) for name, v in medians.items()}
    out["rounds_us"] = medians
    if "now" in medians and "baseline" in medians:
        out["now_over_baseline"] = statistics.median(
            n / b for n, b in zip(medians["now"], medians["baseline"], strict=True)
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--baseline", type=Path, help="a checkout of an earlier commit to compare with")
    args = parser.parse_args()
    from plancache import Client
    from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
    from tests.support.processes import STANDIN_SERVER_ARGS, server_process
    from tests.support.specs import matmul_spec
    from tests.support.standin import STANDIN_TARGET

    tmp = Path(tempfile.mkdtemp(prefix="plancache-oversize-"))
    token = secrets.token_hex(16)
    tokens = tmp / "tokens"
    tokens.write_text(f"admin {token}\n")
    tokens.chmod(0o600)
    trees = {"now": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    result: dict[str, Any] = {"per_batch": PER_BATCH, "target_mb_per_batch": TARGET_MB_PER_BATCH, "trees": {}}
    redis = EmbeddedRedis(tmp / "redis", persist=False).start()
    try:
        addresses = {name: f"127.0.0.1:{free_port()}" for name in trees}
        # The gateways one after the other for the RSS (one gateway's allocations do not move another's)...
        for name, tree in trees.items():
            print(name, tree, flush=True)
            with server_process(
                addresses[name],
                redis.url,
                tmp / f"{name}.log",
                "--gpus",
                "none",
                "--tokens-file",
                str(tokens),
                env=env_of(tree),
                token=token,
            ) as server:
                result["trees"][name] = {"tree": str(tree), "batches": batches(addresses[name], server.pid)}
        # ... and side by side for the hit path (a stand-in worker beside the first builds the plan).
        with server_process(
            addresses["now"],
            redis.url,
            tmp / "now-hits.log",
            *STANDIN_SERVER_ARGS,
            "--tokens-file",
            str(tokens),
            env=env_of(REPO),
            token=token,
        ):
            with Client(addresses["now"], token=token, cache=False, allow_unsigned=True) as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        key = client.compile(matmul_spec(m=64), STANDIN_TARGET).key
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.5)
            if "baseline" in trees:
                with server_process(
                    addresses["baseline"],
                    redis.url,
                    tmp / "baseline-hits.log",
                    "--gpus",
                    "none",
                    "--tokens-file",
                    str(tokens),
                    env=env_of(trees["baseline"]),
                    token=token,
                ):
                    result["hits"] = hit_round_trips(addresses, token, key)
            else:
                result["hits"] = hit_round_trips({"now": addresses["now"]}, token, key)
    finally:
        redis.stop()
    for entry in result["trees"].values():
        grown = [b["rss_after_mb"] - b["rss_before_mb"] for b in entry["batches"]]
        entry["grown_mb_max_batch"] = max(grown)
        entry["grown_mb_total"] = entry["batches"][-1]["rss_after_mb"] - entry["batches"][0]["rss_before_mb"]
    write_json(args.out / "oversize.json", result)
    fig, axes = figure(1)
    ax = axes[0]
    for name, entry in result["trees"].items():
        ax.plot(
            range(len(entry["batches"]) + 1),
            [entry["batches"][0]["rss_before_mb"], *(b["rss_after_mb"] for b in entry["batches"])],
            marker="o",
            label=name,
        )
    ax.set_xticks(range(1, len(BATCHES) + 1), [f"{m}\n{s} MiB" for s, m in BATCHES], fontsize=7)
    ax.set_ylabel("gateway RSS, MB"), ax.legend(fontsize=8)
    ax.set_title(f"after each batch of {PER_BATCH} unauthenticated oversize requests", fontsize=9)
    save(fig, args.out / "oversize.png")
    print({n: (e["grown_mb_max_batch"], e["grown_mb_total"]) for n, e in result["trees"].items()}, result.get("hits"))


if __name__ == "__main__":
    main()

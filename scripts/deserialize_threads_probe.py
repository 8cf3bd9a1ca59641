"""Does a plan's deserialization run beside another thread's (issue 41)?

A stored start streams its workload's plans and deserializes them one after
the other on the stream's thread (plancache.transport.workload): a stored
decode step (six graphs) took about as long as those deserializations (GPU
run 34: 0.18 s, ~30 ms a plan). Whether deserializing on several threads at
once would shorten that depends on whether cuDNN's deserialize lets go of
the interpreter and scales. This probe builds the decode step's graphs
(examples/decoder_step.py through plancache.functional, the worker's
compiler in this process, heuristic plans) at several batch sizes, then
deserializes one set on one thread and another set on --threads threads
(each with a handle of its own), each set once (a set's second
deserialization may find its kernels loaded), alternating which comes
first, and reports the wall times.

    python3 scripts/deserialize_threads_probe.py --out DIR    # DIR/deserialize_threads_probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def recording_client(compiler: Any) -> Any:
    """build_time_probe's STAND-IN recording client, keeping each plan's blob as well."""
    from scripts.build_time_probe import RecordingClient

    class BlobRecordingClient(RecordingClient):
        def __init__(self) -> None:
            super().__init__(compiler)
            self.blobs: list[bytes] = []

        def compile(self, spec: Any, target: Any = None, options: Any = None, **kwargs: Any) -> Any:
            plan = super().compile(spec, target, options, **kwargs)
            self.blobs.append(plan.blob)
            return plan

    return BlobRecordingClient()


def decode_blobs(compiler: Any, batch: int) -> list[bytes]:
    import torch

    import plancache.functional as pf
    from examples.decoder_step import Config, build, decode_step, functional_ops

    client = recording_client(compiler)
    pf.configure(client, target=compiler.target)  # type: ignore[arg-type]
    model, cache, x = build(Config(batch=batch), torch.bfloat16, torch.device("cuda"))
    with torch.inference_mode():
        decode_step(model, cache, x, functional_ops())
    torch.cuda.synchronize()
    return client.blobs


def deserialize_all(blobs: list[bytes], threads: int) -> float:
    """Wall seconds to deserialize `blobs` split over `threads` threads, each with its own handle."""
    import cudnn
    import torch

    handles = [cudnn.create_handle() for _ in range(threads)]
    shares = [blobs[i::threads] for i in range(threads)]
    start = threading.Barrier(threads + 1)
    graphs: list[Any] = []

    def work(index: int) -> None:
        torch.cuda.set_device(0)
        start.wait()
        for blob in shares[index]:
            graph = cudnn.pygraph()
            graph.deserialize(handles[index], blob)
            graphs.append(graph)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    began = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--batches", default="8,16,24,32,40,48", help="one set of the decode step's plans each")
    args = parser.parse_args()
    import torch

    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    torch.cuda.init()
    compiler = CudnnCompiler(0)
    sets = {int(b): decode_blobs(compiler, int(b)) for b in args.batches.split(",")}
    rows = []
    for i, (batch, blobs) in enumerate(sets.items()):
        threads = 1 if i % 2 == 0 else args.threads  # alternate: each set deserialized once, fresh
        seconds = deserialize_all(blobs, threads)
        rows.append({"batch": batch, "plans": len(blobs), "threads": threads, "wall_s": seconds})
        print(json.dumps(rows[-1]), flush=True)
    one = [r["wall_s"] for r in rows if r["threads"] == 1]
    many = [r["wall_s"] for r in rows if r["threads"] > 1]
    result = {
        "rows": rows,
        "median_one_thread_s": statistics.median(one),
        "median_threads_s": statistics.median(many),
        "threads_over_one": statistics.median(many) / statistics.median(one),
        "plan_bytes": {b: [len(x) for x in blobs] for b, blobs in sets.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "deserialize_threads_probe.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()

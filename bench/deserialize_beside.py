"""Diagnostic (issue 41): plans deserialized on a background thread while the
program's own thread runs its CUDA work, as the workload's start-up stream does.

GPU run 27: with the stream deserializing on its thread, the decode step's
first torch op failed with "operation would make the legacy stream depend on
a capturing blocking stream" (four runs of four). This finds which plans do
it and whether a thread of its own non-blocking stream avoids it.

    python3 bench/deserialize_beside.py --out DIR [--repeats 2]

First the decode step of examples/decoder_step.py runs once through
plancache.functional with every geometry built here (bench.startup_node's
LocalBuilds stand-in), its plans' blobs kept. Then, per mode and repeat, a
fresh process runs the same step in torch eager in a loop on its main thread
(the program's own work, on torch's default stream) while a thread
deserializes every blob, and says what failed, where, and when:

  thread-default      the thread's own cuDNN handle on the default stream (what run 27 did)
  thread-nonblocking  the thread's handle, and its torch work, on a stream of its own
                      (torch.cuda.Stream: non-blocking)
  caller              no thread: the main thread deserializes them all, then runs the step
                      (the cost a first use pays on the caller's thread)

Writes DIR/deserialize_beside.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pickle
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYPLAN = b"CUDNN_FE_PYPLAN\0"  # how the frontend's Python-engine plans begin (cudnn._plan_serdes, 1.32)
MODES = ("thread-default", "thread-nonblocking", "caller")


def collect(blobs_file: Path) -> list[dict[str, Any]]:
    """The decode step's plans, built here: [{key, ops, blob}] in first-use order."""
    import torch

    import plancache.functional as pf
    from bench.startup_node import LocalBuilds
    from examples.decoder_step import Config, build, decode_step, functional_ops

    kept: list[dict[str, Any]] = []

    class Recording(LocalBuilds):
        def compile(self, spec: Any, target: Any = None, options: Any = None, *a: Any, **k: Any) -> Any:
            plan = super().compile(spec, target, options, *a, **k)
            graph = getattr(spec, "spec", spec)
            ops = [n.op for n in getattr(graph, "nodes", [])]
            kept.append({"key": plan.key, "ops": ops, "blob": plan.blob})
            return plan

        _compile = compile

    model, cache, x = build(Config(), torch.bfloat16, torch.device("cuda"))
    pf.configure(Recording())  # type: ignore[arg-type]
    with torch.inference_mode():
        decode_step(model, cache, x, functional_ops())
    torch.cuda.synchronize()
    blobs_file.write_bytes(pickle.dumps(kept))
    return kept


def child(mode: str, blobs_file: Path) -> dict[str, Any]:
    import cudnn
    import torch

    from examples.decoder_step import Config, build, decode_step, torch_ops
    from plancache.gpu.stack import load_math_libraries

    plans = pickle.loads(blobs_file.read_bytes())
    model, cache, x = build(Config(), torch.bfloat16, torch.device("cuda"))
    ops = torch_ops()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    spans: list[tuple[int, float, float]] = []
    thread_errors: list[dict[str, Any]] = []
    main_errors: list[dict[str, Any]] = []
    keep: list[Any] = []

    def deserialize_all() -> None:
        try:
            stream = None
            if mode == "thread-nonblocking":
                stream = torch.cuda.Stream()
                keep.append(stream)
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                handle = cudnn.create_handle()
                if stream is not None:
                    cudnn.set_stream(handle, stream.cuda_stream)
                load_math_libraries(0)
            for i, p in enumerate(plans):
                started = time.perf_counter() - t0
                try:
                    g = cudnn.pygraph()
                    g.deserialize(handle, p["blob"])
                    keep.append(g)
                except Exception as e:
                    thread_errors.append({"at_s": time.perf_counter() - t0, "plan": i, "error": str(e)[:300]})
                spans.append((i, started, time.perf_counter() - t0))
        except Exception as e:
            why = f"{type(e).__name__}: {traceback.format_exc()[-600:]}"
            thread_errors.append({"at_s": time.perf_counter() - t0, "plan": None, "error": why})

    steps = 0
    if mode == "caller":
        deserialize_all()
        with torch.inference_mode():
            decode_step(model, cache, x, ops)
        torch.cuda.synchronize()
        steps = 1
    else:
        thread = threading.Thread(target=deserialize_all)
        thread.start()
        with torch.inference_mode():
            while thread.is_alive() or steps < 3:
                try:
                    decode_step(model, cache, x, ops)
                    torch.cuda.synchronize()
                except Exception as e:
                    main_errors.append({"at_s": time.perf_counter() - t0, "step": steps, "error": str(e)[:300]})
                    if len(main_errors) > 20:
                        break
                steps += 1
        thread.join()
    return {
        "mode": mode,
        "total_s": time.perf_counter() - t0,
        "steps": steps,
        "plans": len(plans),
        "spans": spans,
        "thread_errors": thread_errors,
        "main_errors": main_errors,
        "while_deserializing": [next((i for i, a, b in spans if a <= err["at_s"] <= b), None) for err in main_errors],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", choices=MODES)
    parser.add_argument("--blobs", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.blobs)), flush=True)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    blobs = args.out / "decode_plans.pickle"
    kept = collect(blobs)
    runs = []
    for repeat in range(args.repeats):
        for mode in MODES:
            proc = subprocess.run(
                [sys.executable, __file__, "--out", str(args.out), "--child", mode, "--blobs", str(blobs)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            line = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
            record = json.loads(line[0]) if line and line[0].startswith("{") else {"mode": mode}
            record.update(repeat=repeat, rc=proc.returncode, stderr_tail=proc.stderr[-1500:])
            runs.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "spans"})[:3000], flush=True)
    plans = [
        {"key": p["key"], "ops": p["ops"], "bytes": len(p["blob"]), "python_engine": p["blob"].startswith(PYPLAN)}
        for p in kept
    ]
    (args.out / "deserialize_beside.json").write_text(json.dumps({"plans": plans, "runs": runs}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "client" / "src"))
    main()

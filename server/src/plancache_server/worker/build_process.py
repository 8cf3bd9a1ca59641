"""One build process of a worker's pool (plancache_server.worker.build_pool).

Started by the worker with its compiler's name and its GPU; answers "ready"
once the compiler is loaded (CUDA context, cuDNN handle, cuBLASLt), then
builds the pieces it is sent, one at a time, until its stdin ends. Frames
go out on the stdout it was started with; anything else that writes to
stdout (a native library) is sent to stderr, the worker's log.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys

from plancache_server.worker.build_tasks import decode_task, encode_result, run_task
from plancache_server.worker.compiler.faults import EXIT_GPU_LOST
from plancache_server.worker.frames import read_frame, write_frame

log = logging.getLogger("plancache_server.worker.build_process")

PR_SET_PDEATHSIG = 1


def end_with_parent() -> None:
    """Linux: this process gets SIGKILL when the worker that started it dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main() -> int:
    parser = argparse.ArgumentParser(prog="plancache-build-process")
    parser.add_argument("--compiler", required=True)
    parser.add_argument("--device", type=int, required=True)
    parser.add_argument("--autotune-strategy", default="screened")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much")
    args = parser.parse_args()
    end_with_parent()
    if args.nice:
        os.nice(args.nice)
    parent = os.getppid()
    frames = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s %(levelname)s build-process-{os.getpid()}: %(message)s",
        stream=sys.stderr,
    )
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # the worker decides when its pool ends (a terminal's Ctrl-C reaches both)
    from plancache_server.worker.compiler import load_compiler

    try:
        compiler = load_compiler(args.compiler, args.device, args.autotune_strategy)
    except Exception as e:
        log.error("cannot load the %r compiler: %s: %s", args.compiler, type(e).__name__, e)
        return 3
    if os.getppid() != parent:  # the worker died while this process loaded
        return 0
    write_frame(frames, {"ready": True, "pid": os.getpid(), "target": compiler.target.id})
    stdin = sys.stdin.buffer
    while (frame := read_frame(stdin)) is not None:
        task = decode_task(*frame)
        result = run_task(compiler, task)
        write_frame(frames, *encode_result(result))
        if result.gpu_lost:  # nothing more can run in this process's CUDA context
            return EXIT_GPU_LOST
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

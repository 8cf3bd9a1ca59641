"""How plans run on this process's GPUs: handles, streams and workspaces.

- **Handles**: one cuDNN handle per thread and device (a handle must not be
  used by two threads at once). Each remembers the stream plancache last set
  on it, so a call on the same stream does not set it again.
- **Workspaces**: one buffer per device and stream, shared by every plan that
  runs there and grown to the largest need, instead of one per plan. Sharing
  is safe because work on one stream runs in order; a buffer replaced by a
  larger one is freed through torch's caching allocator, which reuses it only
  on the same stream. A captured plan (CUDA graph) keeps a private workspace:
  its replay may run on any stream.
- **Runtime**: the torch and cuDNN calls behind all of this, in one class, so
  the logic above is tested without a GPU (tests install a stand-in with
  `use_runtime`).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Replayable(Protocol):
    def replay(self) -> None: ...


class Runtime(Protocol):
    """The tensor library and the cuDNN frontend as plancache uses them."""

    def dtype(self, name: str) -> Any: ...
    def scalar(self, shape: tuple[int, ...], value: float, dtype: Any) -> Any: ...
    def device_object(self, index: int) -> Any: ...
    def current_device(self) -> int: ...
    def stream_getter(self) -> Callable[[int], int]: ...
    def new_handle(self, device: int) -> Any: ...
    def own_stream(self, device: int) -> int: ...
    def set_stream(self, handle: Any, stream: int) -> None: ...
    def deserialize(self, handle: Any, blob: bytes) -> Any: ...
    def empty(self, size: int, device: int) -> Any: ...
    def capture(self, launch: Callable[[], None], device: int, before: Callable[[int], None]) -> Replayable: ...


class HandleState:
    """A thread's cuDNN handle on one device and the stream last set on it."""

    __slots__ = ("_runtime", "device", "handle", "stream")

    def __init__(self, runtime: Runtime, device: int) -> None:
        self._runtime = runtime
        self.device = device
        self.handle = runtime.new_handle(device)
        self.stream: int | None = None

    def use(self, stream: int) -> None:
        if self.stream != stream:
            self._runtime.set_stream(self.handle, stream)
            self.stream = stream


@dataclass(slots=True)
class WorkspaceSlot:
    buffer: Any
    size: int
    # Buffers this slot outgrew, kept: a CUDA graph captured before the growth
    # replays with the old address (freeing it made a captured training step
    # read freed memory on the H200, GPU run 22).
    retired: list[Any] = field(default_factory=list)


def _nbytes(buffer: Any) -> int:
    return int(getattr(buffer, "nbytes", 0) or 0)


class WorkspacePool:
    """One workspace per (device, stream), grown to the largest plan's need."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._slots: dict[tuple[int, int], WorkspaceSlot] = {}
        self._lock = threading.Lock()

    def slot(self, device: int, stream: int, need: int) -> WorkspaceSlot:
        found = self._slots.get((device, stream))
        if found is not None and found.size >= need:
            return found
        with self._lock:
            found = self._slots.get((device, stream))
            if found is None:
                found = self._slots[(device, stream)] = WorkspaceSlot(
                    self._runtime.empty(max(need, 1), device), max(need, 1)
                )
            elif found.size < need:
                # Plans holding this slot read .buffer on every call and so move to the new one.
                found.retired.append(found.buffer)
                found.buffer, found.size = self._runtime.empty(need, device), need
            return found

    def held_bytes(self) -> int:
        """Bytes of workspace held now, over every device and stream."""
        return sum(s.size + sum(_nbytes(r) for r in s.retired) for s in list(self._slots.values()))

    def release(self) -> None:
        """Drop every workspace (plans allocate again on their next call). The caller has synchronized
        the device: a workspace's memory may be handed out again at once."""
        with self._lock:
            for s in self._slots.values():
                s.buffer, s.size, s.retired = None, 0, []
            self._slots.clear()


class _Process:
    """What one runtime holds for the whole process."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.workspaces = WorkspacePool(runtime)
        self.local = threading.local()


_process: _Process | None = None
_process_lock = threading.Lock()


def process() -> _Process:
    global _process
    current = _process
    if current is None:
        with _process_lock:
            if _process is None:
                _process = _Process(TorchRuntime())
            current = _process
    return current


def use_runtime(runtime: Runtime | None) -> None:
    """Install another runtime (tests' stand-in), or None for torch's on next use.
    Handles, workspaces and the plans' tensor tables start afresh."""
    global _process
    with _process_lock:
        _process = _Process(runtime) if runtime is not None else None


def handle_state(device: int | None = None) -> HandleState:
    """This thread's handle on `device` (the current device by default)."""
    proc = process()
    index = proc.runtime.current_device() if device is None else device
    states: dict[int, HandleState] | None = getattr(proc.local, "handles", None)
    if states is None:
        states = proc.local.handles = {}
    state = states.get(index)
    if state is None:
        state = states[index] = HandleState(proc.runtime, index)
    return state


def on_own_stream() -> None:
    """Put this thread's plan work (its cuDNN handle and its torch work) on a
    stream of its own, on the current device, for as long as the thread runs:
    what a background loader does before it deserializes anything.

    A thread deserializing plans beside a program's own CUDA work did its work
    on the legacy default stream, and that program's next torch op failed on
    the H200 ("operation would make the legacy stream depend on a capturing
    blocking stream", GPU run 27, every run of the decode step). Once per
    thread; before the thread's handle is made, so that its set-up (cuBLASLt's
    warm-up matmul) runs on the new stream too."""
    proc = process()
    device = proc.runtime.current_device()
    owned: set[int] | None = getattr(proc.local, "own_streams", None)
    if owned is None:
        owned = proc.local.own_streams = set()
    if device in owned:
        return
    stream = proc.runtime.own_stream(device)
    handle_state(device).use(stream)
    owned.add(device)


def workspace_bytes_held() -> int:
    """GPU memory held by plancache's shared workspaces (captured plans' own excluded)."""
    return process().workspaces.held_bytes()


_allocator: concurrent.futures.ThreadPoolExecutor | None = None
_allocator_lock = threading.Lock()
# A kept tensor's allocation is a malloc and at most a fill: past this the GPU is stuck, and the call
# that needed it fails (plancache.functional then runs torch's function) instead of waiting forever.
ALLOCATION_TIMEOUT_S = 60.0


def outside_graph_pools(make: Callable[[], T], device: int) -> T:
    """`make()` run on plancache's allocation thread, with `device` current there: what it allocates
    comes from torch's ordinary pool even while this thread's allocations go to a CUDA graph's private
    pool (cudagraph trees route them per thread). For tensors kept across calls: workspaces, constants.
    While this thread's stream captures a CUDA graph, `make()` runs here as it did before: the graph's
    own pool holds what it uses, and another thread's allocation or synchronize could break a capture
    in torch's default (global) mode (a program capturing with torch.cuda.graph; cudagraph trees capture
    after a warm-up run, which made the tensors already)."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return make()
    global _allocator
    with _allocator_lock:
        if _allocator is None:
            _allocator = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="plancache-alloc")

    # Made on the caller's current stream, as a tensor of the caller's own would be: the fill is ordered
    # before the caller's next kernels, and the caching allocator hands the memory out again, once freed,
    # only to work ordered after it on that stream. Only the thread differs.
    stream = torch.cuda.current_stream(device)

    def run() -> T:
        with torch.cuda.device(device), torch.cuda.stream(stream):
            return make()

    try:
        return _allocator.submit(run).result(timeout=ALLOCATION_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        raise RuntimeError(
            f"plancache: allocating a kept tensor on GPU {device} took over {ALLOCATION_TIMEOUT_S:.0f} s "
            "(the allocation thread did not answer)"
        ) from None


class TorchRuntime:
    """The real runtime: torch for tensors and streams, the cuDNN frontend for plans."""

    def __init__(self) -> None:
        from plancache.gpu.stack import require_gpu_stack

        self._torch, self._cudnn = require_gpu_stack()
        self._streams: list[Any] = []

    def dtype(self, name: str) -> Any:
        from plancache.gpu.stack import torch_dtype

        return torch_dtype(name)

    def scalar(self, shape: tuple[int, ...], value: float, dtype: Any) -> Any:
        return self._torch.full(shape, value, dtype=dtype)

    def device_object(self, index: int) -> Any:
        return self._torch.device("cuda", index)

    def current_device(self) -> int:
        return int(self._torch.cuda.current_device())

    def stream_getter(self) -> Callable[[int], int]:
        # torch's raw getter answers in ~0.1 us; torch.cuda.current_stream() builds a Stream object (~3 us).
        raw = getattr(self._torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw  # type: ignore[no-any-return]
        current = self._torch.cuda.current_stream
        return lambda device: int(current(device).cuda_stream)

    def new_handle(self, device: int) -> Any:
        from plancache.gpu.stack import load_math_libraries

        with self._torch.cuda.device(device):
            handle = self._cudnn.create_handle()
            load_math_libraries(device)
        return handle

    def own_stream(self, device: int) -> int:
        """A new stream, made this thread's current one on `device` (torch's current stream is per thread).
        torch's streams are created non-blocking: work on them never waits for, nor is waited for by, the
        legacy default stream that a program's own work runs on."""
        stream = self._torch.cuda.Stream(device)
        self._torch.cuda.set_stream(stream)
        self._streams.append(stream)  # alive as long as the runtime: a handle may point at it
        return int(stream.cuda_stream)

    def set_stream(self, handle: Any, stream: int) -> None:
        self._cudnn.set_stream(handle, stream)

    def deserialize(self, handle: Any, blob: bytes) -> Any:
        graph = self._cudnn.pygraph()
        graph.deserialize(handle, blob)
        return graph

    def empty(self, size: int, device: int) -> Any:
        """A workspace, kept for the process's life (retired ones too). Made by a thread of its own:
        under torch.compile(mode="reduce-overhead") cudagraph trees route every allocation of the thread
        that runs the compiled program into their private pool, and a workspace kept from there failed
        the step ("1 tensor(s) in the cudagraph pool not tracked as outputs", GPU run 30; a stream of its
        own did not escape the routing, which is per thread)."""
        torch = self._torch
        return outside_graph_pools(lambda: torch.empty(size, device=device, dtype=torch.uint8), device)

    def capture(self, launch: Callable[[], None], device: int, before: Callable[[int], None]) -> Replayable:
        """A CUDA graph of one `launch`, captured on a side stream after one
        eager warm-up run there (first runs load modules, which capture forbids).
        `before(stream)` points the cuDNN handle at the stream that runs it."""
        torch = self._torch
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), torch.cuda.stream(side):
            before(int(side.cuda_stream))
            launch()
            side.synchronize()
            graph.capture_begin()
            try:
                launch()
            finally:
                graph.capture_end()
        torch.cuda.current_stream(device).wait_stream(side)
        return graph  # type: ignore[no-any-return]

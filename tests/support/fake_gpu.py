"""A stand-in GPU runtime for CPU-only tests of plan execution (never used
by the product): tensors that only carry geometry, a frontend graph that
records what it was asked to execute, and a runtime that counts handles,
stream changes, workspaces and captures. The numerics are GPU-tested
(tests/gpu/)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_addresses = itertools.count(0x10000, 0x1000)


@dataclass(frozen=True)
class FakeDevice:
    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


@dataclass(frozen=True)
class FakeDtype:
    name: str

    def __str__(self) -> str:
        return f"fake.{self.name}"


_DTYPES: dict[str, FakeDtype] = {}


def dtype(name: str) -> FakeDtype:
    return _DTYPES.setdefault(name, FakeDtype(name))


class FakeTensor:
    def __init__(
        self,
        shape: tuple[int, ...],
        stride: tuple[int, ...] | None = None,
        dtype_name: str = "half",
        device: FakeDevice | None = None,
    ) -> None:
        self.shape = tuple(shape)
        self._stride = tuple(stride) if stride is not None else _row_major(self.shape)
        self.dtype = dtype(dtype_name)
        self.device = device if device is not None else FakeDevice("cuda", 0)
        self._ptr = next(_addresses)

    def stride(self) -> tuple[int, ...]:
        return self._stride

    def data_ptr(self) -> int:
        return self._ptr

    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return self._stride == _row_major(self.shape)


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


@dataclass
class FakeGraph:
    blob: bytes
    loaded_with: Any
    calls: list[tuple[dict[int, Any], Any, Any]] = field(default_factory=list)
    takes_ordered: bool = True  # the frontend's ordered form (tensor_uids=): False as an older frontend
    ordered_calls: int = 0

    def execute(self, pack: Any, workspace: Any, handle: Any = None, tensor_uids: Any = None) -> None:
        if tensor_uids is not None:
            if not self.takes_ordered:
                raise TypeError("execute() got an unexpected keyword argument 'tensor_uids'")
            assert len(tensor_uids) == len(pack) and len(set(tensor_uids)) == len(tensor_uids), (tensor_uids, pack)
            pack = dict(zip(tensor_uids, pack, strict=True))
            self.ordered_calls += 1
        self.calls.append((dict(pack), workspace, handle))


class FakeLowered:
    """The frontend's lowered graph as plancache.run.raw_execute reads it:
    `_execute_with_raw_ptrs` reads the `void*` array at `address`."""

    def __init__(self, graph: FakeGraph) -> None:
        self.graph = graph
        self.raw_calls: list[tuple[dict[int, int], int, int, int]] = []

    def _execute_with_raw_ptrs(self, address: int, count: int, workspace: int, handle: int, index: int) -> None:
        import ctypes

        pointers = list((ctypes.c_void_p * count).from_address(address))
        order = self.graph._variant_pack_uids()
        assert len(order) == count, (order, count)
        self.raw_calls.append((dict(zip(order, pointers, strict=True)), workspace, handle, index))


@dataclass
class FakeRawGraph(FakeGraph):
    """A deserialized graph whose backend takes raw pointers: its variant
    pack is the uids of the first ordered call, less `bound_by_graph` (the
    slots a graph fills itself), ascending."""

    bound_by_graph: tuple[int, ...] = ()
    selected_engine: Any = None
    _plans: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lowered_graph = FakeLowered(self)
        self._order: list[int] | None = None

    def execute(self, pack: Any, workspace: Any, handle: Any = None, tensor_uids: Any = None) -> None:
        if self._order is None:
            uids = tensor_uids if tensor_uids is not None else list(pack)
            self._order = sorted(u for u in uids if u not in self.bound_by_graph)
        super().execute(pack, workspace, handle, tensor_uids)

    def _variant_pack_uids(self) -> list[int] | None:
        return self._order


@dataclass(frozen=True)
class FakeHandle:
    backend_handle: int


class FakeReplay:
    def __init__(self, launch: Callable[[], None]) -> None:
        self.launch = launch
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.launch()


class FakeRuntime:
    def __init__(self) -> None:
        self.stream = 7  # the "current stream" the code under test sees
        self.device = 0
        self.handles: list[object] = []
        self.set_streams: list[tuple[object, int]] = []
        self.own_streams: list[int] = []  # devices own_stream() made a stream on
        self.graphs: list[FakeGraph] = []
        self.allocations: list[FakeTensor] = []
        self.captures: list[FakeReplay] = []
        self.raw = False  # deserialized graphs take raw pointers (FakeRawGraph), handles carry a backend int

    def dtype(self, name: str) -> Any:
        return dtype(name)

    def scalar(self, shape: tuple[int, ...], value: float, dtype_: Any) -> Any:
        t = FakeTensor(shape, dtype_name=dtype_.name, device=FakeDevice("cpu"))
        t.value = value  # type: ignore[attr-defined]
        return t

    def device_object(self, index: int) -> Any:
        return FakeDevice("cuda", index)

    def current_device(self) -> int:
        return self.device

    def stream_getter(self) -> Callable[[int], int]:
        return lambda device: self.stream

    def new_handle(self, device: int) -> Any:
        handle: Any = FakeHandle(0x5000 + len(self.handles)) if self.raw else object()
        self.handles.append(handle)
        return handle

    def own_stream(self, device: int) -> int:
        self.own_streams.append(device)
        return 1000 + len(self.own_streams)

    def set_stream(self, handle: Any, stream: int) -> None:
        self.set_streams.append((handle, stream))

    def deserialize(self, handle: Any, blob: bytes) -> Any:
        graph = FakeRawGraph(blob, handle) if self.raw else FakeGraph(blob, handle)
        self.graphs.append(graph)
        return graph

    def empty(self, size: int, device: int) -> Any:
        t = FakeTensor((size,), dtype_name="uint8", device=FakeDevice("cuda", device))
        self.allocations.append(t)
        return t

    def capture(self, launch: Callable[[], None], device: int, before: Callable[[int], None]) -> Any:
        before(99)  # the capture's side stream
        launch()  # the warm-up
        replay = FakeReplay(launch)
        self.captures.append(replay)
        return replay

"""Plan execution logic on a stand-in runtime (tests/support/fake_gpu.py):
checks, the bound fast path, captures, shared workspaces, handles and
streams. The numerics of every path are GPU tests (tests/gpu/)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from plancache import InvalidRequest, Plan
from plancache.run import execution
from plancache.v1 import plancache_pb2 as pb
from tests.support.fake_gpu import FakeDevice, FakeRuntime, FakeTensor


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    fake = FakeRuntime()
    execution.use_runtime(fake)
    yield fake
    execution.use_runtime(None)


def make_plan(workspace: int = 1024, blob: bytes = b"plan-blob", key: str = "k1") -> Plan:
    tensors = [
        pb.TensorBinding(uid=1, name="A", dim=[8, 256, 512], stride=[131072, 512, 1], data_type=pb.DATA_TYPE_HALF),
        pb.TensorBinding(uid=2, name="B", dim=[8, 512, 256], stride=[131072, 256, 1], data_type=pb.DATA_TYPE_HALF),
        pb.TensorBinding(
            uid=3, name="C", dim=[8, 256, 256], stride=[65536, 256, 1], data_type=pb.DATA_TYPE_HALF, is_output=True
        ),
        pb.TensorBinding(
            uid=4,
            name="alpha",
            dim=[1, 1, 1],
            stride=[1, 1, 1],
            data_type=pb.DATA_TYPE_FLOAT,
            is_pass_by_value=True,
            scalar_value=0.5,
        ),
    ]
    metadata = pb.PlanMetadata(
        key=key, tensors=tensors, workspace_size=workspace, blob_sha256=hashlib.sha256(blob).hexdigest()
    )
    return Plan(blob, metadata)


def inputs() -> dict[str, Any]:
    return {"A": FakeTensor((8, 256, 512)), "B": FakeTensor((8, 512, 256)), "C": FakeTensor((8, 256, 256))}


# ---- checks ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("A", FakeTensor((8, 256, 256)), "shape (8, 256, 256) but the plan was built for (8, 256, 512)"),
        ("A", FakeTensor((8, 256, 512), stride=(131072, 1, 256)), "strides (131072, 1, 256)"),
        ("A", FakeTensor((8, 256, 512), dtype_name="bfloat16"), "dtype fake.bfloat16 but the plan was built for half"),
        ("A", FakeTensor((8, 256, 512), device=FakeDevice("cpu")), "on cpu but the plan runs on cuda:0"),
        ("A", FakeTensor((8, 256, 512), device=FakeDevice("cuda", 1)), "on cuda:1 but the plan runs on cuda:0"),
        ("A", 3.0, "a number was given"),
        ("A", "not a tensor", "expected a tensor, got str"),
        ("nope", FakeTensor((1,)), "no tensor 'nope' (tensors: A, B, C, alpha)"),
    ],
)
def test_execute_refuses_a_tensor_that_does_not_match_the_plan(
    runtime: FakeRuntime, name: str, bad: Any, message: str
) -> None:
    tensors = inputs() | {name: bad}
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        make_plan().execute(tensors)
    assert not runtime.graphs or not runtime.graphs[0].calls


def test_execute_refuses_a_missing_tensor(runtime: FakeRuntime) -> None:
    tensors = inputs()
    del tensors["C"]
    with pytest.raises(InvalidRequest, match=re.escape("tensor 'C' (uid 3) is not bound")):
        make_plan().execute(tensors)


def test_execute_binds_by_uid_and_fills_scalar_defaults_once(runtime: FakeRuntime) -> None:
    plan = make_plan()
    t = inputs()
    plan.execute({1: t["A"], 2: t["B"], 3: t["C"]})
    plan.execute(t)
    (first, _, _), (second, _, _) = runtime.graphs[0].calls
    assert first[1] is t["A"] and first[3] is t["C"]
    assert first[4].value == 0.5 and first[4] is second[4], "the spec's scalar default is made once per plan"
    plan.execute(t | {"alpha": 2.0})
    assert runtime.graphs[0].calls[-1][0][4].value == 2.0


# ---- handles, streams, workspaces -------------------------------------------------


def test_the_stream_is_set_on_the_handle_only_when_it_changes(runtime: FakeRuntime) -> None:
    plan, t = make_plan(), inputs()
    for _ in range(5):
        plan.execute(t)
    assert [s for _, s in runtime.set_streams] == [7]
    runtime.stream = 8
    plan.execute(t)
    assert [s for _, s in runtime.set_streams] == [7, 8]


def test_plans_on_one_stream_share_one_workspace_grown_to_the_largest_need(runtime: FakeRuntime) -> None:
    sizes = [(i * 37) % 100 * 1000 + 1 for i in range(100)]
    plans = [make_plan(workspace=s, key=f"k{i}") for i, s in enumerate(sizes)]
    t = inputs()
    for plan in plans:
        plan.execute(t)
    assert execution.workspace_bytes_held() == max(sizes), "one workspace per stream, not one per plan"
    workspaces = {id(call[1]) for g in runtime.graphs for call in g.calls}
    assert len(workspaces) < 10  # grown a few times, never one per plan
    last = runtime.graphs[-1].calls[-1][1]
    assert last.shape == (max(sizes),)


def test_a_workspace_a_stream_outgrew_stays_allocated(runtime: FakeRuntime) -> None:
    """A CUDA graph captured before the growth replays with the old buffer's
    address: freeing it made a captured training step read freed memory."""
    import gc
    import weakref

    make_plan(workspace=1000, key="small").execute(inputs())
    (first,) = runtime.allocations
    kept = weakref.ref(first)
    del first
    make_plan(workspace=5000, key="large").execute(inputs())
    gc.collect()
    assert len(runtime.allocations) == 2 and runtime.allocations[-1].shape == (5000,)
    runtime.allocations.clear()  # only the pool holds them now (the fake graphs recorded them too)
    for graph in runtime.graphs:
        graph.calls.clear()
    gc.collect()
    assert kept() is not None


def test_another_stream_gets_its_own_workspace(runtime: FakeRuntime) -> None:
    plan, t = make_plan(workspace=500), inputs()
    plan.execute(t)
    runtime.stream = 8
    plan.execute(t)
    (_, ws7, _), (_, ws8, _) = runtime.graphs[0].calls
    assert ws7 is not ws8
    assert execution.workspace_bytes_held() == 1000


def test_each_thread_uses_its_own_handle_and_the_graph_is_loaded_once(runtime: FakeRuntime) -> None:
    plan, t = make_plan(), inputs()
    plan.execute(t)
    thread = threading.Thread(target=plan.execute, args=(t,))
    thread.start()
    thread.join()
    assert len(runtime.handles) == 2
    assert len(runtime.graphs) == 1, "one deserialize per device"
    handles = [call[2] for call in runtime.graphs[0].calls]
    assert handles[0] is not handles[1]


def test_a_background_load_deserializes_on_a_stream_of_its_own_thread(runtime: FakeRuntime) -> None:
    """A background prefetch's thread (the workload's start-up stream) deserializes beside the program's own
    work: its handle is on a stream it made, never the program's (the legacy default stream on the H200,
    whose next op failed beside it: GPU run 27); the program's own calls stay on the program's stream."""
    from plancache.transport.background import BackgroundPrefetch
    from plancache.transport.results import PrefetchResult

    plans = [make_plan(key="k1", blob=b"one"), make_plan(key="k2", blob=b"two")]

    def run(on_plan: Any) -> PrefetchResult:
        result = PrefetchResult(total=len(plans))
        for index, plan in enumerate(plans):
            result.plans[index] = plan
            on_plan(index, plan)
        return result

    loaded = BackgroundPrefetch(run, load=True).wait(timeout=10)
    assert sorted(loaded.plans) == [0, 1] and runtime.own_streams == [0], "one stream, made once by the thread"
    loader_handle = runtime.graphs[0].loaded_with
    assert [g.loaded_with for g in runtime.graphs] == [loader_handle, loader_handle]
    assert (loader_handle, 1001) in runtime.set_streams  # pointed at its own stream before either load
    assert runtime.set_streams.index((loader_handle, 1001)) == 0
    plans[0].execute(inputs())  # the program's thread: its own handle, on the program's stream (7)
    assert runtime.set_streams[-1][1] == runtime.stream and runtime.set_streams[-1][0] is not loader_handle
    assert len(runtime.graphs) == 2, "executed with the graph the loader made"


# ---- the bound fast path -----------------------------------------------------------


def test_a_bound_call_executes_the_packed_tensors(runtime: FakeRuntime) -> None:
    t = inputs()
    bound = make_plan().bind(t)
    bound()
    bound()
    calls = runtime.graphs[0].calls
    assert len(calls) == 2
    assert calls[0][0] == {1: t["A"], 2: t["B"], 3: t["C"], 4: calls[0][0][4]}
    assert [s for _, s in runtime.set_streams] == [7]


def test_a_bound_call_takes_new_tensors_of_the_same_geometry_for_that_call_only(runtime: FakeRuntime) -> None:
    t = inputs()
    bound = make_plan().bind(t)
    other = FakeTensor((8, 256, 512))
    bound({"A": other})
    bound()
    (with_other, _, _), (again, _, _) = runtime.graphs[0].calls
    assert with_other[1] is other and with_other[2] is t["B"]
    assert again[1] is t["A"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (FakeTensor((8, 256, 511)), "shape"),
        (FakeTensor((8, 256, 512), stride=(1, 8, 2048)), "strides"),
        (FakeTensor((8, 256, 512), dtype_name="float"), "dtype"),
        (FakeTensor((8, 256, 512), device=FakeDevice("cpu")), "on cpu"),
        (None, "expected a tensor"),
    ],
)
def test_a_bound_call_refuses_a_tensor_of_another_geometry_dtype_or_device(
    runtime: FakeRuntime, bad: Any, message: str
) -> None:
    bound = make_plan().bind(inputs())
    with pytest.raises(InvalidRequest, match=message):
        bound({"A": bad})
    assert runtime.graphs[0].calls == []


def test_a_bound_call_from_another_thread_is_refused(runtime: FakeRuntime) -> None:
    bound = make_plan().bind(inputs())
    errors: list[BaseException] = []

    def call() -> None:
        try:
            bound()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], InvalidRequest) and "another thread" in str(errors[0])


def test_a_bound_call_follows_the_current_stream_and_its_workspace(runtime: FakeRuntime) -> None:
    bound = make_plan(workspace=100).bind(inputs())
    bound()
    runtime.stream = 8
    bound()
    (_, ws7, _), (_, ws8, _) = runtime.graphs[0].calls
    assert ws7 is not ws8
    assert [s for _, s in runtime.set_streams] == [7, 8]


def test_a_bound_plan_moves_to_the_grown_workspace(runtime: FakeRuntime) -> None:
    small = make_plan(workspace=100, key="small").bind(inputs())
    make_plan(workspace=5000, key="large").execute(inputs())
    small()
    assert runtime.graphs[0].calls[-1][1].shape == (5000,), "the replaced buffer is not kept alive by the bound plan"


# ---- captures ------------------------------------------------------------------------


def test_a_capture_replays_on_its_own_workspace(runtime: FakeRuntime) -> None:
    t = inputs()
    captured = make_plan(workspace=300).capture(t)
    assert len(runtime.graphs[0].calls) == 1, "one warm-up run before the recording"
    captured()
    captured(t)
    assert runtime.captures[0].replays == 2
    workspace = runtime.graphs[0].calls[-1][1]
    assert workspace.shape == (300,) and execution.workspace_bytes_held() == 0
    assert runtime.set_streams[0][1] == 99, "recorded on the capture's stream"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (FakeTensor((8, 256, 512)), "not the captured tensor"),
        (FakeTensor((8, 256, 512), dtype_name="float"), "dtype"),
        (FakeTensor((4, 256, 512)), "shape"),
        (FakeTensor((8, 256, 512), device=FakeDevice("cuda", 1)), "cuda:1"),
    ],
)
def test_a_replay_refuses_tensors_other_than_the_captured_ones(runtime: FakeRuntime, bad: Any, message: str) -> None:
    captured = make_plan().capture(inputs())
    with pytest.raises(InvalidRequest, match=message):
        captured({"A": bad})
    assert runtime.captures[0].replays == 0


# ---- ragged (packed) tensors ------------------------------------------------------


def make_ragged_plan() -> Plan:
    """A packed-prefill plan: q and o ragged over [4, 8, 512, 128] with THD strides."""
    thd = [512 * 8 * 128, 128, 8 * 128, 1]
    tensors = [
        pb.TensorBinding(
            uid=11, name="q", dim=[4, 8, 512, 128], stride=thd, data_type=pb.DATA_TYPE_BFLOAT16, ragged_offset_uid=19
        ),
        pb.TensorBinding(
            uid=14,
            name="o",
            dim=[4, 8, 512, 128],
            stride=thd,
            data_type=pb.DATA_TYPE_BFLOAT16,
            is_output=True,
            ragged_offset_uid=19,
        ),
        pb.TensorBinding(
            uid=19, name="token_offsets", dim=[5, 1, 1, 1], stride=[1, 1, 1, 1], data_type=pb.DATA_TYPE_INT32
        ),
    ]
    blob = b"ragged-plan"
    return Plan(
        blob,
        pb.PlanMetadata(key="ragged", tensors=tensors, workspace_size=64, blob_sha256=hashlib.sha256(blob).hexdigest()),
    )


def test_a_ragged_tensor_binds_as_its_packed_buffer_of_any_token_count(runtime: FakeRuntime) -> None:
    plan = make_ragged_plan()
    offsets = FakeTensor((5, 1, 1, 1), dtype_name="int32")
    for tokens in (949, 2048, 1):
        packed = {
            "q": FakeTensor((tokens, 8, 128), dtype_name="bfloat16"),
            "o": FakeTensor((tokens, 8, 128), dtype_name="bfloat16"),
        }
        plan.execute({**packed, "token_offsets": offsets})
    bound = plan.bind(
        {
            "q": FakeTensor((949, 8, 128), dtype_name="bfloat16"),
            "o": FakeTensor((949, 8, 128), dtype_name="bfloat16"),
            "token_offsets": offsets,
        }
    )
    bound(
        {"q": FakeTensor((100, 8, 128), dtype_name="bfloat16"), "o": FakeTensor((100, 8, 128), dtype_name="bfloat16")}
    )
    assert len(runtime.graphs[0].calls) == 4  # three executes and the bound call


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (FakeTensor((949, 8, 128), stride=(1, 949, 949 * 8), dtype_name="bfloat16"), "must be contiguous"),
        (FakeTensor((7,), dtype_name="bfloat16"), "a packed buffer of 7 elements is not whole tokens of 1024"),
        (FakeTensor((949, 8, 100), dtype_name="bfloat16"), "not whole tokens of 1024"),
        (FakeTensor((949, 8, 128), dtype_name="half"), "dtype fake.half but the plan was built for bfloat16"),
        (
            FakeTensor((949, 8, 128), dtype_name="bfloat16", device=FakeDevice("cpu")),
            "on cpu but the plan runs on cuda:0",
        ),
    ],
)
def test_a_ragged_buffer_must_be_dense_whole_tokens_of_the_right_type(
    runtime: FakeRuntime, bad: Any, message: str
) -> None:
    good = {
        "o": FakeTensor((949, 8, 128), dtype_name="bfloat16"),
        "token_offsets": FakeTensor((5, 1, 1, 1), dtype_name="int32"),
    }
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        make_ragged_plan().execute({**good, "q": bad})


def test_a_stopped_prefetch_does_not_sleep_out_a_retry_delay() -> None:
    """A manifest prefetch refused for now (RESOURCE_EXHAUSTED with a retry delay) waits the delay before asking
    again; a stop during that wait ends the prefetch at once, its entries counted as stopped."""
    import threading
    import time
    from types import SimpleNamespace

    import grpc

    from plancache.transport.manifest import Manifest, ManifestEntry
    from plancache.transport.prefetching import ManifestPrefetch, PrefetchStop
    from plancache.wire.rich_status import trailing_metadata as rich_trailers

    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self) -> str:
            return "busy: retry later"

        def trailing_metadata(self) -> Any:
            from plancache.errors import ResourceExhausted

            return rich_trailers(ResourceExhausted("busy: retry later", retry_after=5.0))

        def cancel(self) -> None:
            pass

        def __iter__(self) -> Any:
            raise self

    asked: list[int] = []

    def prefetch(request: Any, timeout: Any = None, metadata: Any = None) -> Refused:
        asked.append(1)
        return Refused()

    connection = SimpleNamespace(stub=SimpleNamespace(Prefetch=prefetch), metadata=())
    intake = SimpleNamespace(cached=lambda *a, **k: None)
    manifest = Manifest(entries=[ManifestEntry(key=f"k{i}") for i in range(3)])
    stop = PrefetchStop()
    fetch = ManifestPrefetch(
        connection,  # type: ignore[arg-type]
        intake,  # type: ignore[arg-type]
        manifest,
        None,
        compile_missing=False,
        tuned_only=False,
        progress=None,
        on_plan=None,
        stop=stop,
    )
    threading.Timer(0.3, stop.stop).start()
    started = time.monotonic()
    result = fetch.run(60.0)
    assert time.monotonic() - started < 2.0, "the retry's delay (2.5 s at least) was not slept out"
    assert asked == [1] and result.stopped == 3 and not result.errors


def test_a_background_prefetch_says_how_far_an_entry_is_and_whether_it_is_worth_waiting_for() -> None:
    """position(i): the entries up to i not come yet and the stream's pace; worth_waiting(i): among the next
    STREAM_FREE_AHEAD, or expected within STREAM_WAIT_S at that pace; a skipped entry is not kept when it comes."""
    import time

    from plancache.transport import background
    from plancache.transport.background import BackgroundPrefetch

    run, gates = gated_stream(40)
    pending = BackgroundPrefetch(run, load=False)
    assert pending.position(5) == (6, None)
    assert pending.worth_waiting(background.STREAM_FREE_AHEAD - 1)  # the next plans: waited for, pace unknown
    assert not pending.worth_waiting(10)  # far, pace unknown: asked of the service
    pending.skip(10)
    for index in range(3):  # three plans 20 ms apart
        gates[index].set()
        time.sleep(0.02)
    deadline = time.monotonic() + 5
    while pending.position(2)[0] and time.monotonic() < deadline:
        time.sleep(0.005)
    ahead, pace = pending.position(4)
    assert ahead == 2 and pace is not None and 0.005 < pace < 0.2
    assert pending.worth_waiting(4)  # the next two
    assert not pending.worth_waiting(5)  # three plans at 20 ms or more: past 50 ms
    for gate in gates:
        gate.set()
    result = pending.wait(timeout=10)
    assert 10 not in result.plans and len(result.plans) == 39 and result.stopped == 0


def test_a_held_background_prefetch_deserializes_only_from_start_loading_and_never_after_stop_loading(
    runtime: FakeRuntime,
) -> None:
    """A workload's stream is `held`: its plans are fetched but not deserialized (another program's record costs
    fetches only) until start_loading(), which deserializes the plans already there, in order, off the caller's
    thread, and the rest as they come; stop_loading() is final; a prefetch without `load` never deserializes."""

    from plancache.transport.background import BackgroundPrefetch
    from tests.support.waiting import wait_until

    run, gates = gated_stream(6)
    pending = BackgroundPrefetch(run, load=True, held=True)
    for index in range(3):
        gates[index].set()
    pending.wait_for(2, timeout=10)
    assert runtime.graphs == [] and not pending.loading  # fetched, held
    pending.start_loading()
    wait_until(lambda: len(runtime.graphs) == 3, timeout=10, what="the three plans already fetched, deserialized")
    assert [g.blob for g in runtime.graphs] == [b"plan 0", b"plan 1", b"plan 2"]  # in order
    assert runtime.own_streams == [0]  # on a stream the loading thread made, not the caller's
    gates[3].set()
    wait_until(lambda: len(runtime.graphs) == 4, timeout=10, what="the next plan, deserialized as it came")
    pending.stop_loading()
    pending.start_loading()  # stop is final
    for gate in gates[4:]:
        gate.set()
    assert len(pending.wait(timeout=10).plans) == 6 and len(runtime.graphs) == 4

    unloading = BackgroundPrefetch(run, load=False, held=True)
    unloading.start_loading()  # without `load`: nothing to start
    assert len(unloading.wait(timeout=10).plans) == 6 and len(runtime.graphs) == 4


def gated_stream(count: int) -> tuple[Any, list[Any]]:
    """A prefetch's `run` bringing `count` plans ("plan i"), each once its gate is set."""
    import threading

    from plancache.transport.results import PrefetchResult

    plans = [make_plan(key=f"k{i}", blob=f"plan {i}".encode()) for i in range(count)]
    gates = [threading.Event() for _ in plans]

    def run(on_plan: Any) -> PrefetchResult:
        result = PrefetchResult(total=len(plans))
        for index, plan in enumerate(plans):
            assert gates[index].wait(10)
            result.plans[index] = plan
            on_plan(index, plan)
        return result

    return run, gates

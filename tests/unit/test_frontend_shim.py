"""plancache.cudnn without a GPU: the real frontend's IR builds the graphs
(its validate() and plan calls need a GPU, so the tests put recorders in
their place on the frontend's class), a stand-in client answers
(tests/support/frontdoor_standins.py), and a stand-in graph takes the served
plan. What is checked: the spec and key a program's graph asks for, the
deferred plan calls and their replay when the graph builds locally, the
program's pack reaching the served plan by uid, the reasons logged once,
and that a plan failing verification is never loaded. The numerics are
tests/gpu/test_gpu_frontend_shim.py."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import pytest

from examples.generate import matmul_fp16
from plancache import CompileFailed, CompileOptions, GraphSpec, IntegrityError, Unavailable, UntrustedPlan
from plancache.frontdoors.service import SERVICE
from tests.support.frontdoor_standins import TARGET, StandInClient, StandInServedGraph, key_of

frontend = pytest.importorskip("cudnn", reason="needs the cuDNN frontend's Python IR (nvidia-cudnn-frontend)")
shim = pytest.importorskip("plancache.cudnn")
# The drop-in's modules the tests reach into: the counts and reasons, what serves a graph, the capture.
built_records = pytest.importorskip("plancache.cudnn._built")
serving = pytest.importorskip("plancache.cudnn._serving")
capturing = pytest.importorskip("plancache.cudnn._capture")

HALF, FLOAT = frontend.data_type.HALF, frontend.data_type.FLOAT


class Recorder:
    """The frontend's GPU-only calls, recorded in order (the local build)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.loaded: list[Any] = []
        cls = frontend.pygraph
        monkeypatch.setattr(cls, "validate", self._record("validate", lambda g: setattr(g, "_is_validated", True)))
        monkeypatch.setattr(cls, "build_operation_graph", self._record("build_operation_graph"))
        for name in (
            "create_execution_plans",
            "check_support",
            "build_plans",
            "get_execution_plan_count",
            "execute",
            "build_plan_at_index",
            "execute_plan_at_index",
            "create_execution_plan",
        ):
            monkeypatch.setattr(cls, name, self._record(name))
        monkeypatch.setattr(serving, "_load", self._load)

    def _record(self, name: str, then: Any = None) -> Any:
        def call(g: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return then(g) if then is not None else None

        return call

    def _load(self, graph: Any, plan: Any) -> StandInServedGraph:
        served = StandInServedGraph(plan.blob)
        self.loaded.append(served)
        return served

    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    monkeypatch.setattr(built_records, "_STATS", shim.Stats())
    built_records._once.forget()
    built_records._RECENT.clear()
    return Recorder(monkeypatch)


@pytest.fixture
def client() -> Iterator[StandInClient]:
    standin = StandInClient()
    shim.configure(standin, target=TARGET)
    yield standin
    SERVICE.reset()


def _row_major(shape: list[int]) -> list[int]:
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


def sdpa_graph(is_inference: bool = True) -> tuple[Any, list[Any]]:
    """The walkthrough's section 5 graph (b4 h16 s1024 d64 causal), its tensors without uids."""
    g = shim.pygraph(name="sdpa", io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    dims = [4, 16, 1024, 64]
    q, k, v = (g.tensor(name=n, dim=dims, stride=_row_major(dims), data_type=HALF) for n in ("Q", "K", "V"))
    o, stats = g.sdpa(
        name="sdpa", q=q, k=k, v=v, is_inference=is_inference, attn_scale=1 / math.sqrt(64), use_causal_mask=True
    )
    o.set_output(True).set_data_type(HALF)
    o.set_dim(dims).set_stride(_row_major(dims))
    if stats is not None:
        stats.set_output(True).set_data_type(FLOAT)
    return g, [q, k, v, o]


def matmul_graph() -> tuple[Any, list[Any]]:
    """The walkthrough's section 6 graph: uids 1, 2, 3 set by the program."""
    g = shim.pygraph(name="serializable_mm", io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    a = g.tensor(name="A", dim=[8, 256, 512], stride=_row_major([8, 256, 512]), data_type=HALF).set_uid(1)
    b = g.tensor(name="B", dim=[8, 512, 256], stride=_row_major([8, 512, 256]), data_type=HALF).set_uid(2)
    c = g.matmul(A=a, B=b, compute_data_type=FLOAT)
    c.set_output(True).set_data_type(HALF).set_uid(3)
    return g, [a, b, c]


def build(g: Any) -> None:
    """The walkthrough's build(g), as h200_baseline.py writes it."""
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(frontend.build_plan_policy.ALL)


# ---- the module ----------------------------------------------------------------------


def test_the_module_is_the_frontend_but_for_its_pygraph() -> None:
    for name in frontend.__all__:
        if name not in ("pygraph", "Graph", "wrapper"):
            assert getattr(shim, name) is getattr(frontend, name), name
    assert issubclass(shim.pygraph, frontend.pygraph) and shim.pygraph is not frontend.pygraph
    assert shim.sdpa_capabilities is frontend.sdpa_capabilities  # through the module's __getattr__ as well
    assert {"configure", "stats", "graphs"} <= set(dir(shim))
    ours = {name for name in vars(shim) if not name.startswith("__")}
    assert {name for name in ours & set(dir(frontend)) if getattr(shim, name) is not getattr(frontend, name)} == {
        "pygraph"
    }  # nothing else shadowed


# ---- what a graph asks for ---------------------------------------------------------------


def test_the_walkthroughs_sdpa_asks_for_the_spec_of_its_frontend_uids(
    recorder: Recorder, client: StandInClient
) -> None:
    g, tensors = sdpa_graph()
    assert [t.uid for t in tensors] == [1, 2, 3, 4]  # the IR's own, in creation order
    build(g)
    ((spec, target, options),) = client.asked
    hand = GraphSpec(io_data_type="half")
    q, k, v = (hand.tensor([4, 16, 1024, 64], name=n, uid=u) for n, u in (("q", 1), ("k", 2), ("v", 3)))
    o, _ = hand.sdpa(q, k, v, attn_scale=0.125, use_causal_mask=True)
    assert o is not None
    o.set_output(True).set_uid(4)
    assert spec.spec_hash() == hand.spec_hash()  # is_inference=True is the catalog's generate_stats=False
    assert target == TARGET and options == CompileOptions(heuristic_modes=("A", "FALLBACK"))
    assert g.plancache.plan.key == key_of(hand, TARGET, options) and g.plancache.source == "compiled"


def test_the_walkthroughs_matmul_is_the_example_plan(recorder: Recorder, client: StandInClient) -> None:
    g, _ = matmul_graph()
    build(g)
    assert client.asked[0][0].spec_hash() == matmul_fp16().spec_hash()


def test_a_program_meeting_its_graph_at_three_sizes_has_the_family_built(
    recorder: Recorder, client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plancache.cudnn counts served graphs toward their family as plancache.functional
    does (plancache.frontdoors.families)."""
    from plancache.frontdoors import families as _families

    monkeypatch.setattr(_families.WATCH, "starter", lambda work: work())
    monkeypatch.setattr(_families.WATCH, "_signatures", type(_families.WATCH._signatures)())
    for m in (128, 256, 320):
        g = shim.pygraph(name="mm", io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
        a = g.tensor(name="A", dim=[8, m, 512], stride=_row_major([8, m, 512]), data_type=HALF).set_uid(1)
        b = g.tensor(name="B", dim=[8, 512, 256], stride=_row_major([8, 512, 256]), data_type=HALF).set_uid(2)
        g.matmul(A=a, B=b, compute_data_type=FLOAT).set_output(True).set_data_type(HALF).set_uid(3)
        build(g)
    ((family, _, _),) = client.families
    (varying,) = family.varying
    assert varying.sizes == tuple(
        range(1, 513)
    )  # 2 x 320 -> 1024 sizes, halved to the 512 graphs a family asked for on a program's behalf may name
    assert family.values_of(client.asked[-1][0]) == {varying.symbol: 320}


def test_training_sdpa_asks_for_its_stats(recorder: Recorder, client: StandInClient) -> None:
    g, _ = sdpa_graph(is_inference=False)
    build(g)
    (node,) = client.asked[0][0].nodes
    assert node.attributes["generate_stats"] is True and set(node.outputs) == {"O", "Stats"}


def test_torch_dtypes_given_as_data_types_are_captured() -> None:
    class TorchDtype:  # what `data_type=x.dtype` hands the IR: no cudnn enum name
        def __str__(self) -> str:
            return "torch.bfloat16"

    g = shim.pygraph(intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    a = g.tensor(name="A", dim=[1, 64, 32], stride=[2048, 32, 1], data_type=TorchDtype())
    b = g.tensor(name="B", dim=[1, 32, 16], stride=[512, 16, 1], data_type=TorchDtype())
    g.matmul(A=a, B=b).set_output(True).set_data_type(TorchDtype())
    spec = capturing.capture(g, frontend)
    assert {t.data_type for t in spec.tensors if not t.is_virtual} == {"bfloat16"}


def test_the_programs_plan_options_are_the_plans_options(recorder: Recorder, client: StandInClient) -> None:
    g, _ = matmul_graph()
    g.deselect_workspace_greater_than(1 << 20)
    g.deselect_behavior_notes([frontend.behavior_note.RUNTIME_COMPILATION])
    g.build([frontend.heur_mode.A])
    options = client.asked[0][2]
    assert options == CompileOptions(
        heuristic_modes=("A",), workspace_limit=1 << 20, excluded_behavior_notes=("RUNTIME_COMPILATION",)
    )
    assert g.plancache.plan.key == key_of(matmul_fp16(), TARGET, options)


def test_each_graph_asks_with_its_own_plan_calls_options_whatever_graphs_came_before(
    recorder: Recorder, client: StandInClient
) -> None:
    """The options of graphs that leave their plan list alone are kept by what they were made from (they are on
    every graph's build step): a graph with other calls, or the same calls and a plan-list call, asks with its own."""
    plain = CompileOptions(heuristic_modes=("A",), workspace_limit=1 << 20)
    for limit, modes, expected in (
        (1 << 20, [frontend.heur_mode.A], plain),
        (1 << 20, [frontend.heur_mode.A], plain),
        (1 << 10, [frontend.heur_mode.A], CompileOptions(heuristic_modes=("A",), workspace_limit=1 << 10)),
        (1 << 20, [frontend.heur_mode.B], CompileOptions(heuristic_modes=("B",), workspace_limit=1 << 20)),
        (1 << 20, [frontend.heur_mode.A], plain),
    ):
        g, _ = matmul_graph()
        g.deselect_workspace_greater_than(limit)
        g.build(modes)
        assert client.asked[-1][2] == expected
    selected, _ = matmul_graph()
    selected.deselect_workspace_greater_than(1 << 20)
    selected.create_execution_plans([frontend.heur_mode.A])
    selected.select_plan(0)
    selected.build_plans(frontend.build_plan_policy.HEURISTICS_CHOICE)
    asked = client.asked[-1][2]
    assert asked.selected_plan == 0 and not asked.autotune and asked.heuristic_modes == ("A",)


# ---- a served graph ------------------------------------------------------------------------


def test_a_served_graph_runs_the_programs_pack_by_uid(recorder: Recorder, client: StandInClient) -> None:
    g, (q, k, _, _) = sdpa_graph()
    build(g)
    assert (
        "create_execution_plans" not in recorder.names() and "build_plans" not in recorder.names()
    )  # deferred, then needless
    (served,) = recorder.loaded
    assert g.get_workspace_size() == served.workspace
    g.execute({q: "q", k: "k", "V": "v", 4: "o"}, "ws")  # tensor handles, a name, a uid
    assert served.executed == [({1: "q", 2: "k", 3: "v", 4: "o"}, "ws", None)]
    assert g.serialize(as_bytes=True) == g.plancache.plan.blob and bytes(g.serialize()) == g.plancache.plan.blob
    assert shim.stats().served == 1 and shim.graphs()[-1] is g.plancache


def test_a_first_execute_without_a_build_asks_plancache(recorder: Recorder, client: StandInClient) -> None:
    g, (a, b, c) = matmul_graph()
    g.execute({a: 1, b: 2, c: 3}, "ws")
    assert len(client.asked) == 1 and recorder.loaded[0].executed == [({1: 1, 2: 2, 3: 3}, "ws", None)]
    assert "execute" not in recorder.names()


# ---- local builds ------------------------------------------------------------------------------


def test_with_the_server_down_graphs_build_locally_as_the_program_would_and_it_is_logged_once(
    recorder: Recorder,
    client: StandInClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client.error = Unavailable("failed to connect to all addresses")
    caplog.set_level(logging.INFO, logger="plancache.cudnn")
    for make in (sdpa_graph, matmul_graph):
        g, _ = make()
        build(g)
        assert g.plancache.source == "local" and g.plancache.reason == "Unavailable: failed to connect to all addresses"
    plan_calls = [
        (n, a) for n, a, _ in recorder.calls if n in ("create_execution_plans", "check_support", "build_plans")
    ]
    heuristics = [frontend.heur_mode.A, frontend.heur_mode.FALLBACK]
    expected = [
        ("create_execution_plans", (heuristics,)),
        ("check_support", ()),
        ("build_plans", (frontend.build_plan_policy.ALL,)),
    ]
    assert plan_calls == expected * 2  # the program's own calls, in its order, with its arguments
    assert not recorder.loaded
    assert [r.getMessage() for r in caplog.records] == [
        "plancache.cudnn: graphs built locally: Unavailable: failed to connect to all addresses"
    ]
    assert shim.stats().local == 2


def test_without_a_server_graphs_build_locally(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("PLANCACHE_SERVER", raising=False)
    SERVICE.reset()
    g, _ = matmul_graph()
    build(g)
    assert g.plancache.reason.startswith("NotConfigured: no plancache server configured")
    assert recorder.names().count("build_plans") == 1 and len(caplog.records) == 1


@pytest.mark.parametrize(
    "error",
    [
        UntrustedPlan("plan k1: signed by an unknown key", signer="abc", unknown_key=True),
        IntegrityError("blob sha256 mismatch"),
    ],
)
def test_a_plan_failing_verification_is_never_loaded(
    recorder: Recorder, client: StandInClient, error: Exception
) -> None:
    client.error = error  # type: ignore[assignment]
    g, _ = matmul_graph()
    build(g)
    assert not recorder.loaded and g.plancache.plan is None and g.plancache.source == "local"
    assert recorder.names().count("build_plans") == 1


def test_a_graph_the_capture_does_not_cover_builds_locally_naming_why(
    recorder: Recorder, client: StandInClient, caplog: pytest.LogCaptureFixture
) -> None:
    g = shim.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    q, k, v = (g.tensor(name=n, dim=[1, 2, 64, 64], stride=[8192, 4096, 64, 1], data_type=HALF) for n in "qkv")
    g.sdpa(
        q=q,
        k=k,
        v=v,
        generate_stats=False,
        score_mod=lambda graph, score: graph.mul(a=score, b=score) if score.get_dim()[2] > 32 else score,
    )[0].set_output(True)
    build(g)
    assert not client.asked and "the callback uses 'get_dim' of a tensor" in g.plancache.reason
    aot = shim.pygraph(io_data_type=HALF, device_property=object())
    y = aot.tensor(name="y", dim=[1, 8, 8], stride=[64, 8, 1], data_type=HALF)
    aot.matmul(y, y).set_output(True)
    build(aot)
    assert "device_property" in aot.plancache.reason
    assert len(caplog.records) == 2  # each graph's own reason


def test_new_node_types_uid_0_and_scalars_held_in_the_graph_are_served(
    recorder: Recorder, client: StandInClient
) -> None:
    """A layernorm backward (no classic op), a tensor of uid 0 and a tensor_scalar: all asked for."""
    g = shim.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    x = g.tensor(name="x", dim=[8, 64, 1, 1], stride=[64, 1, 64, 64], data_type=HALF).set_uid(0)
    dy = g.tensor(name="dy", dim=[8, 64, 1, 1], stride=[64, 1, 64, 64], data_type=HALF)
    scale = g.tensor(name="scale", dim=[1, 64, 1, 1], stride=[64, 1, 64, 64], data_type=FLOAT)
    mean, inv_var = (
        g.tensor(name=n, dim=[8, 1, 1, 1], stride=[1, 1, 1, 1], data_type=FLOAT) for n in ("mean", "inv_var")
    )
    dx, d_scale, d_bias = g.layernorm_backward(grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_var)
    g.mul(a=dx, b=g.tensor_scalar(0.5, frontend.scalar_type.COMPILE_TIME_CONST, name="half")).set_output(True)
    d_scale.set_output(True).set_data_type(FLOAT)
    d_bias.set_output(True).set_data_type(FLOAT)
    build(g)
    assert g.plancache.source != "local", g.plancache.reason
    spec = client.asked[0][0]
    assert [n.op for n in spec.nodes] == ["layernorm_backward", "mul"]
    assert 0 in {t.uid for t in spec.tensors} and [t.constant for t in spec.tensors if t.constant is not None] == [0.5]


def test_cudnns_refusal_and_a_blob_that_does_not_load_build_locally(
    recorder: Recorder, client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.error = CompileFailed("cuDNN does not support this graph on sm_90")
    g, _ = matmul_graph()
    build(g)
    assert g.plancache.reason.startswith("CompileFailed")
    client.error = None

    def broken(graph: Any, plan: Any) -> Any:
        raise RuntimeError("deserialize: wrong frontend version")

    monkeypatch.setattr(serving, "_load", broken)
    g2, _ = matmul_graph()
    build(g2)
    assert g2.plancache.reason == "loading the served plan failed: RuntimeError: deserialize: wrong frontend version"
    assert recorder.names().count("build_plans") == 2


def test_plan_list_queries_are_answered_from_the_workers_records(recorder: Recorder, client: StandInClient) -> None:
    """test_matmul_bias_relu's pattern: the behavior notes of plan 0 asked
    before the build. Answered from the plan list the worker recorded, with
    nothing planned here; the build is the plan the program's own would run
    (no autotuning: the program looks at its plan list)."""
    g, _ = matmul_graph()
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
    assert g.get_behavior_notes_for_plan_at_index(0) == [frontend.behavior_note.RUNTIME_COMPILATION]
    assert g.get_execution_plan_count() == 3
    assert g.get_plan_name_at_index(1) == "eng7_standin"
    assert g.get_engine_and_knobs_at_index(1) == (7, {frontend.knob_type.TILE_SIZE: 2})
    assert g.get_workspace_size_plan_at_index(0) == 256
    g.check_support()
    g.build_plans()
    assert (
        g.plancache.source == "compiled"
        and "create_execution_plans" not in recorder.names()
        and "build_plans" not in recorder.names()
    )
    assert len(client.asked) == 1 and client.asked[0][2].autotune is False  # the records' plan is the one built


def test_pinned_and_selected_plans_are_the_plans_options(recorder: Recorder, client: StandInClient) -> None:
    """test_conv_bias's pattern: explicit plans by engine and knobs, no heuristics; and select_plan."""
    g, _ = matmul_graph()
    g.validate()
    g.build_operation_graph()
    g.create_execution_plan(7, {frontend.knob_type.TILE_SIZE: 2})
    g.create_execution_plan(9, {})
    assert recorder.names().count("create_execution_plan") == 2  # made here too: the frontend says now what it refuses
    g.select_numeric_notes([frontend.numerical_note.TENSOR_CORE])
    g.check_support()
    g.build_plans()
    options = client.asked[0][2]
    assert [(p.engine_id, p.knobs) for p in options.pinned_plans] == [(7, (("TILE_SIZE", 2),)), (9, ())]
    assert options.pinned_only and not options.autotune
    assert [(f.kind, f.keep, f.notes) for f in options.note_filters] == [("numeric", True, ("TENSOR_CORE",))]
    assert g.plancache.source == "compiled"

    refusing, _ = matmul_graph()
    refusing.validate()

    def refuse(graph: Any, engine: int, knobs: Any = None) -> None:
        raise frontend.cudnnGraphNotSupportedError("Finalizing the engine config failed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frontend.pygraph, "create_execution_plan", refuse)
        with pytest.raises(
            frontend.cudnnGraphNotSupportedError
        ):  # as the program's own graph raises it (test_conv_bias catches or fails on it)
            refusing.create_execution_plan(3, {})
    refusing.create_execution_plan(9, {})
    refusing.deselect_engines(["eng3"])
    refusing.build_plans()
    assert [p.engine_id for p in client.asked[-1][2].pinned_plans] == [9] and client.asked[-1][
        2
    ].deselected_engines == ("eng3",)

    h, _ = matmul_graph()
    h.build([frontend.heur_mode.A])
    assert client.asked[-1][2].selected_plan is None
    k, _ = matmul_graph()
    k.validate()
    k.create_execution_plans([frontend.heur_mode.A])
    k.select_plan(2)
    k.build_plans()
    assert client.asked[-1][2].selected_plan == 2 and not client.asked[-1][2].pinned_only


def test_a_program_that_runs_candidates_itself_builds_locally(recorder: Recorder, client: StandInClient) -> None:
    g, _ = matmul_graph()
    g.validate()
    g.create_execution_plans([frontend.heur_mode.A])
    g.build_plan_at_index(1)  # an autotuner's loop
    assert g.plancache.reason == "the program calls build_plan_at_index()" and not client.asked
    assert recorder.names()[-2:] == ["create_execution_plans", "build_plan_at_index"]
    served, _ = matmul_graph()
    build(served)
    assert served.plancache.source == "compiled"
    before = shim.stats()
    served.execute_plan_at_index({}, None, 1)  # a served graph asked to run another candidate: its own plans are built
    assert served.plancache.source == "local" and "after it was served" in str(served.plancache.reason)
    after = shim.stats()
    assert (after.served, after.local) == (before.served - 1, before.local + 1)
    assert recorder.names()[-3:] == ["check_support", "build_plans", "execute_plan_at_index"]


def test_a_real_client_pointed_at_a_dead_port_builds_locally(recorder: Recorder) -> None:
    from plancache import Client
    from plancache_server.store.embedded_redis import free_port

    with Client(f"127.0.0.1:{free_port()}", cache=False, timeout=5, compile_timeout=5) as dead:
        shim.configure(dead, target=TARGET)
        try:
            g, _ = matmul_graph()
            build(g)
        finally:
            SERVICE.reset()
    assert g.plancache.reason.startswith("Unavailable") and recorder.names().count("build_plans") == 1


# ---- a hedged miss -------------------------------------------------------------------------


class Workspace:
    """A program's workspace tensor: its size is all plancache.cudnn reads."""

    def __init__(self, size: int) -> None:
        self.size = size

    def numel(self) -> int:
        return self.size

    def element_size(self) -> int:
        return 1


def test_a_hedged_miss_runs_the_programs_own_build_then_the_services_plan(
    recorder: Recorder, client: StandInClient
) -> None:
    client.hedge = True
    g, (a, b, c) = matmul_graph()
    build(g)
    # The program's own build is the race's local side: its deferred plan calls, then its build, as it made them.
    assert recorder.names()[-3:] == ["create_execution_plans", "check_support", "build_plans"]
    assert g.plancache.source == "local" and g.plancache.reason == built_records.HEDGED and g.plancache.local_built
    assert shim.stats().local == 1 and shim.stats().reasons == {built_records.HEDGED: 1}
    (asked,) = client.asked
    assert g.plancache.key == key_of(*asked)  # the plan the service builds for the graph's next run
    g.execute({a: 1, b: 2, c: 3}, Workspace(4096))
    assert recorder.names()[-1] == "execute" and recorder.loaded == []  # the program's own plan ran
    assert client.pending is not None
    client.pending.answer()
    g.execute({a: 1, b: 2, c: 3}, Workspace(16))  # the service's plan needs 256 bytes: not with this workspace
    assert recorder.names().count("execute") == 2 and recorder.loaded == []
    g.execute({a: 1, b: 2, c: 3}, Workspace(4096))  # a safe point: it takes over
    (served,) = recorder.loaded
    assert (
        served.executed == [({1: 1, 2: 2, 3: 3}, served.executed[0][1], None)]
        and recorder.names().count("execute") == 2
    )
    assert g.plancache.source == "compiled" and g.plancache.hedged and client.pending.adoptions == 1
    assert shim.graphs() == [g.plancache]  # the same record: a takeover is not another build
    assert g.get_workspace_size() == served.workspace


def test_a_hedged_miss_the_service_answers_first_is_served(recorder: Recorder, client: StandInClient) -> None:
    client.hedge, client.race_outcome = True, "service"
    g, (a, b, c) = matmul_graph()
    build(g)
    assert "build_plans" in recorder.names()  # the program's build ran (what the hedge costs when the service wins)
    assert g.plancache.source == "compiled" and shim.stats().served == 1
    g.execute({a: 1, b: 2, c: 3}, "ws")
    assert recorder.loaded[0].executed and "execute" not in recorder.names()


def test_a_hedged_miss_whose_service_fails_keeps_the_programs_plan(recorder: Recorder, client: StandInClient) -> None:
    client.hedge = True
    g, (a, b, c) = matmul_graph()
    build(g)
    assert client.pending is not None
    client.pending._plan = None  # type: ignore[assignment]  # the service answered with no plan
    client.pending.answer()
    g.execute({a: 1, b: 2, c: 3}, Workspace(4096))
    g.execute({a: 1, b: 2, c: 3}, Workspace(4096))
    assert recorder.loaded == [] and recorder.names().count("execute") == 2 and g.plancache.source == "local"


class Proofs:
    """Counts plancache.cudnn's proofs (plancache.cudnn._capture.prove) and can make each find a difference, as a
    capture that misreads a graph would (a field a newer frontend adds)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        self.difference: str | None = None
        real = capturing.differences

        def differences(program: Any, rebuilt: Any) -> list[str]:
            self.made += 1
            return [self.difference] if self.difference else real(program, rebuilt)

        monkeypatch.setattr(capturing, "differences", differences)


@pytest.fixture
def proofs(monkeypatch: pytest.MonkeyPatch) -> Proofs:
    return Proofs(monkeypatch)


def test_a_hedged_miss_proves_its_graph_when_the_services_plan_takes_over_not_in_the_build(
    recorder: Recorder, client: StandInClient, proofs: Proofs
) -> None:
    client.hedge = True
    g, (a, b, c) = matmul_graph()
    build(g)
    assert proofs.made == 0 and g.plancache.reason == built_records.HEDGED  # the build step did not prove it
    assert client.pending is not None
    client.pending.answer()
    g.execute({a: 1, b: 2, c: 3}, Workspace(4096))
    g.execute({a: 1, b: 2, c: 3}, Workspace(4096))
    assert proofs.made == 1 and len(recorder.loaded) == 1 and g.plancache.source == "compiled"


def test_a_hedged_miss_whose_capture_differs_never_runs_the_services_plan(
    recorder: Recorder, client: StandInClient, proofs: Proofs, caplog: pytest.LogCaptureFixture
) -> None:
    client.hedge = True
    proofs.difference = "node 0: parameter 'padding' [1] (the program) against [0]"
    g, (a, b, c) = matmul_graph()
    build(g)
    assert g.plancache.source == "local" and recorder.names().count("build_plans") == 1
    assert client.pending is not None
    client.pending.answer()
    for _ in range(2):
        g.execute({a: 1, b: 2, c: 3}, Workspace(4096))
    assert recorder.loaded == [] and recorder.names().count("execute") == 2 and client.pending.adoptions == 0
    assert g.plancache.source == "local" and "differs from the program's graph" in (g.plancache.reason or "")
    assert shim.stats().local == 1 and list(shim.stats().reasons) == [g.plancache.reason]
    assert any("keeps its own build" in r.getMessage() for r in caplog.records)


def test_a_proof_that_fails_at_the_take_over_keeps_the_programs_plan_and_says_why(
    recorder: Recorder, client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.hedge = True
    g, (a, b, c) = matmul_graph()
    build(g)
    assert client.pending is not None
    client.pending.answer()

    def broken(program: Any, rebuilt: Any) -> list[str]:
        raise RuntimeError("the frontend refuses the rebuilt graph")

    monkeypatch.setattr(capturing, "differences", broken)
    g.execute({a: 1, b: 2, c: 3}, Workspace(4096))  # the program's execute, not an exception of plancache's
    assert recorder.loaded == [] and recorder.names()[-1] == "execute" and g.plancache.source == "local"
    assert "proving the graph failed: RuntimeError" in (g.plancache.reason or "")


def test_a_service_plan_first_for_a_graph_whose_capture_differs_is_refused_and_nothing_builds_twice(
    recorder: Recorder, client: StandInClient, proofs: Proofs
) -> None:
    client.hedge, client.race_outcome = True, "service"
    proofs.difference = "node 0: a field the capture dropped"
    g, (a, b, c) = matmul_graph()
    build(g)
    assert recorder.names().count("build_plans") == 1 and recorder.loaded == []
    assert g.plancache.source == "local" and g.plancache.local_built
    assert "differs from the program's graph" in (g.plancache.reason or "") and shim.stats().served == 0
    g.execute({a: 1, b: 2, c: 3}, "ws")
    assert recorder.names()[-1] == "execute" and recorder.loaded == []


def test_without_a_race_a_graph_whose_capture_differs_is_not_asked_for(
    recorder: Recorder, client: StandInClient, proofs: Proofs
) -> None:
    proofs.difference = "node 0: a field the capture dropped"
    g, _ = matmul_graph()
    build(g)
    assert client.asked == [] and proofs.made == 1 and g.plancache.source == "local"
    assert recorder.names().count("build_plans") == 1


# ---- what the process tells the service -------------------------------------------------------


def test_every_graph_is_counted_for_the_service_once_with_its_reason_class(
    recorder: Recorder, client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What plancache.cudnn counts for its reports (plancache.transport.outcomes) is
    what stats() says: the served graphs, and each local one under its reason class."""
    from plancache.transport import outcomes

    outcomes.reset_outcome_stats()
    for _ in range(2):
        build(matmul_graph()[0])  # served
    client.source = "cache"
    build(sdpa_graph()[0])  # the service's plan, from the disk cache
    client.source = "compiled"
    for error in (
        CompileFailed("cuDNN refuses it"),
        Unavailable("down"),
        UntrustedPlan("unknown key", signer="abc", unknown_key=True),
    ):
        client.error = error
        build(matmul_graph()[0])
    client.error = None
    g, _ = matmul_graph()
    g.validate()
    g.build_plan_at_index(0)  # the program drives its own candidates
    counted = {(k.path, k.target_id, k.outcome, k.reason, k.node_type): n for k, n in outcomes.outcome_stats().items()}
    stats = shim.stats()
    assert (stats.served, stats.local) == (3, 4)
    assert counted == {
        ("cudnn", TARGET.id, outcomes.Outcome.SERVED, "", "MATMUL"): 2,
        ("cudnn", TARGET.id, outcomes.Outcome.DISK_CACHE, "", "SDPA"): 1,
        ("cudnn", TARGET.id, outcomes.Outcome.LOCAL, "compile_failed", "MATMUL"): 1,
        ("cudnn", TARGET.id, outcomes.Outcome.LOCAL, "unavailable", "MATMUL"): 1,
        ("cudnn", TARGET.id, outcomes.Outcome.LOCAL, "untrusted_plan", "MATMUL"): 1,
        ("cudnn", TARGET.id, outcomes.Outcome.LOCAL, "program_drives", "MATMUL"): 1,
    }
    outcomes.reset_outcome_stats()

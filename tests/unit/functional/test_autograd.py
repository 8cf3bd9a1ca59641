"""plancache.functional with autograd, on this machine without torch: the
training forward's plan and every backward graph fetched at a geometry's
first call (each spec valid by plancache's own rules), what the forward
saves, what each backward graph is bound to, the gradients' dims, and what
runs torch instead (a refused backward graph, torch.compile, a first call
under CUDA graph capture). The autograd.Function itself is torch's: its
forward and backward bodies run here with a recording context; the
gradients' values are checked on the GPU (tests/gpu/test_gpu_training.py)."""

from __future__ import annotations

from typing import Any

import pytest

import plancache.functional as pf
from plancache import CompileFailed, InvalidRequest
from plancache.functional import _attention, _autograd, _batch_norm, _linear, _norms, _requests, _tensor_ops
from plancache.graphspec.validation import normalize
from plancache.keys.query import PlanQuery
from tests.support.fake_gpu import FakeRuntime
from tests.support.frontdoor_standins import StandInClient, StandInOps, StandInTensor
from tests.unit.functional.modes import set_modes
from tests.unit.functional.recording import RecordingFunction, backward

T = StandInTensor


@pytest.fixture(autouse=True)
def autograd(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """conftest.py's stand-in service and runtime, with grad mode on and torch's autograd.Function recorded."""
    set_modes(monkeypatch, grad_on=True)
    monkeypatch.setattr(_autograd, "_function", lambda: RecordingFunction)
    RecordingFunction.calls = []


def asked_names(client: StandInClient) -> list[str]:
    for spec, _, _ in client.asked:
        normalize(spec)  # every graph asked for is valid by plancache's rules (the worker normalizes again)
    return [spec.name for spec, _, _ in client.asked]


def graph_calls(runtime: FakeRuntime) -> dict[str, list[dict[int, Any]]]:
    """Each deserialized graph's calls, by the function its spec names."""
    out: dict[str, list[dict[int, Any]]] = {}
    for graph in runtime.graphs:
        out.setdefault(graph.blob.decode(errors="replace"), []).extend(pack for pack, _, _ in graph.calls)
    return out


def test_linear_gelu_fetches_its_backward_at_the_first_call_and_runs_it(
    client: StandInClient, runtime: FakeRuntime
) -> None:
    x, w, b = T((4, 16, 64), requires_grad=True), T((32, 64), requires_grad=True), T((32,), requires_grad=True)
    y = pf.linear(x, w, b, activation="gelu")
    assert asked_names(client) == ["plancache.functional.linear"] + ["plancache.functional.linear.backward"] * 4
    forward = client.asked[0][0]
    assert {t.uid for t in forward.tensors if t.is_output} == {
        _requests.OUTPUT_UID,
        _linear.PRE_ACTIVATION_UID,
    }  # the GELU's input is saved
    ctx, out = RecordingFunction.calls[-1]
    assert out is y and ctx.saved_tensors[:2] == (x, w) and ctx.saved_tensors[2].shape == (4, 16, 32)
    dx, dw, db = backward()
    assert (dx.shape, dw.shape, db.shape) == ((4, 16, 64), (32, 64), (32,))
    assert pf.stats()["linear.backward"].cudnn == 4 and pf.stats()["linear"].cudnn == 1
    assert len(runtime.graphs) == 5 and all(
        g.ordered_calls == len(g.calls) == 1 for g in runtime.graphs
    )  # the frontend's ordered execute
    # A second geometry call fetches nothing more.
    pf.linear(T((4, 16, 64), requires_grad=True), w, b, activation="gelu")
    assert len(client.asked) == 5


def test_what_does_not_need_a_gradient_is_not_computed(client: StandInClient, runtime: FakeRuntime) -> None:
    x, w = T((8, 64)), T((32, 64), requires_grad=True)  # the first layer: no dX
    pf.linear(x, w)
    dx, dw = backward()
    assert dx is None and dw.shape == (32, 64)
    assert pf.stats()["linear.backward"].cudnn == 1  # wgrad only


@pytest.mark.parametrize(
    "call, expected",
    [
        (
            lambda: pf.layer_norm(
                T((4, 16, 64), requires_grad=True), (64,), T((64,), requires_grad=True), T((64,), requires_grad=True)
            ),
            [(4, 16, 64), (64,), (64,)],
        ),
        (lambda: pf.rms_norm(T((4, 16, 64), requires_grad=True), 64), [(4, 16, 64)]),
        (
            lambda: pf.rms_norm(T((4, 16, 64), requires_grad=True), 64, T((64,), requires_grad=True)),
            [(4, 16, 64), (64,)],
        ),
        (
            lambda: pf.conv2d(
                T((2, 8, 16, 16), (2048, 1, 128, 8), requires_grad=True),
                T((16, 8, 3, 3), (72, 1, 24, 8), requires_grad=True),
                T((16,), requires_grad=True),
                padding=1,
                relu=True,
            ),
            [(2, 8, 16, 16), (16, 8, 3, 3), (16,)],
        ),
        (
            lambda: pf.scaled_dot_product_attention(
                T((2, 8, 128, 64), requires_grad=True),
                T((2, 2, 128, 64), requires_grad=True),
                T((2, 2, 128, 64), requires_grad=True),
                is_causal=True,
                enable_gqa=True,
            ),
            [(2, 8, 128, 64), (2, 2, 128, 64), (2, 2, 128, 64)],
        ),
        (
            lambda: pf.scaled_dot_product_attention(
                T((2, 8, 128, 64), requires_grad=True),
                T((2, 8, 128, 64)),
                T((2, 8, 128, 64)),
                T((1, 8, 128, 128), requires_grad=True),
                dropout_p=0.1,
            ),
            [(2, 8, 128, 64), None, None, (1, 8, 128, 128), None],
        ),
        (
            lambda: pf.batch_norm(
                T((4, 16, 8, 8), (1024, 1, 128, 16), requires_grad=True),
                T((16,), dtype="float32"),
                T((16,), dtype="float32"),
                T((16,), dtype="float32", requires_grad=True),
                T((16,), dtype="float32", requires_grad=True),
                training=True,
            ),
            [(4, 16, 8, 8), (16,), (16,), None, None, None, None],
        ),
    ],
    ids=[
        "layer_norm",
        "rms_norm-no-weight",
        "rms_norm",
        "conv2d-bias-relu-nhwc",
        "sdpa-causal-gqa",
        "sdpa-bias-grad-dropout",
        "batch_norm-training",
    ],
)
def test_every_function_gets_a_gradient_per_input_from_served_graphs(
    client: StandInClient, runtime: FakeRuntime, call: Any, expected: list[Any]
) -> None:
    call()
    names = asked_names(client)
    function = names[0].removeprefix("plancache.functional.")
    assert len(names) >= 2 and all(n == f"plancache.functional.{function}.backward" for n in names[1:]), names
    grads = backward()
    assert [None if g is None else g.shape for g in grads] == expected
    assert pf.stats()[f"{function}.backward"].cudnn >= 1 and not pf.stats()[function].torch


def test_batch_norm_training_writes_the_running_statistics_in_place(
    client: StandInClient, runtime: FakeRuntime
) -> None:
    mean, var = T((16,), dtype="float32"), T((16,), dtype="float32")
    pf.batch_norm(T((4, 16, 8, 8), (1024, 1, 128, 16), requires_grad=True), mean, var, training=True, momentum=0.2)
    (pack,) = next(g for g in runtime.graphs if g.calls).calls[0:1]
    bound = pack[0]
    assert (
        bound[4] is mean and bound[23] is mean and bound[5] is var and bound[24] is var
    )  # cuDNN's next running statistics over the caller's
    momentum = next(c for c in client.asked[0][0].tensors if c.uid == 11)
    assert momentum.is_pass_by_value and momentum.scalar_value == 0.2


def test_a_backward_graph_cudnn_refuses_leaves_the_whole_geometry_to_torch(
    client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward and backward run the same side: a gradient is never computed from a forward it did not see."""
    calls: list[Any] = []
    monkeypatch.setattr(_tensor_ops, "available", lambda: True)
    monkeypatch.setattr(_norms, "torch_layer_norm", lambda *args, **kwargs: calls.append(args) or "torch layer_norm")
    asked = client.compile

    def refuse_backward(query: PlanQuery, *args: Any, **kwargs: Any) -> Any:
        if query.spec.name.endswith(".backward"):
            client.asked.append((query.spec, query.target, None))
            raise CompileFailed("cuDNN does not support this graph on sm_90")
        return asked(query, *args, **kwargs)

    monkeypatch.setattr(client, "compile", refuse_backward)
    x = T((4, 64), requires_grad=True)
    assert pf.layer_norm(x, (64,)) == "torch layer_norm" == pf.layer_norm(x, (64,))
    assert len(calls) == 2 and not RecordingFunction.calls
    stats = pf.stats()["layer_norm"]
    assert stats.torch == 2 and stats.cudnn == 0 and "does not support" in next(iter(stats.reasons))


def test_matmul_and_paged_decode_have_no_served_backward(
    client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_tensor_ops, "available", lambda: True)
    monkeypatch.setattr(_linear, "torch_matmul", lambda *args, **kwargs: "torch matmul")
    assert pf.matmul(T((4, 8), requires_grad=True), T((8, 2))) == "torch matmul"
    assert not client.asked and "no served backward" in next(iter(pf.stats()["matmul"].reasons))


def test_the_first_call_of_a_geometry_under_cuda_graph_capture_is_refused(client: StandInClient) -> None:
    ops = _tensor_ops.ops()
    assert isinstance(ops, StandInOps)
    ops.capturing_graph = True
    with pytest.raises(InvalidRequest, match=r"while a CUDA graph is being captured: .* call it once before capturing"):
        pf.rms_norm(T((4, 64), requires_grad=True), 64)
    assert not client.asked
    ops.capturing_graph = False
    pf.rms_norm(T((4, 64), requires_grad=True), 64)
    ops.capturing_graph = True
    pf.rms_norm(T((4, 64), requires_grad=True), 64)  # warmed up: captured like any call
    assert pf.stats()["rms_norm"].cudnn == 2


def test_under_torch_compile_every_function_is_torchs(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> None:
    set_modes(monkeypatch, compiling=True)
    monkeypatch.setattr(_norms, "torch_rms_norm", lambda *args: "torch rms_norm")
    monkeypatch.setattr(_attention, "torch_scaled_dot_product_attention", lambda *args, **kwargs: "torch sdpa")
    monkeypatch.setattr(_batch_norm, "torch_batch_norm", lambda *args: "torch batch_norm")
    q = T((2, 8, 128, 64), requires_grad=True)
    assert pf.rms_norm(q, 64) == "torch rms_norm" and pf.scaled_dot_product_attention(q, q, q) == "torch sdpa"
    assert pf.batch_norm(T((4, 16, 8, 8)), None, None, training=True) == "torch batch_norm"
    assert not client.asked


def test_a_bias_gradient_cudnn_refuses_is_torchs_sum_and_the_rest_stays_served(
    client: StandInClient, runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU run 22: cuDNN refuses a reduction over a linear's rows; only that piece is torch's
    (a sum: what ran the forward does not change it)."""
    asked = client.compile
    sums: list[Any] = []

    def refuse_reductions(query: PlanQuery, *args: Any, **kwargs: Any) -> Any:
        if any(node.op == "reduction" for node in query.spec.nodes):
            client.asked.append((query.spec, query.target, None))
            raise CompileFailed("cuDNN does not support this graph on sm_90: !is_NHWC")
        return asked(query, *args, **kwargs)

    monkeypatch.setattr(client, "compile", refuse_reductions)
    monkeypatch.setattr(
        _autograd.TorchSum,
        "__call__",
        lambda self, tensors: sums.append((self.axes, self.dims)) or T((32,), dtype="float32"),
    )
    pf.linear(T((4, 16, 64), requires_grad=True), T((32, 64), requires_grad=True), T((32,), requires_grad=True))
    dx, dw, db = backward()
    assert dx.shape == (4, 16, 64) and dw.shape == (32, 64)
    assert (
        sums == [((0, 1), (1, 64, 32))] and db.shape == (32,) and str(db.dtype) == "torch.float16"
    )  # summed over the rows, cast back
    stats = pf.stats()
    assert stats["linear"].torch == 0 and stats["linear.backward"].cudnn == 2  # dgrad and wgrad served
    assert any(r.startswith("bgrad: CompileFailed") for r in stats["linear.backward"].reasons)


def test_a_frontend_without_the_ordered_execute_runs_the_mapping_form(
    client: StandInClient, runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.fake_gpu import FakeGraph

    monkeypatch.setattr(
        runtime,
        "deserialize",
        lambda handle, blob: runtime.graphs.append(FakeGraph(blob, handle, takes_ordered=False)) or runtime.graphs[-1],
    )
    x, w = T((8, 64), requires_grad=True), T((32, 64), requires_grad=True)
    y = pf.linear(x, w)
    pf.linear(x, w)
    (graph,) = runtime.graphs
    assert graph.ordered_calls == 0 and len(graph.calls) == 2 and graph.calls[0][0][_requests.OUTPUT_UID] is y
    assert graph.calls[1][0][1] is x and graph.calls[1][0][2] is w


def test_batch_norm_input_cudnn_is_not_asked_for_says_why(client: StandInClient) -> None:
    """Without torch to run it (this machine), a call cuDNN is not asked for names the argument;
    with torch, torch's own error or result."""
    x = T((4, 16, 8, 8), (1024, 1, 128, 16), requires_grad=True)
    with pytest.raises(
        InvalidRequest, match=r"running_mean must be a contiguous float32 \(16,\) tensor, got torch.float32 dims \(8,\)"
    ):
        pf.batch_norm(x, T((8,), dtype="float32"), T((16,), dtype="float32"), training=True)
    with pytest.raises(InvalidRequest, match=r"input dims \(4, 16, 64\): cuDNN's batchnorm takes 4-D"):
        pf.batch_norm(T((4, 16, 64)), T((16,), dtype="float32"), T((16,), dtype="float32"), training=True)
    assert not client.asked

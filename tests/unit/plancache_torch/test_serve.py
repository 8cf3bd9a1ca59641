"""`plancache.torch.serve(model)` on the CPU: a model's own layers routed through plancache module by module (its
results and gradients torch's, what was routed counted as the mode counts it), every other torch call untouched
(no mode on the stack), eager and under torch.compile (fullgraph: the operators traced), and the layers given
back by `unserve`. The CPU routes (tests/unit/plancache_torch/test_mode.py's `cpu_routes`) let the routes take
CPU tensors: the operators' CPU implementation is torch's own, so results compare exactly in float64. That the
routed calls run served plans is the GPU's (tests/gpu/test_gpu_torch.py)."""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="plancache.torch needs torch (make test installs its CPU build)")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import plancache.functional as pf  # noqa: E402
import plancache.torch as pt  # noqa: E402
from plancache.errors import InvalidRequest  # noqa: E402
from plancache.torch import _mode, _serve  # noqa: E402
from tests.unit.plancache_torch.test_mode import (  # noqa: E402
    Recorder,
    TracedRaces,
    assert_same,
    calls_the_mode_sees,
    compiled_step,
    model_and_inputs,
    step,
)

D = torch.float64


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_mode, "ROUTED_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(_mode, "SERVED_DTYPES", (torch.float16, torch.bfloat16, torch.float32, torch.float64))
    pt.clear_stats()
    pf.clear()
    yield
    pt.clear_stats()
    pf.clear()


def test_a_served_model_gives_torchs_loss_and_gradients_its_layers_routed() -> None:
    model, x, image = model_and_inputs()
    expected = step(model, x, image)
    assert pt.serve(model) is model
    got = step(model, x, image)
    assert_same(got, expected)
    stats = pt.stats()
    # Block's layers: a Conv2d, a LayerNorm, five Linears; its rms_norm and attention are calls of its own.
    assert (stats["linear"].routed, stats["layer_norm"].routed, stats["conv2d"].routed) == (5, 1, 1)
    assert "scaled_dot_product_attention" not in stats and "rms_norm" not in stats


def test_no_other_call_of_the_model_is_intercepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TorchFunctionMode on the stack: the model's other calls (its adds, views, its attention) are torch's own."""
    seen = calls_the_mode_sees(monkeypatch)
    model, x, image = model_and_inputs()
    pt.serve(model)
    step(model, x, image)
    assert seen == [] and not torch.overrides._get_current_function_mode_stack()


def test_a_layer_plancache_leaves_runs_torchs_forward_counted_by_reason() -> None:
    layer = nn.Linear(8, 4).to(D)
    x = torch.randn(8, dtype=D)  # a 1-D input: the route leaves it to torch
    expected = layer(x)
    pt.serve(layer)
    torch.testing.assert_close(layer(x), expected)
    assert pt.stats()["linear"].left == {"input of 1 dims, weight of 2": 1}


def test_serving_twice_is_once_and_unserve_gives_each_layer_its_own_forward_back() -> None:
    model, x, image = model_and_inputs()
    classes = {name: type(m) for name, m in model.named_modules()}
    pt.serve(model)
    served = {name: type(m) for name, m in model.named_modules() if _serve.served(m)}
    assert set(served) == {"stem", "norm", "q", "kv", "out", "up", "down"}
    # each its served class, a subclass of its own (isinstance holds), no instance forward
    assert all(_serve.SERVED_CLASSES[classes[name]] is kind for name, kind in served.items())
    assert all(isinstance(m, classes[name]) and "forward" not in m.__dict__ for name, m in model.named_modules())
    pt.serve(model)
    assert {name: type(m) for name, m in model.named_modules() if _serve.served(m)} == served
    assert pt.unserve(model) is model
    assert {name: type(m) for name, m in model.named_modules()} == classes
    assert not any(_serve.served(m) or "forward" in m.__dict__ for m in model.modules())
    step(model, x, image)
    assert not pt.stats()  # nothing routed once unserved


def test_only_the_exact_classes_are_served() -> None:
    """A subclass may have changed what forward does; a layer with an instance forward of its own keeps it; a
    Conv2d padding other than with zeros is not what F.conv2d computes."""

    class Scaled(nn.Linear):
        def forward(self, input: Any) -> Any:
            return super().forward(input) * 2

    hooked = nn.Linear(4, 4)
    own = hooked.forward
    hooked.forward = lambda x: own(x) + 1  # type: ignore[method-assign]
    model = nn.Sequential(Scaled(4, 4), hooked, nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect"), nn.Linear(4, 4))
    pt.serve(model)
    assert [_serve.served(m) for m in model] == [False, False, False, True]


def test_a_served_model_copies_saves_and_loads() -> None:
    model, x, image = model_and_inputs()
    pt.serve(model)
    kinds = [type(m) for m in model.modules()]
    twin = copy.deepcopy(model)
    assert [type(m) for m in twin.modules()] == kinds  # the copy's layers served as the model's
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert [type(m) for m in loaded.modules()] == kinds and sum(map(_serve.served, loaded.modules())) == 7
    assert set(model.state_dict()) == set(nn.Module.state_dict(model))  # nothing added to the state
    assert_same(step(twin, x, image), step(model, x, image))


def test_a_served_model_compiles_with_fullgraph_to_plancaches_operators() -> None:
    model, x, image = model_and_inputs()
    expected = step(model, x, image)
    pt.serve(model)
    got, recorder = compiled_step(torch.compile, model, x, image)
    assert_same(got, expected)
    assert recorder.graphs == 1
    ours = {t for t in recorder.targets if t.startswith("plancache.")}
    assert {
        "plancache.linear_train.default",
        "plancache.layer_norm_train.default",
        "plancache.conv2d_train.default",
    } <= ours
    assert not any("sdpa" in t or "rms_norm" in t for t in ours)  # the model's own calls: torch's


def test_transformers_conv1d_is_served_as_its_addmm() -> None:
    """transformers' Conv1D (GPT-2): x @ weight + bias over the last dim, torch.addmm on a 2-D view."""

    class Conv1D(nn.Module):  # transformers.pytorch_utils.Conv1D, as it is written there
        def __init__(self, nf: int, nx: int) -> None:
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.randn(nx, nf, dtype=D))
            self.bias = nn.Parameter(torch.randn(nf, dtype=D))

        def forward(self, x: Any) -> Any:
            size_out = x.size()[:-1] + (self.nf,)  # noqa: RUF005 (as transformers writes it)
            x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
            return x.view(size_out)

    Conv1D.__module__ = "transformers.pytorch_utils"
    layer = Conv1D(6, 8)
    x = torch.randn(2, 5, 8, dtype=D)
    expected = layer(x)
    pt.serve(layer)
    assert _serve.served(layer)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)  # linear's addmm is the layer's: the same bits
    assert pt.stats()["linear"].routed == 1
    other = Conv1D(6, 8)
    Conv1D.__module__ = "somewhere.else"
    assert not _serve.served(pt.serve(type(other)(6, 8)))  # a Conv1D of another library: its own


def test_rms_norm_layers_are_served() -> None:
    if not hasattr(nn, "RMSNorm"):
        pytest.skip("this torch has no nn.RMSNorm")
    layer = nn.RMSNorm(8, eps=1e-6).to(D)
    x = torch.randn(3, 8, dtype=D)
    expected = layer(x)
    pt.serve(layer)
    torch.testing.assert_close(layer(x), expected)
    assert pt.stats()["rms_norm"].routed == 1
    torch.testing.assert_close(F.rms_norm(x, [8], layer.weight, 1e-6), expected)


@pytest.mark.parametrize("function", [pt.serve, pt.unserve])
@pytest.mark.parametrize("model", [None, lambda x: x, torch.randn(2)])
def test_what_is_not_a_module_is_refused_naming_it(function: Any, model: Any) -> None:
    with pytest.raises(InvalidRequest, match=r"plancache\.torch\.(un)?serve: model must be a torch\.nn\.Module, got"):
        function(model)


# ---- a decided geometry: the table's entry at once ---------------------------------------------------


def _key(layer: nn.Module, x: Any) -> Any:
    """plancache.functional's table key of `layer(x)`'s call (its route's function, the layer's arguments)."""
    from plancache.functional import _norms
    from plancache.functional._geometry import hashable, weighted_key

    params = [p for p in layer.parameters()]
    grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))
    if isinstance(layer, nn.Linear):
        return weighted_key("linear", x, layer.weight, layer.bias, None, grad)
    if isinstance(layer, nn.Conv2d):
        options = (layer.stride, layer.padding, layer.dilation, layer.groups, False)
        return weighted_key("conv2d", x, layer.weight, layer.bias, options, grad)
    if isinstance(layer, nn.LayerNorm):
        shape = hashable(layer.normalized_shape)
        return _norms._norm_key("layer_norm", x, shape, layer.eps, grad, layer.weight, layer.bias)
    return _norms._norm_key("rms_norm", x, hashable(layer.normalized_shape), layer.eps, grad, layer.weight, None)


ROUTES = {
    nn.Linear: "linear",
    nn.Conv2d: "conv2d",
    nn.LayerNorm: "layer_norm",
    getattr(nn, "RMSNorm", None): "rms_norm",
}


def _decided(monkeypatch: pytest.MonkeyPatch, layer: nn.Module, x: Any, entry: Any) -> list[Any]:
    """`entry` in plancache.functional's table as `layer(x)`'s geometry (CPU tensors standing in for CUDA ones:
    the eager CUDA path's decision); what reaches the route past the decided geometries is recorded and left to
    torch (plancache.functional runs CUDA tensors only)."""
    from plancache.functional._table import TABLE

    monkeypatch.setattr(_mode, "_eager", lambda x: not torch.compiler.is_compiling())
    TABLE.put(_key(layer, x), entry)
    undecided: list[Any] = []

    def recorded(args: Any, kwargs: Any) -> Any:
        undecided.append(args)
        return _mode.Left("undecided")

    monkeypatch.setattr(_mode, f"undecided_{ROUTES[type(layer)]}", recorded)
    return undecided


LAYERS = {
    "Linear": (lambda: nn.Linear(8, 4), [6, 8], [2, 3, 8]),
    "Conv2d": (lambda: nn.Conv2d(3, 4, 3, padding=1, stride=(2, 1)), [2, 3, 5, 6], [1, 3, 5, 6]),
    "LayerNorm": (lambda: nn.LayerNorm(8), [6, 8], [2, 3, 8]),
    "RMSNorm": (lambda: nn.RMSNorm(8), [6, 8], [2, 3, 8]),
}


@pytest.mark.parametrize("kind", list(LAYERS))
def test_a_geometry_torch_won_runs_torchs_function_at_once_counted_as_before(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served layer's call whose geometry's race torch won: torch's function on the call's tensors (the layer's
    result and gradients, bit for bit), counted routed (stats) and run by torch (plancache.functional's
    counts), without the route's checks or plancache.functional's wrapper: the host time a decided call saves."""
    from plancache.functional._table import TorchFaster, counts

    if not hasattr(nn, kind):
        pytest.skip(f"this torch has no nn.{kind}")
    make, decided_shape, other_shape = LAYERS[kind]
    layer = make().to(D)
    function = ROUTES[type(layer)]
    reference = copy.deepcopy(layer)
    x = torch.randn(decided_shape, dtype=D, requires_grad=True)
    entry_ran: list[Any] = []
    undecided = _decided(monkeypatch, layer, x, TorchFaster(function, "k", entry_ran.append, "verdict"))
    pt.serve(layer)
    got, expected = layer(x), reference(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    got.sum().backward(), expected.sum().backward()
    torch.testing.assert_close(layer.weight.grad, reference.weight.grad, rtol=0, atol=0)
    assert undecided == [] and entry_ran == []  # torch's function called directly, the same one
    assert pt.stats()[function].routed == 1 and counts(function).torch == 1
    layer(torch.randn(other_shape, dtype=D))  # another geometry: undecided, the route's
    assert len(undecided) == 1 and pt.stats()[function].left == {"undecided": 1}


def test_under_the_mode_a_decided_linear_skips_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mode's F.linear(x, w, b) of a decided geometry: the same at once (its keyword calls take the route)."""
    from plancache.functional._table import TorchFaster

    layer = nn.Linear(8, 4).to(D).requires_grad_(False)
    x = torch.randn(5, 8, dtype=D)
    undecided = _decided(monkeypatch, layer, x, TorchFaster("linear", "k", print, "verdict"))
    with torch.no_grad(), pt.mode():
        got = F.linear(x, layer.weight, layer.bias)
        assert undecided == []
        F.linear(x, layer.weight, bias=layer.bias)
        assert len(undecided) == 1
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
    assert pt.stats()["linear"].routed == 1


def test_a_geometry_whose_plan_won_runs_the_entry_with_the_calls_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's plan entry gets the call's tensors, and its result is the layer's; with row buckets set (a
    padded geometry's key is another) the route decides as before; under torch.compile, the traced call."""
    from plancache.frontdoors.buckets import BUCKETS

    class PlanStandIn:  # a Served entry's call: its tensors in, the function's result out
        used = 0

        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []

        def __call__(self, tensors: tuple[Any, ...]) -> Any:
            self.calls.append(tensors)
            return F.linear(*tensors) + 1  # told apart from torch's

    layer = nn.Linear(8, 4).to(D).requires_grad_(False)  # an inference geometry
    x = torch.randn(5, 8, dtype=D)
    plan = PlanStandIn()
    undecided = _decided(monkeypatch, layer, x, plan)
    pt.serve(layer)
    with torch.no_grad():
        expected = F.linear(x, layer.weight, layer.bias) + 1
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)
        (tensors,) = plan.calls
        assert tensors[0] is x and tensors[1] is layer.weight and tensors[2] is layer.bias and undecided == []
        monkeypatch.setattr(BUCKETS, "functions", frozenset({"linear"}))
        layer(x)
        monkeypatch.setattr(BUCKETS, "functions", frozenset())
        assert len(undecided) == 1
        torch._dynamo.reset()
        traced = torch.compile(layer, backend="eager", fullgraph=True)(x)
        # the traced call is decided at trace time (_mode.traced_linear), not by the table's entry: the operator's
        torch.testing.assert_close(traced, expected - 1)
        assert len(undecided) == 1 and len(plan.calls) == 1
    torch._dynamo.reset()


def test_a_geometry_plancache_could_not_serve_runs_torchs_function_and_asks_again_when_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A geometry the table leaves to torch for a reason that may pass (the service unreachable): torch's function
    at once, as plancache.functional's hit runs it, until the entry is due to ask again; then the route's."""
    from plancache.functional._table import Fallback, counts

    layer = nn.Linear(8, 4).to(D).requires_grad_(False)
    x = torch.randn(5, 8, dtype=D)
    entry = Fallback("linear", _key(layer, x), F.linear, "the service is unreachable", transient=True)
    undecided = _decided(monkeypatch, layer, x, entry)
    pt.serve(layer)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
        assert undecided == [] and counts("linear").torch == 1
        entry.expires = 0.0  # RETRY_AFTER_S passed: this call runs torch's and leaves the table
        layer(x)
        layer(x)
    assert len(undecided) == 1 and counts("linear").torch == 2


def test_decided_calls_from_several_threads_are_each_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads calling one served layer of a decided geometry at once: every call torch's result, every call
    counted, routed and on the table's entry (no count lost to a race between threads)."""
    import threading

    from plancache.functional._table import TorchFaster, counts

    layer = nn.Linear(8, 4).to(D).requires_grad_(False)
    x = torch.randn(5, 8, dtype=D)
    undecided = _decided(monkeypatch, layer, x, TorchFaster("linear", "k", print, "verdict"))
    pt.serve(layer)
    expected = F.linear(x, layer.weight, layer.bias)
    calls, threads = 400, 4
    monkeypatch.setattr(_serve, "RETURN_AFTER", calls * threads + 1)  # every call the served forward's
    wrong: list[int] = []

    def work() -> None:
        with torch.no_grad():
            for i in range(calls):
                if not torch.equal(layer(x), expected):
                    wrong.append(i)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert wrong == [] and undecided == []
    assert pt.stats()["linear"].routed == calls * threads and counts("linear").torch == calls * threads
    # RETURN_AFTER as shipped: the threads' calls send the layer back once (their counts of calls in a row may
    # overlap: it goes back a few calls later), every result torch's
    monkeypatch.setattr(_serve, "RETURN_AFTER", 16)
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert wrong == [] and not _serve.served(layer) and pt.stats()["linear"].returned == 1


def test_a_layer_torch_runs_for_good_goes_back_to_its_own_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """RETURN_AFTER calls in a row that torch's function ran for good (the geometry's race torch's): the layer's own
    forward again, said in stats() (`returned`), its later calls torch's and uncounted; serve() serves it again."""
    from plancache.functional._table import TorchFaster, counts

    layer = nn.Linear(8, 4).to(D).requires_grad_(False)
    x = torch.randn(5, 8, dtype=D)
    undecided = _decided(monkeypatch, layer, x, TorchFaster("linear", "k", print, "verdict"))
    pt.serve(layer)
    expected = F.linear(x, layer.weight, layer.bias)
    with torch.no_grad():
        for _ in range(_serve.RETURN_AFTER - 1):
            layer(x)
        assert _serve.served(layer) and pt.stats()["linear"].returned == 0
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)  # the last in a row
        assert not _serve.served(layer) and type(layer) is nn.Linear and "forward" not in layer.__dict__
        assert pt.stats()["linear"].returned == 1 and pt.stats()["linear"].routed == _serve.RETURN_AFTER
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)  # nn.Linear's own forward
    assert pt.stats()["linear"].routed == _serve.RETURN_AFTER and counts("linear").torch == _serve.RETURN_AFTER
    assert undecided == [] and _serve._TORCH_RUNS not in layer.__dict__
    pt.serve(layer)
    assert _serve.served(layer)


def test_a_layer_a_plan_runs_some_calls_of_stays_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two geometries, torch's and a plan's, called in turn: no run of torch's calls is RETURN_AFTER long, the
    layer stays served however long it runs; a geometry left to torch for a reason that may pass (the service
    unreachable) never sends the layer back."""
    from plancache.functional._table import TABLE, Fallback, TorchFaster

    class PlanStandIn:
        used = 0

        def __call__(self, tensors: tuple[Any, ...]) -> Any:
            return F.linear(*tensors)

    layer = nn.Linear(8, 4).to(D).requires_grad_(False)
    x, y = torch.randn(5, 8, dtype=D), torch.randn(3, 8, dtype=D)
    _decided(monkeypatch, layer, x, TorchFaster("linear", "k", print, "verdict"))
    TABLE.put(_key(layer, y), PlanStandIn())
    pt.serve(layer)
    with torch.no_grad():
        for _ in range(3 * _serve.RETURN_AFTER):
            for _ in range(_serve.RETURN_AFTER - 1):
                layer(x)
            layer(y)
        assert _serve.served(layer)
        TABLE.put(_key(layer, x), Fallback("linear", _key(layer, x), F.linear, "unreachable", transient=True))
        for _ in range(3 * _serve.RETURN_AFTER):
            layer(x)
    assert _serve.served(layer) and pt.stats()["linear"].returned == 0


def test_a_served_layers_race_charges_its_lookup_to_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Racing geometry's call through a served layer: while its race runs, plancache.functional._race.LOOKUP is
    the layer's own way to the entry (the key, the table's lookup: it finds this entry), which the race's plan arm
    pays on each run with autograd, and the layer's two arms without: its served call (the plan) and its class's
    forward, each on the call's input, their calls not counted as the program's; unset after the call."""
    from plancache.functional import _race, _tensor_ops
    from plancache.functional._table import Racing

    monkeypatch.setattr(_tensor_ops.ops(), "capturing", lambda: False)  # (this CPU torch cannot say)
    seen: list[Any] = []

    arm_results: list[Any] = []

    def settle(inner: Any, tensors: tuple[Any, ...], result: Any) -> Any:
        lookup = _race.LOOKUP.call
        seen.append(lookup() if lookup is not None else None)
        assert _race.LOOKUP.arms is not None
        served_call, own_forward = _race.LOOKUP.arms
        for _ in range(3):  # as the race runs them: the layer's served call (the plan here), its own forward
            arm_results.append((served_call(), own_forward()))
        return inner

    class PlanStandIn:
        used = 0

        def __call__(self, tensors: tuple[Any, ...]) -> Any:
            seen.append(_race.LOOKUP.call)
            return F.linear(*tensors)

    layer = nn.Linear(8, 4).to(D).requires_grad_(False)
    x = torch.randn(5, 8, dtype=D)
    plan = PlanStandIn()
    racing = Racing(plan, _key(layer, x), settle)
    _decided(monkeypatch, layer, x, racing)
    pt.serve(layer)
    with torch.no_grad():
        layer(x)  # before the race is due: the plan's run, nothing set up for a race
        assert seen == [None]
        racing.due = 0.0  # the race is due at this call
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
    _, inner_saw, lookup_found, *arm_runs = seen
    assert lookup_found is racing and inner_saw is not None  # the plan's run happens under the same LOOKUP
    assert _race.LOOKUP.call is None and _race.LOOKUP.arms is None
    assert len(arm_runs) == 3  # the served arm ran the plan (the Racing entry's inner), not another race
    expected = F.linear(x, layer.weight, layer.bias)
    for served_result, own_result in arm_results:
        torch.testing.assert_close(served_result, expected, rtol=0, atol=0)
        torch.testing.assert_close(own_result, expected, rtol=0, atol=0)
    assert pt.stats()["linear"].routed == 2  # the race's calls of the layer are not the program's


# ---- a served layer traced: the route's decision, made at trace time --------------------------------


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D, as it is written there (GPT-2's linear)."""

    __module__ = "transformers.pytorch_utils"

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf))
        self.bias = nn.Parameter(torch.randn(nf))

    def forward(self, x: Any) -> Any:
        size_out = x.size()[:-1] + (self.nf,)  # noqa: RUF005 (as transformers writes it)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Layers(nn.Module):
    """Each served layer kind, a Conv2d whose padding plancache has no form for ("same") among them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.same = nn.Conv2d(4, 4, 3, padding="same", bias=False)
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 32)
        self.gpt = Conv1D(16, 32)
        self.rms = nn.RMSNorm(16, eps=1e-6) if hasattr(nn, "RMSNorm") else nn.Identity()
        self.down = nn.Linear(16, 8, bias=False)

    def forward(self, image: Any) -> Any:
        y = self.norm(self.same(self.conv(image)).flatten(2))
        return self.down(self.rms(self.gpt(F.silu(self.up(y)))))


def _traced_run(model: nn.Module, compile_fn: Any, image: Any, training: bool) -> tuple[Any, list[Any], Recorder]:
    """`model`'s output and gradients (a training step's) compiled afresh with fullgraph, and the graphs traced."""
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = compile_fn(model, backend=recorder, fullgraph=True)
    model.zero_grad()
    if not training:
        with torch.no_grad():
            return compiled(image), [], recorder
    out = compiled(image)
    out.pow(2).mean().backward()
    return out.detach(), [p.grad for p in model.parameters()], recorder


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("case", ["torch's linear faster", "plans faster", "float64 not served"])
def test_a_served_model_traced_makes_the_calls_the_modes_routes_make(
    monkeypatch: pytest.MonkeyPatch, case: str, training: bool
) -> None:
    """Compiled with fullgraph, a served model's layers trace what the mode's routes trace for the same model:
    the same functions raced with the same geometry, the same calls left to torch for the same reasons (in
    stats().left_compiled), the same plancache operators in the graph; its results and gradients torch's."""
    races = TracedRaces({"linear"} if case == "torch's linear faster" else set())
    monkeypatch.setattr(_mode, "RACED_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(_mode, "_race_traced_call", races)
    if case == "float64 not served":
        monkeypatch.setattr(_mode, "SERVED_DTYPES", (torch.float16, torch.bfloat16, torch.float32))
    torch.manual_seed(0)
    model = Layers().to(D)
    image = torch.randn(2, 3, 4, 4, dtype=D)
    with torch.no_grad():
        expected = model(image)
    arms = {}
    for arm, compile_fn, net in (
        ("mode", pt.compile, model),
        ("served", torch.compile, pt.serve(copy.deepcopy(model))),
    ):
        pf.clear()  # a new table: each arm races its geometries afresh
        _mode.LEFT_COMPILED.clear()
        races.asked.clear()
        out, grads, recorder = _traced_run(net, compile_fn, image, training)
        torch.testing.assert_close(out, expected)
        ours = {t for t in recorder.targets if t.startswith("plancache.")}
        arms[arm] = (set(races.asked), set(_mode.LEFT_COMPILED), ours, grads, dict(pt.stats()))
    (mode_asked, mode_left, mode_ops, mode_grads, _), (asked, left, ops, grads, stats) = arms["mode"], arms["served"]
    assert asked == mode_asked and left == mode_left and ops == mode_ops
    for got, want in zip(grads, mode_grads, strict=True):
        torch.testing.assert_close(got, want)
    assert all(a[3] == training for a in asked)
    same = "stride=(1, 1), padding='same', dilation=(1, 1)"
    linear = f"plancache.linear{'_train' if training else ''}.default"
    if case == "float64 not served":
        assert not asked and not ops  # every call left to torch, before any race
        assert stats["linear"].left_compiled == ("input is torch.float64 (plancache serves float16 and bfloat16)",)
        return
    assert stats["conv2d"].left_compiled == (same,)
    assert {a[0] for a in asked} == {"conv2d", "layer_norm", "linear"} | (
        {"rms_norm"} if hasattr(nn, "RMSNorm") else set()
    )
    # the linears' three geometries (up, Conv1D's transposed weight, down), the Conv1D's traced as the mode's addmm
    assert len([a for a in asked if a[0] == "linear"]) == 3
    if case == "torch's linear faster":
        assert linear not in ops and not any(op.startswith("plancache.linear") for op in ops)
        assert stats["linear"].left_compiled == ("torch's function is faster here: linear",)
    else:
        assert linear in ops and not (stats["linear"].left_compiled if "linear" in stats else ())
    assert f"plancache.layer_norm{'_train' if training else ''}.default" in ops


class GraphKeeper:
    """A torch.compile backend that keeps each graph's nodes in order, its inputs among them (dynamo's graph and
    AOT autograd's forward and backward: what inductor is given, and keys its cache by), then runs it as AOT
    autograd would."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def _keep(self, gm: Any) -> None:
        self.calls.append([f"{n.op}:{n.target}" for n in gm.graph.nodes])

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        from torch._dynamo.backends.common import aot_autograd

        self._keep(gm)

        def keep(g: Any, inputs: Any) -> Any:
            self._keep(g)
            return g

        return aot_autograd(fw_compiler=keep, bw_compiler=keep)(gm, example_inputs)


@pytest.mark.parametrize("training", [False, True])
def test_where_torch_runs_every_call_the_compiled_graph_is_the_unserved_models(
    monkeypatch: pytest.MonkeyPatch, training: bool
) -> None:
    """Every traced call's race torch's (the GPU runs' verdict for GPT-2 and ResNet-50 compiled): the served model's
    graphs are the unserved model's, call for call (transformers' Conv1D its own addmm, not a linear of its weight
    transposed): inductor compiles, and caches, what it would without plancache."""
    monkeypatch.setattr(_mode, "RACED_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(_mode, "_race_traced_call", TracedRaces({"linear", "layer_norm", "rms_norm", "conv2d"}))
    torch.manual_seed(0)
    model = Layers().to(D)
    image = torch.randn(2, 3, 4, 4, dtype=D)
    graphs = {}
    for arm, net in (("torch", model), ("served", pt.serve(copy.deepcopy(model)))):
        pf.clear()
        torch._dynamo.reset()
        keeper = GraphKeeper()
        compiled = torch.compile(net, backend=keeper, fullgraph=True)
        if training:
            compiled(image).pow(2).mean().backward()
        else:
            with torch.no_grad():
                compiled(image)
        graphs[arm] = keeper.calls
    assert any("addmm" in call for graph in graphs["torch"] for call in graph)
    assert graphs["served"] == graphs["torch"]


def test_a_served_layer_that_torch_says_is_compiling_outside_dynamos_trace_takes_its_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.compiler.is_compiling() is true with no dynamo trace to keep the call's tensors (torch.export's
    non-strict tracing): the layer's call is the route's, its reasons recorded as a traced call's."""
    monkeypatch.setattr(_mode, "SERVED_DTYPES", (torch.float16, torch.bfloat16))
    _mode.LEFT_COMPILED.clear()
    layers = [nn.Linear(8, 4), nn.LayerNorm(8), nn.Conv2d(3, 4, 3)]
    inputs = [torch.randn(5, 8, dtype=D), torch.randn(5, 8, dtype=D), torch.randn(1, 3, 5, 5, dtype=D)]
    expected = [layer.to(D)(x) for layer, x in zip(layers, inputs, strict=True)]
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    got = [pt.serve(layer)(x) for layer, x in zip(layers, inputs, strict=True)]
    monkeypatch.undo()
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
    assert {function for function, _ in _mode.LEFT_COMPILED} == {"linear", "layer_norm", "conv2d"}
    _mode.LEFT_COMPILED.clear()

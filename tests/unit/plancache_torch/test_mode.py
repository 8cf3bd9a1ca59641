"""`with plancache.torch.mode():` on the CPU: an unchanged model's calls routed
to plancache's operators, eager and under torch.compile (fullgraph: no graph
break), its results and gradients torch's, what is left to torch counted by
reason, and the mode's scope (a thread, while entered; entered twice refused).

The mode routes CUDA tensors of float16 and bfloat16. Here the `cpu_routes`
fixture lets it route CPU tensors of any float type: the operators' CPU
implementation is torch's own forward and backward, so results compare
exactly in float64. That the routed calls run served plans is
tests/gpu/test_gpu_torch.py's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="plancache.torch needs torch (make test installs its CPU build)")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import plancache.functional as pf  # noqa: E402
import plancache.torch as pt  # noqa: E402
from plancache.errors import InvalidRequest  # noqa: E402
from plancache.torch import _mode  # noqa: E402

D = torch.float64


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    pt.clear_stats()
    pf.clear()
    _mode.LEFT_COMPILED.clear()  # kept by clear_stats(): each test traces its own programs
    yield
    pt.clear_stats()
    pf.clear()
    _mode.LEFT_COMPILED.clear()


@pytest.fixture
def cpu_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_mode, "ROUTED_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(_mode, "SERVED_DTYPES", (torch.float16, torch.bfloat16, torch.float32, torch.float64))


class Block(nn.Module):
    """A pre-norm transformer block (GQA attention, RMS-normed MLP) and a conv stem: layers as models write them."""

    def __init__(self, hidden: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.LayerNorm(hidden)
        self.q = nn.Linear(hidden, hidden)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.Parameter(torch.ones(hidden))
        self.up = nn.Linear(hidden, 2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)

    def forward(self, x: Any, image: Any) -> Any:
        b, s, h = x.shape
        x = x + self.stem(image).flatten(1).view(b, s, h)
        y = self.norm(x)
        q = self.q(y).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(y).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        a = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        y = F.rms_norm(x, [h], self.mlp_norm, 1e-6)
        return x + self.down(F.silu(self.up(y)))


ROUTED = ("conv2d", "layer_norm", "linear", "scaled_dot_product_attention", "rms_norm")


def model_and_inputs(dtype: Any = D) -> tuple[Block, Any, Any]:
    torch.manual_seed(0)
    model = Block().to(dtype)
    x = torch.randn(2, 8, 32, dtype=dtype, requires_grad=True)
    image = torch.randn(2, 3, 8, 8, dtype=dtype)
    return model, x, image


def step(model: nn.Module, x: Any, image: Any, fn: Any = None) -> tuple[Any, list[Any]]:
    """Loss and gradients (input's, then each parameter's) of one training step."""
    model.zero_grad()
    x = x.detach().clone().requires_grad_()
    loss = (model if fn is None else fn)(x, image).pow(2).mean()
    loss.backward()
    return loss.detach(), [x.grad, *(p.grad for p in model.parameters())]


def calls_the_mode_sees(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every torch function any mode instance is handed from now on (the list fills as they come)."""
    seen: list[Any] = []
    original = _mode.PlanCacheMode.__torch_function__

    def counting(self: Any, func: Any, *rest: Any, **kwargs: Any) -> Any:
        seen.append(func)
        return original(self, func, *rest, **kwargs)

    monkeypatch.setattr(_mode.PlanCacheMode, "__torch_function__", counting)
    return seen


def compiled_step(compile_fn: Any, model: nn.Module, x: Any, image: Any) -> tuple[tuple[Any, list[Any]], Recorder]:
    """One training step of `model` compiled afresh by `compile_fn` (fullgraph), and the graphs it was given."""
    torch._dynamo.reset()
    recorder = Recorder()
    return step(model, x, image, compile_fn(model, backend=recorder, fullgraph=True)), recorder


def assert_same(a: tuple[Any, list[Any]], b: tuple[Any, list[Any]]) -> None:
    torch.testing.assert_close(a[0], b[0])
    assert len(a[1]) == len(b[1])
    for index, (g, r) in enumerate(zip(a[1], b[1], strict=True)):
        torch.testing.assert_close(g, r, msg=lambda m, i=index: f"gradient {i}: {m}")


def test_an_unchanged_model_under_the_mode_gives_torchs_loss_and_gradients(cpu_routes: None) -> None:
    model, x, image = model_and_inputs()
    expected = step(model, x, image)
    with pt.mode():
        got = step(model, x, image)
    assert_same(got, expected)
    stats = pt.stats()
    assert {name for name in ROUTED if stats[name].routed} == set(ROUTED), stats
    assert stats["linear"].routed == 5 and not stats["linear"].left


def test_calls_plancache_does_not_serve_run_torchs_function_counted_by_reason() -> None:
    """Without the CPU routes: CPU tensors and batch_norm are torch's, and said why."""
    x = torch.randn(2, 4, 8, 16)
    expected = F.layer_norm(x, [16])
    with pt.mode():
        torch.testing.assert_close(F.layer_norm(x, [16]), expected)
        F.scaled_dot_product_attention(x, x, x, attn_mask=torch.ones(8, 8, dtype=torch.bool))
        F.batch_norm(x, torch.zeros(4), torch.ones(4), training=True)
    stats = pt.stats()
    assert stats["layer_norm"].routed == 0 and stats["layer_norm"].left == {"input is on cpu": 1}
    assert stats["scaled_dot_product_attention"].left == {"query is on cpu": 1}
    assert stats["batch_norm"].left == {"input is on cpu": 1}


def test_a_call_left_to_torch_names_its_first_unserved_tensor_and_examines_no_further(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A float32 call (every norm and linear of an fp32 model): the reason is the first tensor's in torch's argument
    order, and the tensors after it are not examined (forming a reason per tensor was ~1.3 µs each, on every call)."""
    examined: list[str] = []
    unserved = _mode._unserved

    def recorded(name: str, t: object, optional: bool = False) -> _mode.Left | None:
        examined.append(name)
        return unserved(name, t, optional)

    monkeypatch.setattr(_mode, "_unserved", recorded)
    monkeypatch.setattr(_mode, "ROUTED_DEVICES", {"cuda", "cpu"})
    x, w = torch.randn(4, 16), torch.randn(16)
    expected = F.layer_norm(x, [16], w, w)
    with pt.mode():
        torch.testing.assert_close(F.layer_norm(x, [16], w, w), expected)
        F.layer_norm(x.to(torch.bfloat16), [16], w, w)  # the input served, its weight not: the weight's reason
    left = pt.stats()["layer_norm"].left
    assert left == {
        "input is torch.float32 (plancache serves float16 and bfloat16)": 1,
        "weight is torch.float32 (plancache serves float16 and bfloat16)": 1,
    }, left
    assert examined == ["input", "input", "weight"]


def test_batch_norm_is_routed_eager_with_torchs_running_statistics(
    cpu_routes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eager, F.batch_norm goes to plancache.functional.batch_norm with torch's arguments (a BatchNorm2d's
    running statistics, training flag, momentum and eps; that it serves them on CUDA and updates the
    statistics in place is tests/gpu/test_gpu_torch.py's): here a stand-in for it on the CPU runs torch's."""
    calls: list[tuple[Any, ...]] = []

    def functional_stand_in(*args: Any) -> Any:
        calls.append(args)
        return F.batch_norm(*args)

    monkeypatch.setattr(_mode, "_eager", lambda x: True)  # the CUDA path's decision, on CPU tensors
    monkeypatch.setattr(pf, "batch_norm", functional_stand_in)
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4).to(D)
    reference = nn.BatchNorm2d(4).to(D)
    reference.load_state_dict(bn.state_dict())
    x = torch.randn(2, 4, 5, 5, dtype=D, requires_grad=True)
    expected = reference(x)
    expected.pow(2).sum().backward()
    expected_grad, x.grad = x.grad, None
    with pt.mode():
        got = bn(x)
    got.pow(2).sum().backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x.grad, expected_grad)
    torch.testing.assert_close(bn.running_mean, reference.running_mean)
    torch.testing.assert_close(bn.running_var, reference.running_var)
    assert pt.stats()["batch_norm"].routed == 1 and not pt.stats()["batch_norm"].left
    ((_, mean, var, weight, bias, training, momentum, eps),) = calls
    assert mean is bn.running_mean and var is bn.running_var and weight is bn.weight and bias is bn.bias
    assert (training, momentum, eps) == (True, 0.1, 1e-5)
    bn.eval(), reference.eval()
    with torch.no_grad():
        evaluated = reference(x)
        with pt.mode():
            torch.testing.assert_close(bn(x), evaluated)
    assert pt.stats()["batch_norm"].routed == 2 and calls[1][5] is False


def test_batch_norm_under_compile_runs_plancaches_operators_and_updates_the_running_statistics(
    cpu_routes: None,
) -> None:
    """Compiled with fullgraph, a BatchNorm2d in training runs plancache::batch_norm_train (forward) and
    plancache::batch_norm_backward, and its running statistics end as torch's own (the operator returns them;
    the route copies them into the module's buffers, which the compiled program does); in evaluation, torch's
    own batch norm, traced (inductor fuses it), the reason recorded. Results, gradients and statistics equal torch's over three steps (float32: the
    statistics and parameters plancache serves are float32, as torch's mixed precision leaves them)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    reference = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    reference.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder, fullgraph=True)
    for _ in range(3):
        x = torch.randn(2, 3, 6, 6)
        with pt.mode():
            got = compiled(x)
        expected = reference(x)
        torch.testing.assert_close(got, expected)
        got.pow(2).sum().backward()
        expected.pow(2).sum().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad)
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)
    assert int(model[1].num_batches_tracked) == 3
    assert {"plancache.batch_norm_train.default", "plancache.batch_norm_backward.default"} <= recorder.targets
    model.eval(), reference.eval()
    with torch.no_grad(), pt.mode():
        torch.testing.assert_close(compiled(x), reference(x))
    assert "plancache.batch_norm.default" not in recorder.targets
    assert ("batch_norm", _mode.EVALUATION_BATCH_NORM_COMPILED) in _mode.LEFT_COMPILED


def test_batch_norm_left_to_torch_under_compile_says_why(cpu_routes: None) -> None:
    x = torch.randn(2, 4, 5, 5, dtype=D)
    no_stats = _mode._batch_norm((x, None, None), {"training": True})
    assert isinstance(no_stats, _mode.Left) and "without running statistics" in no_stats.reason
    cumulative = _mode._batch_norm((x, torch.zeros(4, dtype=D), torch.ones(4, dtype=D)), {"momentum": None})
    assert isinstance(cumulative, _mode.Left) and "momentum=None" in cumulative.reason
    w = torch.ones(4, dtype=torch.float32, requires_grad=True)
    stats = (torch.zeros(4), torch.ones(4))
    evaluation = _mode._batch_norm((x.float(), *stats, w), {})
    assert isinstance(evaluation, _mode.Left) and "autograd in evaluation mode" in evaluation.reason
    half_statistics = _mode._batch_norm((x.half(), stats[0].half(), stats[1].half()), {"training": True})
    assert isinstance(half_statistics, _mode.Left) and "not float32" in half_statistics.reason
    flat = _mode._batch_norm((x.float().flatten(2), *stats), {"training": True})
    assert isinstance(flat, _mode.Left) and "3-D input" in flat.reason


def test_options_plancache_has_no_form_for_are_left_to_torch(cpu_routes: None) -> None:
    q = torch.randn(1, 2, 4, 8)
    with pt.mode():
        dropped = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        both = F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool), is_causal=True)
        F.conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), padding="same")
        F.linear(torch.randn(8), torch.randn(4, 8))
    assert dropped.shape == q.shape
    torch.testing.assert_close(  # what torch makes of a boolean mask with is_causal=True, as without the mode
        both, F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool), is_causal=True)
    )
    stats = pt.stats()
    assert stats["scaled_dot_product_attention"].left == {
        "dropout (torch's mask; plancache's draws another)": 1,
        "a boolean attn_mask with is_causal=True": 1,
    }
    assert stats["conv2d"].left == {"stride=1, padding='same', dilation=1": 1}
    assert stats["linear"].left == {"input of 1 dims, weight of 2": 1}


def boolean_masks(b: int, s_q: int, s_kv: int) -> dict[str, Any]:
    """Boolean attn_masks as models pass them: causal with left padding (the padded queries see no key: a
    fully masked row), a key-padding mask broadcast over queries, one 2-D mask for every batch and head."""
    causal = torch.ones(s_q, s_kv, dtype=torch.bool).tril(s_kv - s_q)
    padded = causal.expand(b, 1, s_q, s_kv).clone()
    padded[0, :, :, :2] = False  # sequence 0 starts at its third position
    padding = torch.ones(b, 1, 1, s_kv, dtype=torch.bool)
    padding[1, ..., -3:] = False
    return {"causal, left padding": padded, "key padding": padding, "2-D": causal}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("kind", ["causal, left padding", "key padding", "2-D"])
def test_a_boolean_mask_is_routed_as_an_additive_bias_with_torchs_results(
    cpu_routes: None, kind: str, compiled: bool
) -> None:
    """transformers passes SDPA a boolean causal mask under torch.compile: routed as cuDNN's bias (-inf where a
    key is masked out), a query that sees no key 0 as torch gives it, values and gradients torch's (float64)."""
    mask = boolean_masks(2, 6, 6)[kind]
    q, k, v = (torch.randn(2, 4, 6, 8, dtype=D, requires_grad=True) for _ in range(3))

    def attend(q: Any, k: Any, v: Any) -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    expected = attend(q, k, v)
    weighting = torch.randn_like(expected)
    expected_grads = torch.autograd.grad((expected * weighting).sum(), (q, k, v))
    torch._dynamo.reset()
    recorder = Recorder()
    run = torch.compile(attend, backend=recorder, fullgraph=True) if compiled else attend
    with pt.mode():
        got = run(q, k, v)
    grads = torch.autograd.grad((got * weighting).sum(), (q, k, v))
    torch.testing.assert_close(got, expected)
    for ours, theirs in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(ours, theirs)
    if kind == "causal, left padding":
        assert not got[0, :, :2].any() and not expected[0, :, :2].any()  # torch's 0 for a query that sees no key
    if compiled:
        assert recorder.graphs == 1 and "plancache.sdpa_train.default" in recorder.targets
        assert (
            not pt.stats().get("scaled_dot_product_attention")
            or not pt.stats()["scaled_dot_product_attention"].left_compiled
        )
    else:
        assert pt.stats()["scaled_dot_product_attention"].routed == 1
        assert not pt.stats()["scaled_dot_product_attention"].left


def test_what_a_compiled_program_leaves_to_torch_is_said_with_the_reason(cpu_routes: None) -> None:
    """Compiled with fullgraph=True (no graph break for the record), the reasons are kept, recorded as the
    program is traced; its later runs recompile nothing (GPU run 33: recorded by every run, the record was
    guarded on and the second run recompiled the whole program: a compiled GPT-2's second step took 7.7 s)."""

    def fn(q: Any, x: Any, w: Any) -> Any:
        return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).sum() + F.linear(x, w).sum()

    q, x, w = torch.randn(1, 2, 4, 8, dtype=D), torch.randn(4, 8, dtype=D), torch.randn(3, 8, dtype=D)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = pt.compile(fn, backend=recorder, fullgraph=True)
    compiled(q, x, w)
    assert recorder.graphs == 1 and "plancache.linear.default" in recorder.targets
    dropout = ("dropout (torch's mask; plancache's draws another)",)
    assert pt.stats()["scaled_dot_product_attention"].left_compiled == dropout
    assert all(not s.left_compiled for name, s in pt.stats().items() if name != "scaled_dot_product_attention")
    for _ in range(3):
        compiled(q, x, w)
    assert recorder.graphs == 1  # recording them recompiles nothing
    pt.clear_stats()
    compiled(q, x, w)
    assert recorder.graphs == 1
    assert pt.stats()["scaled_dot_product_attention"].left_compiled == dropout  # kept: traced once


def test_the_record_of_what_a_compiled_program_leaves_is_marked_as_torchs_decorator_marks_it() -> None:
    """_mode marks its recording function as torch._dynamo.assume_constant_result would, without importing
    dynamo for eager programs: if torch changes how the decorator marks a function, this fails."""

    def plain() -> bool:
        return True

    marked = torch._dynamo.assume_constant_result(plain)
    added = set(vars(marked)) - set(vars(lambda: True))
    assert added and all(getattr(_mode._note_left_compiled, name, None) == vars(marked)[name] for name in added)


def test_transformers_addmm_form_of_linear_is_routed(cpu_routes: None) -> None:
    """transformers' Conv1D (GPT-2) is torch.addmm(bias, x, w): linear with the weight w.T."""
    x, w, b = torch.randn(6, 16, dtype=D), torch.randn(16, 8, dtype=D), torch.randn(8, dtype=D)
    with pt.mode():
        got = torch.addmm(b, x, w)
        scaled = torch.addmm(b, x, w, beta=0.5)
    torch.testing.assert_close(got, torch.addmm(b, x, w))
    torch.testing.assert_close(scaled, torch.addmm(b, x, w, beta=0.5))
    assert pt.stats()["linear"].routed == 1 and pt.stats()["linear"].left == {"beta or alpha other than 1": 1}


class Recorder:
    """A torch.compile backend that keeps the operators of every graph it is given (then runs it as AOT autograd would)."""

    def __init__(self) -> None:
        self.graphs = 0
        self.targets: set[str] = set()

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        from torch._dynamo.backends.common import aot_autograd

        self.graphs += 1

        def keep(g: Any, inputs: Any) -> Any:
            self.targets |= {str(n.target) for n in g.graph.nodes if n.op == "call_function"}
            return g

        return aot_autograd(fw_compiler=keep, bw_compiler=keep)(gm, example_inputs)


def test_compiled_with_fullgraph_the_model_runs_plancaches_operators_forward_and_backward(cpu_routes: None) -> None:
    model, x, image = model_and_inputs()
    expected = step(model, x, image)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder, fullgraph=True)  # a graph break raises
    with pt.mode():
        got = step(model, x, image, compiled)
    assert_same(got, expected)
    assert recorder.graphs == 1
    ours = {t for t in recorder.targets if t.startswith("plancache.")}
    assert ours == {
        f"plancache.{name}.default"
        for base in ("conv2d", "layer_norm", "linear", "sdpa", "rms_norm")
        for name in (f"{base}_train", f"{base}_backward")
    }, recorder.targets


def test_the_mode_entered_inside_a_compiled_function(cpu_routes: None) -> None:
    x, w = torch.randn(4, 16, dtype=D), torch.randn(16, dtype=D)

    def fn(x: Any, w: Any) -> Any:
        with pt.mode():
            return F.rms_norm(x, [16], w) * 2

    torch._dynamo.reset()
    recorder = Recorder()
    got = torch.compile(fn, backend=recorder, fullgraph=True)(x, w)
    torch.testing.assert_close(got, F.rms_norm(x, [16], w) * 2)
    assert "plancache.rms_norm.default" in recorder.targets


def test_plancache_torch_compile_traces_the_routes_and_runs_without_the_mode(
    cpu_routes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plancache.torch.compile: the model's graphs hold plancache's operators, forward and backward, with
    torch's loss and gradients; once compiled, its calls reach no TorchFunctionMode (entered around a compiled
    model, the mode sees every call the compiled program makes, and each is dispatched twice)."""
    model, x, image = model_and_inputs()
    expected = step(model, x, image)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = pt.compile(model, backend=recorder, fullgraph=True)
    assert_same(step(model, x, image, compiled), expected)
    assert recorder.graphs == 1
    assert {t for t in recorder.targets if t.startswith("plancache.")} >= {
        "plancache.linear_train.default",
        "plancache.linear_backward.default",
        "plancache.conv2d_train.default",
        "plancache.sdpa_train.default",
    }, recorder.targets
    seen = calls_the_mode_sees(monkeypatch)
    assert_same(step(model, x, image, compiled), expected)
    assert seen == []  # the compiled program ran with no mode to intercept its calls
    outer = torch.compile(model, backend=recorder, fullgraph=True)
    with pt.mode():
        step(model, x, image, outer)  # traced
        seen.clear()
        step(model, x, image, outer)
    assert seen  # entered around a compiled model, the mode sees the compiled program's calls as it runs


def test_dynamic_shapes_trace_once_and_give_torchs_results(cpu_routes: None) -> None:
    """Sizes marked dynamic: one graph serves them (each size's plan is its own geometry at run time)."""
    lin = nn.Linear(16, 8).to(D)

    def fn(x: Any) -> Any:
        return F.layer_norm(lin(x), [8])

    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(fn, backend=recorder, fullgraph=True, dynamic=True)
    with pt.mode(), torch.no_grad():
        for rows in (3, 5, 9):
            x = torch.randn(rows, 16, dtype=D)
            torch.testing.assert_close(compiled(x), fn(x))
    assert recorder.graphs == 1
    assert {"plancache.linear.default", "plancache.layer_norm.default"} <= recorder.targets


def test_inductor_compiles_the_operators(cpu_routes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile's default backend: the operators stay calls in inductor's program, the results torch's."""
    import torch._inductor.config

    # One compiling process: inductor's pool would take every core of the test machine from the other tests
    # (a Redis cluster's failover test timed out beside it on CI's 2 cores).
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)
    model, x, image = model_and_inputs(torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with pt.mode(), torch.no_grad():
        got = compiled(x, image)
    torch.testing.assert_close(got, model(x, image), rtol=1e-4, atol=1e-4)


def test_one_mode_entered_twice_is_refused_and_nesting_another_routes_once(cpu_routes: None) -> None:
    x = torch.randn(3, 8, dtype=D)
    expected = F.layer_norm(x, [8])
    mode = pt.mode()
    with mode:
        with pytest.raises(InvalidRequest, match="entered already"), mode:
            pass
        with pt.mode():
            torch.testing.assert_close(F.layer_norm(x, [8]), expected)
    assert pt.stats()["layer_norm"].routed == 1
    with mode:  # entered again once it left
        F.layer_norm(x, [8])
    assert pt.stats()["layer_norm"].routed == 2


def test_the_mode_lives_on_its_thread_while_entered(cpu_routes: None) -> None:
    x = torch.randn(3, 8, dtype=D)
    inside, outside = threading.Event(), threading.Event()
    other: list[int] = []

    def elsewhere() -> None:
        inside.wait(10)
        before = pt.stats().get("layer_norm")
        F.layer_norm(x, [8])  # another thread: not routed
        after = pt.stats().get("layer_norm")
        other.append((after.routed if after else 0) - (before.routed if before else 0))
        outside.set()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    with pt.mode():
        F.layer_norm(x, [8])
        inside.set()
        assert outside.wait(10)
    thread.join()
    assert other == [0]
    F.layer_norm(x, [8])  # after the mode: not routed
    assert pt.stats()["layer_norm"].routed == 1


def test_the_reasons_kept_per_function_are_bounded(cpu_routes: None) -> None:
    """A reason names argument values (a padding, a stride): a program varying them cannot grow the counters."""
    x, w = torch.randn(1, 2, 9, 9), torch.randn(2, 2, 3, 3)
    with pt.mode():
        for dilation in range(1, _mode.MAX_REASONS + 11):
            F.conv2d(x, w, padding="same", dilation=dilation)  # left to torch, the dilation in the reason
    left = pt.stats()["conv2d"].left
    assert len(left) == _mode.MAX_REASONS + 1 and left[_mode.OTHER_REASONS] == 10


def test_a_calls_arguments_are_bound_by_torchs_names_or_left_with_the_reason() -> None:
    """How F.layer_norm hands the mode its call (input and shape positional, the rest by keyword), and the forms
    that have no binding: each bound to torch's parameter order with its defaults, or left to torch saying why."""
    names = ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable")
    defaults = {"weight": None, "bias": None, "eps": 1e-5, "cudnn_enable": True}
    bind = _mode._bind
    assert bind(("x", (4,)), {"weight": "w", "bias": "b", "eps": 0.1}, names, defaults) == [
        "x",
        (4,),
        "w",
        "b",
        0.1,
        True,
    ]
    assert bind(("x", (4,), "w", "b", 0.1, False), {}, names, defaults) == ["x", (4,), "w", "b", 0.1, False]
    assert bind(("x",), {"normalized_shape": (4,), "eps": 0.2}, names, defaults) == ["x", (4,), None, None, 0.2, True]
    left = [
        bind(("x", (4,)), {"scale": 2}, names, defaults),  # not one of torch's parameters
        bind(("x", (4,), "w"), {"weight": "w2"}, names, defaults),  # given twice: torch's own error is torch's
        bind(("x",), {}, names, defaults),  # normalized_shape missing
        bind(tuple(range(7)), {}, names, defaults),
    ]
    assert [getattr(x, "reason", None) for x in left] == [
        "argument 'scale'",
        "argument 'weight'",
        "argument 'normalized_shape' missing",
        "more positional arguments than torch's function takes",
    ]


class _NativeStandIn:
    """plancache.torch.native.NATIVE's state, as the mode reads it."""

    def __init__(self, state: str) -> None:
        self.state = state


@pytest.mark.parametrize("state", ["on", "disabled (PLANCACHE_NATIVE=0)"])
def test_eager_calls_go_to_the_operators_where_the_native_extension_is_on(
    cpu_routes: None, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """Eager on CUDA, a routed call is plancache.functional's while the native extension is off, the operator's
    (its calls replayed and its autograd C++ there) while it is on; a boolean-mask attention and batch norm stay
    plancache.functional's either way. Here on CPU tensors with the CUDA path's decision, stand-ins for the
    functions: which one ran is what is asserted (the operators' CPU implementation is torch's)."""
    from plancache.torch import _ops

    ran: list[str] = []

    def stand_in(name: str, torch_function: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            ran.append(name)
            return torch_function(*args, **kwargs)

        return run

    monkeypatch.setattr(_mode, "_eager", lambda x: True)
    monkeypatch.setattr(_ops, "_native", _NativeStandIn(state))
    monkeypatch.setattr(pf, "linear", stand_in("pf.linear", F.linear))
    monkeypatch.setattr(pf, "layer_norm", stand_in("pf.layer_norm", F.layer_norm))

    def attention(q: Any, k: Any, v: Any, mask: Any, dropout: float, causal: bool, scale: Any, gqa: bool) -> Any:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale, enable_gqa=gqa
        )

    monkeypatch.setattr(pf, "scaled_dot_product_attention", stand_in("pf.scaled_dot_product_attention", attention))
    torch.manual_seed(0)
    x, w = torch.randn(4, 8, dtype=D, requires_grad=True), torch.randn(6, 8, dtype=D, requires_grad=True)
    q = torch.randn(1, 2, 4, 8, dtype=D)
    boolean = torch.ones(4, 4, dtype=torch.bool).tril()
    with pt.mode():
        out = F.linear(F.layer_norm(x, [8]), w)
        F.scaled_dot_product_attention(q, q, q, attn_mask=boolean)
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(out, F.linear(F.layer_norm(x, [8]), w))
    if state == "on":
        assert ran == ["pf.scaled_dot_product_attention"]  # the boolean mask's
        assert out.grad_fn.name().endswith("linear_train_defaultBackward")  # the operator's autograd
    else:
        assert ran == ["pf.layer_norm", "pf.linear", *["pf.scaled_dot_product_attention"] * 2]


# ---- a compiled call raced against torch's function as it is traced ------------------------------------


class TracedRaces:
    """_mode._race_traced_call's stand-in (the race itself runs CUDA calls: tests/gpu/test_gpu_race.py): what it
    was asked, and the functions torch's is faster for."""

    def __init__(self, torch_faster: set[str]) -> None:
        self.torch_faster = torch_faster
        self.asked: list[tuple[Any, ...]] = []

    def __call__(self, function: str, specs: Any, options: Any, training: bool) -> str | None:
        self.asked.append((function, specs, options, training))
        if function == "broken":
            raise RuntimeError("no GPU here")
        return f"torch's function is faster here: {function}" if function in self.torch_faster else None


@pytest.fixture
def traced_races(cpu_routes: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[TracedRaces]:
    races = TracedRaces({"linear"})
    monkeypatch.setattr(_mode, "RACED_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(_mode, "_race_traced_call", races)
    yield races


def test_a_compiled_call_torch_is_faster_for_is_left_to_torch_as_it_is_traced(traced_races: TracedRaces) -> None:
    """Raced once, at trace time, with the call's geometry as constants: a geometry torch's function wins is
    torch's in the traced program (no plancache operator: inductor compiles it as without plancache), said in
    left_compiled; one the plan wins is the operator's; later runs trace nothing again."""
    model, x, image = model_and_inputs()
    expected = step(model, x, image)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = pt.compile(model, backend=recorder, fullgraph=True)
    got = step(model, x, image, compiled)
    assert_same(got, expected)
    assert recorder.graphs == 1
    ours = {t.split(".")[1] for t in recorder.targets if t.startswith("plancache.")}
    assert not any(name.startswith("linear") for name in ours)  # every linear left to torch
    assert {"layer_norm_train", "rms_norm_train", "sdpa_train", "conv2d_train"} <= ours
    asked = {function for function, *_ in traced_races.asked}
    assert asked == {"linear", "layer_norm", "rms_norm", "scaled_dot_product_attention", "conv2d"}
    linear = [a for a in traced_races.asked if a[0] == "linear"]
    assert len(linear) == 4  # one race per geometry: five linears, two of them q's and the output's (32 -> 32)
    assert len(set(linear)) == 4
    q_spec = linear[0][1][0]
    # The first linear's input (the layer norm's output, wanting its gradient): its geometry as constants.
    assert q_spec == (tuple(x.shape), tuple(x.stride()), D, -1, True)
    assert all(a[3] for a in traced_races.asked)  # a training step's calls: raced with their backward
    assert pt.stats()["linear"].left_compiled == ("torch's function is faster here: linear",)
    count = len(traced_races.asked)
    step(model, x, image, compiled)
    assert len(traced_races.asked) == count and recorder.graphs == 1  # nothing traced or raced again


def test_a_traced_geometry_is_raced_once_however_many_call_sites_make_it(traced_races: TracedRaces) -> None:
    """A model's repeated blocks make the same calls and dynamo traces every call site: each geometry is raced
    once (a compiled program's cold start waited for a race per call site), traced again or not, until
    plancache.functional's table is cleared (a new deployment): then again."""
    layers = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)], nn.Linear(16, 8)).to(D)
    x = torch.randn(4, 16, dtype=D)

    def trace_and_run() -> None:
        torch._dynamo.reset()
        with torch.no_grad():
            got = pt.compile(layers, backend=Recorder(), fullgraph=True)(x)
        torch.testing.assert_close(got, layers(x))

    trace_and_run()
    weights = [a[1][1][0] for a in traced_races.asked]
    assert sorted(weights) == [(8, 16), (16, 16)]  # two geometries of five call sites
    trace_and_run()
    assert len(traced_races.asked) == 2
    pf.clear()
    trace_and_run()
    assert len(traced_races.asked) == 4


def test_a_compiled_call_with_dynamic_sizes_is_not_raced(traced_races: TracedRaces) -> None:
    lin = nn.Linear(16, 8).to(D)

    def fn(x: Any) -> Any:
        return lin(x)

    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(fn, backend=recorder, fullgraph=True, dynamic=True)
    with pt.mode(), torch.no_grad():
        for rows in (3, 5):
            x = torch.randn(rows, 16, dtype=D)
            torch.testing.assert_close(compiled(x), fn(x))
    assert not traced_races.asked and "plancache.linear.default" in recorder.targets


def test_a_compiled_race_that_fails_leaves_the_call_to_plancaches_operator_and_says_why(
    traced_races: TracedRaces, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, w = torch.randn(4, 16, dtype=D), torch.randn(8, 16, dtype=D)

    def fn(x: Any, w: Any) -> Any:
        left = _mode._raced_left("broken", (x, w, None), ())
        return F.linear(x, w) if left is None else x

    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        got = pt.compile(fn, backend=recorder, fullgraph=True)(x, w)
    torch.testing.assert_close(got, F.linear(x, w))
    assert ("broken", "not raced (RuntimeError: no GPU here)") in _mode.LEFT_COMPILED


def test_with_the_race_off_a_compiled_call_is_not_raced(traced_races: TracedRaces) -> None:
    pf.set_race_torch(False)
    x, w = torch.randn(4, 16, dtype=D), torch.randn(8, 16, dtype=D)
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        pt.compile(F.linear, backend=recorder, fullgraph=True)(x, w)
    assert not traced_races.asked and "plancache.linear.default" in recorder.targets


def test_a_traced_race_calls_plancache_functional_as_the_eager_route_would(
    cpu_routes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What _race_traced_call runs for each routed function (on tensors of the call's geometry): the function's
    eager call, its arguments in plancache.functional's order, the tensors made as the trace described them."""
    calls: dict[str, tuple[Any, ...]] = {}
    for name in ("layer_norm", "rms_norm", "linear", "scaled_dot_product_attention", "conv2d"):
        monkeypatch.setattr(pf, name, lambda *args, _name=name: calls.setdefault(_name, args))
    made: list[Any] = []

    def cpu_made(spec: Any) -> Any:
        shape, stride, dtype, _, requires_grad = spec
        made.append(torch.empty_strided(shape, stride, dtype=dtype).normal_().requires_grad_(requires_grad))
        return made[-1]

    monkeypatch.setattr(_mode, "_made", cpu_made)
    monkeypatch.setattr(_mode, "torch_faster_reason", lambda call: call() and None)
    monkeypatch.setattr(_mode, "_operator_faster_reason", lambda *args: None)
    monkeypatch.setattr(_mode, "RACED_DEVICES", {"cuda", "cpu"})
    model, x, image = model_and_inputs()
    torch._dynamo.reset()
    step(model, x, image, pt.compile(model, backend=Recorder(), fullgraph=True))
    assert set(calls) == {"layer_norm", "rms_norm", "linear", "scaled_dot_product_attention", "conv2d"}
    hidden = x.shape[-1]
    ln = calls["layer_norm"]
    assert ln[1] == [hidden] and ln[2].shape == ln[3].shape == (hidden,) and ln[4] == 1e-5
    rms = calls["rms_norm"]
    assert rms[1] == [hidden] and rms[2].shape == (hidden,) and rms[3] == 1e-6
    q, k, _, mask, dropout, causal, scale, gqa = calls["scaled_dot_product_attention"]
    assert (q.shape[1], k.shape[1], mask, dropout, causal, scale, gqa) == (4, 2, None, 0.0, True, None, True)
    conv = calls["conv2d"]
    assert conv[0].shape == image.shape and conv[1].shape == (4, 3, 3, 3) and conv[3:] == ((1, 1), (1, 1), (1, 1), 1)
    assert calls["linear"][0].requires_grad and calls["linear"][1].requires_grad  # a training step's, as traced


def _operator_cases() -> list[tuple[str, list[Any], tuple[Any, ...]]]:
    """A call of each routed function: its tensors (None: not given) and options, as _raced_left takes them."""
    q = torch.randn(1, 4, 16, 8, dtype=D)
    kv = torch.randn(1, 2, 16, 8, dtype=D)
    return [
        ("linear", [torch.randn(6, 16, dtype=D), torch.randn(8, 16, dtype=D), torch.randn(8, dtype=D)], ()),
        ("linear", [torch.randn(6, 16, dtype=D), torch.randn(8, 16, dtype=D), None], ()),
        ("layer_norm", [torch.randn(6, 16, dtype=D), torch.randn(16, dtype=D), None], ((16,), 1e-5)),
        ("rms_norm", [torch.randn(6, 16, dtype=D), torch.randn(16, dtype=D)], ((16,), None)),
        (
            "conv2d",
            [torch.randn(2, 3, 8, 8, dtype=D), torch.randn(4, 3, 3, 3, dtype=D), None],
            ((2, 2), (1, 1), (1, 1), 1),
        ),
        ("scaled_dot_product_attention", [q, kv, kv.clone(), None], (0.0, True, None, True)),
    ]


@pytest.fixture
def cpu_race(cpu_routes: None, monkeypatch: pytest.MonkeyPatch) -> Any:
    """plancache.functional's race on the CPU: nothing to synchronize, no device to time alone."""
    from plancache.functional import _race, _tensor_ops

    monkeypatch.setattr(_tensor_ops.TorchOps, "synchronize", lambda self, device: None)
    monkeypatch.setattr(_tensor_ops.TorchOps, "device_seconds", lambda self, run, runs, device, hold_s: None)
    return _race


@pytest.mark.parametrize("training", [False, True])
def test_a_traced_calls_operator_is_raced_as_the_compiled_program_calls_it(
    cpu_race: Any, monkeypatch: pytest.MonkeyPatch, training: bool
) -> None:
    """Where the plan won plancache.functional's race, the traced call's operator (the plan behind torch's
    dispatcher and the operator's registration: what the compiled program calls) races torch's function: each
    function's operator call gives torch's function's result (the operators' CPU implementation is torch's own),
    the verdict follows the margin, the operator's runs are not the program's calls."""
    every: list[Any] = []
    for function, tensors, options in _operator_cases():
        made = [None if t is None else t.clone().requires_grad_(training) for t in tensors]
        every += [t for t in made if t is not None]
        with torch.enable_grad() if training else torch.no_grad():
            got = _mode._operator_call(function, made, options, training)
            torch.testing.assert_close(got, _mode._eager_call(function, made, options, F))
            assert got.requires_grad == training
            monkeypatch.setattr(cpu_race, "MARGIN", 1.0)  # the plan never faster by enough: torch's function
            reason = _mode._operator_faster_reason(function, made, options, training)
            assert reason is not None and reason.startswith(cpu_race.TORCH_FASTER), function
            assert "plancache's operator" in reason and "µs a call" in reason
            monkeypatch.setattr(cpu_race, "MARGIN", -1e9)  # the plan always faster by enough
            assert _mode._operator_faster_reason(function, made, options, training) is None
    assert all(t.grad is None for t in every)  # the race's backward takes gradients apart


def test_an_operator_races_runs_leave_the_programs_counters_as_they_were(
    cpu_race: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plancache.functional._table import counts

    real = _mode._operator_call

    def counted(function: str, *args: Any) -> Any:
        counts(function).cudnn += 1  # as a served plan's call counts itself
        return real(function, *args)

    monkeypatch.setattr(_mode, "_operator_call", counted)
    before = counts("linear").cudnn
    function, tensors, options = _operator_cases()[0]
    with torch.no_grad():
        _mode._operator_faster_reason(function, tensors, options, False)
    assert counts("linear").cudnn == before


@pytest.mark.parametrize("torch_wins", [True, False])
def test_a_compiled_call_whose_operator_torch_beats_is_torchs_in_the_traced_program(
    cpu_race: Any, monkeypatch: pytest.MonkeyPatch, torch_wins: bool
) -> None:
    """End to end through dynamo's trace (plancache.functional's own race, which needs a GPU, says the plan won):
    the operator raced as the call is traced, on real tensors made for it; torch's function traced where it wins,
    its reason in left_compiled, else plancache's operator; the result torch's either way."""
    monkeypatch.setattr(_mode, "RACED_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(_mode, "torch_faster_reason", lambda call: None)
    monkeypatch.setattr(cpu_race, "MARGIN", 1.0 if torch_wins else -1e9)
    lin = nn.Linear(16, 8).to(D)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = pt.compile(lin, backend=recorder, fullgraph=True)
    x = torch.randn(4, 16, dtype=D)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), lin(x))
    assert ("plancache.linear.default" in recorder.targets) == (not torch_wins)
    left = pt.stats()["linear"].left_compiled if "linear" in pt.stats() else ()
    assert any("plancache's operator" in reason for reason in left) == torch_wins, left


@pytest.mark.parametrize("plan_won", [True, False])
def test_a_traced_calls_operator_is_raced_only_where_the_plan_won_its_own_race(
    cpu_routes: None, monkeypatch: pytest.MonkeyPatch, plan_won: bool
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(_mode, "_made", lambda spec: torch.randn(spec[0], dtype=spec[2]))
    monkeypatch.setattr(_mode, "torch_faster_reason", lambda call: None if plan_won else "torch's: the plan's race")
    monkeypatch.setattr(_mode, "_operator_faster_reason", lambda function, *args: asked.append(function) or "op's")
    spec = ((4, 16), (16, 1), D, -1, False)
    reason = _mode._race_traced_call("linear", (spec, ((8, 16), (16, 1), D, -1, False), None), (), False)
    assert (reason, asked) == (("op's", ["linear"]) if plan_won else ("torch's: the plan's race", []))


@pytest.mark.parametrize(
    ("shape", "stride"), [((2, 3), (3, 1)), ((2, 3), (1, 2)), ((4, 1, 5, 5), (0, 0, 5, 1)), ((0, 3), (3, 1))]
)
def test_a_traced_races_tensors_take_the_calls_layout(shape: tuple[int, ...], stride: tuple[int, ...]) -> None:
    """Broadcast (zero) strides included: a mask expanded over batch and heads is raced in its own layout."""
    made = _mode._made((shape, stride, D, -1, True))
    assert (tuple(made.shape), made.stride(), made.dtype, made.is_leaf, made.requires_grad) == (
        shape,
        stride,
        D,
        True,
        True,
    )
    assert made.numel() == 0 or bool(made.abs().sum() > 0)


def test_stats_say_how_many_geometries_were_raced(monkeypatch: pytest.MonkeyPatch) -> None:
    served = pf.FunctionStats(cudnn=3, torch=5, geometries=2, torch_geometries=1, reasons={"torch's ...": 1}, raced=2)
    monkeypatch.setattr(pt.pf, "stats", lambda: {"linear": served})
    linear = pt.stats()["linear"]
    assert (linear.cudnn, linear.torch, linear.raced, linear.reasons) == (3, 5, 2, {"torch's ...": 1})


def test_an_eager_routed_call_takes_stored_plans_only_and_puts_the_setting_back() -> None:
    """plancache.torch's eager calls: a geometry's first call takes its plans where stored, else torch's function
    runs it while the service builds them (tests/unit/functional/test_stored_only.py); the setting is the call's."""
    from plancache.functional._first_call import STORED_ONLY

    seen: list[bool] = []

    def route(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        seen.append(STORED_ONLY.on)
        if args:
            raise RuntimeError("the route failed")
        return "served"

    assert _mode.dispatch("linear", route, F.linear, (), {}) == "served"
    with pytest.raises(RuntimeError, match="the route failed"):
        _mode.dispatch("linear", route, F.linear, (1,), {})
    assert seen == [True, True] and not STORED_ONLY.on

"""plancache.torch's autograd in C++ (csrc/kernels.cpp, `install_autograd`): the native extension's registration
for the Autograd key of every training operator, built here with the machine's C++ compiler and tested on the CPU
(where every operator runs torch's own forward and backward: the autograd around them is device-independent).

What is asserted is that it is Python's registration (torch.library.register_autograd of the same
plancache.torch._ops.Gradient) in everything a program sees: the same outputs, the same gradient for every input
in every combination of inputs wanting one, the same errors (a saved tensor written in place, a second backward),
the same under torch.compile's AOT autograd and torch.library.opcheck. Removed, Python's serves again."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from plancache.torch import _ops  # noqa: E402 (registers the operators)
from plancache.torch import native as _native  # noqa: E402

from .native_build import BUILD_DIR, NEEDS_A_BUILD  # noqa: E402
from .test_operators import CASES, rand  # noqa: E402

pytestmark = NEEDS_A_BUILD

ops = torch.ops.plancache
TRAINING = sorted(c for c in CASES if "_train" in c)


@pytest.fixture(scope="module")
def native() -> Any:
    os.environ.setdefault(_native.NATIVE_DIR_ENV, BUILD_DIR)
    return _native.build()


@contextlib.contextmanager
def cpp_autograd(native: Any) -> Iterator[None]:
    installed = _native.install_gradients(native, _ops.OPERATORS)
    assert installed == [op.name for op in _ops.OPERATORS if op.gradient is not None]
    try:
        yield
    finally:
        native.remove_autograd()


def run_case(case: str, retain: bool = False) -> tuple[list[Any], list[Any], list[str]]:
    """The case's outputs, every input's gradient (a backward of every differentiable output, weighted by a fixed
    random tensor), and the grad_fn that made them."""
    torch.manual_seed(0)
    op, args = CASES[case]()
    outs = op(*args)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    names = sorted({o.grad_fn.name() for o in outs if o.grad_fn is not None})
    differentiable = [o for o in outs if o.requires_grad]
    torch.manual_seed(1)
    weights = [torch.randn_like(o) for o in differentiable]
    loss = sum((o * w).sum() for o, w in zip(differentiable, weights, strict=True))
    loss.backward(retain_graph=retain)
    grads = [a.grad if isinstance(a, torch.Tensor) else None for a in args]
    return [o.detach() for o in outs], grads, names


def assert_identical(ours: list[Any], theirs: list[Any]) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b) and a.stride() == b.stride() and a.dtype == b.dtype


@pytest.mark.parametrize("case", TRAINING)
def test_every_output_and_gradient_is_pythons_registrations(native: Any, case: str) -> None:
    python_outs, python_grads, python_fn = run_case(case)
    with cpp_autograd(native):
        outs, grads, fn = run_case(case)
    name = case.split(maxsplit=1)[0]
    assert python_fn == [f"GeneratedBackwardFor_plancache_{name}_defaultBackward"]
    assert fn == [f"plancache::{name}Backward"]
    assert_identical(outs, python_outs)
    assert_identical(grads, python_grads)
    assert any(g is not None for g in grads)


@pytest.mark.parametrize("case", TRAINING)
def test_the_grad_fn_is_the_cpp_one_while_installed_and_pythons_after(native: Any, case: str) -> None:
    op, args = CASES[case]()
    with cpp_autograd(native):
        outs = op(*args)
        first = (list(outs) if isinstance(outs, (list, tuple)) else [outs])[0]
        assert first.grad_fn.name() == f"plancache::{op._qualified_op_name.split('::')[1]}Backward"
    outs = op(*args)
    first = (list(outs) if isinstance(outs, (list, tuple)) else [outs])[0]
    assert first.grad_fn.name().startswith("GeneratedBackwardFor_plancache")


# Every subset of a linear's and a layer norm's inputs wanting a gradient (the first layer's input wants none, a
# frozen weight none): the backward is told the same `needs`, the same gradients come back, None elsewhere.
SUBSETS = [(x, w, b) for x in (False, True) for w in (False, True) for b in (False, True) if x or w or b]


@pytest.mark.parametrize("wants", SUBSETS, ids=lambda s: "".join("xwb"[i] for i, on in enumerate(s) if on))
@pytest.mark.parametrize("function", ["linear_train", "layer_norm_train"])
def test_only_the_inputs_that_want_a_gradient_get_one(native: Any, function: str, wants: tuple[bool, ...]) -> None:
    def run() -> list[Any]:
        torch.manual_seed(2)
        x, w, b = rand(4, 8, grad=wants[0]), rand(8 if function == "layer_norm_train" else 6, 8), rand(6)
        if function == "layer_norm_train":
            w, b = rand(8), rand(8)
        w.requires_grad_(wants[1])
        b.requires_grad_(wants[2])
        if function == "linear_train":
            out = ops.linear_train(x, w, b, "gelu")[0]
        else:
            out = ops.layer_norm_train(x, [8], w, b, 1e-5)[0]
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        return [x.grad, w.grad, b.grad]

    python = run()
    with cpp_autograd(native):
        cpp = run()
    assert_identical(cpp, python)
    assert [g is not None for g in cpp] == list(wants)


def test_no_graph_without_grad_mode_or_an_input_wanting_one(native: Any) -> None:
    with cpp_autograd(native):
        x, w = rand(4, 8, grad=True), rand(6, 8, grad=True)
        with torch.no_grad():
            out = ops.linear_train(x, w, None, None)[0]
        assert out.grad_fn is None and not out.requires_grad
        out = ops.linear_train(x.detach(), w.detach(), None, None)[0]
        assert out.grad_fn is None and not out.requires_grad


def test_only_a_tensor_outside_the_gradients_wanting_one_still_makes_a_graph_as_python_does(native: Any) -> None:
    """An attention mask that requires grad: autograd.Function gives the output a grad_fn and the mask no
    gradient; so does the C++ registration."""

    def run() -> tuple[bool, Any]:
        torch.manual_seed(3)
        q, k, v = rand(1, 2, 4, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)
        mask = rand(1, 1, 4, 4, grad=True)
        out = ops.sdpa_train(q, k, v, mask, False, None, False)[0]
        out.sum().backward()
        return out.requires_grad, mask.grad

    assert run() == (True, None)
    with cpp_autograd(native):
        assert run() == (True, None)


def test_batch_norms_statistics_carry_no_gradient(native: Any) -> None:
    with cpp_autograd(native):
        x, w, b = rand(3, 4, 5, 5, grad=True), rand(4, grad=True), rand(4, grad=True)
        outs = ops.batch_norm_train(x, w, b, rand(4), rand(4).abs(), 0.1, 1e-5)
        assert outs[0].requires_grad
        assert [o.requires_grad for o in outs[1:]] == [False] * 4


def test_an_unused_first_output_gets_a_zero_gradient_as_python_gives_it(native: Any) -> None:
    """A loss of a layer norm's statistics only: its result's gradient is materialized as zeros (autograd.Function's
    default), the backward run with it."""

    def run() -> list[Any]:
        torch.manual_seed(4)
        x, w = rand(4, 8, grad=True), rand(8, grad=True)
        _, mean, inv = ops.layer_norm_train(x, [8], w, None, 1e-5)
        (mean.sum() + inv.sum()).backward()
        return [x.grad, w.grad]

    python = run()
    with cpp_autograd(native):
        assert_identical(run(), python)


def _error(run: Callable[[], Any]) -> str:
    with pytest.raises(RuntimeError) as raised:
        run()
    return str(raised.value)


def test_a_saved_input_written_in_place_and_a_second_backward_raise_as_python_does(native: Any) -> None:
    def written() -> None:
        x, w = rand(4, 8, grad=True), rand(6, 8, grad=True)
        y = x * 1
        out = ops.linear_train(y, w, None, None)[0]
        y.add_(1)
        out.sum().backward()

    def twice() -> None:
        x, w = rand(4, 8, grad=True), rand(6, 8, grad=True)
        out = ops.linear_train(x, w, None, None)[0].sum()
        out.backward()
        out.backward()

    python = (_error(written), _error(twice))
    with cpp_autograd(native):
        cpp = (_error(written), _error(twice))
    assert "modified by an inplace operation" in python[0] and "modified by an inplace operation" in cpp[0]
    assert "backward through the graph a second time" in python[1]
    assert "backward through the graph a second time" in cpp[1]


def test_retained_graphs_give_the_same_gradient_twice(native: Any) -> None:
    with cpp_autograd(native):
        x, w = rand(4, 8, grad=True), rand(6, 8, grad=True)
        out = ops.linear_train(x, w, None, "relu")[0].sum()
        out.backward(retain_graph=True)
        first = x.grad.clone()
        out.backward()
        assert torch.equal(x.grad, 2 * first)


def test_a_compiled_training_step_traces_through_it_and_gives_eagers_gradients(native: Any) -> None:
    """AOT autograd traces the forward through the C++ kernel and the backward through its node: the compiled
    program's loss and gradients are eager's (aot_eager: the traced graphs, run by torch's own kernels)."""

    def step(x: Any, w: Any, g: Any) -> Any:
        h = ops.layer_norm_train(x, [8], g, None, 1e-5)[0]
        return ops.linear_train(h, w, None, "gelu")[0].square().mean()

    def run(fn: Callable[..., Any]) -> list[Any]:
        torch.manual_seed(5)
        x, w, g = rand(4, 8, grad=True), rand(6, 8, grad=True), rand(8, grad=True)
        loss = fn(x, w, g)
        loss.backward()
        return [loss.detach(), x.grad, w.grad, g.grad]

    with cpp_autograd(native):
        torch._dynamo.reset()
        compiled = run(torch.compile(step, backend="aot_eager", fullgraph=True))
        eager = run(step)
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", TRAINING)
def test_opcheck_passes_with_it(native: Any, case: str) -> None:
    torch.manual_seed(0)
    op, args = CASES[case]()
    with cpp_autograd(native):
        results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


def test_an_install_that_fails_part_way_leaves_pythons_registration_on_every_operator(native: Any) -> None:
    class Broken:
        """An operator whose backward operator does not exist: its install fails after the earlier ones."""

        name = "linear_train"
        gradient = _ops.Gradient("no_such_backward", ((_ops.NEEDS, 0),), of=(0,))

    with pytest.raises(RuntimeError, match="no_such_backward"):
        _native.install_gradients(native, [*_ops.OPERATORS, Broken()])
    out = ops.layer_norm_train(rand(4, 8, grad=True), [8], None, None, 1e-5)[0]
    assert out.grad_fn.name().startswith("GeneratedBackwardFor_plancache")

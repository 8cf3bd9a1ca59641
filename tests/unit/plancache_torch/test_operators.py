"""plancache's torch operators on the CPU: their schemas, fake implementations,
autograd registrations and AOT dispatch (torch.library.opcheck), their
gradients against torch's own autograd, and the meaning of what a training
forward saves (what a served forward writes: the backward of either reads it).

On the CPU every operator runs torch's own forward and backward
(plancache.torch._torch_math): the path a geometry plancache does not serve
takes on the GPU. The served path is tests/gpu/test_gpu_torch.py's."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="plancache.torch needs torch (make test installs its CPU build)")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import plancache.torch  # noqa: E402 (registers the operators)
from plancache.torch import _torch_math as tm  # noqa: E402

ops = torch.ops.plancache


def rand(*shape: int, dtype: Any = torch.float32, grad: bool = False) -> Any:
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def sdpa_inputs(dtype: Any = torch.float32, gqa: bool = False, transposed: bool = False) -> tuple[Any, ...]:
    """q [2, 4, 6, 8], k/v with 4 heads (2 with grouped-query attention); BSHD views where `transposed`."""
    kv_heads = 2 if gqa else 4
    if transposed:
        q = rand(2, 6, 4, 8, dtype=dtype).transpose(1, 2)
        k = rand(2, 6, kv_heads, 8, dtype=dtype).transpose(1, 2)
        v = rand(2, 6, kv_heads, 8, dtype=dtype).transpose(1, 2)
    else:
        q, k, v = (
            rand(2, 4, 6, 8, dtype=dtype),
            rand(2, kv_heads, 6, 8, dtype=dtype),
            rand(2, kv_heads, 6, 8, dtype=dtype),
        )
    return q, k, v


# Each operator, with arguments opcheck runs it on (its backward's through the training forward's autograd).
CASES: dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]] = {
    "layer_norm": lambda: (ops.layer_norm, (rand(3, 5, 16), [16], rand(16), rand(16), 1e-5)),
    "layer_norm no params": lambda: (ops.layer_norm, (rand(3, 5, 16), [16], None, None, 1e-5)),
    "layer_norm_train": lambda: (
        ops.layer_norm_train,
        (rand(3, 5, 16, grad=True), [16], rand(16, grad=True), rand(16, grad=True), 1e-5),
    ),
    "layer_norm_train bf16": lambda: (
        ops.layer_norm_train,
        (rand(4, 32, dtype=torch.bfloat16, grad=True), [32], rand(32, dtype=torch.bfloat16, grad=True), None, 1e-5),
    ),
    "rms_norm": lambda: (ops.rms_norm, (rand(3, 5, 16), [16], rand(16), 1e-6)),
    "rms_norm_train": lambda: (ops.rms_norm_train, (rand(3, 5, 16, grad=True), [16], rand(16, grad=True), None)),
    "linear": lambda: (ops.linear, (rand(3, 5, 16), rand(8, 16), rand(8), None)),
    "linear gelu": lambda: (ops.linear, (rand(3, 5, 16), rand(8, 16), None, "gelu")),
    "linear_train": lambda: (
        ops.linear_train,
        (rand(3, 5, 16, grad=True), rand(8, 16, grad=True), rand(8, grad=True), None),
    ),
    "linear_train gelu": lambda: (
        ops.linear_train,
        (rand(3, 5, 16, grad=True), rand(8, 16, grad=True), rand(8, grad=True), "gelu"),
    ),
    "linear_train silu frozen weight": lambda: (
        ops.linear_train,
        (rand(5, 16, grad=True), rand(8, 16), None, "silu"),
    ),
    "sdpa": lambda: (ops.sdpa, (*sdpa_inputs(), None, True, None, False)),
    "sdpa_train": lambda: (
        ops.sdpa_train,
        (*(t.requires_grad_() for t in sdpa_inputs()), None, False, 0.3, False),
    ),
    "sdpa_train gqa causal": lambda: (
        ops.sdpa_train,
        (*(t.detach().requires_grad_() for t in sdpa_inputs(gqa=True, transposed=True)), None, True, None, True),
    ),
    "sdpa_train float mask": lambda: (
        ops.sdpa_train,
        (*(t.requires_grad_() for t in sdpa_inputs()), rand(1, 1, 6, 6), False, None, False),
    ),
    "batch_norm": lambda: (ops.batch_norm, (rand(2, 4, 5, 5), rand(4), rand(4), rand(4), rand(4).abs(), 1e-5)),
    "batch_norm no params channels-last": lambda: (
        ops.batch_norm,
        (rand(2, 4, 5, 5).to(memory_format=torch.channels_last), None, None, rand(4), rand(4).abs(), 1e-5),
    ),
    "batch_norm_train": lambda: (
        ops.batch_norm_train,
        (rand(3, 4, 5, 5, grad=True), rand(4, grad=True), rand(4, grad=True), rand(4), rand(4).abs(), 0.1, 1e-5),
    ),
    "batch_norm_train channels-last no weight": lambda: (
        ops.batch_norm_train,
        (
            rand(3, 4, 5, 5).to(memory_format=torch.channels_last).requires_grad_(),
            None,
            rand(4, grad=True),
            rand(4),
            rand(4).abs(),
            0.3,
            1e-3,
        ),
    ),
    "conv2d": lambda: (ops.conv2d, (rand(2, 4, 9, 9), rand(6, 4, 3, 3), rand(6), [1, 1], [1, 1], [1, 1], 1, False)),
    "conv2d_train relu": lambda: (
        ops.conv2d_train,
        (rand(2, 4, 9, 9, grad=True), rand(6, 4, 3, 3, grad=True), rand(6, grad=True), [2, 2], [1, 0], [1, 1], 1, True),
    ),
    "conv2d_train channels-last groups": lambda: (
        ops.conv2d_train,
        (
            rand(2, 4, 8, 8).to(memory_format=torch.channels_last).requires_grad_(),
            rand(4, 2, 3, 3, grad=True),
            None,
            [1, 1],
            [1, 1],
            [1, 1],
            2,
            False,
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_opcheck(case: str) -> None:
    """torch's own checks of a custom operator: schema, fake tensors, autograd registration, AOT dispatch (dynamic)."""
    torch.manual_seed(0)
    op, args = CASES[case]()
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


def test_every_operator_is_checked() -> None:
    """Each registered operator is in CASES (a backward through its training forward's autograd)."""
    checked = {CASES[c]()[0]._qualified_op_name.split("::")[1] for c in CASES}
    backward = {name.removesuffix("_train") + "_backward" for name in checked if name.endswith("_train")}
    registered = {name.split("::")[1] for name in plancache.torch.OPERATORS}
    assert registered == checked | backward


def grads_of(fn: Callable[..., Any], inputs: list[Any], dy: Any) -> tuple[Any, list[Any]]:
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*leaves)
    out.backward(dy)
    return out.detach(), [leaf.grad for leaf in leaves]


def assert_same_grads(ours: Callable[..., Any], theirs: Callable[..., Any], inputs: list[Any]) -> None:
    """Result and every gradient of `ours` equal torch autograd's of `theirs` (float64: to rounding)."""
    torch.manual_seed(1)
    dy = torch.randn_like(theirs(*inputs).detach())
    out, grads = grads_of(ours, inputs, dy)
    ref, ref_grads = grads_of(theirs, inputs, dy)
    torch.testing.assert_close(out, ref)
    for index, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        if r is None:
            assert g is None, index
        else:
            assert g is not None, index
            torch.testing.assert_close(g, r, msg=lambda m, i=index: f"input {i}: {m}")


D = torch.float64


def test_layer_norm_gradients() -> None:
    inputs = [rand(3, 5, 16, dtype=D, grad=True), rand(16, dtype=D, grad=True), rand(16, dtype=D, grad=True)]
    assert_same_grads(
        lambda x, w, b: ops.layer_norm_train(x, [16], w, b, 1e-5)[0],
        lambda x, w, b: F.layer_norm(x, [16], w, b, 1e-5),
        inputs,
    )


def test_layer_norm_over_two_dims_without_a_bias() -> None:
    inputs = [rand(3, 4, 8, dtype=D, grad=True), rand(4, 8, dtype=D, grad=True)]
    assert_same_grads(
        lambda x, w: ops.layer_norm_train(x, [4, 8], w, None, 1e-5)[0],
        lambda x, w: F.layer_norm(x, [4, 8], w, None, 1e-5),
        inputs,
    )


def test_rms_norm_gradients() -> None:
    inputs = [rand(3, 5, 16, dtype=D, grad=True), rand(16, dtype=D, grad=True)]
    assert_same_grads(
        lambda x, w: ops.rms_norm_train(x, [16], w, 1e-6)[0], lambda x, w: F.rms_norm(x, [16], w, 1e-6), inputs
    )
    inputs = [rand(6, 16, dtype=D, grad=True)]
    assert_same_grads(lambda x: ops.rms_norm_train(x, [16], None, None)[0], lambda x: F.rms_norm(x, [16]), inputs)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_linear_gradients(activation: str | None) -> None:
    inputs = [rand(3, 5, 16, dtype=D, grad=True), rand(8, 16, dtype=D, grad=True), rand(8, dtype=D, grad=True)]
    assert_same_grads(
        lambda x, w, b: ops.linear_train(x, w, b, activation)[0],
        lambda x, w, b: tm.activate(F.linear(x, w, b), activation),
        inputs,
    )


def test_linear_gradient_of_a_frozen_weight_is_not_computed() -> None:
    x, w = rand(5, 16, dtype=D, grad=True), rand(8, 16, dtype=D)
    out = ops.linear_train(x, w, None, None)[0]
    out.sum().backward()
    assert x.grad is not None and w.grad is None


@pytest.mark.parametrize(
    "options",
    [
        {"is_causal": False, "scale": None, "gqa": False, "mask": False, "transposed": False},
        {"is_causal": True, "scale": 0.2, "gqa": False, "mask": False, "transposed": True},
        {"is_causal": True, "scale": None, "gqa": True, "mask": False, "transposed": True},
        {"is_causal": False, "scale": None, "gqa": False, "mask": True, "transposed": False},
    ],
    ids=["plain", "causal scaled BSHD", "gqa causal", "float mask"],
)
def test_sdpa_gradients(options: dict[str, Any]) -> None:
    q, k, v = (t.requires_grad_() for t in sdpa_inputs(D, gqa=options["gqa"], transposed=options["transposed"]))
    mask = rand(1, 4, 6, 6, dtype=D) if options["mask"] else None
    causal, scale, gqa = options["is_causal"], options["scale"], options["gqa"]
    extra = {"enable_gqa": True} if gqa else {}
    assert_same_grads(
        lambda q, k, v: ops.sdpa_train(q, k, v, mask, causal, scale, gqa)[0],
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale=scale, **extra),
        [q, k, v],
    )


@pytest.mark.parametrize(
    "conv",
    [
        {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "relu": False, "bias": True},
        {"stride": [2, 1], "padding": [0, 2], "dilation": [1, 2], "groups": 2, "relu": True, "bias": False},
    ],
    ids=["plain", "strided dilated grouped relu"],
)
def test_conv2d_gradients(conv: dict[str, Any]) -> None:
    groups = conv["groups"]
    inputs = [rand(2, 4, 9, 9, dtype=D, grad=True), rand(6, 4 // groups, 3, 3, dtype=D, grad=True)]
    if conv["bias"]:
        inputs.append(rand(6, dtype=D, grad=True))
    s, p, d, relu = conv["stride"], conv["padding"], conv["dilation"], conv["relu"]

    def theirs(x: Any, w: Any, b: Any = None) -> Any:
        y = F.conv2d(x, w, b, s, p, d, groups)
        return torch.relu(y) if relu else y

    assert_same_grads(lambda x, w, b=None: ops.conv2d_train(x, w, b, s, p, d, groups, relu), theirs, inputs)


@pytest.mark.parametrize("params", ["weight and bias", "bias only", "none"])
def test_batch_norm_train_gradients_and_running_statistics(params: str) -> None:
    """The training operator's result and gradients are torch's batch norm's, and the next running statistics
    it returns are the ones torch's writes in place (the caller's are left as they were)."""
    torch.manual_seed(2)
    x = rand(4, 3, 5, 5, dtype=D, grad=True)
    w = None if params != "weight and bias" else rand(3, dtype=D, grad=True)
    b = None if params == "none" else rand(3, dtype=D, grad=True)
    mean, var = rand(3, dtype=D), rand(3, dtype=D).abs() + 0.5
    inputs = [t for t in (x, w, b) if t is not None]

    def ours(*given: Any) -> Any:
        it = iter(given)
        xx, ww, bb = next(it), (next(it) if w is not None else None), (next(it) if b is not None else None)
        return ops.batch_norm_train(xx, ww, bb, mean, var, 0.2, 1e-5)[0]

    def theirs(*given: Any) -> Any:
        it = iter(given)
        xx, ww, bb = next(it), (next(it) if w is not None else None), (next(it) if b is not None else None)
        return F.batch_norm(xx, mean.clone(), var.clone(), ww, bb, True, 0.2, 1e-5)

    assert_same_grads(ours, theirs, inputs)
    before = (mean.clone(), var.clone())
    _, saved_mean, inv, next_mean, next_var = ops.batch_norm_train(x.detach(), w, b, mean, var, 0.2, 1e-5)
    torch.testing.assert_close((mean, var), before)  # the arguments untouched
    expected_mean, expected_var = mean.clone(), var.clone()
    F.batch_norm(x.detach(), expected_mean, expected_var, w, b, True, 0.2, 1e-5)
    torch.testing.assert_close(next_mean, expected_mean)
    torch.testing.assert_close(next_var, expected_var)  # unbiased, as torch's
    torch.testing.assert_close(saved_mean, x.detach().mean((0, 2, 3)))
    torch.testing.assert_close(inv, (x.detach().var((0, 2, 3), unbiased=False) + 1e-5).rsqrt())


def test_the_backward_operator_finds_the_training_forwards_geometry_without_its_running_statistics() -> None:
    """batch_norm_backward has no running statistics (they are the module's, updated meanwhile): it resolves the
    forward's table entry by the layout a served forward's had (float32 [C] on the input's device), and a hit
    allocates nothing. Here the forward's key is made as batch_norm_op makes it, a sentinel entry under it."""
    from plancache.functional import _batch_norm
    from plancache.functional._table import TABLE

    class Sentinel:
        used = 0

    x, w, b = rand(2, 4, 3, 3), rand(4), rand(4)
    mean, var = torch.zeros(4), torch.ones(4)
    key = _batch_norm._op_key(
        x, w, b, _batch_norm._layout_key(mean), _batch_norm._layout_key(var), True, 0.1, 1e-5, True
    )
    sentinel = Sentinel()
    TABLE.put(key, sentinel)  # type: ignore[arg-type]
    try:
        assert _batch_norm.batch_norm_backward_entry(x, w, b, 0.1, 1e-5) is sentinel
    finally:
        TABLE.discard(key, sentinel)  # type: ignore[arg-type]


def test_batch_norm_evaluation_is_torchs() -> None:
    torch.manual_seed(3)
    x = rand(2, 3, 4, 4, dtype=D).to(memory_format=torch.channels_last)
    w, b, mean, var = rand(3, dtype=D), rand(3, dtype=D), rand(3, dtype=D), rand(3, dtype=D).abs() + 0.1
    got = ops.batch_norm(x, w, b, mean, var, 1e-5)
    torch.testing.assert_close(got, F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5))
    assert got.stride() == torch.empty_like(x).stride()


def test_saved_outputs_mean_what_a_served_forward_writes() -> None:
    """A backward run by a plan may read what torch's forward saved, and the other way round:
    a norm's row mean and inverse deviation (float32 [rows, 1, 1, 1]), attention's log-sum-exp of the
    scaled scores (float32 [b, h, s_q, 1]), a GELU's pre-activation."""
    x = rand(3, 5, 16)
    _, mean, rstd = ops.layer_norm_train(x, [16], None, None, 1e-5)
    rows = x.reshape(15, 16)
    assert mean.shape == rstd.shape == (15, 1, 1, 1) and mean.dtype == torch.float32
    torch.testing.assert_close(mean.flatten(), rows.mean(1))
    torch.testing.assert_close(rstd.flatten(), torch.rsqrt(rows.var(1, unbiased=False) + 1e-5))
    _, inv = ops.rms_norm_train(x, [16], None, 1e-6)
    torch.testing.assert_close(inv.flatten(), torch.rsqrt(rows.pow(2).mean(1) + 1e-6))
    q, k, v = sdpa_inputs()
    _, lse = ops.sdpa_train(q, k, v, None, True, None, False)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    assert lse.shape == (2, 4, 6, 1) and lse.dtype == torch.float32
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1, keepdim=True))
    out, pre = ops.linear_train(x, rand(8, 16), None, "gelu")
    torch.testing.assert_close(out, F.gelu(pre))


@pytest.mark.parametrize(
    "case", ["layer_norm_train", "sdpa_train gqa causal", "conv2d_train channels-last groups", "linear_train gelu"]
)
def test_outputs_have_the_layouts_the_fake_says(case: str) -> None:
    """A compiled program plans memory from the fake implementation: the real outputs' dims, strides and types are those."""
    torch.manual_seed(0)
    op, args = CASES[case]()
    real = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = op(*fake_args)
    real_list = list(real) if isinstance(real, (tuple, list)) else [real]
    fake_list = list(fake) if isinstance(fake, (tuple, list)) else [fake]
    assert [(t.shape, t.stride(), t.dtype) for t in real_list] == [(t.shape, t.stride(), t.dtype) for t in fake_list]


def test_a_wrong_shape_raises_torchs_error_at_trace_time() -> None:
    """Under torch.compile the fake implementation checks the call as torch's function would."""
    with pytest.raises(Exception, match=r"normalized_shape|expected input"):
        torch.compile(lambda x: ops.layer_norm(x, [8], None, None, 1e-5), backend="aot_eager", fullgraph=True)(
            rand(3, 16)
        )
    with pytest.raises(Exception, match=r"shapes cannot be multiplied|same reduction dim|mat1"):
        torch.compile(lambda x, w: ops.linear(x, w, None, None), backend="aot_eager", fullgraph=True)(
            rand(3, 16), rand(8, 12)
        )


def test_an_unknown_activation_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'tanh' is not one of"):
        ops.linear(rand(3, 16), rand(8, 16), None, "tanh")


def test_keyword_arguments_reach_the_operators_as_the_schema_orders_them() -> None:
    x, w = rand(3, 16), rand(16)
    torch.testing.assert_close(
        ops.layer_norm(x, [16], weight=w, bias=None, eps=1e-5), F.layer_norm(x, [16], w, None, 1e-5)
    )
    compiled = torch.compile(
        lambda x, w: ops.rms_norm_train(input=x, normalized_shape=[16], weight=w, eps=None)[0],
        backend="aot_eager",
        fullgraph=True,
    )
    torch.testing.assert_close(compiled(x, w), F.rms_norm(x, [16], w))

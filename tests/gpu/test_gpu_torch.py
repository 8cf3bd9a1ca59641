"""plancache.torch on a real GPU, its plans from the session's server: each
operator passes torch.library.opcheck on CUDA tensors while served (no
torch fallback), served gradients against torch autograd in float32, and
unchanged models (a transformer block written with torch.nn, torchvision's
ResNet-50, transformers' GPT-2 and Llama) under `plancache.torch.mode()`:
eager, torch.compile(fullgraph=True) and mode="reduce-overhead", their
losses, outputs and gradients against the same model without plancache,
the routed calls served by plancache's plans."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.gpu.functional_helpers import _t, randn, rel_err

pytestmark = pytest.mark.gpu

TOLERANCE = {"float16": 2e-2, "bfloat16": 5e-2}


@pytest.fixture
def pt(pf: Any) -> Any:
    import plancache.torch

    plancache.torch.clear_stats()
    return plancache.torch


def served_since(pf: Any, before: dict[str, Any], function: str) -> tuple[int, int]:
    """(cudnn, torch) calls of `function` since `before` (plancache.functional.stats())."""
    now, then = pf.stats().get(function), before.get(function)
    return (
        (now.cudnn if now else 0) - (then.cudnn if then else 0),
        (now.torch if now else 0) - (then.torch if then else 0),
    )


def cases(dtype: str) -> dict[str, tuple[str, Callable[[], tuple[Any, tuple[Any, ...]]]]]:
    """Operator cases on CUDA: (plancache.functional's function counted, (operator, arguments))."""
    torch = _t()
    ops = torch.ops.plancache

    def r(*shape: int, grad: bool = False, last: bool = False) -> Any:
        t = randn(*shape, dtype=dtype, scale=0.5)
        if last:
            t = t.to(memory_format=torch.channels_last)
        return t.requires_grad_(grad)

    def f32(*shape: int, grad: bool = False, positive: bool = False) -> Any:
        t = torch.rand(*shape, device="cuda") + 0.5 if positive else torch.randn(*shape, device="cuda")
        return t.requires_grad_(grad)

    return {
        # A half BatchNorm2d as torch's mixed precision leaves it: float32 parameters and statistics.
        "batch_norm": (
            "batch_norm",
            lambda: (
                ops.batch_norm,
                (r(8, 64, 28, 28, last=True), f32(64), f32(64), f32(64), f32(64, positive=True), 1e-5),
            ),
        ),
        "batch_norm_train": (
            "batch_norm",
            lambda: (
                ops.batch_norm_train,
                (
                    r(8, 64, 28, 28, last=True).requires_grad_(),
                    f32(64, grad=True),
                    f32(64, grad=True),
                    f32(64),
                    f32(64, positive=True),
                    0.1,
                    1e-5,
                ),
            ),
        ),
        "layer_norm": ("layer_norm", lambda: (ops.layer_norm, (r(4, 64, 256), [256], r(256), r(256), 1e-5))),
        "layer_norm_train": (
            "layer_norm",
            lambda: (
                ops.layer_norm_train,
                (r(4, 64, 256, grad=True), [256], r(256, grad=True), r(256, grad=True), 1e-5),
            ),
        ),
        "rms_norm_train": (
            "rms_norm",
            lambda: (ops.rms_norm_train, (r(4, 64, 256, grad=True), [256], r(256, grad=True), 1e-6)),
        ),
        "linear": ("linear", lambda: (ops.linear, (r(4, 64, 256), r(512, 256), r(512), "gelu"))),
        "linear_train": (
            "linear",
            lambda: (ops.linear_train, (r(4, 64, 256, grad=True), r(512, 256, grad=True), r(512, grad=True), None)),
        ),
        "linear_train gelu": (
            "linear",
            lambda: (ops.linear_train, (r(256, 256, grad=True), r(512, 256, grad=True), None, "gelu")),
        ),
        "sdpa": (
            "scaled_dot_product_attention",
            lambda: (ops.sdpa, (r(2, 8, 128, 64), r(2, 8, 128, 64), r(2, 8, 128, 64), None, True, None, False)),
        ),
        "sdpa_train gqa BSHD": (
            "scaled_dot_product_attention",
            lambda: (
                ops.sdpa_train,
                (
                    r(2, 128, 8, 64).transpose(1, 2).detach().requires_grad_(),
                    r(2, 128, 2, 64).transpose(1, 2).detach().requires_grad_(),
                    r(2, 128, 2, 64).transpose(1, 2).detach().requires_grad_(),
                    None,
                    True,
                    None,
                    True,
                ),
            ),
        ),
        "conv2d_train channels-last": (
            "conv2d",
            lambda: (
                ops.conv2d_train,
                (
                    r(8, 64, 28, 28, last=True).requires_grad_(),
                    r(64, 64, 3, 3, last=True).requires_grad_(),
                    None,
                    [1, 1],
                    [1, 1],
                    [1, 1],
                    1,
                    False,
                ),
            ),
        ),
    }


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_operator_passes_opcheck_served(pf: Any, pt: Any, dtype: str) -> None:
    """torch's own checks of each operator on CUDA tensors, and every call served by a plan (none left to torch) but
    batch_norm's evaluation, which cuDNN builds no engine for (run 35): torch's, counted."""
    torch = _t()
    failures = {}
    for name, (function, make) in cases(dtype).items():
        before = pf.stats()
        op, args = make()
        results = torch.library.opcheck(op, args)
        cudnn, by_torch = served_since(pf, before, function)
        # batch_norm is evaluation: cuDNN proposes no engine for its graph (GPU run 35): torch's, counted.
        by_cudnn = name != "batch_norm"
        as_expected = (cudnn > 0 and not by_torch) if by_cudnn else (by_torch > 0 and not cudnn)
        if set(results.values()) != {"SUCCESS"} or not as_expected:
            failures[name] = (results, {"cudnn": cudnn, "torch": by_torch}, pf.stats().get(function))
    assert not failures, failures


def grads_against_float32(
    ours: Callable[..., Any], reference: Callable[..., Any], inputs: list[Any]
) -> dict[str, float]:
    """Relative errors of `ours` (output, each gradient) against `reference` run in float32 on float32 copies."""
    torch = _t()
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = ours(*leaves)
    dy = torch.randn_like(out, dtype=torch.float32).to(out.dtype)
    out.backward(dy)
    copies = [t.detach().float().requires_grad_(t.requires_grad) for t in inputs]
    expected = reference(*copies)
    expected.backward(dy.float())
    errors = {"output": rel_err(out, expected)}
    for i, (leaf, copy) in enumerate(zip(leaves, copies, strict=True)):
        if leaf.requires_grad:
            errors[f"grad {i}"] = rel_err(leaf.grad, copy.grad)
    return errors


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_served_training_operators_give_torchs_gradients(pf: Any, pt: Any, dtype: str) -> None:
    torch = _t()
    fn = torch.nn.functional
    ops = torch.ops.plancache

    def r(*shape: int) -> Any:
        return randn(*shape, dtype=dtype, scale=0.5).requires_grad_()

    checks = {
        "layer_norm": (
            lambda x, w, b: ops.layer_norm_train(x, [256], w, b, 1e-5)[0],
            lambda x, w, b: fn.layer_norm(x, [256], w, b, 1e-5),
            [r(4, 64, 256), r(256), r(256)],
        ),
        "rms_norm": (
            lambda x, w: ops.rms_norm_train(x, [256], w, 1e-6)[0],
            lambda x, w: fn.rms_norm(x, [256], w, 1e-6),
            [r(4, 64, 256), r(256)],
        ),
        "linear": (
            lambda x, w, b: ops.linear_train(x, w, b, "gelu")[0],
            lambda x, w, b: fn.gelu(fn.linear(x, w, b)),
            [r(4, 64, 256), r(512, 256), r(512)],
        ),
        "scaled_dot_product_attention": (
            lambda q, k, v: ops.sdpa_train(q, k, v, None, True, None, False)[0],
            lambda q, k, v: fn.scaled_dot_product_attention(q, k, v, is_causal=True),
            [r(2, 8, 128, 64), r(2, 8, 128, 64), r(2, 8, 128, 64)],
        ),
    }
    worst = {}
    for function, (ours, reference, inputs) in checks.items():
        before = pf.stats()
        errors = grads_against_float32(ours, reference, inputs)
        _, by_torch = served_since(pf, before, function)
        backward_cudnn, backward_torch = served_since(pf, before, f"{function}.backward")
        worst[function] = (max(errors.values()), by_torch, backward_cudnn, backward_torch)
    assert all(w < TOLERANCE[dtype] and t == 0 and bc > 0 and bt == 0 for w, t, bc, bt in worst.values()), worst


def block(torch: Any, hidden: int = 512, heads: int = 8) -> Any:
    nn, functional = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x: Any) -> Any:
            b, s, h = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, h // heads).unbind(2)
            a = functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            return x + self.down(functional.gelu(self.up(self.norm2(x))))

    return Block


def train_step(model: Any, x: Any, fn: Any = None) -> tuple[Any, list[Any]]:
    model.zero_grad(set_to_none=True)
    loss = (model if fn is None else fn)(x).float().pow(2).mean()
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def worst_grad(a: list[Any], b: list[Any]) -> float:
    return max(rel_err(g, r) for g, r in zip(a, b, strict=True))


@pytest.mark.parametrize("compile_mode", [None, "default", "reduce-overhead"])
def test_an_unchanged_block_trains_under_the_mode_eager_and_compiled(
    pf: Any, pt: Any, compile_mode: str | None
) -> None:
    """Loss and gradients of the plain torch.nn block with the mode against without it, in the same mode of running;
    the routed functions served (forward and backward plans), nothing left to torch."""
    torch = _t()
    torch.manual_seed(0)
    model = block(torch)().cuda().bfloat16()
    x = torch.randn(4, 256, 512, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    fn = None if compile_mode is None else torch.compile(model, fullgraph=True, mode=compile_mode)
    expected = train_step(model, x, fn)
    torch._dynamo.reset()
    fn = None if compile_mode is None else torch.compile(model, fullgraph=True, mode=compile_mode)
    before = pf.stats()
    with pt.mode():
        for _ in range(3):  # warm-up, CUDA graph recording and replay
            got = train_step(model, x, fn)
    assert rel_err(got[0], expected[0]) < TOLERANCE["bfloat16"]
    assert worst_grad(got[1], expected[1]) < TOLERANCE["bfloat16"]
    for function in ("layer_norm", "linear", "scaled_dot_product_attention"):
        cudnn, by_torch = served_since(pf, before, function)
        backward, backward_torch = served_since(pf, before, f"{function}.backward")
        assert cudnn > 0 and by_torch == backward_torch == 0 and backward > 0, (function, pt.stats().get(function))


@pytest.mark.parametrize("compile_mode", [None, "default"])
def test_a_served_block_trains_as_torchs_its_layers_served(pf: Any, pt: Any, compile_mode: str | None) -> None:
    """plancache.torch.serve(model): the block's own layers (its layer norms and linears) run served plans forward
    and backward, eager and compiled; its attention, a call of its own, is torch's; loss and gradients torch's."""
    import copy

    torch = _t()
    torch.manual_seed(0)
    model = block(torch)().cuda().bfloat16()
    x = torch.randn(4, 256, 512, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    expected = train_step(model, x, None if compile_mode is None else torch.compile(model, fullgraph=True))
    served = pt.serve(copy.deepcopy(model))
    torch._dynamo.reset()
    fn = None if compile_mode is None else torch.compile(served, fullgraph=True)
    before = pf.stats()
    for _ in range(2):
        got = train_step(served, x, fn)
    assert rel_err(got[0], expected[0]) < TOLERANCE["bfloat16"]
    assert worst_grad(got[1], expected[1]) < TOLERANCE["bfloat16"]
    for function in ("layer_norm", "linear"):
        cudnn, by_torch = served_since(pf, before, function)
        backward, _ = served_since(pf, before, f"{function}.backward")
        assert cudnn > 0 and by_torch == 0 and backward > 0, (function, pt.stats().get(function))
    assert served_since(pf, before, "scaled_dot_product_attention") == (0, 0)


def test_torchvision_resnet50_inference_channels_last(pf: Any, pt: Any) -> None:
    torch = _t()
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().half().to(memory_format=torch.channels_last).eval()
    x = torch.randn(8, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = model(x)
        before = pf.stats()
        with pt.mode():
            got = model(x)
        compiled = torch.compile(model, fullgraph=True)
        with pt.mode():
            got_compiled = compiled(x)
    assert rel_err(got, expected) < TOLERANCE["float16"] and rel_err(got_compiled, expected) < TOLERANCE["float16"]
    stats = pt.stats()
    assert stats["conv2d"].routed == 53 and served_since(pf, before, "conv2d")[0] > 0, stats["conv2d"]
    # batch_norm: routed eager, where plancache.functional gives its float16 statistics to torch (it serves
    # float32 ones, as torch's mixed precision leaves them); compiled, left to torch for them at trace time.
    cudnn, by_torch = served_since(pf, before, "batch_norm")
    assert stats["batch_norm"].routed == 53 and cudnn == 0 and by_torch > 0, stats
    assert stats["linear"].routed == 1, stats


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_an_unchanged_batch_norm_is_served_with_torchs_running_statistics(
    pf: Any, pt: Any, dtype: str, compiled: bool
) -> None:
    """A BatchNorm2d as torch's mixed precision leaves it (float32 parameters and statistics) over a half
    channels-last input: under the mode, training then evaluation, its output, gradients and running
    statistics against torch's, its forward and backward served. Eager, plancache.functional.batch_norm
    updates the statistics in place; compiled (fullgraph), plancache::batch_norm_train returns the next ones
    and the compiled program copies them into the module's buffers; evaluation, compiled, is torch's (traced)."""
    torch = _t()
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(64).cuda()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-0.5, 0.5)
    reference = torch.nn.BatchNorm2d(64).cuda()
    reference.load_state_dict(bn.state_dict())
    x = randn(8, 64, 28, 28, dtype=dtype).contiguous(memory_format=torch.channels_last).requires_grad_()
    # A random weighting: the mean square of a normalized output is constant per channel (its input gradient 0).
    weighting = torch.randn(8, 64, 28, 28, device="cuda")
    expected = reference(x)
    (expected.float() * weighting).mean().backward()
    expected_grads = [x.grad.clone(), reference.weight.grad, reference.bias.grad]
    x.grad = None
    torch._dynamo.reset()
    run = torch.compile(bn, fullgraph=True) if compiled else bn
    before = pf.stats()
    with pt.mode():
        got = run(x)
    (got.float() * weighting).mean().backward()
    tolerance = TOLERANCE[dtype]
    assert rel_err(got, expected) < tolerance
    for ours, theirs in zip([x.grad, bn.weight.grad, bn.bias.grad], expected_grads, strict=True):
        assert rel_err(ours, theirs) < tolerance
    assert rel_err(bn.running_mean, reference.running_mean) < 1e-2
    assert rel_err(bn.running_var, reference.running_var) < 1e-2
    backward = served_since(pf, before, "batch_norm.backward")
    assert served_since(pf, before, "batch_norm") == (1, 0) and backward[0] > 0 and not backward[1], pf.stats()
    bn.eval(), reference.eval()
    if compiled:
        from plancache.torch._mode import EVALUATION_BATCH_NORM_COMPILED, LEFT_COMPILED

        # Recorded once a process, as a program is traced: an earlier test's trace may have left it (GPU run 37).
        LEFT_COMPILED.discard(("batch_norm", EVALUATION_BATCH_NORM_COMPILED))
    with torch.no_grad():
        evaluated = reference(x)
        before = pf.stats()
        with pt.mode():
            assert rel_err(run(x), evaluated) < tolerance
    if compiled:
        # Evaluation under compile: torch's batch norm, traced (inductor fuses it), the reason recorded by this
        # trace (other reasons other programs of the process left are listed beside it).
        assert served_since(pf, before, "batch_norm") == (0, 0), pf.stats()
        assert EVALUATION_BATCH_NORM_COMPILED in pt.stats()["batch_norm"].left_compiled, pt.stats()
    else:
        # Eager evaluation: cuDNN proposes no engine for this batchnorm inference graph (GPU run 35: "No valid
        # engine configs"), so torch's batch norm runs it, with the same result (above), counted with the reason.
        assert served_since(pf, before, "batch_norm") == (0, 1), pf.stats()
        reasons = pf.stats()["batch_norm"].reasons
        assert any("No valid engine" in reason for reason in reasons), pf.stats()["batch_norm"]
        assert pt.stats()["batch_norm"].routed == 2 and not pt.stats()["batch_norm"].left


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_boolean_mask_is_served_as_cudnns_bias_with_torchs_results(pf: Any, pt: Any, compiled: bool) -> None:
    """A boolean causal mask with padding (what transformers passes SDPA under torch.compile): served as cuDNN's
    bias, forward and backward, with torch's values and gradients. Every query sees some key here: for one that
    sees none, torch's CUDA kernels do not give the 0 its math backend gives (GPU run 35), and plancache gives 0
    (scripts/bool_mask_probe.py prints each backend's answer)."""
    torch = _t()
    torch.manual_seed(0)
    b, h, s, d = 2, 8, 128, 64
    mask = torch.ones(s, s, dtype=torch.bool, device="cuda").tril().expand(b, 1, s, s).clone()
    mask[1, :, 16:, :16] = False  # sequence 1's later queries do not see its first 16 keys
    q, k, v = (randn(b, h, s, d, dtype="bfloat16").requires_grad_() for _ in range(3))

    def attend(q: Any, k: Any, v: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    expected = attend(q, k, v)
    weighting = torch.randn(b, h, s, d, device="cuda")
    expected_grads = torch.autograd.grad((expected.float() * weighting).sum(), (q, k, v))
    torch._dynamo.reset()
    run = torch.compile(attend, fullgraph=True) if compiled else attend
    before = pf.stats()
    with pt.mode():
        got = run(q, k, v)
    grads = torch.autograd.grad((got.float() * weighting).sum(), (q, k, v))
    assert rel_err(got, expected) < TOLERANCE["bfloat16"]
    for ours, theirs in zip(grads, expected_grads, strict=True):
        assert rel_err(ours, theirs) < TOLERANCE["bfloat16"]
    forward = served_since(pf, before, "scaled_dot_product_attention")
    backward = served_since(pf, before, "scaled_dot_product_attention.backward")
    assert forward[0] > 0 and not forward[1] and backward[0] > 0 and not backward[1], pf.stats()
    assert not pt.stats().get("scaled_dot_product_attention") or not pt.stats()["scaled_dot_product_attention"].left


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_transformers_models_train_under_the_mode(pf: Any, pt: Any, family: str, compiled: bool) -> None:
    torch = _t()
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=1024, attn_implementation="sdpa")
        config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1024,
            attn_implementation="sdpa",
        )
        model = transformers.LlamaForCausalLM(config)
    model = model.cuda().bfloat16().train()
    ids = torch.randint(0, 1024, (2, 128), device="cuda")

    def step() -> tuple[Any, list[Any]]:
        # Compiled, transformers passes SDPA a boolean causal mask (it cannot look at the mask's values to
        # leave it out): served as cuDNN's bias.
        torch._dynamo.reset()
        run = torch.compile(model) if compiled else model
        model.zero_grad(set_to_none=True)
        loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]

    expected = step()
    before = pf.stats()
    with pt.mode():
        got = step()
    assert rel_err(got[0], expected[0]) < TOLERANCE["bfloat16"]
    assert worst_grad(got[1], expected[1]) < 2 * TOLERANCE["bfloat16"]
    stats = pt.stats()
    if not compiled:  # a compiled program's calls are not the mode's to count (plancache.functional counts them)
        assert stats["linear"].routed > 0 and stats["scaled_dot_product_attention"].routed > 0, stats
    else:
        attention = stats.get("scaled_dot_product_attention")
        assert attention is None or not attention.left_compiled, stats
    assert served_since(pf, before, "linear")[0] > 0 and served_since(pf, before, "scaled_dot_product_attention")[0] > 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_what_torchs_forward_saves_is_what_a_served_forward_writes(pf: Any, pt: Any, dtype: str) -> None:
    """A forward torch ran (its plans were away) may meet a backward a plan runs: the saved outputs must mean the
    same. cuDNN's statistics against torch's (plancache.torch._torch_math), and the served backward from either."""
    torch = _t()
    from plancache.torch import _torch_math as tm

    ops = torch.ops.plancache
    x, w, b = randn(8, 128, 256, dtype=dtype), randn(256, dtype=dtype), randn(256, dtype=dtype)
    served = ops.layer_norm_train(x, [256], w, b, 1e-5)
    by_torch = tm.layer_norm_train(x, [256], w, b, 1e-5)
    assert rel_err(served[1], by_torch[1]) < 1e-3 and rel_err(served[2], by_torch[2]) < 1e-3
    served = ops.rms_norm_train(x, [256], w, 1e-6)
    assert rel_err(served[1], tm.rms_norm_train(x, [256], w, 1e-6)[1]) < 1e-3
    q, k, v = (randn(2, 8, 256, 64, dtype=dtype) for _ in range(3))
    out, stats = ops.sdpa_train(q, k, v, None, True, None, False)
    torch_out, lse = tm.sdpa_train(q, k, v, None, True, None, False, train=True)
    assert stats.shape == lse.shape and rel_err(stats, lse) < 1e-3, (stats.flatten()[:4], lse.flatten()[:4])
    dy = randn(2, 8, 256, 64, dtype=dtype)
    before = pf.stats()
    from_served = ops.sdpa_backward(dy, q, k, v, None, True, None, False, out, stats, [True, True, True])
    from_torch = ops.sdpa_backward(dy, q, k, v, None, True, None, False, torch_out, lse, [True, True, True])
    assert served_since(pf, before, "scaled_dot_product_attention.backward")[0] == 2
    for ours, theirs in zip(from_torch, from_served, strict=True):
        assert rel_err(ours, theirs) < TOLERANCE[dtype]

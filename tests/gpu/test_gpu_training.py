"""plancache.functional's autograd on a real GPU, its plans (forward and
backward) from the session's server: every differentiable function's
output and gradients against torch autograd in float32 for float16 and
bfloat16, each backward served (no torch fallback), dropout's gradient
against the mask cuDNN drew (read back through an identity V), batch
norm's running statistics, torch.compile and CUDA graph capture of a
training step, what torch refuses (a double backward, a second backward,
a saved tensor modified in place) refused the same way, and the two
training examples against torch eager."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.functional_helpers import _t, randn, rel_err
from tests.support.processes import REPO, trusting_env

pytestmark = pytest.mark.gpu

# max |ours - reference| / max |reference|, the reference torch autograd in float32.
TOLERANCE = {"float16": 2e-2, "bfloat16": 5e-2}
DTYPES = ("float16", "bfloat16")


def check_grads(
    pf: Any, function: str, ours: Callable[..., Any], reference: Callable[..., Any], inputs: list[Any], dtype: str
) -> list[Any]:
    """`ours(*inputs)` and its gradients (for a random dY) against
    `reference` in float32 on float32 copies; the backward served.

    Each error must be under TOLERANCE or, where torch's own run of
    `reference` in the same low precision is further from float32 than that
    (a ReLU whose input rounds across 0 flips a whole term of dX), within
    twice torch's own error."""
    torch = _t()
    before, before_forward = pf.stats().get(f"{function}.backward"), pf.stats().get(function)
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = ours(*leaves)
    dy = torch.randn_like(out, dtype=torch.float32).to(out.dtype)
    out.backward(dy)
    runs = {}
    for name, cast in (("float32", lambda t: t.float()), ("torch low precision", lambda t: t)):
        copies = [cast(t.detach()).requires_grad_(t.requires_grad) if t.is_floating_point() else t for t in inputs]
        result = reference(*copies)
        result.backward(dy.to(result.dtype))
        runs[name] = (result, copies)
    torch.cuda.synchronize()
    (expected, refs), (theirs, lows) = runs["float32"], runs["torch low precision"]
    errors = {"output": (rel_err(out, expected), rel_err(theirs, expected))}
    for index, (leaf, ref, low) in enumerate(zip(leaves, refs, lows, strict=True)):
        if leaf.requires_grad:
            assert leaf.grad is not None and leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype, index
            errors[f"grad {index}"] = (rel_err(leaf.grad, ref.grad), rel_err(low.grad, ref.grad))
    beyond = {k: v for k, v in errors.items() if v[0] >= max(TOLERANCE[dtype], 2 * v[1])}
    assert not beyond, (
        f"{function} {dtype}: relative errors (ours, torch's own) {errors} "
        f"(limit {TOLERANCE[dtype]:g} or twice torch's)"
    )
    after, after_forward = pf.stats()[f"{function}.backward"], pf.stats()[function]
    assert after.cudnn > (before.cudnn if before else 0), after
    assert after_forward.torch == (before_forward.torch if before_forward else 0), after_forward
    return [leaf.grad for leaf in leaves]


def grad(t: Any) -> Any:
    return t.requires_grad_(True)


# ---- each function --------------------------------------------------------------------


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gradients(pf: Any, dtype: str, activation: str | None) -> None:
    torch = _t()

    def reference(x: Any, w: Any, b: Any) -> Any:
        y = torch.nn.functional.linear(x, w, b)
        return y if activation is None else getattr(torch.nn.functional, activation)(y)

    inputs = [
        grad(randn(4, 64, 256, dtype=dtype)),
        grad(randn(512, 256, dtype=dtype, scale=1 / 16)),
        grad(randn(512, dtype=dtype, scale=0.1)),
    ]
    check_grads(pf, "linear", lambda x, w, b: pf.linear(x, w, b, activation=activation), reference, inputs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_without_bias_and_a_frozen_input(pf: Any, dtype: str) -> None:
    torch = _t()
    x, w = (
        randn(64, 256, dtype=dtype),
        grad(randn(128, 256, dtype=dtype, scale=1 / 16)),
    )  # the first layer: x needs no gradient
    grads = check_grads(pf, "linear", pf.linear, torch.nn.functional.linear, [x, w], dtype)
    assert grads[0] is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_gradients(pf: Any, dtype: str) -> None:
    torch = _t()
    x, w, b = (
        grad(randn(8, 128, 1024, dtype=dtype)),
        grad(1 + randn(1024, dtype=dtype, scale=0.1)),
        grad(randn(1024, dtype=dtype, scale=0.1)),
    )
    check_grads(
        pf,
        "layer_norm",
        lambda x, w, b: pf.layer_norm(x, (1024,), w, b),
        lambda x, w, b: torch.nn.functional.layer_norm(x, (1024,), w, b),
        [x, w, b],
        dtype,
    )
    check_grads(
        pf,
        "rms_norm",
        lambda x, w: pf.rms_norm(x, (1024,), w, 1e-5),
        lambda x, w: torch.nn.functional.rms_norm(x, (1024,), w, 1e-5),
        [x, w],
        dtype,
    )
    check_grads(
        pf,
        "rms_norm",
        lambda x: pf.rms_norm(x, 1024, None, 1e-5),
        lambda x: torch.nn.functional.rms_norm(x, (1024,), None, 1e-5),
        [x],
        dtype,
    )


ATTENTION_CASES = {
    "causal": ({"is_causal": True}, (2, 8, 256, 64), 8),
    "gqa": ({"is_causal": True, "enable_gqa": True}, (2, 8, 256, 64), 2),
    "sliding-window": ({"is_causal": True, "sliding_window": 64}, (2, 4, 256, 64), 4),
    "head-dim-128": ({}, (2, 4, 128, 128), 4),
}


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_gradients(pf: Any, dtype: str, case: str) -> None:
    from plancache.functional import _attention

    options, (b, h, s, d), kv_heads = ATTENTION_CASES[case]
    q, k, v = (
        grad(randn(b, h, s, d, dtype=dtype)),
        grad(randn(b, kv_heads, s, d, dtype=dtype)),
        grad(randn(b, kv_heads, s, d, dtype=dtype)),
    )

    def reference(q: Any, k: Any, v: Any) -> Any:
        return _attention.torch_scaled_dot_product_attention(q, k, v, **options)

    check_grads(
        pf,
        "scaled_dot_product_attention",
        lambda q, k, v: pf.scaled_dot_product_attention(q, k, v, **options),
        reference,
        [q, k, v],
        dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_gradients_through_a_fused_projection_a_bias_and_padding(pf: Any, dtype: str) -> None:
    """q, k, v as BSHD views of one [b, s, 3, h, d] projection; a float bias that requires grad (dBias); key padding."""
    torch = _t()
    from plancache.functional import _attention

    b, s, h, d = 2, 128, 4, 64
    qkv = grad(randn(b, s, 3, h, d, dtype=dtype))
    bias = grad(randn(1, h, s, s, dtype=dtype, scale=0.5))

    def ours(qkv: Any, bias: Any) -> Any:
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        return pf.scaled_dot_product_attention(q, k, v, bias)

    def reference(qkv: Any, bias: Any) -> Any:
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        return _attention.torch_scaled_dot_product_attention(q, k, v, bias)

    check_grads(pf, "scaled_dot_product_attention", ours, reference, [qkv, bias], dtype)
    lengths = torch.tensor([s, s // 2], dtype=torch.int32, device="cuda")
    q, k, v = (grad(randn(b, h, s, d, dtype=dtype)) for _ in range(3))
    check_grads(
        pf,
        "scaled_dot_product_attention",
        lambda q, k, v: pf.scaled_dot_product_attention(q, k, v, seq_len_kv=lengths),
        lambda q, k, v: _attention.torch_scaled_dot_product_attention(q, k, v, seq_len_kv=lengths),
        [q, k, v],
        dtype,
    )


def test_sdpa_dropout_gradients_match_the_mask_cudnn_drew(pf: Any) -> None:
    """The mask is read back from the same geometry with V the identity (O = dropout(P) / (1 - p));
    the gradients then equal float32 autograd through that mask."""
    torch = _t()
    b, h, s, p = 1, 4, 64, 0.2
    q, k = randn(b, h, s, s, dtype="bfloat16"), randn(b, h, s, s, dtype="bfloat16")
    identity = torch.eye(s, device="cuda", dtype=torch.bfloat16).expand(b, h, s, s).contiguous()
    torch.manual_seed(1234)
    revealed = pf.scaled_dot_product_attention(grad(q.clone()), grad(k.clone()), grad(identity.clone()), dropout_p=p)
    keep = revealed.detach().float() != 0
    assert 0.7 < float(keep.float().mean()) < 0.9, float(keep.float().mean())  # about 1 - p kept
    v = grad(randn(b, h, s, s, dtype="bfloat16"))

    def ours(q: Any, k: Any, v: Any) -> Any:
        torch.manual_seed(1234)  # the same seed: the same mask
        return pf.scaled_dot_product_attention(q, k, v, dropout_p=p)

    def reference(q: Any, k: Any, v: Any) -> Any:
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(s), dim=-1)
        return (weights * keep / (1 - p)) @ v

    check_grads(pf, "scaled_dot_product_attention", ours, reference, [grad(q), grad(k), v], "bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv2d_gradients(pf: Any, dtype: str) -> None:
    """Channels-last (what cuDNN trains on; torch's own cuDNN path prefers it too)."""
    torch = _t()
    fmt = torch.channels_last
    x = grad(randn(8, 32, 16, 16, dtype=dtype).contiguous(memory_format=fmt))
    w = grad(randn(64, 32, 3, 3, dtype=dtype, scale=1 / 17).contiguous(memory_format=fmt))
    b = grad(randn(64, dtype=dtype, scale=0.1))
    for stride, relu in ((1, True), (2, False)):

        def reference(x: Any, w: Any, b: Any, stride: int = stride, relu: bool = relu) -> Any:
            y = torch.nn.functional.conv2d(x, w, b, stride, 1)
            return torch.relu(y) if relu else y

        check_grads(
            pf,
            "conv2d",
            lambda x, w, b, stride=stride, relu=relu: pf.conv2d(x, w, b, stride, 1, relu=relu),
            reference,
            [x, w, b],
            dtype,
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_training_gradients_and_running_statistics(pf: Any, dtype: str) -> None:
    torch = _t()
    x = grad(randn(8, 32, 16, 16, dtype=dtype).contiguous(memory_format=torch.channels_last))
    w, b = grad(1 + torch.randn(32, device="cuda") * 0.1), grad(torch.randn(32, device="cuda") * 0.1)
    mean, var = torch.randn(32, device="cuda") * 0.1, 1 + torch.rand(32, device="cuda")
    ours_mean, ours_var, ref_mean, ref_var = mean.clone(), var.clone(), mean.clone(), var.clone()
    check_grads(
        pf,
        "batch_norm",
        lambda x, w, b: pf.batch_norm(x, ours_mean, ours_var, w, b, training=True, momentum=0.1, eps=1e-5),
        lambda x, w, b: torch.nn.functional.batch_norm(
            x, mean.clone(), var.clone(), w, b, training=True, momentum=0.1, eps=1e-5
        ),
        [x, w, b],
        dtype,
    )
    torch.nn.functional.batch_norm(
        x.detach().float(), ref_mean, ref_var, w.detach(), b.detach(), training=True, momentum=0.1, eps=1e-5
    )  # one update
    assert rel_err(ours_mean, ref_mean) < 1e-2 and rel_err(ours_var, ref_var) < 1e-2, (
        ours_mean,
        ref_mean,
        ours_var,
        ref_var,
    )  # torch's update: unbiased variance
    with torch.no_grad():
        y = pf.batch_norm(x, ours_mean, ours_var, w, b, training=False, eps=1e-5)
        expected = torch.nn.functional.batch_norm(x.float(), ours_mean, ours_var, w, b, training=False, eps=1e-5)
    assert rel_err(y, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv2d_training_in_nchw_is_torchs_with_the_reason(pf: Any, dtype: str, gpu_session: dict[str, Any]) -> None:
    """GPU run 22: cuDNN proposes no engine for a graph of an NCHW training
    convolution's backward on the H200; the geometry is torch's, forward and
    backward, its reason counted, the gradients torch's."""
    torch = _t()
    x, w = grad(randn(8, 32, 16, 16, dtype=dtype)), grad(randn(64, 32, 3, 3, dtype=dtype, scale=1 / 17))
    before = pf.stats().get("conv2d")
    y = pf.conv2d(x, w, None, 1, 1)
    y.float().sum().backward()
    after = pf.stats()["conv2d"]
    reasons = {r: n for r, n in after.reasons.items() if not before or before.reasons.get(r) != n}
    (gpu_session["out"] / f"conv2d_nchw_training_{dtype}.log").write_text(repr(after))
    expected = torch.nn.functional.conv2d(x.detach().float().requires_grad_(True), w.detach().float(), None, 1, 1)
    assert rel_err(y, expected) < TOLERANCE[dtype] and x.grad is not None and w.grad is not None
    if after.torch > (before.torch if before else 0):
        assert reasons and all("cuDNN" in r or "no engine" in r for r in reasons), reasons


# ---- what torch refuses, refused the same way -------------------------------------------


def test_a_double_backward_is_refused(pf: Any) -> None:
    torch = _t()
    x, w = grad(randn(16, 64, dtype="bfloat16")), grad(randn(32, 64, dtype="bfloat16"))
    (dx,) = torch.autograd.grad(pf.linear(x, w, activation="gelu").float().pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked with @once_differentiable"):
        dx.float().sum().backward()


def test_a_second_backward_and_a_modified_saved_input_raise_torchs_errors(pf: Any) -> None:
    torch = _t()
    x, w = grad(randn(16, 64, dtype="bfloat16")), grad(randn(32, 64, dtype="bfloat16"))
    loss = pf.rms_norm(pf.linear(x, w), 32).float().sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        loss.backward()
    hidden = x * 1  # not a leaf: may be modified in place
    y = pf.linear(hidden, w)
    hidden.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.float().sum().backward()
    lengths = torch.tensor([8, 8], dtype=torch.int32, device="cuda")
    q = grad(randn(2, 4, 8, 64, dtype="bfloat16"))
    pf.scaled_dot_product_attention(
        q, q, q, seq_len_kv=lengths
    ).float().sum().backward()  # an integer input: no gradient, no error
    assert q.grad is not None and lengths.grad is None


# ---- a training step: torch.compile and CUDA graphs ---------------------------------------


def _block(pf: Any, params: dict[str, Any], x: Any) -> Any:
    b, s, h = x.shape
    y = pf.rms_norm(x, (h,), params["norm"])
    q, k, v = pf.linear(y, params["wqkv"]).view(b, s, 3, 4, h // 4).permute(2, 0, 3, 1, 4).unbind(0)
    attention = pf.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
    return x + pf.linear(attention, params["wo"], activation="gelu")


def _params() -> dict[str, Any]:
    return {
        "norm": grad(1 + randn(256, dtype="bfloat16", scale=0.1)),
        "wqkv": grad(randn(768, 256, dtype="bfloat16", scale=1 / 16)),
        "wo": grad(randn(256, 256, dtype="bfloat16", scale=1 / 16)),
    }


def test_torch_compile_of_a_training_step_gives_eagers_loss_and_gradients(pf: Any) -> None:
    torch = _t()
    params, x = _params(), randn(2, 128, 256, dtype="bfloat16")

    def step(x: Any) -> Any:
        loss = _block(pf, params, x).float().pow(2).mean()
        loss.backward()
        return loss

    eager_loss = step(x)
    eager = {n: p.grad.clone() for n, p in params.items()}
    for p in params.values():
        p.grad = None
    compiled_loss = torch.compile(step)(x)
    assert rel_err(compiled_loss, eager_loss) < 2e-2
    for name, p in params.items():
        assert rel_err(p.grad, eager[name]) < TOLERANCE["bfloat16"], name


def test_a_training_step_captured_as_a_cuda_graph_replays_eagers_gradients(pf: Any) -> None:
    torch = _t()
    params, static_x = _params(), randn(2, 128, 256, dtype="bfloat16")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # torch's warm-up: every geometry's first call (plans fetched, loaded) before capture
            for p in params.values():
                p.grad = None
            _block(pf, params, static_x).float().pow(2).mean().backward()
    torch.cuda.current_stream().wait_stream(side)
    for p in params.values():
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = _block(pf, params, static_x).float().pow(2).mean()
        static_loss.backward()
    new_x = randn(2, 128, 256, dtype="bfloat16")
    static_x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    replayed = {n: p.grad.clone() for n, p in params.items()}
    replayed_loss = static_loss.clone()
    eager_params = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    eager_loss = _block(pf, eager_params, new_x).float().pow(2).mean()
    eager_loss.backward()
    assert rel_err(replayed_loss, eager_loss) < 1e-3
    for name, p in eager_params.items():
        assert rel_err(replayed[name], p.grad) < 1e-2, name


# ---- the examples ---------------------------------------------------------------------------


@pytest.mark.parametrize("example", ["train_transformer_block", "train_resnet_block"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_training_examples_match_torch_eager(
    gpu_session: dict[str, Any], tmp_path: Path, example: str, dtype: str
) -> None:
    env = {
        **trusting_env(gpu_session["public_key"]),
        "PLANCACHE_CACHE_DIR": str(tmp_path / "cache"),
        "PLANCACHE_HEDGE": "0",
    }
    proc = subprocess.run(
        [
            sys.executable,
            f"examples/{example}.py",
            "--server",
            gpu_session["address"],
            "--dtype",
            dtype,
            "--require-cudnn",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    (gpu_session["out"] / f"{example}_{dtype}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        re.search(r"max rel error vs torch eager: loss [0-9.e+-]+; gradients", proc.stdout)
        and "loss decreased: True" in proc.stdout
    ), proc.stdout


def test_a_prefetched_process_trains_from_the_manifest_asking_nothing(
    pf: Any, gpu_session: dict[str, Any], tmp_path: Path
) -> None:
    """A run's manifest (forward and backward plans), prefetched by a new
    client with an empty disk cache: every plan fetched and deserialized on
    the prefetch's thread, no first call asks the service, and the step's
    gradients equal the first run's."""
    from plancache import Client
    from plancache.frontdoors.service import SERVICE
    from plancache.trust.disk_cache import DiskCache

    torch = _t()
    served_by = SERVICE.client()  # the module's client, configured again at the end
    x, w, b, g = (
        randn(4, 128, 256, dtype="bfloat16"),
        randn(512, 256, dtype="bfloat16", scale=256**-0.5),
        randn(512, dtype="bfloat16"),
        randn(256, dtype="bfloat16"),
    )

    def step() -> list[Any]:
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, b, g)]
        y = pf.rms_norm(leaves[0], (256,), leaves[3], 1e-5)
        q = pf.linear(y, leaves[1], leaves[2], activation="gelu").view(4, 128, 4, 128).transpose(1, 2)
        pf.scaled_dot_product_attention(q, q, q, is_causal=True).float().pow(2).mean().backward()
        torch.cuda.synchronize()
        return [t.grad for t in leaves]

    first = step()
    manifest = pf.manifest()
    assert {e.name for e in manifest.entries} >= {
        "rms_norm",
        "linear",
        "scaled_dot_product_attention",
        "rms_norm.backward",
        "linear.backward.dgrad",
        "linear.backward.wgrad",
        "scaled_dot_product_attention.backward",
    }
    manifest.save(tmp_path / "functions.json")
    pf.clear()
    client = Client(
        gpu_session["address"],
        trusted_keys=[gpu_session["public_key"]],
        allow_unsigned=False,
        cache=DiskCache(tmp_path / "cache"),
        hedge=False,
    )
    asked: list[Any] = []
    compile_ = client.compile
    client.compile = lambda query, *a, **k: (  # type: ignore[method-assign]
        asked.append(getattr(query, "spec", query).name) or compile_(query, *a, **k)  # a PlanQuery, or a spec
    )
    try:
        pf.configure(client)
        pf.set_race_torch(False)  # the plans are under test (conftest.py's pf)
        result = pf.prefetch(tmp_path / "functions.json").wait(timeout=120)
        assert result.failed == 0 and len(result.plans) == len(manifest.entries)
        again = step()
        # Only what is not in a manifest is asked for: a bias gradient cuDNN refuses (torch's sum runs it,
        # as in the first run).
        assert set(asked) <= {"plancache.functional.linear.backward"}, asked
        for ours, before in zip(again, first, strict=True):
            assert rel_err(ours, before) < 1e-2
    finally:
        pf.clear()
        pf.configure(served_by)
        pf.set_race_torch(False)
        client.close()

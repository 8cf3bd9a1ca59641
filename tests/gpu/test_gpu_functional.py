"""plancache.functional on a real GPU, its plans from the session's server:
every function against a float32 torch reference, for float16 and bfloat16
and two layouts each (contiguous, and a transposed or strided one), a
second call of the geometry served from the table, the options torch lacks
against references written out here, bad input raising torch's own error,
what cuDNN is not asked for running torch's function, and the example
decoder step against torch eager (examples/decoder_step.py)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plancache import InvalidRequest
from tests.gpu.functional_helpers import _t, randn, rel_err
from tests.support.processes import REPO, trusting_env

pytestmark = pytest.mark.gpu

# max |ours - reference| / max |reference|, the reference in float32.
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2}
DTYPES = ("float16", "bfloat16")
LAYOUTS = ("contiguous", "strided")


def check(
    pf: Any, function: str, ours: Callable[[], Any], reference: Callable[[], Any], dtype: str, *, served: bool = True
) -> Any:
    """`ours()` matches `reference()`; with `served`, a plan ran it and a
    second call (new tensors of the same geometry) found it in the table."""
    before = pf.stats().get(function)
    out = ours()
    _t().cuda.synchronize()
    error = rel_err(out, reference())
    assert error < TOLERANCE[dtype], f"{function} {dtype}: relative error {error:.2e} (limit {TOLERANCE[dtype]:g})"
    after = pf.stats()[function]
    if served:
        assert after.cudnn == (before.cudnn if before else 0) + 1, f"{function}: torch ran it ({after.reasons})"
        ours()
        again = pf.stats()[function]
        assert again.geometries == after.geometries and again.cudnn == after.cudnn + 1, again
    return out


# ---- matrices -----------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_with_bias_and_gelu(pf: Any, dtype: str, layout: str) -> None:
    nnf = _t().nn.functional
    if layout == "contiguous":
        x, w = randn(4, 64, 512, dtype=dtype), randn(768, 512, dtype=dtype, scale=0.05)
    else:  # rows of a wider buffer; the weight stored transposed (column-major)
        x = randn(256, 1024, dtype=dtype)[:, :512]
        w = randn(512, 768, dtype=dtype, scale=0.05).t()
    b = randn(768, dtype=dtype)
    check(
        pf,
        "linear",
        lambda: pf.linear(x, w, b, activation="gelu"),
        lambda: nnf.gelu(nnf.linear(x.float(), w.float(), b.float())),
        dtype,
    )


@pytest.mark.parametrize("activation", [None, "relu", "silu"])
def test_linear_activations_and_no_bias(pf: Any, activation: str | None) -> None:
    nnf = _t().nn.functional
    x, w = randn(128, 256, dtype="float16"), randn(384, 256, dtype="float16", scale=0.05)
    act = {None: lambda y: y, "relu": nnf.relu, "silu": nnf.silu}[activation]
    check(
        pf,
        "linear",
        lambda: pf.linear(x, w, activation=activation),
        lambda: act(nnf.linear(x.float(), w.float())),
        "float16",
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul(pf: Any, dtype: str, layout: str) -> None:
    if layout == "contiguous":
        a, b = randn(8, 128, 256, dtype=dtype), randn(8, 256, 64, dtype=dtype)
    else:  # a batch against one transposed matrix
        a, b = randn(4, 32, 256, dtype=dtype), randn(128, 256, dtype=dtype).t()
    check(pf, "matmul", lambda: pf.matmul(a, b), lambda: a.float() @ b.float(), dtype)


# ---- convolution -------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_conv2d_bias_relu(pf: Any, dtype: str, layout: str) -> None:
    torch = _t()
    nnf = torch.nn.functional
    x, w, b = randn(8, 64, 28, 28, dtype=dtype), randn(128, 64, 3, 3, dtype=dtype, scale=0.05), randn(128, dtype=dtype)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    stride = 1 if layout == "channels_last" else 2
    # Channels-last is cuDNN's own layout; an NCHW output (torch's for NCHW
    # input) may have no fused engine: then torch runs it, which is right too.
    out = check(
        pf,
        "conv2d",
        lambda: pf.conv2d(x, w, b, stride=stride, padding=1, relu=True),
        lambda: nnf.relu(nnf.conv2d(x.float(), w.float(), b.float(), stride=stride, padding=1)),
        dtype,
        served=layout == "channels_last",
    )
    assert out.is_contiguous(
        memory_format=torch.channels_last if layout == "channels_last" else torch.contiguous_format
    )


# ---- normalization ---------------------------------------------------------------------


def _rows(dtype: str, layout: str, hidden: int) -> Any:
    if layout == "contiguous":
        return randn(32, 64, hidden, dtype=dtype)
    return randn(2048, 2 * hidden, dtype=dtype)[:, :hidden]  # every row a slice of a wider one


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(pf: Any, dtype: str, layout: str) -> None:
    nnf = _t().nn.functional
    x = _rows(dtype, layout, 512)
    w, b = 1 + 0.1 * randn(512, dtype=dtype), randn(512, dtype=dtype)
    bias = b if layout == "contiguous" else None
    check(
        pf,
        "layer_norm",
        lambda: pf.layer_norm(x, (512,), w, bias, eps=1e-5),
        lambda: nnf.layer_norm(x.float(), (512,), w.float(), None if bias is None else bias.float(), 1e-5),
        dtype,
        served=layout == "contiguous",
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(pf: Any, dtype: str, layout: str) -> None:
    torch = _t()
    x = _rows(dtype, layout, 1024)
    w = 1 + 0.1 * randn(1024, dtype=dtype) if layout == "contiguous" else None
    eps = (
        1e-6 if layout == "contiguous" else torch.finfo(getattr(torch, dtype)).eps
    )  # the default eps, written out for the reference

    def reference() -> Any:
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        return y if w is None else y * w.float()

    # Strided rows: whether cuDNN's norm engines take a row stride is for the GPU to say; torch runs them otherwise.
    check(
        pf,
        "rms_norm",
        lambda: pf.rms_norm(x, (1024,), w, eps=1e-6 if layout == "contiguous" else None),
        reference,
        dtype,
        served=layout == "contiguous",
    )


# ---- attention --------------------------------------------------------------------------


def _qkv(
    dtype: str, layout: str, b: int = 2, h: int = 8, s: int = 256, d: int = 64, kv_heads: int | None = None
) -> tuple[Any, Any, Any]:
    hk = kv_heads or h
    if layout == "contiguous":
        return randn(b, h, s, d, dtype=dtype), randn(b, hk, s, d, dtype=dtype), randn(b, hk, s, d, dtype=dtype)
    # BSHD: the [batch, sequence, heads, head dim] a projection writes, seen as BHSD
    return tuple(randn(b, s, n, d, dtype=dtype).transpose(1, 2) for n in (h, hk, hk))  # type: ignore[return-value]


def _reference_attention(
    q: Any, k: Any, v: Any, visible: Any = None, bias: Any = None, scale: float | None = None
) -> Any:
    """Written out in float32: scores, the additive bias, the masked-out keys at -inf, softmax."""
    torch = _t()
    groups = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(groups, dim=1) for t in (k, v))
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k) * (
        scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    )
    if bias is not None:
        scores = scores + bias.float()
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1), v)


def _positions(s_q: int, s_kv: int) -> tuple[Any, Any]:
    torch = _t()
    return torch.arange(s_q, device="cuda").view(s_q, 1), torch.arange(s_kv, device="cuda").view(1, s_kv)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_causal(pf: Any, dtype: str, layout: str) -> None:
    q, k, v = _qkv(dtype, layout)
    i, j = _positions(256, 256)
    check(
        pf,
        "scaled_dot_product_attention",
        lambda: pf.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda: _reference_attention(q, k, v, j <= i),
        dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_bias_and_scale(pf: Any, dtype: str) -> None:
    q, k, v = _qkv(dtype, "contiguous")
    bias = randn(1, 8, 256, 256, dtype=dtype)
    check(
        pf,
        "scaled_dot_product_attention",
        lambda: pf.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.1),
        lambda: _reference_attention(q, k, v, bias=bias, scale=0.1),
        dtype,
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_padding(pf: Any, dtype: str, layout: str) -> None:
    """Keys past each sequence's length are masked; rows past its query length are not compared (unspecified)."""
    torch = _t()
    q, k, v = _qkv(dtype, layout)
    seq_q, seq_kv = (
        torch.tensor([256, 200], dtype=torch.int32, device="cuda"),
        torch.tensor([256, 150], dtype=torch.int32, device="cuda"),
    )
    before = pf.stats().get("scaled_dot_product_attention")
    out = pf.scaled_dot_product_attention(q, k, v, seq_len_q=seq_q, seq_len_kv=seq_kv)
    _, j = _positions(256, 256)
    expected = _reference_attention(q, k, v, (j.view(1, 1, 1, 256) < seq_kv.view(2, 1, 1, 1)))
    for n, length in enumerate(seq_q.tolist()):
        assert rel_err(out[n, :, :length], expected[n, :, :length]) < TOLERANCE[dtype]
    assert pf.stats()["scaled_dot_product_attention"].cudnn == (before.cudnn if before else 0) + 1, pf.stats()[
        "scaled_dot_product_attention"
    ].reasons


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_sliding_window(pf: Any, dtype: str) -> None:
    q, k, v = _qkv(dtype, "contiguous")
    i, j = _positions(256, 256)
    check(
        pf,
        "scaled_dot_product_attention",
        lambda: pf.scaled_dot_product_attention(q, k, v, is_causal=True, sliding_window=64),
        lambda: _reference_attention(q, k, v, (j <= i) & (j > i - 64)),
        dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_alibi(pf: Any, dtype: str) -> None:
    from tests.gpu.references import _alibi_bias  # the GPU-tested ALiBi of examples/ (8 heads: cuDNN's slopes)

    q, k, v = _qkv(dtype, "contiguous")
    i, j = _positions(256, 256)
    check(
        pf,
        "scaled_dot_product_attention",
        lambda: pf.scaled_dot_product_attention(q, k, v, is_causal=True, alibi=True),
        lambda: _reference_attention(q, k, v, j <= i, _alibi_bias(8, 256, q.device)),
        dtype,
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sdpa_grouped_query(pf: Any, layout: str) -> None:
    q, k, v = _qkv("bfloat16", layout, kv_heads=2)
    i, j = _positions(256, 256)
    check(
        pf,
        "scaled_dot_product_attention",
        lambda: pf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        lambda: _reference_attention(q, k, v, j <= i),
        "bfloat16",
    )


def _paged(
    dtype: str,
    layout: str,
    b: int = 8,
    heads: int = 16,
    kv_heads: int = 4,
    d: int = 64,
    page: int = 64,
    pages_per_seq: int = 16,
) -> dict[str, Any]:
    torch = _t()
    pages = b * pages_per_seq
    if layout == "contiguous":
        q = randn(b, heads, 1, d, dtype=dtype)
        k_cache, v_cache = randn(pages, kv_heads, page, d, dtype=dtype), randn(pages, kv_heads, page, d, dtype=dtype)
    else:  # q a slice of a QKV projection; keys and values interleaved in one pool
        q = randn(b, (heads + 2 * kv_heads) * d, dtype=dtype)[:, : heads * d].view(b, heads, 1, d)
        pool = randn(pages, 2, kv_heads, page, d, dtype=dtype)
        k_cache, v_cache = pool[:, 0], pool[:, 1]
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(b, pages_per_seq)
    lengths = torch.linspace(1, pages_per_seq * page, b, device="cuda").round().to(torch.int32)
    return {"q": q, "k": k_cache, "v": v_cache, "table": table, "lengths": lengths}


def _reference_paged(t: dict[str, Any]) -> Any:
    torch = _t()
    out = []
    for n in range(t["q"].shape[0]):
        pages = t["table"][n].long()
        keys = torch.cat(list(t["k"][pages].unbind(0)), dim=1)[
            None, :, : int(t["lengths"][n])
        ]  # [1, kv heads, length, d]
        values = torch.cat(list(t["v"][pages].unbind(0)), dim=1)[None, :, : int(t["lengths"][n])]
        out.append(_reference_attention(t["q"][n : n + 1], keys, values))
    return torch.cat(out)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention(pf: Any, dtype: str, layout: str) -> None:
    t = _paged(dtype, layout)
    check(
        pf,
        "paged_decode_attention",
        lambda: pf.paged_decode_attention(t["q"], t["k"], t["v"], t["table"], t["lengths"]),
        lambda: _reference_paged(t),
        dtype,
    )


# ---- what cuDNN is not asked for, and mistakes ------------------------------------------------


def test_float32_and_a_boolean_mask_run_torch_and_are_counted(pf: Any) -> None:
    torch = _t()
    nnf = torch.nn.functional
    x, w = randn(64, 128, dtype="float32"), randn(256, 128, dtype="float32")
    before = pf.stats().get("linear")
    assert torch.equal(pf.linear(x, w), nnf.linear(x, w))
    after = pf.stats()["linear"]
    assert after.torch == (before.torch if before else 0) + 1 and any("float32" in r for r in after.reasons)
    q, k, v = _qkv("float16", "contiguous")
    mask = torch.rand(256, 256, device="cuda") > 0.2
    torch.testing.assert_close(
        pf.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        nnf.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )
    assert any("boolean mask" in r for r in pf.stats()["scaled_dot_product_attention"].reasons)


def test_a_call_that_needs_autograd_runs_torch(pf: Any) -> None:
    x = randn(64, 128, dtype="float16").requires_grad_(True)
    w = randn(256, 128, dtype="float16")
    y = pf.linear(x, w)
    assert y.grad_fn is not None
    y.sum().backward()
    assert x.grad is not None


def _same_error(ours: Callable[[], Any], theirs: Callable[[], Any]) -> None:
    with pytest.raises(Exception) as expected:
        theirs()
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        ours()


def test_mistakes_raise_torchs_own_errors(pf: Any) -> None:
    torch = _t()
    nnf = torch.nn.functional
    x, w = randn(64, 128, dtype="float16"), randn(256, 130, dtype="float16")
    _same_error(lambda: pf.linear(x, w), lambda: nnf.linear(x, w))  # inner dims
    _same_error(lambda: pf.linear(x, w[:, :128].bfloat16()), lambda: nnf.linear(x, w[:, :128].bfloat16()))  # dtypes
    _same_error(lambda: pf.linear(x, w[:, :128].cpu()), lambda: nnf.linear(x, w[:, :128].cpu()))  # devices
    q, k, v = _qkv("float16", "contiguous", kv_heads=2)
    _same_error(
        lambda: pf.scaled_dot_product_attention(q, k, v), lambda: nnf.scaled_dot_product_attention(q, k, v)
    )  # GQA without enable_gqa
    conv_x, conv_w = randn(2, 16, 8, 8, dtype="float16"), randn(8, 4, 3, 3, dtype="float16")
    _same_error(lambda: pf.conv2d(conv_x, conv_w), lambda: nnf.conv2d(conv_x, conv_w))  # channels


def test_cpu_tensors_and_bad_options_are_invalid_requests(pf: Any) -> None:
    torch = _t()
    with pytest.raises(InvalidRequest, match="input is on the CPU"):
        pf.linear(torch.randn(4, 8), torch.randn(16, 8))
    with pytest.raises(InvalidRequest, match="activation 'tanh'"):
        pf.linear(randn(4, 8, dtype="float16"), randn(16, 8, dtype="float16"), activation="tanh")
    q, k, v = _qkv("float16", "contiguous")
    with pytest.raises(InvalidRequest, match="alibi=True needs is_causal=True"):
        pf.scaled_dot_product_attention(q, k, v, alibi=True)
    t = _paged("float16", "contiguous")
    with pytest.raises(InvalidRequest, match="query must be"):
        pf.paged_decode_attention(t["q"].expand(-1, -1, 2, -1), t["k"], t["v"], t["table"], t["lengths"])


# ---- the example ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_example_decoder_step_matches_torch_eager(gpu_session: dict[str, Any], tmp_path: Path, dtype: str) -> None:
    env = {**trusting_env(gpu_session["public_key"]), "PLANCACHE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            sys.executable,
            "examples/decoder_step.py",
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
    (gpu_session["out"] / f"decoder_step_{dtype}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"max rel error vs torch eager: [0-9.e+-]+", proc.stdout), proc.stdout

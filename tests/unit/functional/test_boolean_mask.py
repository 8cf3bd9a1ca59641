"""A boolean attn_mask served as cuDNN's additive bias (plancache.functional.scaled_dot_product_attention):
the bias gives torch's attention exactly, a query that sees no key included, and one mask's bias is made once
while that mask lives unchanged. On the CPU in float64, with torch's own attention over the bias standing in
for cuDNN's (tests/gpu/test_gpu_torch.py runs the served plans)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the bias is made with torch (make test installs its CPU build)")

import torch.nn.functional as F  # noqa: E402

import plancache.functional as pf  # noqa: E402
from plancache.functional import _attention  # noqa: E402

D = torch.float64


@pytest.fixture
def servable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """CPU float64 calls take the served path's conversion; the calls it makes are recorded and run by torch's
    function (cuDNN's stand-in here)."""
    monkeypatch.setattr(_attention, "_servable", lambda query: True)
    biases: list[Any] = []

    def recorded(query: Any, key: Any, value: Any, attn_mask: Any, *args: Any) -> Any:
        biases.append(attn_mask)
        dropout_p, is_causal, scale, enable_gqa = args[:4]
        return _attention.torch_scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )

    monkeypatch.setattr(_attention, "_sdpa", recorded)
    _attention._forget_mask(None)
    pf.clear()
    yield biases
    _attention._forget_mask(None)
    pf.clear()


def masks() -> dict[str, Any]:
    causal = torch.ones(5, 7, dtype=torch.bool).tril(2)
    left_padded = causal.expand(2, 1, 5, 7).clone()
    left_padded[1, :, :, :3] = False  # its first query sees no key
    key_padding = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    key_padding[0, ..., -2:] = False
    nothing = torch.zeros(5, 7, dtype=torch.bool)
    return {"causal": causal, "left padded": left_padded, "key padding": key_padding, "nothing seen": nothing}


@pytest.mark.parametrize("kind", list(masks()))
def test_the_bias_of_a_boolean_mask_gives_torchs_attention_and_gradients(kind: str) -> None:
    mask = masks()[kind]
    q = torch.randn(2, 3, 5, 8, dtype=D, requires_grad=True)
    k, v = (torch.randn(2, 3, 7, 8, dtype=D, requires_grad=True) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    bias, unattended = _attention.boolean_mask_as_bias(mask, q, k)
    assert bias.dtype == D and tuple(bias.shape[-2:]) == (5, 7)  # cuDNN's bias covers every query and key
    assert torch.isfinite(bias).any(dim=-1).all()  # no row of -inf: a query that sees no key stays finite
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).masked_fill(unattended, 0.0)
    torch.testing.assert_close(got, expected)
    weighting = torch.randn_like(expected)
    torch.testing.assert_close(
        torch.autograd.grad((got * weighting).sum(), (q, k, v)),
        torch.autograd.grad((expected * weighting).sum(), (q, k, v)),
    )


def test_a_served_call_with_a_boolean_mask_runs_its_bias(servable: list[Any]) -> None:
    mask = masks()["left padded"]
    q, k, v = torch.randn(2, 3, 5, 8, dtype=D), torch.randn(2, 3, 7, 8, dtype=D), torch.randn(2, 3, 7, 8, dtype=D)
    got = pf.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert len(servable) == 1 and servable[0].dtype == D  # the call asked for is the bias's, not the mask's
    assert not got[1, :, 0].any()


def test_one_masks_bias_is_made_once_while_it_lives_unchanged(servable: list[Any]) -> None:
    """A model makes one mask a forward and hands it to every layer: one bias for all of them; a mask written
    in place, or another mask, makes its own; the bias goes with its mask."""
    mask = masks()["causal"]
    q, k = torch.randn(2, 3, 5, 8, dtype=D), torch.randn(2, 3, 7, 8, dtype=D)
    for _ in range(3):  # three layers
        pf.scaled_dot_product_attention(q, k, k, mask)
    assert len(servable) == 3 and servable[0] is servable[1] is servable[2]
    mask[0, 0] = False  # written in place: its version moves
    pf.scaled_dot_product_attention(q, k, k, mask)
    assert servable[3] is not servable[2] and servable[3][0, 0].item() == float("-inf")
    pf.scaled_dot_product_attention(q.float(), k.float(), k.float(), mask)  # another dtype: another bias
    assert servable[4].dtype == torch.float32
    servable.clear()
    del mask
    gc.collect()
    assert _attention._last_mask is None  # gone with its mask: nothing kept past it


def test_an_inference_tensors_mask_is_served_though_it_keeps_no_version(servable: list[Any]) -> None:
    """Under torch.inference_mode a mask keeps no version counter (reading it raises): its bias is made at
    each call instead of reused."""
    q, k = torch.randn(2, 3, 5, 8, dtype=D), torch.randn(2, 3, 7, 8, dtype=D)
    with torch.inference_mode():
        mask = masks()["left padded"]
        got = pf.scaled_dot_product_attention(q, k, k, mask)
        pf.scaled_dot_product_attention(q, k, k, mask)
        expected = F.scaled_dot_product_attention(q, k, k, attn_mask=mask)
    torch.testing.assert_close(got, expected)
    assert len(servable) == 2 and servable[0] is not servable[1]


def test_a_boolean_mask_with_is_causal_is_left_as_torch_takes_it(servable: list[Any]) -> None:
    mask = masks()["causal"][:, :5]
    q = torch.randn(1, 2, 5, 8, dtype=D)
    got = pf.scaled_dot_product_attention(q, q, q, mask, is_causal=True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=True))
    assert servable[0] is mask  # not turned into a bias

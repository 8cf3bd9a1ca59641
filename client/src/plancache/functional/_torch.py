"""torch's side of plancache.functional, imported only when a call needs it.

- The fallbacks: what runs a call cuDNN is not asked for (or cannot build).
  For torch's own functions it is the function itself, so a mistake in the
  arguments raises exactly torch's error and anything torch accepts gets
  torch's result. The options torch lacks (padding lengths, a sliding
  window, ALiBi, a paged KV cache) are written out in torch here, in float32.
- `TorchOps`: the tensors a served call makes (its output, constants made
  once per geometry) and the device it runs on. Tests install a stand-in
  with `use_tensor_ops` (tests/support/functional_standin.py).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from plancache.dtypes import INTEGER_TYPES
from plancache.functional._specs import Constant


@functools.cache
def available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _torch() -> Any:
    import torch

    return torch


# ---- fallbacks ------------------------------------------------------------------


def _activation(y: Any, name: str | None) -> Any:
    if name is None:
        return y
    return getattr(_torch().nn.functional, name)(y)


def linear(input: Any, weight: Any, bias: Any = None, *, activation: str | None = None) -> Any:
    return _activation(_torch().nn.functional.linear(input, weight, bias), activation)


def matmul(input: Any, other: Any) -> Any:
    return _torch().matmul(input, other)


def conv2d(
    input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any, *, relu: bool = False
) -> Any:
    y = _torch().nn.functional.conv2d(input, weight, bias, stride, padding, dilation, groups)
    return _torch().relu(y) if relu else y


def layer_norm(input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: float) -> Any:
    return _torch().nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)


def rms_norm(input: Any, normalized_shape: Any, weight: Any, eps: float | None) -> Any:
    return _torch().nn.functional.rms_norm(input, normalized_shape, weight, eps)


def batch_norm(
    input: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any, training: bool, momentum: float, eps: float
) -> Any:
    return _torch().nn.functional.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def inverse_deviation(running_var: Any, eps: float) -> Any:
    """batchnorm_inference's inv_variance: 1 / sqrt(running_var + eps) (running_var None: torch's error, from the fallback)."""
    return None if running_var is None else _torch().rsqrt(running_var + eps)


def dropout_seed(device: Any) -> Any:
    """A Philox seed for cuDNN's dropout, drawn from torch's CUDA generator on
    the tensors' device (torch.manual_seed reproduces it; a CUDA graph
    replays the draw, as torch's own dropout does)."""
    torch = _torch()
    return torch.randint(0, 2**62, (1, 1, 1, 1), dtype=torch.int64, device=device)


def alibi_slopes(heads: int) -> list[float]:
    """cuDNN's ALiBi slopes (cudnn_frontend_utils.h get_alibi_slope): for a
    power of two h, head i (from 1) gets 2^(-8i/h); otherwise the odd
    multiples of half a step fill the heads past the largest power of two."""
    n = 1 << int(math.log2(heads))
    steps = [float(i + 1) for i in range(n)] + [(i + 1) * 0.5 for i in range(0, 2 * (heads - n), 2)]
    return [2.0 ** (-8.0 * s / n) for s in steps]


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    seq_len_q: Any = None,
    seq_len_kv: Any = None,
    sliding_window: int | None = None,
    alibi: bool = False,
) -> Any:
    """torch's function, or with the options it lacks, the same attention in
    float32 with the masks written out (rows past a sequence's length: any)."""
    torch = _torch()
    if seq_len_q is None and seq_len_kv is None and sliding_window is None and not alibi:
        gqa = {"enable_gqa": True} if enable_gqa else {}
        # scale and enable_gqa are keyword-only in torch (2.11: "takes from 3 to 6 positional arguments").
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **gqa
        )
    s_q, s_kv, heads = query.shape[-2], key.shape[-2], query.shape[-3]
    i = torch.arange(s_q, device=query.device).view(s_q, 1)
    j = torch.arange(s_kv, device=query.device).view(1, s_kv)
    allowed = torch.ones(s_q, s_kv, dtype=torch.bool, device=query.device)
    if is_causal:
        allowed &= j <= i
    if sliding_window is not None:
        allowed &= j > i - sliding_window
    allowed = allowed.view(1, 1, s_q, s_kv)
    if seq_len_kv is not None:
        allowed = allowed & (j.view(1, 1, 1, s_kv) < seq_len_kv.reshape(-1, 1, 1, 1))
    bias = torch.zeros((), device=query.device)
    if alibi:
        slopes = torch.tensor(alibi_slopes(heads), device=query.device).view(1, heads, 1, 1)
        bias = slopes * (j - i).float().view(1, 1, s_q, s_kv)
    if attn_mask is not None:
        bias = bias + attn_mask.float()
    return _attention(query, key, value, allowed, bias, scale, dropout_p, enable_gqa)


def _attention(
    q: Any, k: Any, v: Any, allowed: Any, bias: Any, scale: float | None, dropout_p: float, enable_gqa: bool
) -> Any:
    torch = _torch()
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    scores = (
        torch.matmul(q.float(), k.float().transpose(-1, -2))
        * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        + bias
    )
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    if dropout_p:
        weights = torch.nn.functional.dropout(weights, dropout_p)
    return torch.matmul(weights, v.float()).to(q.dtype)


def paged_decode_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    page_table: Any,
    seq_lens: Any,
    *,
    scale: float | None = None,
    max_seq_len: int | None = None,
    value_page_table: Any = None,
) -> Any:
    """Each sequence's pages gathered in page-table order, its first
    seq_lens[i] tokens attended to (float32)."""
    torch = _torch()
    b, kv_heads, d = query.shape[0], key_cache.shape[1], key_cache.shape[3]

    def gathered(pool: Any, table: Any) -> Any:
        pages = pool[table.reshape(b, -1).long()]  # [b, pages per sequence, kv heads, page, d]
        return pages.permute(0, 2, 1, 3, 4).reshape(b, kv_heads, -1, d)

    k = gathered(key_cache, page_table)
    v = gathered(value_cache, value_page_table if value_page_table is not None else page_table)
    limit = seq_lens.reshape(b, 1, 1, 1)
    if max_seq_len is not None:
        limit = limit.clamp(max=max_seq_len)
    allowed = torch.arange(k.shape[2], device=query.device).view(1, 1, 1, -1) < limit
    return _attention(query, k, v, allowed, torch.zeros((), device=query.device), scale, 0.0, True)


# ---- the tensors a served call makes -----------------------------------------------


class TensorOps(Protocol):
    def allocator(
        self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: str, device: int
    ) -> Callable[[], Any]: ...
    def constant(self, constant: Constant, device: int) -> Any: ...
    def current_device(self) -> Callable[[], int]: ...
    def on_device(self, device: int) -> contextlib.AbstractContextManager[None]: ...
    def capturing(self) -> bool: ...


class TorchOps:
    def allocator(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: str, device: int) -> Callable[[], Any]:
        """A call's output, made by one C call (empty_strided with everything bound)."""
        from plancache.gpu.stack import torch_dtype

        torch = _torch()
        return functools.partial(
            torch.empty_strided, shape, stride, dtype=torch_dtype(dtype), device=torch.device("cuda", device)
        )

    def constant(self, constant: Constant, device: int) -> Any:
        from plancache.gpu.stack import torch_dtype

        where = "cpu" if constant.on_host else f"cuda:{device}"
        value = int(constant.value) if constant.dtype in INTEGER_TYPES else constant.value
        return _torch().full(constant.shape, value, dtype=torch_dtype(constant.dtype), device=where)

    def current_device(self) -> Callable[[], int]:
        torch = _torch()
        raw = getattr(
            torch._C, "_cuda_getDevice", None
        )  # ~0.05 µs; torch.cuda.current_device() is a Python wrapper of it
        return raw if raw is not None else torch.cuda.current_device  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def on_device(self, device: int) -> Iterator[None]:
        with _torch().cuda.device(device):
            yield

    def capturing(self) -> bool:
        """Whether the current stream is capturing a CUDA graph."""
        return bool(_torch().cuda.is_current_stream_capturing())


_ops: TensorOps | None = None


def ops() -> TensorOps:
    global _ops
    if _ops is None:
        _ops = TorchOps()
    return _ops


def use_tensor_ops(stand_in: TensorOps | None) -> None:
    """Install a stand-in (tests), or None for torch's on next use."""
    global _ops
    _ops = stand_in

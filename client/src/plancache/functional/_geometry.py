"""Tensor geometry as plain tuples, and the views cuDNN needs of it.

Nothing here imports torch: a tensor is read through `shape`, `stride()`,
`dtype` and `device` only, so the spec every function builds is computed
(and CPU-tested) from the same code the GPU path runs. `tensor_key` and
`hashable` are what a hot path puts in its geometry key.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec.layouts import channels_last, row_major

# cuDNN serves these; float32 would run in TF32 on some engines (torch's
# matmul does not by default), so it stays with torch.
SERVED_DTYPES = ("half", "bfloat16")

Dims = tuple[int, ...]


class Unserved(Exception):
    """cuDNN is not asked for this call (its shape, layout, dtype or an
    option): torch's own function runs it, or says what is wrong with it."""

    def __init__(self, reason: str, *, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient  # may be served later (the service was unreachable)


@dataclass(frozen=True)
class Geo:
    """One tensor argument as the spec sees it."""

    name: str  # the argument's name, for messages
    shape: Dims
    stride: Dims
    dtype: str | None  # plancache's name ("half", ...); None for a dtype plancache has no name for
    dtype_text: str  # as the tensor prints it ("torch.float16")
    device_type: str


_DTYPE_NAMES: dict[str, str | None] = {}


def dtype_name(dtype: Any) -> str | None:
    """plancache's name for a torch dtype (`torch.float16` -> "half"), by the
    names plancache.dtypes already knows; None for one it has no name for."""
    text = str(dtype)
    if text not in _DTYPE_NAMES:
        try:
            _DTYPE_NAMES[text] = dtypes.normalize(text.removeprefix("torch."), "tensor")
        except SpecError:
            _DTYPE_NAMES[text] = None
    return _DTYPE_NAMES[text]


def geo(name: str, tensor: Any) -> Geo:
    if not (hasattr(tensor, "shape") and callable(getattr(tensor, "stride", None)) and hasattr(tensor, "dtype")):
        raise Unserved(f"{name} is a {type(tensor).__name__}, not a tensor")
    if 0 in tuple(tensor.shape):
        raise Unserved(f"{name} is empty (dims {tuple(tensor.shape)})")
    device = getattr(tensor, "device", None)
    return Geo(
        name,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        dtype_name(tensor.dtype),
        str(tensor.dtype),
        str(getattr(device, "type", device)),
    )


def geo_or_none(name: str, tensor: Any) -> Geo | None:
    return None if tensor is None else geo(name, tensor)


def tensor_key(t: Any) -> Hashable:
    """A tensor's part of a geometry key (None for an argument left out)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device(), t.requires_grad)


def weighted_key(function: str, input: Any, weight: Any, bias: Any, options: Hashable, grad: bool) -> tuple[Any, ...]:
    """The geometry key of a call of an input, a weight and an optional bias (linear, conv2d): what its table
    entry is found by; `options` the function's own (linear's activation; conv2d's stride, padding...)."""
    return (
        function,
        input.shape,
        input.stride(),
        input.dtype,
        input.get_device(),
        weight.shape,
        weight.stride(),
        weight.dtype,
        weight.get_device(),
        None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()),
        options,
        grad,
    )


def hashable(value: Any) -> Hashable:
    """An option as a geometry key holds it (a list as a tuple)."""
    return tuple(value) if isinstance(value, list) else value  # type: ignore[no-any-return]


def collapse(shape: Sequence[int], stride: Sequence[int], what: str) -> tuple[int, int]:
    """`shape` seen as one axis: (size, stride). Dims of size 1 do not
    count; the others must step into each other (stride[i] = stride[i+1] x
    shape[i+1]), or the view needs a copy and Unserved says so. No axis of
    size > 1: (size, 0), the stride left to the caller."""
    kept = [(d, s) for d, s in zip(shape, stride, strict=True) if d != 1]
    size = math.prod(shape)
    if not kept:
        return size, 0
    for (_, outer), (inner_dim, inner) in itertools.pairwise(kept):
        if outer != inner * inner_dim:
            raise Unserved(
                f"{what} (dims {tuple(shape)}, strides {tuple(stride)}) is not one strided axis: "
                "cuDNN would need a copy"
            )
    return size, kept[-1][1]


def is_dense(g: Geo) -> bool:
    """Whether `g` is one contiguous run of elements (row-major, any dims of size 1)."""
    try:
        return collapse(g.shape, g.stride, g.name)[1] in (0, 1)
    except Unserved:
        return False


def no_zero_strides(g: Geo) -> None:
    if any(s == 0 and d != 1 for d, s in zip(g.shape, g.stride, strict=True)):
        raise Unserved(f"{g.name} is an expanded view (a zero stride over dims {g.shape})")


def served_dtype(first: Geo, *others: Geo | None, allowed: Sequence[str] | None = None) -> str:
    """The call's element type: `first`'s, which cuDNN must serve; every
    other argument must have it too (or be one of `allowed`)."""
    if first.dtype not in SERVED_DTYPES:
        raise Unserved(f"{first.name} is {first.dtype_text}: plancache.functional serves float16 and bfloat16")
    for g in others:
        if g is not None and g.dtype != first.dtype and g.dtype not in (allowed or ()):
            raise Unserved(f"{g.name} is {g.dtype_text} but {first.name} is {first.dtype_text}")
    return first.dtype


def pair(value: Any, what: str) -> tuple[int, int]:
    """torch's int-or-pair arguments (stride, padding, dilation)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if (
        isinstance(value, Sequence)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return int(value[0]), int(value[1])
    if isinstance(value, Sequence) and len(value) == 1 and isinstance(value[0], int):
        return int(value[0]), int(value[0])
    raise Unserved(f"{what} must be an int or a pair of ints, got {value!r}")


def is_channels_last(shape: Dims, stride: Dims) -> bool:
    """torch's channels_last memory format for a 4-D tensor that is not also
    plain contiguous (then torch keeps NCHW, and so does its conv output)."""

    def same(expected: Dims) -> bool:
        return all(d == 1 or s == e for d, s, e in zip(shape, stride, expected, strict=True))

    return len(shape) == 4 and same(channels_last(shape)) and not same(row_major(shape))

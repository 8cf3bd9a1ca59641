"""What a geometry asks plancache for, and the graph pieces more than one operator's spec uses.

A `Request` is a GraphSpec and how a call binds to it: the caller's tensors
by uid (`inputs`, in the order of the operator's signature:
plancache.functional._signature), the outputs the call allocates (the first
is the function's result, uid OUTPUT_UID; a training forward's others are
what its backward reads), the constants made once per geometry. Every spec
is written with plancache's own builder (the same calls as
examples/generate.py). A builder raises Unserved when cuDNN is not the one
to run the call (torch then runs it, or says what is wrong with it) and
InvalidRequest for a mistake in an argument torch does not have.

Views cost nothing: a matrix's leading dims collapse into one (a linear's
input [b, s, k] is A [1, b*s, k]); a weight read transposed is B with
swapped strides; torch's 1-D bias is [1, 1, n]. The call then binds the
caller's own tensors: cuDNN reads their addresses through the geometry the
spec declares.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plancache.functional._geometry import Dims
from plancache.graphspec.graph import GraphSpec, Tensor
from plancache.graphspec.layouts import packed, row_major

OUTPUT_UID = 20
ACTIVATIONS = ("relu", "gelu", "silu")
ACTIVATION_BACKWARD = {"relu": "relu_backward", "gelu": "gelu_backward", "silu": "swish_backward"}


@dataclass(frozen=True)
class Constant:
    """A tensor the plan reads that the call does not pass (a norm's epsilon,
    a missing weight, the query lengths of a decode): made once per geometry."""

    uid: int
    shape: Dims
    value: float
    dtype: str
    on_host: bool = False  # a pass-by-value scalar lives on the CPU


@dataclass(frozen=True)
class Output:
    """A tensor the plan writes that the call allocates (as torch's function would)."""

    uid: int
    shape: Dims
    stride: Dims
    dtype: str


@dataclass(frozen=True)
class Request:
    """What a geometry asks plancache for, and how a call binds to it: the
    caller's tensors by uid (`inputs`, in the call's order), the outputs it
    allocates (the first is the function's result; a training forward's
    others are what its backward needs), the constants made once."""

    function: str
    spec: GraphSpec
    inputs: tuple[int, ...]
    outputs: tuple[Output, ...]
    constants: tuple[Constant, ...] = ()


def request(
    function: str,
    g: GraphSpec,
    inputs: Sequence[int],
    out: Dims,
    stride: Dims,
    dtype: str,
    constants: Sequence[Constant] = (),
    extra: Sequence[Output] = (),
) -> Request:
    """A request whose first output is the function's result (uid OUTPUT_UID)."""
    return Request(
        function, g, tuple(inputs), (Output(OUTPUT_UID, tuple(out), tuple(stride), dtype), *extra), tuple(constants)
    )


def graph(function: str, dtype: str) -> GraphSpec:
    return GraphSpec(
        name=f"plancache.functional.{function}",
        io_data_type=dtype,
        intermediate_data_type="float",
        compute_data_type="float",
    )


def finish(y: Tensor, stride: Sequence[int] | None = None) -> None:
    y.set_output(True).set_name("output").set_uid(OUTPUT_UID)
    if stride is not None:
        y.set_stride(stride)


def row_stride(size: int, stride: int, inner: int) -> int:
    """The stride of a matrix's rows: its own, or for a single row (any
    value addresses it) the packed one."""
    return stride if size != 1 and stride else max(inner, 1)


def activation(g: GraphSpec, y: Tensor, name: str | None) -> Tensor:
    if name is None:
        return y
    if name == "silu":
        return g.swish(y, swish_beta=1.0)  # type: ignore[no-any-return]
    return getattr(g, name)(y)  # type: ignore[no-any-return]  # relu, gelu (erf: torch's default)


def dense_like(shape: Sequence[int], stride: Sequence[int]) -> Dims:
    """Dense strides with `stride`'s order of axes (slowest first; ties keep
    the axes' order): a view's gradient has the view's layout, packed."""
    order = sorted(range(len(shape)), key=lambda axis: (-stride[axis], axis))
    rank = [0] * len(shape)
    for fastest_last, axis in enumerate(order):
        rank[axis] = len(shape) - 1 - fastest_last
    return packed(shape, rank)


# ---- backward graphs more than one operator has --------------------------------------------


def shaped(request: Request, *shapes: Dims | None) -> Request:
    """`request` with output i allocated in `shapes[i]` (None: as declared):
    the shape the gradient has for the caller, row-major, over the same
    memory as the graph's dims (cuDNN reads the address only). A backward
    then returns its outputs as allocated, without a view per call (a
    view costs an autograd-aware tensor, 1-4 µs of host time)."""
    outputs = list(request.outputs)
    for index, shape in enumerate(shapes):
        if shape is None:
            continue
        declared = outputs[index]
        if math.prod(shape) != math.prod(declared.shape) or tuple(declared.stride) != row_major(declared.shape):
            raise ValueError(f"output {declared.uid} {declared.shape} {declared.stride} is not a dense {tuple(shape)}")
        outputs[index] = dataclasses.replace(declared, shape=tuple(shape), stride=row_major(shape))
    return dataclasses.replace(request, outputs=tuple(outputs))


def activation_backward(function: str, dims: Dims, strides: Dims, act: str, dtype: str) -> Request:
    """dZ = act'(input) * dY, elementwise: uids dY 1 and the activation's input 2
    (a ReLU's output serves: y > 0 exactly where its input was), both `strides`."""
    g = graph(function, dtype)
    dy = g.tensor(list(dims), list(strides), name="dY", uid=1)
    x = g.tensor(list(dims), list(strides), name="input", uid=2)
    extra: dict[str, Any] = {"swish_beta": 1.0} if act == "silu" else {}
    dz = g.node(ACTIVATION_BACKWARD[act], loss=dy, input=x, **extra)[0]
    assert dz is not None
    dz.set_output(True).set_name("dZ").set_uid(OUTPUT_UID).set_stride(list(strides))
    return Request(function, g, (1, 2), (Output(OUTPUT_UID, dims, strides, dtype),))


def bias_grad(function: str, dims: Dims, strides: Dims, reduced: Dims, dtype: str) -> Request:
    """dBias = the sum of dZ (uid 1, `dims`) over every axis `reduced` keeps
    at 1, in float32 (cuDNN's reductions write float32 only: "yType ==
    CUDNN_DATA_FLOAT", measured on the H200)."""
    out_dtype = "float"
    g = graph(function, dtype)
    dz = g.tensor(list(dims), list(strides), name="dZ", uid=1)
    g.reduction(dz, mode="ADD").set_output(True).set_name("dBias").set_uid(OUTPUT_UID).set_dim(
        list(reduced)
    ).set_stride(list(row_major(reduced))).set_data_type(out_dtype)
    return Request(function, g, (1,), (Output(OUTPUT_UID, reduced, row_major(reduced), out_dtype),))

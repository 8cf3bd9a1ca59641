"""The GraphSpecs of the backward graphs (SDPA's is beside its forward in _specs).

Each backward of plancache.functional's functions is one or more cuDNN
graphs, served like any plan: an activation's backward (pointwise, dY and
what the forward saved), a linear's data and weight gradients (two matmuls
over the same views its forward declared), a bias gradient (a reduction over
the rows), a convolution's dgrad and wgrad, the norms' own backward nodes.
The call's uids are 1, 2, ... in the order each builder documents; outputs
from OUTPUT_UID (20) on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from plancache.functional._geometry import Dims
from plancache.functional._specs import OUTPUT_UID, Constant, Output, Request, _graph
from plancache.graphspec.layouts import row_major

ACTIVATION_BACKWARD = {"relu": "relu_backward", "gelu": "gelu_backward", "silu": "swish_backward"}


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
    g = _graph(function, dtype)
    dy = g.tensor(list(dims), list(strides), name="dY", uid=1)
    x = g.tensor(list(dims), list(strides), name="input", uid=2)
    extra: dict[str, Any] = {"swish_beta": 1.0} if act == "silu" else {}
    dz = g.node(ACTIVATION_BACKWARD[act], loss=dy, input=x, **extra)[0]
    assert dz is not None
    dz.set_output(True).set_name("dZ").set_uid(OUTPUT_UID).set_stride(list(strides))
    return Request(function, g, (1, 2), (Output(OUTPUT_UID, dims, strides, dtype),))


def linear_data_grad(m: int, n: int, k: int, w_stride: Sequence[int], dtype: str) -> Request:
    """dX [1, m, k] = dZ [1, m, n] @ W [n, k]: uids dZ 1 (row-major), weight 2 (its own strides)."""
    g = _graph("linear.backward", dtype)
    dz = g.tensor([1, m, n], [m * n, n, 1], name="dZ", uid=1)
    w = g.tensor([1, n, k], [n * k, w_stride[0], w_stride[1]], name="weight", uid=2)
    g.matmul(dz, w).set_output(True).set_name("dX").set_uid(OUTPUT_UID)
    return Request("linear.backward", g, (1, 2), (Output(OUTPUT_UID, (1, m, k), row_major((1, m, k)), dtype),))


def linear_weight_grad(m: int, n: int, k: int, x_strides: Sequence[int], dtype: str) -> Request:
    """dW [1, n, k] = dZ^T [1, n, m] @ X [1, m, k]: uids dZ 1 (row-major, read
    transposed), input 2 (the view its forward declared, `x_strides`)."""
    g = _graph("linear.backward", dtype)
    dz_t = g.tensor([1, n, m], [m * n, 1, n], name="dZ^T", uid=1)
    x = g.tensor([1, m, k], list(x_strides), name="input", uid=2)
    g.matmul(dz_t, x).set_output(True).set_name("dW").set_uid(OUTPUT_UID)
    return Request("linear.backward", g, (1, 2), (Output(OUTPUT_UID, (1, n, k), row_major((1, n, k)), dtype),))


def bias_grad(function: str, dims: Dims, strides: Dims, reduced: Dims, dtype: str) -> Request:
    """dBias = the sum of dZ (uid 1, `dims`) over every axis `reduced` keeps
    at 1, in float32 (cuDNN's reductions write float32 only: "yType ==
    CUDNN_DATA_FLOAT", measured on the H200)."""
    out_dtype = "float"
    g = _graph(function, dtype)
    dz = g.tensor(list(dims), list(strides), name="dZ", uid=1)
    g.reduction(dz, mode="ADD").set_output(True).set_name("dBias").set_uid(OUTPUT_UID).set_dim(
        list(reduced)
    ).set_stride(list(row_major(reduced))).set_data_type(out_dtype)
    return Request(function, g, (1,), (Output(OUTPUT_UID, reduced, row_major(reduced), out_dtype),))


def conv_data_grad(
    dy_dims: Dims,
    dy_strides: Dims,
    w_dims: Dims,
    w_strides: Dims,
    x_dims: Dims,
    dx_strides: Dims,
    attrs: dict[str, object],
    dtype: str,
) -> Request:
    """dX = conv_dgrad(dY, W): uids dY 1, weight 2; dX in the input's dims and layout."""
    g = _graph("conv2d.backward", dtype)
    dy = g.tensor(list(dy_dims), list(dy_strides), name="dY", uid=1)
    w = g.tensor(list(w_dims), list(w_strides), name="weight", uid=2)
    dx = g.conv_dgrad(dy, w, **attrs)
    dx.set_output(True).set_name("dX").set_uid(OUTPUT_UID).set_dim(list(x_dims)).set_stride(list(dx_strides))
    return Request("conv2d.backward", g, (1, 2), (Output(OUTPUT_UID, x_dims, dx_strides, dtype),))


def conv_weight_grad(
    x_dims: Dims,
    x_strides: Dims,
    dy_dims: Dims,
    dy_strides: Dims,
    w_dims: Dims,
    dw_strides: Dims,
    attrs: dict[str, object],
    dtype: str,
) -> Request:
    """dW = conv_wgrad(X, dY): uids input 1, dY 2; dW in the weight's dims and layout."""
    g = _graph("conv2d.backward", dtype)
    x = g.tensor(list(x_dims), list(x_strides), name="input", uid=1)
    dy = g.tensor(list(dy_dims), list(dy_strides), name="dY", uid=2)
    dw = g.conv_wgrad(x, dy, **attrs)
    dw.set_output(True).set_name("dW").set_uid(OUTPUT_UID).set_dim(list(w_dims)).set_stride(list(dw_strides))
    return Request("conv2d.backward", g, (1, 2), (Output(OUTPUT_UID, w_dims, dw_strides, dtype),))


def norm_backward(
    function: str, rows: int, hidden: int, x_row_stride: int, param_dtype: str | None, dtype: str, weight_given: bool
) -> Request:
    """layer_norm's and rms_norm's backward over the forward's [rows, hidden, 1, 1]
    view: uids dY 1 (dense), input 2, weight 3 (a constant of ones without one),
    [mean 4,] inv_variance 5 (float32 [rows, 1, 1, 1]); outputs dX 20 (dense),
    dWeight 21 [, dBias 22] ([1, hidden, 1, 1], the weight's type)."""
    g = _graph(f"{function}.backward", dtype)
    scale_type = param_dtype or dtype
    dy = g.tensor([rows, hidden, 1, 1], [hidden, 1, 1, 1], name="dY", uid=1)
    x = g.tensor([rows, hidden, 1, 1], [x_row_stride, 1, 1, 1], name="input", uid=2)
    scale = g.tensor([1, hidden, 1, 1], data_type=scale_type, name="weight", uid=3)
    inv_var = g.tensor([rows, 1, 1, 1], data_type="float", name="inv_variance", uid=5)
    inputs: tuple[int, ...] = (1, 2, 3, 5)
    if function == "layer_norm":
        mean = g.tensor([rows, 1, 1, 1], data_type="float", name="mean", uid=4)
        grads = g.node("layernorm_backward", grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_var)
        inputs = (1, 2, 3, 4, 5)
    else:
        grads = g.node("rmsnorm_backward", grad=dy, input=x, scale=scale, inv_variance=inv_var, has_dbias=False)
    outputs = [Output(OUTPUT_UID, (rows, hidden, 1, 1), (hidden, 1, 1, 1), dtype)]
    for t, name, uid in zip(
        grads, ("dX", "dWeight", "dBias"), (OUTPUT_UID, OUTPUT_UID + 1, OUTPUT_UID + 2), strict=True
    ):
        if t is None:
            continue
        t.set_output(True).set_name(name).set_uid(uid)
        if uid != OUTPUT_UID:
            t.set_data_type(scale_type)
            outputs.append(Output(uid, (1, hidden, 1, 1), (hidden, 1, 1, 1), scale_type))
    if weight_given:
        return Request(f"{function}.backward", g, inputs, tuple(outputs))
    return Request(
        f"{function}.backward",
        g,
        tuple(u for u in inputs if u != 3),
        tuple(outputs),
        (Constant(3, (1, hidden, 1, 1), 1.0, scale_type),),
    )


def batch_norm_backward(x_dims: Dims, x_strides: Dims, channels: int, dtype: str, weight_given: bool) -> Request:
    """uids dY 1 and input 2 (the input's layout), weight 3 (float32 [1, C, 1, 1],
    a constant of ones without one), the batch's mean 4 and inv_variance 5;
    outputs dX 20 (the input's layout), dWeight 21 and dBias 22 (float32)."""
    g = _graph("batch_norm.backward", dtype)
    params = (1, channels, 1, 1)
    dy = g.tensor(list(x_dims), list(x_strides), name="dY", uid=1)
    x = g.tensor(list(x_dims), list(x_strides), name="input", uid=2)
    scale, mean, inv_var = (
        g.tensor(list(params), data_type="float", name=n, uid=u)
        for n, u in (("weight", 3), ("mean", 4), ("inv_variance", 5))
    )
    grads = g.node("batchnorm_backward", grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv_var)
    outputs = []
    for t, name, uid, dt, dims, strides in zip(
        grads,
        ("dX", "dWeight", "dBias"),
        (20, 21, 22),
        (dtype, "float", "float"),
        (x_dims, params, params),
        (x_strides, row_major(params), row_major(params)),
        strict=True,
    ):
        assert t is not None
        t.set_output(True).set_name(name).set_uid(uid).set_data_type(dt).set_stride(list(strides))
        outputs.append(Output(uid, tuple(dims), tuple(strides), dt))
    constants = () if weight_given else (Constant(3, params, 1.0, "float"),)
    return Request(
        "batch_norm.backward", g, (1, 2, 3, 4, 5) if weight_given else (1, 2, 4, 5), tuple(outputs), constants
    )

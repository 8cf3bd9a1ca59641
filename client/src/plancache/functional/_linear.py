"""linear and matmul: a matrix product (linear's weight read transposed, its bias and activation fused).

Every operator module holds its operators whole, in one order: the
signature (the tensors a call binds, by name: plancache.functional.
_signature), the call (the hot path: a geometry key, a table lookup, the
entry's call; then the first call), the forward's spec, the backward's
graphs and rule, and torch's function, which runs what cuDNN does not.
matmul has no served backward: with autograd, torch's function runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plancache.errors import InvalidRequest
from plancache.frontdoors.buckets import AUTO, BUCKETS, pad_rows
from plancache.functional import _modes
from plancache.functional._autograd import Rule, TorchSum, needed
from plancache.functional._first_call import at_bucket, auto_checked, auto_padded, first_call
from plancache.functional._geometry import Geo, Unserved, collapse, no_zero_strides, served_dtype, weighted_key
from plancache.functional._op_call import OpCall
from plancache.functional._requests import (
    ACTIVATIONS,
    OUTPUT_UID,
    Output,
    Request,
    activation,
    activation_backward,
    bias_grad,
    finish,
    graph,
    request,
    row_stride,
    shaped,
)
from plancache.functional._signature import Bound, Signature, Slot
from plancache.functional._table import TABLE, Served
from plancache.functional._tensor_ops import torch_module
from plancache.graphspec.layouts import row_major

LINEAR = Signature(
    "linear",
    "MATMUL",
    Slot("input", 1, saved=True),
    Slot("weight", 2, saved=True),
    Slot("bias", 3, optional=True),
)
MATMUL = Signature("matmul", "MATMUL", Slot("input", 1), Slot("other", 2))
PRE_ACTIVATION_UID = 21  # a training forward's GELU or SiLU input: what its backward reads
_grad_on, _compiling = _modes.install(globals())


# ---- the calls -------------------------------------------------------------------------------


def linear(input: Any, weight: Any, bias: Any = None, *, activation: str | None = None) -> Any:
    """torch.nn.functional.linear (y = input @ weight.T + bias), with a fused
    `activation`: None, "relu", "gelu" (erf, torch's default) or "silu".
    Differentiable: dX, dW (two matmuls), dBias (a reduction), the activation's backward."""
    if BUCKETS.functions:
        padded = pad_rows("linear", input)
        if padded is not None:
            rows_in, rows = padded
            return _linear(rows_in, weight, bias, activation=activation)[:rows].reshape(
                *input.shape[:-1], weight.shape[0]
            )
    return _linear(input, weight, bias, activation=activation)


def _linear(
    input: Any, weight: Any, bias: Any = None, *, activation: str | None = None, op: OpCall | None = None
) -> Any:
    """linear without bucketing (`op`: a torch operator's call)."""
    if _compiling():
        return torch_linear(input, weight, bias, activation=activation)
    try:
        grad = (
            op.train
            if op is not None
            else _grad_on()
            and (input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        )
        key = weighted_key("linear", input, weight, bias, activation, grad)
    except (AttributeError, TypeError):
        return torch_linear(input, weight, bias, activation=activation)  # not tensors: torch's error
    tensors = (input, weight) if bias is None else (input, weight, bias)
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors) if op is None else op.take(entry, tensors)
    if op is None and AUTO.enabled:  # a new row count of a layer whose rows vary: its auto bucket
        padded = auto_padded("linear", key, input)
        if padded is not None:
            rows_in, rows = padded
            out = at_bucket(key, rows_in, tensors, lambda: _linear(rows_in, weight, bias, activation=activation))
            return out[:rows].reshape(*input.shape[:-1], weight.shape[0])
    if activation is not None and activation not in ACTIVATIONS:
        raise InvalidRequest(
            f"linear: activation {activation!r} is not one of None, {', '.join(map(repr, ACTIVATIONS))}"
        )
    bound = LINEAR.bind(tensors, input=input, weight=weight, bias=bias)
    out = first_call(
        bound,
        key,
        lambda: linear_request(bound.geo("input"), bound.geo("weight"), bound.geo_or_none("bias"), activation, grad),
        bound.fallback(torch_linear, activation=activation),
        grad,
        lambda forward: linear_rule(bound, activation, forward),
        op,
        raced=True,
    )
    return auto_checked(key, input, out) if op is None and AUTO.enabled else out


def decided(input: Any, weight: Any, bias: Any) -> Any:
    """The table's entry for an eager call `linear(input, weight, bias)` (tensors; no activation, no row buckets:
    the key the call would look up first), or None (row buckets set: the call pads its rows first).
    plancache.torch's served layers look here before anything else: a geometry the table holds passed every
    check when it was decided."""
    if BUCKETS.functions:
        return None
    grad = _grad_on() and (input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    return TABLE.get(weighted_key("linear", input, weight, bias, None, grad))


def matmul(input: Any, other: Any) -> Any:
    """torch.matmul for operands of 2 dims or more (batches broadcast as
    torch does when one side is a single matrix or both have the same batch).
    No served backward: with autograd, torch's function runs it (use linear)."""
    if _compiling():
        return torch_matmul(input, other)
    try:
        grad = _grad_on() and (input.requires_grad or other.requires_grad)
        key = (
            "matmul",
            input.shape,
            input.stride(),
            input.dtype,
            input.get_device(),
            other.shape,
            other.stride(),
            other.dtype,
            other.get_device(),
            grad,
        )
    except (AttributeError, TypeError):
        return torch_matmul(input, other)
    entry = TABLE.get(key)
    if entry is not None:
        return entry((input, other))
    bound = MATMUL.bind((input, other), input=input, other=other)
    return first_call(
        bound,
        key,
        lambda: matmul_request(bound.geo("input"), bound.geo("other")),
        bound.fallback(torch_matmul),
        grad,
        raced=True,
    )


# ---- the forward graphs ----------------------------------------------------------------------


def linear_request(x: Geo, w: Geo, bias: Geo | None, act: str | None, training: bool = False) -> Request:
    """`training`: a GELU's or SiLU's input (the pre-activation) is an output
    too (uid PRE_ACTIVATION_UID), which its backward needs; a ReLU's backward reads its output."""
    dt = served_dtype(x, w, bias)
    if len(w.shape) != 2:
        raise Unserved(f"weight must be 2-D (out_features, in_features), got dims {w.shape}")
    n, k = w.shape
    if not x.shape or x.shape[-1] != k:
        raise Unserved(f"input dims {x.shape} do not end with weight's in_features ({k})")
    if bias is not None and bias.shape != (n,):
        raise Unserved(f"bias must have dims ({n},), got {bias.shape}")
    for t in (x, w, bias):
        if t is not None:
            no_zero_strides(t)
    m, sm = collapse(x.shape[:-1], x.stride[:-1], "input's leading dims")
    g = graph(LINEAR.function, dt)
    a = LINEAR.tensor(g, "input", [1, m, k], [m * k, row_stride(m, sm, k * x.stride[-1]), x.stride[-1]])
    b = LINEAR.tensor(g, "weight", [1, k, n], [k * n, w.stride[1], w.stride[0]])  # weight.T: the strides swapped
    y = g.matmul(a, b)
    if bias is not None:
        y = g.bias(y, LINEAR.tensor(g, "bias", [1, 1, n], [n, n, bias.stride[0]]))
    out = (*x.shape[:-1], n)
    extra: tuple[Output, ...] = ()
    if training and act in ("gelu", "silu"):
        y.set_output(True).set_name("pre_activation").set_uid(PRE_ACTIVATION_UID).set_data_type(dt)
        extra = (Output(PRE_ACTIVATION_UID, out, row_major(out), dt),)
    finish(activation(g, y, act))
    inputs = LINEAR.uids(input=x, weight=w, bias=bias)
    return request(LINEAR.function, g, inputs, out, row_major(out), dt, extra=extra)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """torch's batch broadcasting (right-aligned, each dim equal or 1)."""
    width = max(len(a), len(b))
    a, b = (1,) * (width - len(a)) + a, (1,) * (width - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            raise Unserved(f"batch dims {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def matmul_request(a: Geo, b: Geo) -> Request:
    dt = served_dtype(a, b)
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise Unserved("a 1-D operand (torch.matmul's vector rules)")
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise Unserved(f"input's columns ({k}) are not other's rows ({k2})")
    no_zero_strides(a)
    no_zero_strides(b)
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    out = (*_broadcast(batch_a, batch_b), m, n)
    sa, sb = a.stride[-2:], b.stride[-2:]
    if all(d == 1 for d in batch_b):  # one B: A's batch and rows are one matrix
        rows, s_rows = collapse(a.shape[:-1], a.stride[:-1], "input's batch and row dims")
        a_dims, a_strides = [1, rows, k], [rows * k, row_stride(rows, s_rows, k * sa[1]), sa[1]]
        b_dims, b_strides = [1, k, n], [k * n, *sb]
    elif batch_a == batch_b:
        count, s_a = collapse(batch_a, a.stride[:-2], "input's batch dims")
        _, s_b = collapse(batch_b, b.stride[:-2], "other's batch dims")
        a_dims, a_strides = [count, m, k], [s_a or m * k, *sa]
        b_dims, b_strides = [count, k, n], [s_b or k * n, *sb]
    elif all(d == 1 for d in batch_a):  # one A, broadcast over B's batch
        count, s_b = collapse(batch_b, b.stride[:-2], "other's batch dims")
        a_dims, a_strides = [1, m, k], [m * k, *sa]
        b_dims, b_strides = [count, k, n], [s_b or k * n, *sb]
    else:
        raise Unserved(f"batch dims {batch_a} and {batch_b} broadcast other than over a single matrix")
    g = graph(MATMUL.function, dt)
    finish(g.matmul(MATMUL.tensor(g, "input", a_dims, a_strides), MATMUL.tensor(g, "other", b_dims, b_strides)))
    return request(MATMUL.function, g, MATMUL.uids(input=a, other=b), out, row_major(out), dt)


# ---- linear's backward -----------------------------------------------------------------------


def _data_grad(m: int, n: int, k: int, w_stride: Sequence[int], dtype: str) -> Request:
    """dX [1, m, k] = dZ [1, m, n] @ W [n, k]: uids dZ 1 (row-major), weight 2 (its own strides)."""
    g = graph("linear.backward", dtype)
    dz = g.tensor([1, m, n], [m * n, n, 1], name="dZ", uid=1)
    w = g.tensor([1, n, k], [n * k, w_stride[0], w_stride[1]], name="weight", uid=2)
    g.matmul(dz, w).set_output(True).set_name("dX").set_uid(OUTPUT_UID)
    return Request("linear.backward", g, (1, 2), (Output(OUTPUT_UID, (1, m, k), row_major((1, m, k)), dtype),))


def _weight_grad(m: int, n: int, k: int, x_strides: Sequence[int], dtype: str) -> Request:
    """dW [1, n, k] = dZ^T [1, n, m] @ X [1, m, k]: uids dZ 1 (row-major, read
    transposed), input 2 (the view its forward declared, `x_strides`)."""
    g = graph("linear.backward", dtype)
    dz_t = g.tensor([1, n, m], [m * n, 1, n], name="dZ^T", uid=1)
    x = g.tensor([1, m, k], list(x_strides), name="input", uid=2)
    g.matmul(dz_t, x).set_output(True).set_name("dW").set_uid(OUTPUT_UID)
    return Request("linear.backward", g, (1, 2), (Output(OUTPUT_UID, (1, n, k), row_major((1, n, k)), dtype),))


def linear_rule(bound: Bound, act: str | None, forward: Request) -> Rule:
    """dZ = act'(Z) dY (a ReLU's from its output, a GELU's or SiLU's from the
    pre-activation its training forward saved), dX = dZ W, dW = dZ^T X, dBias = sum of dZ's rows."""
    x, w, bias = bound.geo("input"), bound.geo("weight"), bound.geo_or_none("bias")
    n, k = w.shape
    m, sm = collapse(x.shape[:-1], x.stride[:-1], "input's leading dims")
    x_strides = [m * k, row_stride(m, sm, k * x.stride[-1]), x.stride[-1]]  # the view linear_request declared
    out = forward.outputs[0]
    dt = out.dtype
    rows = (1, m, n)
    requests = {
        "dgrad": shaped(_data_grad(m, n, k, w.stride, dt), x.shape),
        "wgrad": shaped(_weight_grad(m, n, k, x_strides, dt), w.shape),
    }
    if bias is not None:
        requests["bgrad"] = shaped(bias_grad("linear.backward", rows, row_major(rows), (1, 1, n), dt), (n,))
    if act is not None:
        requests["act"] = activation_backward("linear.backward", rows, row_major(rows), act, dt)
    save_outputs = () if act is None else (0,) if act == "relu" else (1,)
    at_x, at_w, at_b, count = bound.index("input"), bound.index("weight"), bound.index("bias"), len(bound.tensors)
    assert at_x is not None and at_w is not None

    def run(
        p: dict[str, Served], inputs: list[Any], saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]
    ) -> tuple[Any, ...]:
        xt, wt = inputs[at_x], inputs[at_w]
        # dY (conformed to the output's dense layout) and the saved tensor are
        # the [1, m, n] rows the graphs declare, as memory: no view needed.
        dz = p["act"]((grad, saved[0])) if act is not None else grad
        grads: list[Any] = [None] * count
        grads[at_x] = p["dgrad"]((dz, wt)) if needs[at_x] else None
        grads[at_w] = p["wgrad"]((dz, xt)) if needs[at_w] else None
        if at_b is not None and needed(needs, at_b):
            grads[at_b] = p["bgrad"]((dz,)).to(dz.dtype)
        return tuple(grads)

    return Rule(
        requests, bound.saved, save_outputs, run, count, out.shape, out.stride, {"bgrad": TorchSum((0, 1), rows)}
    )


# ---- torch's --------------------------------------------------------------------------------


def torch_linear(input: Any, weight: Any, bias: Any = None, *, activation: str | None = None) -> Any:
    y = torch_module().nn.functional.linear(input, weight, bias)
    return y if activation is None else getattr(torch_module().nn.functional, activation)(y)


def torch_matmul(input: Any, other: Any) -> Any:
    return torch_module().matmul(input, other)

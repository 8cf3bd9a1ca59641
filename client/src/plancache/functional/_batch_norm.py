"""batch_norm: a half model's BatchNorm2d under torch's mixed precision, training and evaluation.

The module's order is every operator module's (plancache.functional.
_linear says it): signature, call, forward spec, backward graph and rule,
torch's function. Its signature has the call's own tensors after the
caller's: evaluation binds the inverse deviation it computes from
running_var (not running_var itself); training binds running_mean and
running_var twice, read and then written in place.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from plancache.functional import _modes
from plancache.functional._autograd import Rule
from plancache.functional._first_call import first_call
from plancache.functional._geometry import (
    Dims,
    Geo,
    Unserved,
    geo_or_none,
    is_dense,
    no_zero_strides,
    served_dtype,
    tensor_key,
)
from plancache.functional._norms import EPSILON_UID, INV_VARIANCE_UID, MEAN_UID, norm_node_run
from plancache.functional._op_call import BACKWARD, OpCall
from plancache.functional._requests import Constant, Output, Request, dense_like, finish, graph, request, shaped
from plancache.functional._signature import Bound, Signature, Slot
from plancache.functional._table import TABLE, Fallback
from plancache.functional._tensor_ops import torch_module
from plancache.graphspec.layouts import row_major

BATCH_NORM = Signature(
    "batch_norm",
    "BATCHNORM",
    Slot("input", 1, saved=True),
    Slot("weight", 2, optional=True, saved=True),
    Slot("bias", 3, optional=True),
    Slot("running_mean", 4, optional=True),
    Slot("running_var", 5, optional=True),  # training's; evaluation binds inv_variance instead
    Slot("inv_variance", 6, optional=True, to_torch=False),
    Slot("next_running_mean", 23, optional=True, to_torch=False),
    Slot("next_running_var", 24, optional=True, to_torch=False),
)
MOMENTUM_UID = 11
_grad_on, _compiling = _modes.install(globals())


def batch_norm(
    input: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Any:
    """torch.nn.functional.batch_norm of a 4-D float16/bfloat16 input with
    float32 per-channel tensors (a half model's BatchNorm2d under torch's
    mixed precision). Training: the batch's statistics, the running ones
    updated in place as torch does (cuDNN writes them; unbiased variance);
    differentiable through cuDNN's batchnorm backward. Evaluation: the
    running statistics (inv_variance computed each call); with autograd,
    torch's function runs it (its backward is per-channel pointwise math,
    a graph cuDNN computes wrongly: plancache.frontend_graph.defects)."""
    if _compiling():
        return torch_batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    try:
        grad = _grad_on() and (
            input.requires_grad
            or (weight is not None and weight.requires_grad)
            or (bias is not None and bias.requires_grad)
        )
        key = (
            "batch_norm",
            input.shape,
            input.stride(),
            input.dtype,
            input.get_device(),
            tensor_key(running_mean),
            tensor_key(running_var),
            tensor_key(weight),
            tensor_key(bias),
            bool(training),
            momentum,
            eps,
            grad,
        )
    except (AttributeError, TypeError):
        return torch_batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if (running_mean is None or running_var is None) and (not training or running_mean is not running_var):
        # torch's own answer (or error) for these
        return torch_batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    entry = TABLE.get(key)
    if type(entry) is Fallback:  # torch runs this geometry: with this call's running statistics, as torch would
        return entry.run(torch_batch_norm, input, running_mean, running_var, weight, bias, training, momentum, eps)
    # Built without generators: this is every call's path (run 22: batch_norm's host time was 1.42x raw + allocation).
    if weight is None:
        given: tuple[Any, ...] = (input,) if bias is None else (input, bias)
    else:
        given = (input, weight) if bias is None else (input, weight, bias)
    if not training:
        tensors = (*given, running_mean, inverse_deviation(running_var, eps))
    elif running_mean is None or running_var is None:
        tensors = given
    else:
        tensors = (*given, running_mean, running_var, running_mean, running_var)  # read, then written in place
    if entry is not None:
        return entry(tensors)
    running = _running(bool(training), running_mean, running_var, tensors[-1])
    bound = BATCH_NORM.bind(tensors, input=input, weight=weight, bias=bias, **running)

    def forward() -> Request:
        if momentum is None:
            raise Unserved("momentum=None (a cumulative average)")
        x, mean = bound.geo("input"), bound.geo_or_none("running_mean")
        var = bound.geo_or_none("running_var") if training else geo_or_none("running_var", running_var)
        w, b = bound.geo_or_none("weight"), bound.geo_or_none("bias")
        return batch_norm_request(x, mean, var, w, b, training=bool(training), momentum=float(momentum), eps=float(eps))

    def rule(forward: Request) -> Rule:
        if not training:
            raise Unserved(
                "autograd in evaluation mode (its backward is per-channel pointwise math, which cuDNN computes wrongly)"
            )
        return batch_norm_rule(bound, forward)

    def fallback(input: Any, weight: Any = None, bias: Any = None, **_statistics: Any) -> Any:
        # The first call's own statistics; a later call of a geometry torch runs passes its own (above).
        return torch_batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)

    return first_call(bound, key, forward, bound.fallback(fallback), grad, rule)


def batch_norm_op(
    input: Any,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    training: bool,
    momentum: float,
    eps: float,
    *,
    op: OpCall,
    next_mean: Any = None,
    next_var: Any = None,
) -> Any:
    """batch_norm for a torch operator (plancache.torch), running statistics given: what `op.take` gives
    (None where torch runs the geometry). An operator does not write its arguments, so training reads
    running_mean and running_var and writes the next ones into `next_mean` and `next_var` (the same graph as
    batch_norm's, whose call binds the running statistics to both); evaluation reads running_mean and the
    inverse deviation computed from running_var. The key leaves out requires_grad (an operator runs below
    autograd: its backward resolves the geometry with the forward's key)."""
    if _compiling():
        return None
    key = _op_key(
        input, weight, bias, _layout_key(running_mean), _layout_key(running_var), training, momentum, eps, op.train
    )
    if weight is None:
        given: tuple[Any, ...] = (input,) if bias is None else (input, bias)
    else:
        given = (input, weight) if bias is None else (input, weight, bias)
    if training:
        tensors = (*given, running_mean, running_var, next_mean, next_var)
        inv_variance = None
    else:
        inv_variance = inverse_deviation(running_var, eps)
        tensors = (*given, running_mean, inv_variance)
    entry = TABLE.get(key)
    if entry is not None:
        return op.take(entry, tensors)
    bound = BATCH_NORM.bind(
        tensors,
        input=input,
        weight=weight,
        bias=bias,
        running_mean=running_mean,
        running_var=running_var if training else None,
        inv_variance=inv_variance,
        next_running_mean=next_mean if training else None,
        next_running_var=next_var if training else None,
    )

    def forward() -> Request:
        x, mean = bound.geo("input"), bound.geo("running_mean")
        var = bound.geo("running_var") if training else geo_or_none("running_var", running_var)
        w, b = bound.geo_or_none("weight"), bound.geo_or_none("bias")
        return batch_norm_request(x, mean, var, w, b, training=training, momentum=momentum, eps=eps)

    def rule(forward: Request) -> Rule:
        return batch_norm_rule(bound, forward)

    def fallback(input: Any, weight: Any = None, bias: Any = None, **_statistics: Any) -> Any:
        # Nothing written: the operator runs torch's function itself (op.take gives None).
        return None

    return first_call(bound, key, forward, bound.fallback(fallback), op.train, rule if training else None, op)


def batch_norm_backward_entry(input: Any, weight: Any, bias: Any, momentum: float, eps: float) -> Any:
    """For a backward operator: the training geometry's entry under the forward's key (what
    batch_norm_op(op=BACKWARD) gives), whose running statistics' part is the layout a served forward's had,
    float32 [C] on the input's device (any other was torch's). Stand-ins of that layout are made only when
    the table does not hold the geometry yet; a hit allocates nothing."""
    channels, device = input.shape[1], input.get_device()
    stats = ((channels,), (1,), torch_module().float32, device)
    entry = TABLE.get(_op_key(input, weight, bias, stats, stats, True, momentum, eps, True))
    if entry is not None:
        return entry
    stand_in = input.new_empty((channels,), dtype=torch_module().float32)
    return batch_norm_op(
        input, weight, bias, stand_in, stand_in, True, momentum, eps, op=BACKWARD, next_mean=stand_in, next_var=stand_in
    )


def _op_key(
    input: Any,
    weight: Any,
    bias: Any,
    mean_layout: Hashable,
    var_layout: Hashable,
    training: bool,
    momentum: float,
    eps: float,
    train: bool,
) -> Hashable:
    return (
        "batch_norm.op",
        input.shape,
        input.stride(),
        input.dtype,
        input.get_device(),
        mean_layout,
        var_layout,
        _layout_key(weight),
        _layout_key(bias),
        training,
        momentum,
        eps,
        train,
    )


def _layout_key(t: Any) -> Hashable:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


def _running(training: bool, mean: Any, var: Any, inv_variance: Any) -> dict[str, Any]:
    """The running statistics' slots, by mode: training binds running_mean and running_var
    twice, read and then written in place (uids 4, 5 and 23, 24); evaluation binds running_mean
    and the inverse deviation the call computes from running_var (uids 4, 6)."""
    in_place = training and mean is not None
    return {
        "running_mean": mean,
        "running_var": var if in_place else None,
        "inv_variance": None if training else inv_variance,
        "next_running_mean": mean if in_place else None,
        "next_running_var": var if in_place else None,
    }


def inverse_deviation(running_var: Any, eps: float) -> Any:
    """batchnorm_inference's inv_variance: 1 / sqrt(running_var + eps)
    (running_var None: torch's error, from the fallback)."""
    return None if running_var is None else torch_module().rsqrt(running_var + eps)


# ---- the forward graph -----------------------------------------------------------------------


def batch_norm_request(
    x: Geo,
    running_mean: Geo | None,
    running_var: Geo | None,
    weight: Geo | None,
    bias: Geo | None,
    *,
    training: bool,
    momentum: float,
    eps: float,
) -> Request:
    """torch.nn.functional.batch_norm of a 4-D float16/bfloat16 input with
    float32 per-channel tensors (torch's own mixed precision for a half
    model's BatchNorm2d), the output in the input's layout.

    Training: cuDNN's batchnorm node; the batch's mean and inv_variance are
    outputs (the backward's, uids 21, 22), and the next running statistics
    are written over the caller's running_mean and running_var (uids 23, 24
    bound to the same tensors as 4, 5: the frontend's own test_batchnorm does
    so, and the update is torch's: unbiased variance, `momentum`).
    Evaluation: batchnorm_inference, its inv_variance (uid 6) computed by the call."""
    dt = served_dtype(x)
    if len(x.shape) != 4:
        raise Unserved(f"input dims {x.shape}: cuDNN's batchnorm takes 4-D (N, C, H, W) inputs")
    no_zero_strides(x)
    channels = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and (t.shape != (channels,) or t.dtype != "float" or not is_dense(t)):
            raise Unserved(
                f"{name} must be a contiguous float32 ({channels},) tensor, got {t.dtype_text} dims {t.shape}"
            )
    if (running_mean is None) != (running_var is None):
        raise Unserved("running_mean and running_var go together")
    if not training and running_mean is None:
        raise Unserved("evaluation without running statistics")
    params = [1, channels, 1, 1]
    layout = dense_like(x.shape, x.stride)
    g = graph(BATCH_NORM.function, dt)
    xt = BATCH_NORM.tensor(g, "input", x.shape, x.stride)
    constants = []
    ports = []
    for name, given, fill in (("weight", weight, 1.0), ("bias", bias, 0.0)):
        ports.append(BATCH_NORM.tensor(g, name, params, data_type="float"))
        if given is None:
            constants.append(Constant(BATCH_NORM.uid(name), tuple(params), fill, "float"))
    extra: list[Output] = []
    in_place = training and running_mean is not None
    if training:
        running: dict[str, Any] = {}
        if running_mean is not None:
            running = {
                "in_running_mean": BATCH_NORM.tensor(g, "running_mean", params, data_type="float"),
                "in_running_var": BATCH_NORM.tensor(g, "running_var", params, data_type="float"),
                "momentum": g.scalar(float(momentum), name="momentum", uid=MOMENTUM_UID),
            }
            constants.append(Constant(MOMENTUM_UID, (1, 1, 1, 1), float(momentum), "float", on_host=True))
        y, mean, inv_var, next_mean, next_var = g.node(
            "batchnorm",
            input=xt,
            scale=ports[0],
            bias=ports[1],
            epsilon=g.scalar(float(eps), name="epsilon", uid=EPSILON_UID),
            **running,
        )
        constants.append(Constant(EPSILON_UID, (1, 1, 1, 1), float(eps), "float", on_host=True))
        for made, name, uid in ((mean, "mean", MEAN_UID), (inv_var, "inv_variance", INV_VARIANCE_UID)):
            assert made is not None
            made.set_output(True).set_name(name).set_uid(uid).set_data_type("float")
            extra.append(Output(uid, tuple(params), row_major(params), "float"))
        if in_place:
            for made, name in ((next_mean, "next_running_mean"), (next_var, "next_running_var")):
                assert made is not None
                made.set_output(True).set_name(name).set_uid(BATCH_NORM.uid(name)).set_data_type("float")
    else:
        mean_t = BATCH_NORM.tensor(g, "running_mean", params, data_type="float")
        inv_t = BATCH_NORM.tensor(g, "inv_variance", params, data_type="float")
        y = g.batchnorm_inference(xt, mean_t, inv_t, ports[0], ports[1])
    assert y is not None
    finish(y, layout)
    inputs = BATCH_NORM.uids(
        input=x, weight=weight, bias=bias, **_running(training, running_mean, running_var, running_var)
    )
    return request(BATCH_NORM.function, g, inputs, x.shape, layout, dt, constants, extra)


# ---- the backward ----------------------------------------------------------------------------


def _backward(x_dims: Dims, x_strides: Dims, channels: int, dtype: str, weight_given: bool) -> Request:
    """uids dY 1 and input 2 (the input's layout), weight 3 (float32 [1, C, 1, 1],
    a constant of ones without one), the batch's mean 4 and inv_variance 5;
    outputs dX 20 (the input's layout), dWeight 21 and dBias 22 (float32)."""
    g = graph("batch_norm.backward", dtype)
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


def batch_norm_rule(bound: Bound, forward: Request) -> Rule:
    """batchnorm_backward from dY, the input, the weight and the batch's saved mean and inv_variance."""
    x, weight = bound.geo("input"), bound.geo_or_none("weight")
    out = forward.outputs[0]
    backward = shaped(
        _backward(x.shape, out.stride, x.shape[1], out.dtype, weight is not None), None, (x.shape[1],), (x.shape[1],)
    )
    if tuple(x.stride) != tuple(out.stride):
        raise Unserved(
            f"input strides {x.stride} are not a dense layout (batchnorm's backward reads it as its output's)"
        )
    count = len(bound.tensors)
    return Rule({"backward": backward}, bound.saved, (1, 2), norm_node_run(bound), count, out.shape, out.stride)


# ---- torch's --------------------------------------------------------------------------------


def torch_batch_norm(
    input: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Any:
    return torch_module().nn.functional.batch_norm(
        input, running_mean, running_var, weight, bias, training, momentum, eps
    )

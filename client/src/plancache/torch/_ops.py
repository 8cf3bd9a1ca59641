"""plancache's torch operators: each function a registered operator, its training forward and backward too.

    torch.ops.plancache.layer_norm(x, [768], w, b, 1e-5)          # inference: one served plan
    out, mean, rstd = torch.ops.plancache.layer_norm_train(...)   # training: what the backward reads too

Every function of plancache.functional that has a served backward is three
operators (`torch.library`): `<name>` (inference), `<name>_train`
(the training forward: its result and what its backward reads, as
aten::native_layer_norm returns its statistics) and `<name>_backward`,
which the training forward's autograd registration calls. So
torch.compile traces them as any aten operator (no graph break), AOT
autograd puts the backward operator in the backward graph, and the
compiled program runs the served plans: an operator's implementation is
the function's geometry table (plancache.functional._op_call), called at
run time, never traced.

An operator's outputs have one layout whatever runs them (its fake
implementation says it; the layouts torch would give): a geometry
plancache does not serve, or one on the CPU, runs torch's own forward and
backward (plancache.torch._torch_math), which write and read the same
saved outputs as the served plans.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from plancache.functional import _attention, _batch_norm, _convolution, _linear, _norms
from plancache.functional._autograd import Differentiable, conform
from plancache.functional._op_call import BACKWARD, INFERENCE, TRAINING
from plancache.functional._requests import ACTIVATIONS
from plancache.torch import _torch_math as tm

NAMESPACE = "plancache"
# The operators are defined through torch.library.Library rather than
# torch.library.custom_op: the same schema, fake implementation and autograd
# registration, without custom_op's Python wrapper around every call (its
# autograd wrapper, redispatch and dynamo guard: ~30 µs a call against ~10 µs
# on the development CPU, bench/torch_mode_cost.py), which a compiled program
# would pay per operator outside a CUDA graph.
LIBRARY = torch.library.Library(NAMESPACE, "DEF")


class Operator:
    """One of plancache's operators: `torch.ops.plancache.<name>`, its
    implementation (one for every device: the CUDA path asks plancache,
    the others run torch's own), fake implementation and autograd."""

    def __init__(self, name: str, schema: str, implementation: Callable[..., Any]) -> None:
        self.name, self.qualname = name, f"{NAMESPACE}::{name}"
        LIBRARY.define(f"{name}{schema}")
        LIBRARY.impl(name, implementation, "CompositeExplicitAutograd")
        self.implementation = implementation
        self.gradient: Gradient | None = None

    def __call__(self, *args: Any) -> Any:
        return getattr(torch.ops.plancache, self.name)(*args)

    def register_fake(self, fake: Callable[..., Any]) -> Callable[..., Any]:
        torch.library.register_fake(self.qualname, fake, lib=LIBRARY)
        return fake

    def register_gradient(self, gradient: Gradient) -> None:
        """Its autograd (`gradient`): Python's registration now, the native extension's C++ one where it loads."""
        self.gradient = gradient
        torch.library.register_autograd(
            self.qualname, gradient.backward_call, setup_context=gradient.setup_context, lib=LIBRARY
        )


def operator(name: str, schema: str) -> Callable[[Callable[..., Any]], Operator]:
    """`@operator("layer_norm", "(Tensor input, ...) -> Tensor")`: the function below is its implementation."""

    def define(implementation: Callable[..., Any]) -> Operator:
        return Operator(name, schema, implementation)

    return define


# What a training operator's autograd keeps at its forward and hands its backward operator, as data: one
# description for both registrations that read it, Python's (`Operator.register_gradient`: torch.library's
# register_autograd) and the native extension's C++ one (plancache.torch.native installs it where it loads: no
# Python on an eager training call's autograd). A backward operator's arguments are the incoming gradient of
# the first output, then these, in order:
ARGUMENT, OUTPUT, OUTPUTS, NEEDS = 0, 1, 2, 3  # a forward argument; a forward output; every output as one list;
# whether each tensor of `of` wants its gradient (the forward's needs_input_grad)


@dataclass(frozen=True)
class Gradient:
    """A training operator's backward: `backward` called with (grad of output 0, *arguments), its results the
    gradients of the forward arguments at `of`; the outputs at `non_differentiable` carry none."""

    backward: str
    arguments: tuple[tuple[int, int], ...]
    of: tuple[int, ...]
    non_differentiable: tuple[int, ...] = ()
    # Read from `arguments` once (each call's setup and backward would otherwise walk them).
    _kept: tuple[int, ...] = field(init=False, repr=False)  # forward arguments read
    _outputs: tuple[int, ...] = field(init=False, repr=False)  # outputs read (OUTPUT)
    _every_output: bool = field(init=False, repr=False)  # OUTPUTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "_kept", tuple(sorted({i for kind, i in self.arguments if kind == ARGUMENT})))
        object.__setattr__(self, "_outputs", tuple(sorted({i for kind, i in self.arguments if kind == OUTPUT})))
        object.__setattr__(self, "_every_output", any(kind == OUTPUTS for kind, _ in self.arguments))

    def setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        outputs = output if isinstance(output, (list, tuple)) else (output,)
        tensors = [i for i in self._kept if isinstance(inputs[i], Tensor)]
        kept_outputs = range(len(outputs)) if self._every_output else self._outputs
        ctx.save_for_backward(*[inputs[i] for i in tensors], *[outputs[k] for k in kept_outputs])
        # The arguments that are not tensors, by position (the tensors come back from saved_tensors).
        ctx.layout = (tensors, kept_outputs, {i: inputs[i] for i in self._kept if i not in tensors})
        if self.non_differentiable:
            ctx.mark_non_differentiable(*[outputs[k] for k in self.non_differentiable])

    def backward_call(self, ctx: Any, *grads: Any) -> tuple[Any, ...]:
        tensors, kept_outputs, others = ctx.layout
        saved = ctx.saved_tensors
        values = dict(zip(tensors, saved, strict=False))  # the saved outputs follow
        count = len(tensors)
        needs = ctx.needs_input_grad
        grad = grads[0][0] if isinstance(grads[0], (list, tuple)) else grads[0]  # a Tensor[] result's first
        arguments: list[Any] = [grad]
        for kind, i in self.arguments:
            if kind == ARGUMENT:
                arguments.append(values[i] if i in values else others[i])
            elif kind == OUTPUT:
                arguments.append(saved[count + kept_outputs.index(i)])
            elif kind == OUTPUTS:
                arguments.append(list(saved[count:]))
            else:
                arguments.append([bool(needs[j]) for j in self.of])
        results = getattr(torch.ops.plancache, self.backward)(*arguments)
        full: list[Any] = [None] * len(needs)
        for j, g in zip(self.of, results, strict=True):
            full[j] = g
        return tuple(full)


def _arguments(*positions: int) -> tuple[tuple[int, int], ...]:
    return tuple((ARGUMENT, i) for i in positions)


def _served(t: Tensor) -> bool:
    """Whether plancache is asked: a CUDA tensor (the CPU's run torch's own). is_cuda: a tenth of device.type's
    cost, on every operator call. The first such call starts the native kernels (plancache.torch.native),
    which take the operators' CUDA calls from then on and call these implementations for what they have not
    kept."""
    if t.is_cuda:
        if _native is None:
            _start_native()
        return True
    return False


_native: Any = None  # plancache.torch.native.NATIVE, once started


def native() -> Any:
    """The native extension's holder (its `state`: "on" where its kernels and autograd serve), started at the
    first ask: what the setting says happens then (plancache.torch.native)."""
    if _native is None:
        _start_native()
    return _native


def _start_native() -> None:
    """The native kernels' start, once per process (imported here, not at the module's import: `python -m
    plancache.torch.native` would otherwise find its module imported by the package first)."""
    global _native
    from plancache.torch.native import NATIVE

    NATIVE.start(OPERATORS)
    _native = NATIVE


def _present(*tensors: Tensor | None) -> tuple[Tensor, ...]:
    """A call's tuple of tensors (plancache.functional's order): those given."""
    return tuple(t for t in tensors if t is not None)


def _run_rule(
    entry: Differentiable, tensors: tuple[Tensor, ...], saved: tuple[Tensor, ...], grad: Tensor, needs: Sequence[bool]
) -> tuple[Any, ...]:
    """A served geometry's backward: its rule's graphs, one gradient (or None) per tensor of the call's tuple."""
    rule = entry.rule
    return rule.run(entry.pieces, list(tensors), saved, conform(grad, rule.out_stride), needs)


def _spread(grads: tuple[Any, ...], given: Sequence[bool]) -> list[Any]:
    """Gradients of the call's tuple (given tensors only) at the operator's fixed positions."""
    it = iter(grads)
    return [next(it) if present else None for present in given]


def _check_activation(activation: str | None) -> None:
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(
            f"plancache::linear: activation {activation!r} is not one of None, {', '.join(map(repr, ACTIVATIONS))}"
        )


# ---- layer_norm -----------------------------------------------------------------------------------

_GRADS3 = "(Tensor?, Tensor?, Tensor?)"
_NORM_ARGS = "Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps"


@operator("layer_norm", f"({_NORM_ARGS}) -> Tensor")
def layer_norm(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    if _served(input):
        out = _norms._layer_norm(input, normalized_shape, weight, bias, eps, op=INFERENCE)
        if out is not None:
            return tm.in_layout_of(out, input)
    return tm.in_layout_of(F.layer_norm(input, list(normalized_shape), weight, bias, eps), input)


def _layer_norm_layouts(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    """The result's layout and a row statistic's; torch's checks of the call, made at trace time."""
    F.layer_norm(input, list(normalized_shape), weight, bias, eps)
    stats = (tm.rows_of(input, normalized_shape), 1, 1, 1)
    return torch.empty_like(input), input.new_empty(stats, dtype=tm.stats_dtype(input))


# A fake implementation is given the schema's arguments, positionally (the dispatcher's).
@layer_norm.register_fake
def _layer_norm_fake(*args: Any) -> Tensor:
    return _layer_norm_layouts(*args)[0]


@operator("layer_norm_train", f"({_NORM_ARGS}) -> (Tensor, Tensor, Tensor)")
def layer_norm_train(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The result, the rows' mean and inverse deviation (float32 [rows, 1, 1, 1])."""
    if _served(input):
        outs = _norms._layer_norm(input, normalized_shape, weight, bias, eps, op=TRAINING)
        if outs is not None:
            out, mean, inv_variance = outs
            return tm.in_layout_of(out, input), mean, inv_variance
    return tm.layer_norm_train(input, normalized_shape, weight, bias, eps)


@layer_norm_train.register_fake
def _layer_norm_train_fake(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    out, stats = _layer_norm_layouts(*args)
    return out, stats, torch.empty_like(stats)


@operator(
    "layer_norm_backward", f"(Tensor grad, {_NORM_ARGS}, Tensor mean, Tensor inv_variance, bool[] needs) -> {_GRADS3}"
)
def layer_norm_backward(
    grad: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    mean: Tensor,
    inv_variance: Tensor,
    needs: Sequence[bool],
) -> tuple[Tensor | None, ...]:
    """dInput, dWeight, dBias (None where not needed or not given)."""
    if _served(input):
        entry = _norms._layer_norm(input, normalized_shape, weight, bias, eps, op=BACKWARD)
        if isinstance(entry, Differentiable):
            given = (True, weight is not None, bias is not None)
            tensors = _present(input, weight, bias)
            wanted = [n for n, g in zip(needs, given, strict=True) if g]
            dx, dw, db = _spread(_run_rule(entry, tensors, (mean, inv_variance), grad, wanted), given)
            return _grads((dx, dw, db), (input, weight, bias), needs)
    return _grads(
        tm.layer_norm_backward(grad, input, normalized_shape, weight, bias, mean, inv_variance, needs),
        (input, weight, bias),
        needs,
    )


def _grads(
    grads: Sequence[Tensor | None], tensors: Sequence[Tensor | None], needs: Sequence[bool]
) -> tuple[Tensor | None, ...]:
    """Each gradient in its tensor's layout (torch.empty_like's), None where not needed or no
    tensor: what the fake implementation says."""
    out: list[Tensor | None] = []
    for g, t, n in zip(grads, tensors, needs, strict=True):
        out.append(tm.in_layout_of(g, t) if n and t is not None and g is not None else None)
    return tuple(out)


def _grads_fake(tensors: Sequence[Tensor | None], needs: Sequence[bool]) -> tuple[Tensor | None, ...]:
    return tuple(torch.empty_like(t) if n and t is not None else None for t, n in zip(tensors, needs, strict=True))


@layer_norm_backward.register_fake
def _layer_norm_backward_fake(
    grad: Tensor, input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, *rest: Any
) -> tuple[Tensor | None, ...]:
    return _grads_fake((input, weight, bias), rest[-1])


layer_norm_train.register_gradient(
    Gradient("layer_norm_backward", (*_arguments(0, 1, 2, 3, 4), (OUTPUT, 1), (OUTPUT, 2), (NEEDS, 0)), of=(0, 2, 3))
)


# ---- rms_norm -------------------------------------------------------------------------------------

_RMS_ARGS = "Tensor input, int[] normalized_shape, Tensor? weight, float? eps"


@operator("rms_norm", f"({_RMS_ARGS}) -> Tensor")
def rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None) -> Tensor:
    if _served(input):
        out = _norms._rms_norm(input, normalized_shape, weight, eps, op=INFERENCE)
        if out is not None:
            return tm.in_layout_of(out, input)
    return tm.in_layout_of(F.rms_norm(input, list(normalized_shape), weight, eps), input)


def _rms_norm_layouts(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None
) -> tuple[Tensor, Tensor]:
    """The result's layout and the row statistic's; torch's checks of the call, made at trace time."""
    F.rms_norm(input, list(normalized_shape), weight, eps)
    stats = (tm.rows_of(input, normalized_shape), 1, 1, 1)
    return torch.empty_like(input), input.new_empty(stats, dtype=tm.stats_dtype(input))


@rms_norm.register_fake
def _rms_norm_fake(*args: Any) -> Tensor:
    return _rms_norm_layouts(*args)[0]


@operator("rms_norm_train", f"({_RMS_ARGS}) -> (Tensor, Tensor)")
def rms_norm_train(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None
) -> tuple[Tensor, Tensor]:
    """The result and the rows' inverse root mean square (float32 [rows, 1, 1, 1])."""
    if _served(input):
        outs = _norms._rms_norm(input, normalized_shape, weight, eps, op=TRAINING)
        if outs is not None:
            out, inv_variance = outs
            return tm.in_layout_of(out, input), inv_variance
    return tm.rms_norm_train(input, normalized_shape, weight, eps)


@rms_norm_train.register_fake
def _rms_norm_train_fake(*args: Any) -> tuple[Tensor, Tensor]:
    return _rms_norm_layouts(*args)


@operator("rms_norm_backward", f"(Tensor grad, {_RMS_ARGS}, Tensor inv_variance, bool[] needs) -> (Tensor?, Tensor?)")
def rms_norm_backward(
    grad: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    eps: float | None,
    inv_variance: Tensor,
    needs: Sequence[bool],
) -> tuple[Tensor | None, ...]:
    """dInput, dWeight (None where not needed or not given)."""
    if _served(input):
        entry = _norms._rms_norm(input, normalized_shape, weight, eps, op=BACKWARD)
        if isinstance(entry, Differentiable):
            given = (True, weight is not None)
            wanted = [n for n, g in zip(needs, given, strict=True) if g]
            grads = _spread(_run_rule(entry, _present(input, weight), (inv_variance,), grad, wanted), given)
            return _grads(grads, (input, weight), needs)
    return _grads(
        tm.rms_norm_backward(grad, input, normalized_shape, weight, inv_variance, needs), (input, weight), needs
    )


@rms_norm_backward.register_fake
def _rms_norm_backward_fake(
    grad: Tensor, input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, *rest: Any
) -> tuple[Tensor | None, ...]:
    return _grads_fake((input, weight), rest[-1])


rms_norm_train.register_gradient(
    Gradient(
        "rms_norm_backward",
        (*_arguments(0, 1, 2, 3), (OUTPUT, 1), (NEEDS, 0)),
        of=(0, 2),
    )
)


# ---- linear ---------------------------------------------------------------------------------------

_LINEAR_ARGS = "Tensor input, Tensor weight, Tensor? bias, str? activation"


def _linear_out(input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The result's layout (row-major), torch's checks of the call made at trace time."""
    F.linear(input, weight, bias)
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


@operator("linear", f"({_LINEAR_ARGS}) -> Tensor")
def linear(input: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
    """input @ weight.T + bias, then `activation` (None, "relu", "gelu", "silu"): row-major."""
    _check_activation(activation)
    if _served(input):
        out = _linear._linear(input, weight, bias, activation=activation, op=INFERENCE)
        if out is not None:
            return out if out.is_contiguous() else out.contiguous()
    return tm.linear_train(input, weight, bias, activation, train=False)[0]


@linear.register_fake
def _linear_fake(input: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
    _check_activation(activation)
    return _linear_out(input, weight, bias)


@operator("linear_train", f"({_LINEAR_ARGS}) -> Tensor[]")
def linear_train(input: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> list[Tensor]:
    """The result, and a GELU's or SiLU's pre-activation (its backward reads it)."""
    _check_activation(activation)
    if _served(input):
        outs = _linear._linear(input, weight, bias, activation=activation, op=TRAINING)
        if outs is not None:
            return [t if t.is_contiguous() else t.contiguous() for t in outs]
    return tm.linear_train(input, weight, bias, activation, train=True)


@linear_train.register_fake
def _linear_train_fake(input: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> list[Tensor]:
    _check_activation(activation)
    count = 2 if tm.saves_pre_activation(activation) else 1
    return [_linear_out(input, weight, bias) for _ in range(count)]


@operator(
    "linear_backward", f"(Tensor grad, {_LINEAR_ARGS}, Tensor[] saved, bool[] needs) -> (Tensor?, Tensor?, Tensor?)"
)
def linear_backward(
    grad: Tensor,
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    activation: str | None,
    saved: Sequence[Tensor],
    needs: Sequence[bool],
) -> tuple[Tensor | None, ...]:
    """dInput, dWeight, dBias (None where not needed or not given); `saved`: the training forward's outputs."""
    if _served(input):
        entry = _linear._linear(input, weight, bias, activation=activation, op=BACKWARD)
        if isinstance(entry, Differentiable):
            given = (True, True, bias is not None)
            wanted = [n for n, g in zip(needs, given, strict=True) if g]
            kept = tuple(saved[i] for i in entry.rule.save_outputs)
            grads = _spread(_run_rule(entry, _present(input, weight, bias), kept, grad, wanted), given)
            return _grads(grads, (input, weight, bias), needs)
    return _grads(tm.linear_backward(grad, input, weight, bias, activation, saved, needs), (input, weight, bias), needs)


@linear_backward.register_fake
def _linear_backward_fake(
    grad: Tensor, input: Tensor, weight: Tensor, bias: Tensor | None, *rest: Any
) -> tuple[Tensor | None, ...]:
    return _grads_fake((input, weight, bias), rest[-1])


linear_train.register_gradient(
    Gradient("linear_backward", (*_arguments(0, 1, 2, 3), (OUTPUTS, 0), (NEEDS, 0)), of=(0, 1, 2))
)


# ---- scaled_dot_product_attention -----------------------------------------------------------------

_SDPA_ARGS = "Tensor query, Tensor key, Tensor value, Tensor? attn_mask, bool is_causal, float? scale, bool enable_gqa"


def _sdpa_call(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    op: Any,
) -> Any:
    return _attention._sdpa(
        query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa, None, None, None, False, op=op
    )


def _sdpa_out(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> Tensor:
    """O's layout (row-major [b, h, s_q, d_v]), torch's checks of the call made at trace time."""
    gqa = {"enable_gqa": True} if enable_gqa else {}
    F.scaled_dot_product_attention(query, key, value, attn_mask, 0.0, is_causal, scale=scale, **gqa)
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


@operator("sdpa", f"({_SDPA_ARGS}) -> Tensor")
def sdpa(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention without dropout: O, row-major [b, h, s_q, d_v]."""
    if _served(query):
        out = _sdpa_call(query, key, value, attn_mask, is_causal, scale, enable_gqa, INFERENCE)
        if out is not None:
            return out if out.is_contiguous() else out.contiguous()
    return tm.sdpa_train(query, key, value, attn_mask, is_causal, scale, enable_gqa, train=False)[0]


@sdpa.register_fake
def _sdpa_fake(*args: Any) -> Tensor:
    return _sdpa_out(*args)


@operator("sdpa_train", f"({_SDPA_ARGS}) -> (Tensor, Tensor)")
def sdpa_train(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[Tensor, Tensor]:
    """O and the rows' log-sum-exp of the scaled scores (float32 [b, h, s_q, 1]: cuDNN's softmax statistics)."""
    if _served(query):
        outs = _sdpa_call(query, key, value, attn_mask, is_causal, scale, enable_gqa, TRAINING)
        if outs is not None:
            out, stats = outs
            return (out if out.is_contiguous() else out.contiguous()), stats
    out, stats = tm.sdpa_train(query, key, value, attn_mask, is_causal, scale, enable_gqa, train=True)
    return out, stats


@sdpa_train.register_fake
def _sdpa_train_fake(*args: Any) -> tuple[Tensor, Tensor]:
    out = _sdpa_out(*args)
    return out, out.new_empty((*out.shape[:-1], 1), dtype=tm.stats_dtype(out))


@operator(
    "sdpa_backward",
    f"(Tensor grad, {_SDPA_ARGS}, Tensor out, Tensor stats, bool[] needs) -> (Tensor?, Tensor?, Tensor?)",
)
def sdpa_backward(
    grad: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    out: Tensor,
    stats: Tensor,
    needs: Sequence[bool],
) -> tuple[Tensor | None, ...]:
    """dQuery, dKey, dValue (None where not needed); the mask takes no gradient here."""
    if _served(query):
        entry = _sdpa_call(query, key, value, attn_mask, is_causal, scale, enable_gqa, BACKWARD)
        if isinstance(entry, Differentiable):
            tensors = _present(query, key, value, attn_mask)
            wanted = [*needs, False][: len(tensors)]
            grads = _run_rule(entry, tensors, (out, stats), grad, wanted)[:3]
            return _grads(grads, (query, key, value), needs)
    return _grads(
        tm.sdpa_backward(grad, query, key, value, attn_mask, is_causal, scale, out, stats, needs),
        (query, key, value),
        needs,
    )


@sdpa_backward.register_fake
def _sdpa_backward_fake(
    grad: Tensor, query: Tensor, key: Tensor, value: Tensor, *rest: Any
) -> tuple[Tensor | None, ...]:
    return _grads_fake((query, key, value), rest[-1])


sdpa_train.register_gradient(
    Gradient("sdpa_backward", (*_arguments(*range(7)), (OUTPUT, 0), (OUTPUT, 1), (NEEDS, 0)), of=(0, 1, 2))
)


# ---- conv2d ---------------------------------------------------------------------------------------

_CONV_ARGS = (
    "Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, int[2] dilation, int groups, bool relu"
)


def _conv_call(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    relu: bool,
    op: Any,
) -> Any:
    return _convolution._conv2d(
        input, weight, bias, tuple(stride), tuple(padding), tuple(dilation), groups, relu=relu, op=op
    )


def _conv_fake(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Tensor:
    y = F.conv2d(input, weight, bias, list(stride), list(padding), list(dilation), groups)
    return torch.empty_like(y, memory_format=tm.conv_memory_format(input, weight))


def _conv2d_forward(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    relu: bool,
    *,
    op: Any,
) -> Tensor:
    fmt = tm.conv_memory_format(input, weight)
    if _served(input):
        got = _conv_call(input, weight, bias, stride, padding, dilation, groups, relu, op)
        if got is not None:
            out = got[0] if isinstance(got, tuple) else got
            return tm.contiguous_in(out, fmt)
    return tm.conv2d_forward(input, weight, bias, stride, padding, dilation, groups, relu)


# torch.nn.functional.conv2d (numeric padding), a ReLU after it where `relu`: channels-last when an operand is,
# contiguous otherwise. The training forward is the same call of the geometry's training form (its backward reads
# the inputs, and a ReLU's output). A Library implementation is given the schema's arguments positionally.
conv2d = operator("conv2d", f"({_CONV_ARGS}) -> Tensor")(lambda *args: _conv2d_forward(*args, op=INFERENCE))
conv2d_train = operator("conv2d_train", f"({_CONV_ARGS}) -> Tensor")(lambda *args: _conv2d_forward(*args, op=TRAINING))


def _conv2d_fake(*args: Any) -> Tensor:
    return _conv_fake(*args[:7])


conv2d.register_fake(_conv2d_fake)
conv2d_train.register_fake(_conv2d_fake)


@operator("conv2d_backward", f"(Tensor grad, {_CONV_ARGS}, Tensor out, bool[] needs) -> (Tensor?, Tensor?, Tensor?)")
def conv2d_backward(
    grad: Tensor,
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    relu: bool,
    out: Tensor,
    needs: Sequence[bool],
) -> tuple[Tensor | None, ...]:
    """dInput, dWeight, dBias (None where not needed or not given)."""
    if _served(input):
        entry = _conv_call(input, weight, bias, stride, padding, dilation, groups, relu, BACKWARD)
        if isinstance(entry, Differentiable):
            given = (True, True, bias is not None)
            wanted = [n for n, g in zip(needs, given, strict=True) if g]
            kept = (out,) if relu else ()
            grads = _spread(_run_rule(entry, _present(input, weight, bias), kept, grad, wanted), given)
            return _grads(grads, (input, weight, bias), needs)
    torch_grads = tm.conv2d_backward(grad, input, weight, bias, stride, padding, dilation, groups, relu, out, needs)
    return _grads(torch_grads, (input, weight, bias), needs)


@conv2d_backward.register_fake
def _conv2d_backward_fake(
    grad: Tensor, input: Tensor, weight: Tensor, bias: Tensor | None, *rest: Any
) -> tuple[Tensor | None, ...]:
    return _grads_fake((input, weight, bias), rest[-1])


conv2d_train.register_gradient(
    Gradient("conv2d_backward", (*_arguments(*range(8)), (OUTPUT, 0), (NEEDS, 0)), of=(0, 1, 2))
)

# ---- batch_norm ------------------------------------------------------------------------------------

_BN_ARGS = "Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var"


@operator("batch_norm", f"({_BN_ARGS}, float eps) -> Tensor")
def batch_norm(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    eps: float,
) -> Tensor:
    """Evaluation: normalized by the running statistics (no autograd: plancache's route leaves evaluation with
    autograd to torch, as plancache.functional.batch_norm does)."""
    if _served(input):
        out = _batch_norm.batch_norm_op(input, weight, bias, running_mean, running_var, False, 0.1, eps, op=INFERENCE)
        if out is not None:
            return tm.in_layout_of(out, input)
    return tm.in_layout_of(F.batch_norm(input, running_mean, running_var, weight, bias, False, 0.0, eps), input)


@batch_norm.register_fake
def _batch_norm_fake(input: Tensor, weight: Tensor | None, bias: Tensor | None, *rest: Any) -> Tensor:
    return torch.empty_like(input)


@operator("batch_norm_train", f"({_BN_ARGS}, float momentum, float eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def batch_norm_train(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    momentum: float,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Training: the result, the batch's mean and inverse deviation per channel (float32 [C]), and the next
    running mean and variance, new tensors (an operator does not write its arguments: plancache.torch's route
    copies them into the module's, which torch.compile traces as the in-place update torch's own makes)."""
    if _served(input):
        next_mean, next_var = torch.empty_like(running_mean), torch.empty_like(running_var)
        outs = _batch_norm.batch_norm_op(
            input,
            weight,
            bias,
            running_mean,
            running_var,
            True,
            momentum,
            eps,
            op=TRAINING,
            next_mean=next_mean,
            next_var=next_var,
        )
        if outs is not None:
            out, mean, inv_variance = outs
            channels = input.shape[1]
            return tm.in_layout_of(out, input), mean.view(channels), inv_variance.view(channels), next_mean, next_var
    return tm.batch_norm_train(input, weight, bias, running_mean, running_var, momentum, eps)


@batch_norm_train.register_fake
def _batch_norm_train_fake(
    input: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor, running_var: Tensor, *rest: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    stats = input.new_empty((input.shape[1],), dtype=tm.stats_dtype(input))
    return (
        torch.empty_like(input),
        stats,
        torch.empty_like(stats),
        torch.empty_like(running_mean),
        torch.empty_like(running_var),
    )


@operator(
    "batch_norm_backward",
    "(Tensor grad, Tensor input, Tensor? weight, Tensor? bias, Tensor mean, Tensor inv_variance, float momentum, "
    f"float eps, bool[] needs) -> {_GRADS3}",
)
def batch_norm_backward(
    grad: Tensor,
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    inv_variance: Tensor,
    momentum: float,
    eps: float,
    needs: Sequence[bool],
) -> tuple[Tensor | None, ...]:
    """dInput, dWeight, dBias (None where not needed or not given)."""
    if _served(input):
        entry = _batch_norm.batch_norm_backward_entry(input, weight, bias, momentum, eps)
        if isinstance(entry, Differentiable):
            channels = input.shape[1]
            given = (True, weight is not None, bias is not None)
            present = _present(input, weight, bias)
            wanted = [n for n, g in zip(needs, given, strict=True) if g]
            # The running statistics' slots take no gradient and the rule does not read them.
            tensors = (*present, mean, mean, mean, mean)
            saved = (mean.view(1, channels, 1, 1), inv_variance.view(1, channels, 1, 1))
            grads = _run_rule(entry, tensors, saved, grad, [*wanted, False, False, False, False])[: len(present)]
            return _grads(_spread(grads, given), (input, weight, bias), needs)
    return _grads(
        tm.batch_norm_backward(grad, input, weight, bias, mean, inv_variance, eps, needs), (input, weight, bias), needs
    )


@batch_norm_backward.register_fake
def _batch_norm_backward_fake(
    grad: Tensor, input: Tensor, weight: Tensor | None, bias: Tensor | None, *rest: Any
) -> tuple[Tensor | None, ...]:
    return _grads_fake((input, weight, bias), rest[-1])


batch_norm_train.register_gradient(
    Gradient(
        "batch_norm_backward",
        (*_arguments(0, 1, 2), (OUTPUT, 1), (OUTPUT, 2), *_arguments(5, 6), (NEEDS, 0)),
        of=(0, 1, 2),
        # The statistics carry no gradient: the next running ones are copied into the module's buffers, which
        # would otherwise join each step's graph to the next one's.
        non_differentiable=(1, 2, 3, 4),
    )
)


OPERATORS = (
    layer_norm,
    layer_norm_train,
    layer_norm_backward,
    rms_norm,
    rms_norm_train,
    rms_norm_backward,
    linear,
    linear_train,
    linear_backward,
    sdpa,
    sdpa_train,
    sdpa_backward,
    conv2d,
    conv2d_train,
    conv2d_backward,
    batch_norm,
    batch_norm_train,
    batch_norm_backward,
)


def overloads() -> SimpleNamespace:
    """Every operator's default overload by name (`OPS.linear(...)`): what a route calls."""
    return SimpleNamespace(**{op.name: getattr(torch.ops.plancache, op.name).default for op in OPERATORS})

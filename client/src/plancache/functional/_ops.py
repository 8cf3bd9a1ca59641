"""The torch-style functions: a geometry key, a table lookup, the entry's call.

Each function's hot path reads its tensors' shapes, strides, dtypes and
devices into a tuple (the key), finds the entry in the table and calls it:
a served plan (plancache's) or torch's own function. Everything else is the
first call of a geometry (`_first_call`): the spec, the plan from the
client (disk cache, then server), or the reason torch runs it instead.

A call that needs autograd (grad mode on and an input that requires grad)
is a geometry of its own: its training forward and backward graphs, served
through a torch.autograd.Function (plancache.functional._autograd); matmul
and paged_decode_attention have no backward here and run torch's function.
Under torch.compile every function is torch's own (traced into the compiled
graph: a cuDNN plan is an opaque call dynamo cannot trace).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from plancache.errors import InvalidRequest, PlanCacheError
from plancache.frontdoors.buckets import BUCKETS, pad_rows, pad_sequence
from plancache.frontdoors.families import WATCH
from plancache.frontdoors.service import ABOUT_THE_GRAPH, SERVICE, TRANSIENT, Once, describe, reason_key
from plancache.functional import _autograd, _specs, _torch
from plancache.functional._geometry import Unserved, geo
from plancache.functional._table import TABLE, Entry, Fallback, Served, counts, served
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.validation import normalize
from plancache.transport import outcomes
from plancache.wire import outcome_labels

log = logging.getLogger("plancache.functional")
_once = Once()


def _bind_torch_checks() -> None:
    """Until torch is first needed: then torch.is_grad_enabled and torch.compiler.is_compiling themselves."""
    global _grad_on, _compiling
    if _torch.available():
        import torch

        _grad_on, _compiling = torch.is_grad_enabled, torch.compiler.is_compiling
    else:
        _grad_on, _compiling = bool, bool


def _first_grad_check() -> bool:
    _bind_torch_checks()
    return _grad_on()


def _first_compiling_check() -> bool:
    _bind_torch_checks()
    return _compiling()


_grad_on: Callable[[], bool] = _first_grad_check
_compiling: Callable[[], bool] = _first_compiling_check


def _describe(names: Sequence[str], tensors: Sequence[Any]) -> str:
    return ", ".join(
        f"{n} {tuple(getattr(t, 'shape', ()))} {getattr(t, 'dtype', type(t).__name__)}"
        for n, t in zip(names, tensors, strict=True)
    )


def _where(names: Sequence[str], tensors: Sequence[Any]) -> str:
    return ", ".join(f"{n} on {getattr(t, 'device', '?')}" for n, t in zip(names, tensors, strict=True))


def _first_call(
    function: str,
    key: Hashable,
    names: Sequence[str],
    tensors: tuple[Any, ...],
    request: Callable[[], _specs.Request],
    fallback: Callable[..., Any],
    needs_grad: bool,
    rule: Callable[[_specs.Request], _autograd.Rule] | None = None,
) -> Any:
    """Run the first call of a geometry and keep what ran it (what worked:
    a call torch refuses, a mistake, leaves nothing behind). With autograd,
    `request` is the training forward and `rule(request)` its backward: every
    plan of both is fetched now."""
    devices = [str(getattr(getattr(t, "device", None), "type", None)) for t in tensors]
    if all(d == "cpu" for d in devices):
        raise InvalidRequest(
            f"{function}: {names[0]} is on the CPU: plancache.functional runs CUDA tensors (call torch's function for CPU tensors)"
        )
    ops = _torch.ops()
    if ops.capturing():
        raise InvalidRequest(
            f"{function}: the first call of a geometry ({_describe(names, tensors)}) while a CUDA graph is being captured: "
            "its plans are fetched and loaded then, which capture forbids; call it once before capturing (torch's warm-up)"
        )
    # torch runs the call outside the handlers: a mistake raises torch's own
    # error, not one chained to why plancache was not asked.
    unserved: Unserved | None = None
    try:
        if needs_grad and rule is None:
            raise Unserved(f"autograd: {function} has no served backward (torch's function runs it)")
        if set(devices) != {"cuda"} or len({t.get_device() for t in tensors}) != 1:
            raise Unserved(f"the tensors are on more than one device ({_where(names, tensors)})")
        asked = request()
        backward = rule(asked) if needs_grad and rule is not None else None
    except Unserved as e:
        unserved = e
    if unserved is not None:
        return _run_fallback(
            function, key, names, tensors, fallback, unserved.reason, "not_asked", transient=unserved.transient
        )
    device = int(tensors[0].get_device())
    failed: tuple[str, bool, bool, str] | None = None  # (reason, transient, logged already, reason class)
    try:
        with ops.on_device(device):  # a miss this node builds itself (the hedge) builds on the tensors' GPU
            plan = SERVICE.compile(asked.spec, device)
            if backward is None:
                entry: Entry = served(asked, plan, device, key)
            else:
                entry = _autograd.Differentiable(
                    Served(asked, plan, device), backward, _backward_pieces(function, backward, device)
                )
        result = entry(tensors)
    except PlanCacheError as e:
        # The service's own failures (no server, server down, no worker) are
        # logged once for all geometries; a graph's (cuDNN refused it) with it.
        about_the_service = not isinstance(e, ABOUT_THE_GRAPH)
        if about_the_service:
            _once(
                log,
                f"service:{reason_key(e)}",
                "plancache.functional: torch runs what plancache cannot serve: %s",
                describe(e),
            )
        failed = (describe(e), isinstance(e, TRANSIENT), about_the_service, outcomes.reason_of(e))
    except Exception as e:  # the plan did not load or run here: torch runs this geometry
        failed = (f"the plan did not run: {type(e).__name__}: {e}", False, False, "load_failed")
    if failed is not None:
        return _run_fallback(
            function,
            key,
            names,
            tensors,
            fallback,
            failed[0],
            failed[3],
            transient=failed[1],
            quiet=failed[2],
            spec=asked.spec,
        )
    TABLE.put(key, entry)
    counts(function).geometries += 1
    WATCH.seen(
        function, asked.spec, device
    )  # shapes that vary: their family built ahead (plancache.frontdoors.families)
    if backward is not None:
        for piece in backward.requests.values():
            WATCH.seen(piece.function, piece.spec, device)
    served_as = outcomes.served_outcome(plan.source)
    outcomes.record(
        "functional",
        outcomes.target_of(plan.key),
        served_as,
        _node_type(function, asked.spec),
        reason="hedged" if served_as is outcomes.Outcome.LOCAL else "",
    )
    log.debug(
        "plancache.functional.%s: plan %s (%s) serves %s", function, plan.key, plan.source, _describe(names, tensors)
    )
    return result


def _backward_pieces(function: str, rule: _autograd.Rule, device: int) -> dict[str, Any]:
    """Every backward graph's plan; a refused optional one (a bias gradient's
    reduction) is torch's, its reason counted under "<function>.backward"."""
    pieces: dict[str, Any] = {}
    for name, request in rule.requests.items():
        try:
            pieces[name] = Served(request, SERVICE.compile(request.spec, device), device)
        except PlanCacheError as e:
            if name not in rule.optional or not isinstance(e, ABOUT_THE_GRAPH):
                raise
            reason = f"{name}: {describe(e)}"
            c = counts(f"{function}.backward")
            c.reasons[reason] = c.reasons.get(reason, 0) + 1
            _record_local(function, request.spec, outcomes.reason_of(e), device)
            _once(
                log,
                f"{function}|{name}|{reason_key(e)}",
                "plancache.functional.%s: torch runs the backward's %s: %s",
                function,
                name,
                describe(e),
            )
            pieces[name] = rule.optional[name]
    return pieces


def _run_fallback(
    function: str,
    key: Hashable,
    names: Sequence[str],
    tensors: tuple[Any, ...],
    fn: Callable[..., Any],
    reason: str,
    reason_class: str,
    *,
    transient: bool,
    quiet: bool = False,
    spec: GraphSpec | None = None,
) -> Any:
    if not _torch.available():
        raise InvalidRequest(f"{function}: {reason} (and torch, which would run it, is not installed)")
    entry = Fallback(function, key, fn, reason, transient)
    result = entry(tensors)  # torch's own error, for a call torch refuses, propagates from here
    TABLE.put(key, entry)
    c = counts(function)
    c.geometries += 1
    c.torch_geometries += 1
    c.reasons[reason] = c.reasons.get(reason, 0) + 1
    _record_local(function, spec, reason_class, _device_of(tensors))
    if not quiet:
        _once(
            log,
            f"{function}|{key!r}",
            "plancache.functional.%s: torch runs %s: %s",
            function,
            _describe(names, tensors),
            reason,
        )
    return result


# The node type a function's graph is counted under when torch ran it before any spec was made.
_NODE_TYPES = {
    "linear": "MATMUL",
    "matmul": "MATMUL",
    "conv2d": "CONV_FPROP",
    "layer_norm": "LAYERNORM",
    "rms_norm": "RMSNORM",
    "batch_norm": "BATCHNORM",
    "scaled_dot_product_attention": "SDPA",
    "paged_decode_attention": "SDPA",
}


def _node_type(function: str, spec: GraphSpec | None) -> str:
    if spec is not None:
        return outcome_labels.anchor_of_ops(n.op for n in spec.nodes)
    return _NODE_TYPES.get(function, "")


def _device_of(tensors: tuple[Any, ...]) -> int:
    try:
        return int(tensors[0].get_device())
    except Exception:
        return 0


def _record_local(function: str, spec: GraphSpec | None, reason_class: str, device: int) -> None:
    """A graph torch runs, told to the service (plancache.transport.outcomes): its spec hash only where the operator opted in."""
    spec_hash = hash_normalized(normalize(spec)) if spec is not None and outcomes.reports_specs() else ""
    outcomes.record(
        "functional",
        SERVICE.known_target_id(device),
        outcomes.Outcome.LOCAL,
        _node_type(function, spec),
        reason=reason_class,
        spec_hash=spec_hash,
    )


# ---- the functions -----------------------------------------------------------------


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


def _linear(input: Any, weight: Any, bias: Any = None, *, activation: str | None = None) -> Any:
    """linear without bucketing."""
    if _compiling():
        return _torch.linear(input, weight, bias, activation=activation)
    try:
        grad = _grad_on() and (input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        key = (
            "linear",
            input.shape,
            input.stride(),
            input.dtype,
            input.get_device(),
            weight.shape,
            weight.stride(),
            weight.dtype,
            weight.get_device(),
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()),
            activation,
            grad,
        )
    except (AttributeError, TypeError):
        return _torch.linear(input, weight, bias, activation=activation)  # not tensors: torch's error
    tensors = (input, weight) if bias is None else (input, weight, bias)
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors)
    if activation is not None and activation not in _specs.ACTIVATIONS:
        raise InvalidRequest(
            f"linear: activation {activation!r} is not one of None, {', '.join(map(repr, _specs.ACTIVATIONS))}"
        )
    names = ("input", "weight", "bias")[: len(tensors)]

    def geos() -> tuple[Any, Any, Any]:
        return geo("input", input), geo("weight", weight), _geo_or_none("bias", bias)

    return _first_call(
        "linear",
        key,
        names,
        tensors,
        lambda: _specs.linear(*geos(), activation, training=grad),
        functools.partial(_bias_last(_torch.linear, len(tensors)), activation=activation),
        grad,
        lambda forward: _autograd.linear(*geos(), activation, forward),
    )


def _bias_last(fn: Callable[..., Any], count: int) -> Callable[..., Any]:
    """fn(input, weight[, bias], ...) whether or not the call passed a bias."""
    if count == 3:
        return fn
    return lambda x, w, **kw: fn(x, w, None, **kw)


def matmul(input: Any, other: Any) -> Any:
    """torch.matmul for operands of 2 dims or more (batches broadcast as
    torch does when one side is a single matrix or both have the same batch).
    No served backward: with autograd, torch's function runs it (use linear)."""
    if _compiling():
        return _torch.matmul(input, other)
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
        return _torch.matmul(input, other)
    entry = TABLE.get(key)
    if entry is not None:
        return entry((input, other))
    return _first_call(
        "matmul",
        key,
        ("input", "other"),
        (input, other),
        lambda: _specs.matmul(geo("input", input), geo("other", other)),
        _torch.matmul,
        grad,
    )


def conv2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
    *,
    relu: bool = False,
) -> Any:
    """torch.nn.functional.conv2d, with a fused ReLU (`relu=True`). The result
    is channels-last when an operand is (as torch's), contiguous otherwise.
    Differentiable: conv_dgrad, conv_wgrad, dBias (a reduction), the ReLU's backward."""
    if _compiling():
        return _torch.conv2d(input, weight, bias, stride, padding, dilation, groups, relu=relu)
    options = (_hashable(stride), _hashable(padding), _hashable(dilation), groups, bool(relu))
    try:
        grad = _grad_on() and (input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        key = (
            "conv2d",
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
    except (AttributeError, TypeError):
        return _torch.conv2d(input, weight, bias, stride, padding, dilation, groups, relu=relu)
    tensors = (input, weight) if bias is None else (input, weight, bias)
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors)

    def fallback(x: Any, w: Any, b: Any = None) -> Any:
        return _torch.conv2d(x, w, b, stride, padding, dilation, groups, relu=relu)

    def geos() -> tuple[Any, Any, Any]:
        return geo("input", input), geo("weight", weight), _geo_or_none("bias", bias)

    def rule(forward: _specs.Request) -> _autograd.Rule:
        x, w, b = geos()
        return _autograd.conv2d(x, w, b, relu, _specs.conv_attributes(stride, padding, dilation, w.shape), forward)

    return _first_call(
        "conv2d",
        key,
        ("input", "weight", "bias")[: len(tensors)],
        tensors,
        lambda: _specs.conv2d(*geos(), stride, padding, dilation, groups, relu),
        fallback,
        grad,
        rule,
    )


def _rows_of_last_dim(x: Any, normalized_shape: Any) -> bool:
    """Whether a norm normalizes `x` over its last dim alone (its rows can be padded)."""
    shape: tuple[int, ...] = tuple(getattr(x, "shape", ()))
    if len(shape) < 2:
        return False
    wanted = tuple(normalized_shape) if isinstance(normalized_shape, list | tuple) else (normalized_shape,)
    return wanted == (shape[-1],)


def _hashable(value: Any) -> Hashable:
    return tuple(value) if isinstance(value, list) else value  # type: ignore[no-any-return]


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """torch.nn.functional.layer_norm. Differentiable: cuDNN's layernorm
    backward, from the rows' statistics its training forward keeps."""
    if BUCKETS.functions and _rows_of_last_dim(input, normalized_shape):
        padded = pad_rows("layer_norm", input)
        if padded is not None:
            rows_in, rows = padded
            return _layer_norm(rows_in, normalized_shape, weight, bias, eps)[:rows].reshape(input.shape)
    return _layer_norm(input, normalized_shape, weight, bias, eps)


def _layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """layer_norm without bucketing."""
    if _compiling():
        return _torch.layer_norm(input, normalized_shape, weight, bias, eps)
    shape = _hashable(normalized_shape)
    try:
        grad = _grad_on() and (
            input.requires_grad
            or (weight is not None and weight.requires_grad)
            or (bias is not None and bias.requires_grad)
        )
        key = (
            "layer_norm",
            input.shape,
            input.stride(),
            input.dtype,
            input.get_device(),
            shape,
            eps,
            grad,
            None if weight is None else (weight.shape, weight.stride(), weight.dtype, weight.get_device()),
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()),
        )
    except (AttributeError, TypeError):
        return _torch.layer_norm(input, normalized_shape, weight, bias, eps)
    tensors: tuple[Any, ...] = (input,)
    if weight is not None:
        tensors += (weight,)
    if bias is not None:
        tensors += (bias,)
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors)
    names = tuple(n for n, t in (("input", input), ("weight", weight), ("bias", bias)) if t is not None)

    def fallback(*given: Any) -> Any:
        parts = dict(zip(names, given, strict=True))
        return _torch.layer_norm(parts["input"], normalized_shape, parts.get("weight"), parts.get("bias"), eps)

    def geos() -> tuple[Any, Any, Any]:
        return geo("input", input), _geo_or_none("weight", weight), _geo_or_none("bias", bias)

    def rule(forward: _specs.Request) -> _autograd.Rule:
        x, w, b = geos()
        return _autograd.norm("layer_norm", x, _specs.normalized(normalized_shape), w, b, forward)

    return _first_call(
        "layer_norm",
        key,
        names,
        tensors,
        lambda: _specs.layer_norm(geos()[0], normalized_shape, *geos()[1:], eps, training=grad),
        fallback,
        grad,
        rule,
    )


def rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> Any:
    """torch.nn.functional.rms_norm; eps None is torch.finfo(input.dtype).eps,
    as torch documents it. Differentiable: cuDNN's rmsnorm backward."""
    if BUCKETS.functions and _rows_of_last_dim(input, normalized_shape):
        padded = pad_rows("rms_norm", input)
        if padded is not None:
            rows_in, rows = padded
            return _rms_norm(rows_in, normalized_shape, weight, eps)[:rows].reshape(input.shape)
    return _rms_norm(input, normalized_shape, weight, eps)


def _rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> Any:
    """rms_norm without bucketing."""
    if _compiling():
        return _torch.rms_norm(input, normalized_shape, weight, eps)
    shape = _hashable(normalized_shape)
    try:
        grad = _grad_on() and (input.requires_grad or (weight is not None and weight.requires_grad))
        key = (
            "rms_norm",
            input.shape,
            input.stride(),
            input.dtype,
            input.get_device(),
            shape,
            eps,
            grad,
            None if weight is None else (weight.shape, weight.stride(), weight.dtype, weight.get_device()),
        )
    except (AttributeError, TypeError):
        return _torch.rms_norm(input, normalized_shape, weight, eps)
    tensors = (input,) if weight is None else (input, weight)
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors)

    def fallback(x: Any, w: Any = None) -> Any:
        return _torch.rms_norm(x, normalized_shape, w, eps)

    def rule(forward: _specs.Request) -> _autograd.Rule:
        return _autograd.norm(
            "rms_norm",
            geo("input", input),
            _specs.normalized(normalized_shape),
            _geo_or_none("weight", weight),
            None,
            forward,
        )

    return _first_call(
        "rms_norm",
        key,
        ("input", "weight")[: len(tensors)],
        tensors,
        lambda: _specs.rms_norm(
            geo("input", input), normalized_shape, _geo_or_none("weight", weight), eps, training=grad
        ),
        fallback,
        grad,
        rule,
    )


def _geo_or_none(name: str, tensor: Any) -> Any:
    return None if tensor is None else geo(name, tensor)


def _signature(t: Any) -> Hashable:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device(), t.requires_grad)


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
    """torch.nn.functional.scaled_dot_product_attention, query/key/value of 4
    dims [batch, heads, sequence, head dim] (any strides: BHSD or a BSHD
    view), plus what torch lacks (keyword-only):

    - `seq_len_q`, `seq_len_kv`: int32 tensors of one length per sequence
      (padding): keys past a sequence's length are masked; rows past its
      query length are unspecified (cuDNN leaves them);
    - `sliding_window`: query i attends to keys j with i - window < j;
    - `alibi`: cuDNN's ALiBi bias (slope of head h times key - query
      position), with `is_causal=True`.

    `attn_mask` as torch takes it; a float mask is cuDNN's bias (dims
    broadcasting to [batch, heads, queries, keys] over batch and heads; a
    boolean mask runs torch). Dropout is cuDNN's (Philox, its seed drawn
    from torch's CUDA generator each call: torch.manual_seed reproduces it,
    but the mask is not the one torch's own dropout would draw).

    Differentiable: cuDNN's SDPA backward with the forward's options and
    softmax statistics, dBias when attn_mask requires grad."""
    if (
        BUCKETS.functions
        and is_causal
        and attn_mask is None
        and seq_len_q is None
        and seq_len_kv is None
        and not dropout_p
        and not alibi
        and sliding_window is None
    ):
        padded = pad_sequence(query, key, value)
        if padded is not None:  # keys after every real one: no real query sees them (causal)
            q, k, v, length = padded
            return _scaled_dot_product_attention(q, k, v, None, 0.0, True, scale, enable_gqa)[:, :, :length]
    return _scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        seq_len_q=seq_len_q,
        seq_len_kv=seq_len_kv,
        sliding_window=sliding_window,
        alibi=alibi,
    )


def _scaled_dot_product_attention(
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
    """scaled_dot_product_attention without bucketing."""
    if _compiling():
        return _torch.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            seq_len_q=seq_len_q,
            seq_len_kv=seq_len_kv,
            sliding_window=sliding_window,
            alibi=alibi,
        )
    try:
        grad = _grad_on() and (
            query.requires_grad
            or key.requires_grad
            or value.requires_grad
            or (attn_mask is not None and attn_mask.requires_grad)
        )
        geometry = (
            "sdpa",
            query.shape,
            query.stride(),
            query.dtype,
            query.get_device(),
            key.shape,
            key.stride(),
            key.dtype,
            key.get_device(),
            value.shape,
            value.stride(),
            value.dtype,
            value.get_device(),
            _signature(attn_mask),
            _signature(seq_len_q),
            _signature(seq_len_kv),
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            sliding_window,
            alibi,
            grad,
        )
    except (AttributeError, TypeError):
        return _torch.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    if attn_mask is None and seq_len_q is None and seq_len_kv is None:
        tensors: tuple[Any, ...] = (query, key, value)
    else:
        tensors = tuple(t for t in (query, key, value, attn_mask, seq_len_q, seq_len_kv) if t is not None)
    if dropout_p:
        tensors = (*tensors, _torch.dropout_seed(query.device))
    entry = TABLE.get(geometry)
    if entry is not None:
        return entry(tensors)
    if alibi and not is_causal:
        raise InvalidRequest(
            "scaled_dot_product_attention: alibi=True needs is_causal=True (cuDNN's ALiBi masks keys after the query)"
        )
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1
    ):
        raise InvalidRequest(
            f"scaled_dot_product_attention: sliding_window must be a positive int, got {sliding_window!r}"
        )
    names = tuple(
        n
        for n, t in zip(
            ("query", "key", "value", "attn_mask", "seq_len_q", "seq_len_kv"),
            (query, key, value, attn_mask, seq_len_q, seq_len_kv),
            strict=True,
        )
        if t is not None
    )
    names += (_specs.DROPOUT_SEED,) if dropout_p else ()
    options = _specs.Attention(dropout_p, is_causal, scale, enable_gqa, sliding_window, alibi)

    def fallback(*given: Any) -> Any:
        parts = dict(zip(names, given, strict=True))
        return _torch.scaled_dot_product_attention(
            parts["query"],
            parts["key"],
            parts["value"],
            parts.get("attn_mask"),
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            seq_len_q=parts.get("seq_len_q"),
            seq_len_kv=parts.get("seq_len_kv"),
            sliding_window=sliding_window,
            alibi=alibi,
        )

    def geos() -> tuple[Any, Any, Any, Any, Any, Any]:
        return (
            geo("query", query),
            geo("key", key),
            geo("value", value),
            _geo_or_none("attn_mask", attn_mask),
            _geo_or_none("seq_len_q", seq_len_q),
            _geo_or_none("seq_len_kv", seq_len_kv),
        )

    def rule(forward: _specs.Request) -> _autograd.Rule:
        mask_grad = attn_mask is not None and bool(attn_mask.requires_grad)
        return _autograd.sdpa(*geos(), options, mask_grad, forward, len(tensors))

    return _first_call(
        "scaled_dot_product_attention",
        geometry,
        names,
        tensors,
        lambda: _specs.sdpa(*geos(), options, training=grad),
        fallback,
        grad,
        rule,
    )


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
    """One decode step of attention over a paged KV cache (inference: with
    autograd, torch's function runs it).

    query [batch, heads, 1, head_dim]; key_cache and value_cache page pools
    [pages, kv_heads, page_size, head_dim] (kv_heads dividing heads:
    grouped-query attention); page_table [batch, pages per sequence] int32,
    the pages of each sequence in order (value_page_table: another table for
    the values, default the same); seq_lens [batch] int32, each sequence's
    length in tokens (the new token included). `scale` defaults to
    1/sqrt(head_dim); `max_seq_len` (the longest length a call may carry)
    defaults to pages per sequence x page size. Returns [batch, heads, 1, head_dim]."""
    if _compiling():
        return _torch.paged_decode_attention(
            query,
            key_cache,
            value_cache,
            page_table,
            seq_lens,
            scale=scale,
            max_seq_len=max_seq_len,
            value_page_table=value_page_table,
        )
    v_table = page_table if value_page_table is None else value_page_table
    try:
        grad = _grad_on() and (query.requires_grad or key_cache.requires_grad or value_cache.requires_grad)
        geometry = (
            "paged_decode",
            query.shape,
            query.stride(),
            query.dtype,
            query.get_device(),
            key_cache.shape,
            key_cache.stride(),
            key_cache.dtype,
            key_cache.get_device(),
            value_cache.shape,
            value_cache.stride(),
            value_cache.dtype,
            value_cache.get_device(),
            _signature(page_table),
            _signature(v_table),
            _signature(seq_lens),
            scale,
            max_seq_len,
            grad,
        )
    except (AttributeError, TypeError) as e:
        raise InvalidRequest(f"paged_decode_attention: every tensor argument must be a tensor ({e})") from None
    tensors = (query, key_cache, value_cache, page_table, v_table, seq_lens)
    entry = TABLE.get(geometry)
    if entry is not None:
        return entry(tensors)

    def fallback(q: Any, kc: Any, vc: Any, table: Any, vtable: Any, lengths: Any) -> Any:
        return _torch.paged_decode_attention(
            q, kc, vc, table, lengths, scale=scale, max_seq_len=max_seq_len, value_page_table=vtable
        )

    def request() -> _specs.Request:
        return _specs.paged_decode(
            geo("query", query),
            geo("key_cache", key_cache),
            geo("value_cache", value_cache),
            geo("page_table", page_table),
            geo("value_page_table", v_table),
            geo("seq_lens", seq_lens),
            scale=scale,
            max_seq_len=max_seq_len,
        )

    names = ("query", "key_cache", "value_cache", "page_table", "value_page_table", "seq_lens")
    return _first_call("paged_decode_attention", geometry, names, tensors, request, fallback, grad)


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
        return _torch.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
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
            _signature(running_mean),
            _signature(running_var),
            _signature(weight),
            _signature(bias),
            bool(training),
            momentum,
            eps,
            grad,
        )
    except (AttributeError, TypeError):
        return _torch.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if (running_mean is None or running_var is None) and (not training or running_mean is not running_var):
        return _torch.batch_norm(
            input, running_mean, running_var, weight, bias, training, momentum, eps
        )  # torch's own answer (or error) for these
    # Built without generators: this is every call's path (run 22: batch_norm's host time was 1.42x raw + allocation).
    if weight is None:
        given: tuple[Any, ...] = (input,) if bias is None else (input, bias)
    else:
        given = (input, weight) if bias is None else (input, weight, bias)
    if not training:
        tensors = (*given, running_mean, _torch.inverse_deviation(running_var, eps))
    elif running_mean is None or running_var is None:
        tensors = given
    else:
        tensors = (*given, running_mean, running_var, running_mean, running_var)  # read, then written in place
    entry = TABLE.get(key)
    if entry is not None:
        return entry(tensors)
    names = tuple(n for n, t in (("input", input), ("weight", weight), ("bias", bias)) if t is not None)
    names += (
        ("running_mean", "running_var", "next_running_mean", "next_running_var")
        if training and len(tensors) > len(given)
        else ()
        if training
        else ("running_mean", "inv_variance")
    )

    def fallback(*args: Any) -> Any:
        parts = dict(zip(names, args, strict=True))
        return _torch.batch_norm(
            parts["input"], running_mean, running_var, parts.get("weight"), parts.get("bias"), training, momentum, eps
        )

    def geos() -> tuple[Any, Any, Any, Any, Any]:
        return (
            geo("input", input),
            _geo_or_none("running_mean", running_mean),
            _geo_or_none("running_var", running_var),
            _geo_or_none("weight", weight),
            _geo_or_none("bias", bias),
        )

    def request() -> _specs.Request:
        if momentum is None:
            raise Unserved("momentum=None (a cumulative average)")
        return _specs.batch_norm(*geos(), training=bool(training), momentum=float(momentum), eps=float(eps))

    def rule(forward: _specs.Request) -> _autograd.Rule:
        if not training:
            raise Unserved(
                "autograd in evaluation mode (its backward is per-channel pointwise math, which cuDNN computes wrongly)"
            )
        x, _, _, w, b = geos()
        return _autograd.batch_norm(x, w, b, forward, len(tensors))

    return _first_call("batch_norm", key, names, tensors, request, fallback, grad, rule)

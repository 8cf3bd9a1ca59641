"""`with plancache.torch.mode():` the torch.nn.functional calls of an unchanged model, served by plancache.

A TorchFunctionMode sees every torch function the program calls on its
thread while it is entered. It takes the ones plancache serves (ROUTES: a
CUDA tensor of half or bfloat16, options cuDNN's graph has) and leaves
every other call to torch, untouched. Eager, a routed call is
plancache.functional's (its autograd.Function: the cheapest hot path in
Python), or, where the native extension is on, plancache's torch operator
(its repeated calls replayed in C++, its autograd C++); under
torch.compile (dynamo traces the mode), it is the operator
(plancache.torch._ops), which the compiled program runs. A call
whose geometry cuDNN does not serve runs torch's own function inside
either, with the same result.

Counted, eager only (a compiled program runs no Python per call; its
operators count in plancache.functional.stats()): calls routed, and calls
left to torch by reason.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

import plancache.functional as pf
from plancache.errors import InvalidRequest
from plancache.functional import _race
from plancache.functional._attention import boolean_mask_as_bias
from plancache.functional._convolution import decided as pf_conv2d_decided
from plancache.functional._first_call import STORED_ONLY, torch_faster_reason
from plancache.functional._linear import decided as pf_linear_decided
from plancache.functional._modes import eager_calls
from plancache.functional._norms import decided_layer_norm as pf_layer_norm_decided
from plancache.functional._norms import decided_rms_norm as pf_rms_norm_decided
from plancache.functional._race import LOOKUP, RACE, TORCH_FASTER
from plancache.functional._race import race as pf_race
from plancache.functional._table import TABLE as PF_TABLE
from plancache.functional._table import Fallback, Racing
from plancache.functional._table import counts as pf_counts
from plancache.torch import _ops

SERVED_DTYPES = (torch.float16, torch.bfloat16)
# Each operator's one overload, looked up once: `torch.ops.plancache.<name>(...)` resolves the namespace, the
# packet and its overload at every call (~1-3 µs a routed call on the development CPU).
OPS = _ops.overloads()
# The devices a routed call may be on. CUDA: plancache's; a test adds "cpu" to
# trace the operators (their CPU implementation is torch's own) on a machine without a GPU.
ROUTED_DEVICES = {"cuda"}
# The devices a compiled call is raced on (plancache.functional serves CUDA tensors; a test adds "cpu").
RACED_DEVICES = {"cuda"}


@dataclass
class RouteCounts:
    routed: int = 0
    left: Counter[str] = field(default_factory=Counter)  # calls left to torch, by reason
    returned: int = 0  # served layers gone back to their own forward (plancache.torch._serve.RETURN_AFTER)


COUNTS: dict[str, RouteCounts] = {}
MAX_REASONS = 64  # distinct reasons kept per function
OTHER_REASONS = "other reasons (more distinct reasons than are kept)"
_counts_lock = threading.Lock()
# (function, reason) of each call a traced program leaves to torch, recorded when dynamo traces it (a compiled
# call is not counted: counting it the eager way, the lock would break the graph). Bounded by the programs'
# traced call sites; clear_stats() keeps them (a compiled program is not traced again).
LEFT_COMPILED: set[tuple[str, str]] = set()


def _note_left_compiled(function: str, reason: str) -> bool:
    """Run by dynamo once, as it traces the call, its result kept as a constant: nothing in the graph, no
    guard. Traced as plain code, a global set's add was replayed by every run and guarded on the set's
    contents: the next run found the set changed and recompiled the whole program (GPU run 33: a compiled
    GPT-2's second step took 7.7 s, torch's 0.02 s)."""
    LEFT_COMPILED.add((function, reason))
    return True


# torch._dynamo.assume_constant_result(_note_left_compiled), without importing torch._dynamo (1.3 s) into
# every eager program: the decorator sets this attribute, which dynamo reads (a unit test holds them equal).
_note_left_compiled._dynamo_marked_constant = True  # type: ignore[attr-defined]


# A compiled call's geometry, as the trace reads it: (shape, stride, dtype, device index, requires_grad);
# None for an optional tensor left out. Python constants only: dynamo hands them to _torch_faster as they are.
Spec = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, int, bool] | None


def _eager_call(function: str, tensors: list[Tensor | None], options: tuple[Any, ...], functions: Any = pf) -> Any:
    """The eager call of a routed function in `functions`: plancache.functional's (a traced call's race runs it),
    or torch.nn.functional's (torch's own, which takes its arguments in the same order). The norms take their
    shape before their tensors; the others take their tensors, then their options."""
    if function in ("layer_norm", "rms_norm"):
        (x, *params), (shape, eps) = tensors, options
        return getattr(functions, function)(x, list(shape), *params, eps)
    if functions is F and function == "scaled_dot_product_attention":  # torch's takes these two by keyword only
        (q, k, v, mask), (dropout_p, is_causal, scale, enable_gqa) = tensors, options
        return F.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return getattr(functions, function)(*tensors, *options)


class _Traced(threading.local):
    """The fake tensors of the call being traced (dynamo's, as comptime hands them over), until _torch_faster takes
    them."""

    fakes: list[Any] | None = None


_TRACED = _Traced()
# Each traced geometry's verdict (function, its tensors' specs, options, training -> why torch's function runs it,
# or None), kept while plancache.functional's table is not cleared: dynamo traces every call site of a model, and
# its repeated blocks (GPT-2's twelve) make the same calls, each of which raced the operator again (its race is
# not the table's) as the compiled program's cold start waited.
_TRACED_VERDICTS: dict[Hashable, tuple[int, str | None]] = {}
MAX_TRACED_VERDICTS = 1024
_TRACED_NAMES = ("traced_0", "traced_1", "traced_2", "traced_3")  # _raced_left's locals, which comptime reads


def _keep_traced(ctx: Any) -> None:
    """Run by dynamo at trace time (torch._dynamo.comptime): the traced call's tensors as dynamo's fake tensors,
    whose sizes are ints where they are static and SymInts where they are dynamic (what traced code itself cannot
    tell apart: dynamo answers `isinstance(size, int)` for both, and the checks that differ differ by version)."""
    fakes = []
    for name in _TRACED_NAMES:
        local = ctx.get_local(name)
        fakes.append(None if local.is_python_constant() and local.as_python_constant() is None else local.as_fake())
    _TRACED.fakes = fakes


def _spec_of(fake: Any) -> Spec:
    """A traced tensor's geometry (None: not given), or ValueError where a size or stride is dynamic."""
    if fake is None:
        return None
    dims = (*fake.shape, *fake.stride())
    if not all(type(d) is int for d in dims):
        raise ValueError("dynamic")
    device = fake.device.index if fake.device.type == "cuda" else -1
    return (tuple(fake.shape), tuple(fake.stride()), fake.dtype, device, bool(fake.requires_grad))


def _torch_faster(function: str, count: int, options: tuple[Any, ...], training: bool) -> str | None:
    """Why torch's function should run this compiled call (its own is faster for the geometry), or None: run by
    dynamo once, as it traces the call, its result kept as a constant (as _note_left_compiled), for the `count`
    tensors _keep_traced kept (_traced_verdict)."""
    fakes, _TRACED.fakes = _TRACED.fakes, None
    return None if fakes is None else _traced_verdict(function, fakes[:count], options, training)


_torch_faster._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _traced_verdict(function: str, fakes: list[Any], options: tuple[Any, ...], training: bool) -> str | None:
    """Why torch's function should run a compiled call of `fakes`' geometry (dynamo's fake tensors of its tensor
    arguments, None where one is not given), or None. A call of dynamic sizes is not raced (no sizes to race at
    trace time). The geometry's race is plancache.functional's (plancache.functional._race), on tensors of the
    call's geometry made here, through its eager call: the entry it leaves in the table is the one the compiled
    program's operator finds at run time (the same key), and a geometry torch wins is left to torch's function in
    the traced program, which inductor then compiles as it would without plancache (its fusions included)."""
    if not RACE.enabled:
        return None
    try:
        specs = tuple(_spec_of(fake) for fake in fakes)
    except ValueError:
        return None
    key: Hashable | None = (function, specs, options, training)
    generation = PF_TABLE.generation
    try:
        known = _TRACED_VERDICTS.get(key)
    except TypeError:  # an option that is not hashable (a list): raced, not kept
        known, key = None, None
    if known is not None and known[0] == generation:
        return known[1]
    try:
        reason = _race_traced_call(function, specs, options, training)
    except Exception as e:  # a race is an optimisation: the plan's operator runs the call
        _note_left_compiled(function, f"not raced ({type(e).__name__}: {e})"[:300])
        return None
    if key is not None:
        with _counts_lock:
            if len(_TRACED_VERDICTS) >= MAX_TRACED_VERDICTS:
                _TRACED_VERDICTS.pop(next(iter(_TRACED_VERDICTS)))  # the oldest
            _TRACED_VERDICTS[key] = (generation, reason)
    return reason


def _race_traced_call(function: str, specs: tuple[Spec, ...], options: tuple[Any, ...], training: bool) -> str | None:
    """The race of a traced call's geometry on tensors made for it (a test replaces it on a machine without a GPU):
    first plancache.functional's own race of the geometry's plan (its eager call), then, where the plan won that,
    plancache's operator (what the compiled program calls: the plan behind torch's dispatcher and the operator's
    registration, host time a bare plan does not pay) against torch's function: torch's where either is faster."""
    # Eager calls, as a program's outside torch.compile: plancache.functional's (not "traced: torch's function"),
    # torch's own functions without the mode (and without torch.compile's session flag, where this torch has it).
    session = getattr(torch.compiler, "_is_compiling_flag", None)
    if session is not None:
        torch.compiler._is_compiling_flag = False
    try:
        grad = torch.enable_grad() if training else torch.no_grad()
        with eager_calls(), torch._C.DisableTorchFunction(), grad:
            tensors = [None if spec is None else _made(spec) for spec in specs]
            reason = torch_faster_reason(lambda: _eager_call(function, tensors, options))
            return reason if reason is not None else _operator_faster_reason(function, tensors, options, training)
    finally:
        if session is not None:
            torch.compiler._is_compiling_flag = session


def _operator_faster_reason(
    function: str, tensors: list[Tensor | None], options: tuple[Any, ...], training: bool
) -> str | None:
    """plancache's operator for the call against torch's function, on `tensors` (plancache.functional's race:
    its rounds, its margin, forward and backward where `training`): why torch's should run it, else None. The
    operator's runs are not the program's calls (its counters are put back)."""
    present = [i for i, t in enumerate(tensors) if t is not None]

    def placed(given: tuple[Tensor, ...]) -> list[Tensor | None]:
        full: list[Tensor | None] = [None] * len(tensors)
        for i, t in zip(present, given, strict=True):
            full[i] = t
        return full

    def operator(given: tuple[Tensor, ...]) -> Any:
        return _operator_call(function, placed(given), options, training)

    def torch_function(*given: Tensor) -> Any:
        return _eager_call(function, placed(given), options, F)

    counted = [pf_counts(name) for name in (function, f"{function}.backward")]
    before = [c.cudnn for c in counted]
    try:
        ours = tuple(tensors[i] for i in present)
        result = operator(ours)  # the plan's first call through the operator (made in torch_faster_reason's)
        first = tensors[0]
        assert first is not None
        device = first.device.index if first.device.type == "cuda" else -1
        verdict = pf_race(operator, torch_function, ours, device, training, result)
    finally:
        for c, cudnn in zip(counted, before, strict=True):
            c.cudnn = cudnn
    if not verdict.torch_wins:
        return None
    return f"{TORCH_FASTER}: " + verdict.describe(plan="plancache's operator")


def _operator_call(function: str, tensors: list[Tensor | None], options: tuple[Any, ...], training: bool) -> Any:
    """The routed call as plancache's operator, as the routes make it under torch.compile."""
    if function in ("layer_norm", "rms_norm"):
        shape = list(options[0])
        if function == "layer_norm":
            x, w, b = tensors
            if training:
                return OPS.layer_norm_train(x, shape, w, b, options[1])[0]
            return OPS.layer_norm(x, shape, w, b, options[1])
        x, w = tensors
        return OPS.rms_norm_train(x, shape, w, options[1])[0] if training else OPS.rms_norm(x, shape, w, options[1])
    if function == "linear":
        x, w, b = tensors
        return OPS.linear_train(x, w, b, None)[0] if training else OPS.linear(x, w, b, None)
    if function == "conv2d":
        (x, w, b), (s, p, d, groups) = tensors, options
        if training:
            return OPS.conv2d_train(x, w, b, list(s), list(p), list(d), groups, False)
        return OPS.conv2d(x, w, b, list(s), list(p), list(d), groups, False)
    (q, k, v, mask), (_dropout, is_causal, scale, gqa) = tensors, options
    if training:
        return OPS.sdpa_train(q, k, v, mask, is_causal, scale, gqa)[0]
    return OPS.sdpa(q, k, v, mask, is_causal, scale, gqa)


def _made(spec: tuple[tuple[int, ...], tuple[int, ...], torch.dtype, int, bool]) -> Tensor:
    shape, stride, dtype, device, requires_grad = spec
    # Random values in the call's layout, broadcast (zero) strides included: a view of storage just large enough.
    size = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
    storage = torch.randn(size, dtype=dtype, device=torch.device("cuda", device) if device >= 0 else "cpu")
    return storage.as_strided(shape, stride).requires_grad_(requires_grad)


def _raced_left(function: str, tensors: tuple[Tensor | None, ...], options: tuple[Any, ...]) -> Left | None:
    """A compiled call torch's function is faster for: left to torch (Left), else None (the operator runs it)."""
    first = tensors[0]
    if not _compiling() or first is None or first.device.type not in RACED_DEVICES:
        return None
    from torch._dynamo.comptime import comptime  # (imported as dynamo traces: plancache.torch._traced says why)

    # Locals that _keep_traced reads (comptime hands it the frame's variables).
    traced_0, traced_1, traced_2, traced_3 = (*tensors, None, None, None, None)[:4]  # noqa: RUF059
    comptime(_keep_traced)
    reason = _torch_faster(function, len(tensors), options, _training(*tensors))
    return None if reason is None else Left(reason)


class Left:
    """A call left to torch, and why (counted under its reason). Routes return
    it rather than raise: dynamo traces the mode, and a plain return traces simply."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _count(function: str, reason: str | None) -> None:
    with _counts_lock:
        entry = COUNTS.get(function)
        if entry is None:
            entry = COUNTS[function] = RouteCounts()
        if reason is None:
            entry.routed += 1
        elif reason in entry.left or len(entry.left) < MAX_REASONS:
            entry.left[reason] += 1
        else:  # a reason names argument values (a padding, a stride): their variety stays bounded here
            entry.left[OTHER_REASONS] += 1


def note_returned(function: str) -> None:
    with _counts_lock:
        entry = COUNTS.get(function)
        if entry is None:
            entry = COUNTS[function] = RouteCounts()
        entry.returned += 1


def _unserved(name: str, t: Any, optional: bool = False) -> Left | None:
    """Why tensor argument `name` is not plancache's (None: it is)."""
    if t is None and optional:
        return None
    if not isinstance(t, Tensor):
        return Left(f"{name} is not a tensor")
    # is_cuda first: a tenth of device.type's cost, on every tensor of every routed call (bench/torch_mode_cost.py)
    if not t.is_cuda and t.device.type not in ROUTED_DEVICES:
        return Left(f"{name} is on {t.device.type}")
    if t.dtype not in SERVED_DTYPES:
        return Left(f"{name} is {t.dtype} (plancache serves float16 and bfloat16)")
    return None


def _training(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _bind(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...], defaults: dict[str, Any]
) -> list[Any] | Left:
    """A call's arguments by torch's parameter names (positional or keyword)."""
    given = len(args)
    if not kwargs and given == len(names):  # every argument given in order: the common call of a module
        return list(args)
    if given > len(names):
        return Left("more positional arguments than torch's function takes")
    values = list(args)
    taken = 0
    for name in names[given:]:  # the rest by keyword, else its default (F.layer_norm passes weight=, bias=, eps=)
        if name in kwargs:
            values.append(kwargs[name])
            taken += 1
        elif name in defaults:
            values.append(defaults[name])
        else:
            return Left(f"argument {name!r} missing")
    if taken != len(kwargs):  # a keyword that is not one of the rest: unknown, or given positionally too
        return Left(f"argument {next(k for k in kwargs if k not in names[given:])!r}")
    return values


def _compiling() -> bool:
    return bool(torch.compiler.is_compiling())


def _eager(x: Tensor) -> bool:
    """Whether a routed call is eager on CUDA."""
    return x.is_cuda and not torch.compiler.is_compiling()


def _functional(x: Tensor) -> bool:
    """Whether a routed call is plancache.functional's (eager, CUDA: its Python autograd.Function, the cheapest
    path in Python) rather than the torch operator's. Eager calls take the operators too where the native
    extension is on: an operator's repeated call is replayed in C++ and its autograd is C++ (plancache.torch.
    native), no Python past the route."""
    if not _eager(x):
        return False
    return bool(_ops.native().state != "on")


def _pair(value: Any) -> list[int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return [int(value[0]), int(value[1])]
    return None


def _shape(value: Any) -> list[int]:
    return [value] if isinstance(value, int) else list(value)


# ---- the routes: torch's arguments in, plancache's call out (Left: torch's) ----------------------


UNDECIDED = object()


def _decidable(x: Any) -> bool:
    """Whether a call with first tensor `x` may be a decided geometry's (eager, CUDA, a served dtype)."""
    return isinstance(x, Tensor) and _functional(x) and x.dtype in SERVED_DTYPES


class _DecidedRun(threading.local):
    """Whether this thread's last decided call (one that found its geometry's entry) ran torch's function for
    good (a race torch won, a geometry plancache cannot serve; not one left for a reason that may pass): a served
    layer reads it (plancache.torch._serve), which goes back to its own forward when torch runs all its calls."""

    torch_for_good = False


DECIDED_RUN = _DecidedRun()


def _run_decided(
    entry: Any,
    tensors: tuple[Any, ...],
    func: Callable[..., Any],
    args: tuple[Any, ...],
    lookup: Callable[..., Any],
    lookup_args: tuple[Any, ...],
    layer: Any = None,
    layer_input: Any = None,
) -> Any:
    """A decided geometry's call, as plancache.functional's hit runs it: torch's function `func(*args)` where the
    table says torch runs the geometry (its race won, or plancache could not serve it), else the entry on
    `tensors` (its plan); UNDECIDED where the table holds nothing for it. `lookup(*lookup_args)`: how the call
    found `entry`, which a Racing entry's race charges to the plan (plancache.functional._race.LOOKUP). `layer`:
    the served layer making the call on `layer_input`, whose race without autograd is the layer's: its served
    forward against its class's own (every host cost of the served call counted, as torch's side will pay none
    once the layer goes back to its own forward); the served calls the race makes are not counted as the
    program's."""
    if entry is None:
        return UNDECIDED
    if isinstance(entry, Fallback):
        result = func(*args)
        entry.taken()
        DECIDED_RUN.torch_for_good = entry.expires is None
        return result
    DECIDED_RUN.torch_for_good = False
    # A Racing entry whose race is due (its calls before run the plan as any entry's), unless this is a race's own
    # run of the layer (LOOKUP set: not raced again, and not counted: plancache.torch._serve).
    if type(entry) is Racing and LOOKUP.call is None and (entry.due <= _race.monotonic() or _race.RACE_NOW.on):
        LOOKUP.call = functools.partial(lookup, *lookup_args)
        if layer is not None:
            own = getattr(type(layer), "torch_forward", type(layer).forward)  # a served class's base's forward
            LOOKUP.arms = (functools.partial(layer.forward, layer_input), functools.partial(own, layer, layer_input))
        try:
            return entry(tensors)
        finally:
            LOOKUP.call = LOOKUP.arms = None
    return entry(tensors)


# The decided geometries' calls (a served layer's, most calls of a step; the mode's linear, conv2d and norms
# called as layers call them): what plancache.functional's hit for the call's key runs, at once (its plan, or torch's
# function where torch won the race or plancache could not serve it); UNDECIDED for any other call, which the
# route's checks decide. Skipped: the route's checks and plancache.functional's wrapper, ~9 µs a call of a served
# linear layer whose race torch won (the GPU's eager path with CPU tensors standing in, on the development CPU:
# bench/serve_cost.py --path torch-won). The key names every tensor's shape, stride, dtype and device, so a call
# the route would leave to torch finds no entry the route made; one plancache.functional holds from a program's own
# call (a weight on the CPU, say) runs as that hit does, torch's function, counted routed rather than left.


def decided_linear(x: Any, w: Any, b: Any, layer: Any = None, layer_input: Any = None) -> Any:
    if not _decidable(x) or x.dim() < 2:
        return UNDECIDED
    try:
        entry = pf_linear_decided(x, w, b)
    except (AttributeError, TypeError):  # a weight or bias that is not a tensor: the route says so
        return UNDECIDED
    args = (x, w, b)
    return _run_decided(
        entry, (x, w) if b is None else args, F.linear, args, pf_linear_decided, args, layer, layer_input
    )


def decided_layer_norm(x: Any, shape: Any, w: Any, b: Any, eps: Any, layer: Any = None, layer_input: Any = None) -> Any:
    if not _decidable(x):
        return UNDECIDED
    try:
        entry = pf_layer_norm_decided(x, shape, w, b, eps)
    except (AttributeError, TypeError):
        return UNDECIDED
    tensors = (x,) if w is None else (x, w)
    args = (x, shape, w, b, eps)
    tensors = tensors if b is None else (*tensors, b)
    return _run_decided(entry, tensors, F.layer_norm, args, pf_layer_norm_decided, args, layer, layer_input)


def decided_rms_norm(x: Any, shape: Any, w: Any, eps: Any, layer: Any = None, layer_input: Any = None) -> Any:
    if not _decidable(x):
        return UNDECIDED
    try:
        key_args = (x, shape, w, None if eps is None else float(eps))
        entry = pf_rms_norm_decided(*key_args)
    except (AttributeError, TypeError):
        return UNDECIDED
    tensors = (x,) if w is None else (x, w)
    args = (x, shape, w, eps)
    return _run_decided(entry, tensors, F.rms_norm, args, pf_rms_norm_decided, key_args, layer, layer_input)


def _layer_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not kwargs and len(args) == 5:  # a layer's call, F.layer_norm(x, shape, weight, bias, eps)
        result = decided_layer_norm(*args)
        if result is not UNDECIDED:
            return result
    return undecided_layer_norm(args, kwargs)


def _layer_norm_unserved(x: Any, w: Any, b: Any) -> Left | None:
    """Why the layer_norm route leaves a call to torch (None: it serves it): its checks, the eager route's and a
    served layer's traced call's (traced_layer_norm, on dynamo's fake tensors)."""
    # `or`: the checks stop at the first tensor left to torch (a Left is true): a call left to torch (an fp32
    # model's every norm and linear) formed each reason, ~1.3 µs apiece, where one is kept.
    return _unserved("input", x) or _unserved("weight", w, True) or _unserved("bias", b, True)


def undecided_layer_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # torch.layer_norm's last argument, cudnn_enable, says nothing plancache reads.
    bound = _bind(
        args,
        kwargs,
        ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable"),
        {"weight": None, "bias": None, "eps": 1e-5, "cudnn_enable": True},
    )
    if isinstance(bound, Left):
        return bound
    x, shape, w, b, eps, _ = bound
    left = _layer_norm_unserved(x, w, b)
    if left is not None:
        return left
    if _functional(x):
        return pf.layer_norm(x, _shape(shape), w, b, eps)
    raced = _raced_left("layer_norm", (x, w, b), (tuple(_shape(shape)), float(eps)))
    if raced is not None:
        return raced
    if _training(x, w, b):
        return OPS.layer_norm_train(x, _shape(shape), w, b, float(eps))[0]
    return OPS.layer_norm(x, _shape(shape), w, b, float(eps))


def _rms_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not kwargs and len(args) == 4:  # a layer's call, F.rms_norm(x, shape, weight, eps)
        result = decided_rms_norm(*args)
        if result is not UNDECIDED:
            return result
    return undecided_rms_norm(args, kwargs)


def _rms_norm_unserved(x: Any, w: Any) -> Left | None:
    """Why the rms_norm route leaves a call to torch (None: it serves it)."""
    return _unserved("input", x) or _unserved("weight", w, True)


def undecided_rms_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bound = _bind(args, kwargs, ("input", "normalized_shape", "weight", "eps"), {"weight": None, "eps": None})
    if isinstance(bound, Left):
        return bound
    x, shape, w, eps = bound
    left = _rms_norm_unserved(x, w)
    if left is not None:
        return left
    eps = None if eps is None else float(eps)
    if _functional(x):
        return pf.rms_norm(x, _shape(shape), w, eps)
    raced = _raced_left("rms_norm", (x, w), (tuple(_shape(shape)), eps))
    if raced is not None:
        return raced
    if _training(x, w):
        return OPS.rms_norm_train(x, _shape(shape), w, eps)[0]
    return OPS.rms_norm(x, _shape(shape), w, eps)


def _linear(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not kwargs and len(args) == 3:
        result = decided_linear(*args)
        if result is not UNDECIDED:
            return result
    return undecided_linear(args, kwargs)


def _linear_unserved(x: Any, w: Any, b: Any) -> Left | None:
    """Why the linear route leaves a call to torch (None: it serves it)."""
    left = _unserved("input", x) or _unserved("weight", w) or _unserved("bias", b, True)
    if left is None and (w.dim() != 2 or x.dim() < 2):
        return Left(f"input of {x.dim()} dims, weight of {w.dim()}")
    return left


def undecided_linear(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The linear route past its decided geometries: the checks, plancache.functional's call."""
    bound = _bind(args, kwargs, ("input", "weight", "bias"), {"bias": None})
    if isinstance(bound, Left):
        return bound
    x, w, b = bound
    left = _linear_unserved(x, w, b)
    if left is not None:
        return left
    if _functional(x):
        return pf.linear(x, w, b)
    raced = _raced_left("linear", (x, w, b), ())
    if raced is not None:
        return raced
    if _training(x, w, b):
        return OPS.linear_train(x, w, b, None)[0]
    return OPS.linear(x, w, b, None)


def _addmm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch.addmm(bias, x, w) with a 1-D bias, beta = alpha = 1: linear with the weight w.T (transformers' Conv1D)."""
    bound = _bind(args, kwargs, ("input", "mat1", "mat2", "beta", "alpha"), {"beta": 1, "alpha": 1})
    if isinstance(bound, Left):
        return bound
    b, x, w, beta, alpha = bound
    if beta != 1 or alpha != 1:
        return Left("beta or alpha other than 1")
    if not isinstance(b, Tensor) or not isinstance(w, Tensor) or b.dim() != 1:
        return Left("a bias that is not 1-D")
    return _linear((x, w.t(), b), {})


def _sdpa(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bound = _bind(
        args,
        kwargs,
        ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
        {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False},
    )
    if isinstance(bound, Left):
        return bound
    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa = bound
    left = _unserved("query", q) or _unserved("key", k) or _unserved("value", v)
    if left is not None:
        return left
    if q.dim() != 4:
        return Left(f"query of {q.dim()} dims (plancache serves [batch, heads, sequence, head dim])")
    if dropout_p:
        return Left("dropout (torch's mask; plancache's draws another)")
    boolean = isinstance(mask, Tensor) and mask.dtype == torch.bool
    if boolean:
        if is_causal:
            return Left("a boolean attn_mask with is_causal=True")  # what torch makes of both is torch's
        if mask.device.type not in ROUTED_DEVICES:
            return Left(f"attn_mask is on {mask.device.type}")
    elif mask is not None:
        left = _unserved("attn_mask", mask)
        if left is not None:
            return left
        if mask.requires_grad:
            return Left("an attn_mask that requires grad")
    scale = None if scale is None else float(scale)
    if _eager(q) and (boolean or _functional(q)):  # a boolean mask: plancache.functional's bias of it
        return pf.scaled_dot_product_attention(q, k, v, mask, 0.0, bool(is_causal), scale, bool(enable_gqa))
    if not boolean:  # a boolean mask's bias is made in the traced program: its geometry is not the call's
        raced = _raced_left(
            "scaled_dot_product_attention", (q, k, v, mask), (0.0, bool(is_causal), scale, bool(enable_gqa))
        )
        if raced is not None:
            return raced
    unattended = None
    if boolean:  # traced under torch.compile, where inductor fuses it
        mask, unattended = boolean_mask_as_bias(mask, q, k)
    if _training(q, k, v):
        out = OPS.sdpa_train(q, k, v, mask, bool(is_causal), scale, bool(enable_gqa))[0]
    else:
        out = OPS.sdpa(q, k, v, mask, bool(is_causal), scale, bool(enable_gqa))
    return out if unattended is None else out.masked_fill(unattended, 0.0)


def decided_conv2d(
    x: Any,
    w: Any,
    b: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: Any,
    layer: Any = None,
    layer_input: Any = None,
) -> Any:
    """Options as the route hands them to plancache.functional: a Conv2d layer's own (pairs of ints; a padding
    given as a word is the route's)."""
    if not _decidable(x) or x.dim() != 4 or not (type(stride) is type(padding) is type(dilation) is tuple):
        return UNDECIDED
    try:
        entry = pf_conv2d_decided(x, w, b, stride, padding, dilation, groups)
    except (AttributeError, TypeError):
        return UNDECIDED
    args = (x, w, b, stride, padding, dilation, groups)
    tensors = (x, w) if b is None else (x, w, b)
    return _run_decided(entry, tensors, F.conv2d, args, pf_conv2d_decided, args, layer, layer_input)


def _conv2d(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not kwargs and len(args) == 7:  # a layer's call, F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        result = decided_conv2d(*args)
        if result is not UNDECIDED:
            return result
    return undecided_conv2d(args, kwargs)


def _conv2d_pairs(stride: Any, padding: Any, dilation: Any) -> tuple[list[int] | None, ...]:
    """A conv2d call's stride, padding and dilation as plancache's pairs (None: one it has no form for; a padding of
    "valid" is zero)."""
    return _pair(stride), _pair(0 if padding == "valid" else padding), _pair(dilation)


def _conv2d_unserved(
    x: Any, w: Any, b: Any, pairs: tuple[list[int] | None, ...], given: tuple[Any, ...]
) -> Left | None:
    """Why the conv2d route leaves a call to torch (None: it serves it); `pairs`: _conv2d_pairs of the call's
    stride, padding and dilation (`given`)."""
    left = _unserved("input", x) or _unserved("weight", w) or _unserved("bias", b, True)
    if left is not None:
        return left
    if x.dim() != 4:
        return Left(f"input of {x.dim()} dims")
    if None in pairs:
        stride, padding, dilation = given
        return Left(f"stride={stride!r}, padding={padding!r}, dilation={dilation!r}")
    return None


def undecided_conv2d(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bound = _bind(
        args,
        kwargs,
        ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
        {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1},
    )
    if isinstance(bound, Left):
        return bound
    x, w, b, stride, padding, dilation, groups = bound
    checked = _conv2d_checked(x, w, b, stride, padding, dilation, groups)
    if isinstance(checked, Left):
        return checked
    s, p, d, _ = checked
    if _functional(x):
        return pf.conv2d(x, w, b, s, p, d, groups)
    raced = _raced_left("conv2d", (x, w, b), checked)
    if raced is not None:
        return raced
    if _training(x, w, b):
        return OPS.conv2d_train(x, w, b, list(s), list(p), list(d), groups, False)
    return OPS.conv2d(x, w, b, list(s), list(p), list(d), groups, False)


def _conv2d_checked(
    x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, groups: Any
) -> Left | tuple[Any, ...]:
    """The conv2d route's checks (a Left), else the call's options as plancache.functional and the race take
    them: (stride, padding, dilation) as pairs, groups. The route's and a served layer's traced call's."""
    pairs = _conv2d_pairs(stride, padding, dilation)
    left = _conv2d_unserved(x, w, b, pairs, (stride, padding, dilation))
    if left is not None:
        return left
    s, p, d = pairs
    assert s is not None and p is not None and d is not None  # (_conv2d_unserved said so)
    return (tuple(s), tuple(p), tuple(d), groups)


EVALUATION_BATCH_NORM_COMPILED = (
    "batch_norm in evaluation under torch.compile (inductor fuses it into its neighbours; cuDNN proposes no engine "
    "for the standalone inference graph on the H200)"
)


def _batch_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Eager: plancache.functional.batch_norm, which updates the running statistics in place, as torch does
    (cuDNN writes them). Compiled: an operator does not write its arguments, so plancache::batch_norm_train
    returns the next running statistics and the route copies them into the module's (dynamo traces the copy as
    torch's own batch norm's in-place update); evaluation is left to torch at trace time (below)."""
    bound = _bind(
        args,
        kwargs,
        ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
        {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5},
    )
    if isinstance(bound, Left):
        return bound
    x, mean, var, w, b, training, momentum, eps = bound
    left = _unserved("input", x)
    if left is not None:
        return left
    if momentum is None:
        return Left("momentum=None (a cumulative average)")
    if _eager(x):
        return pf.batch_norm(x, mean, var, w, b, bool(training), float(momentum), float(eps))
    if not isinstance(mean, Tensor) or not isinstance(var, Tensor):
        return Left("batch_norm without running statistics (track_running_stats=False) under torch.compile")
    # Compiled, what the operator would only hand to torch's kernel is left to torch here, at trace time:
    # inductor fuses torch's batch norm into its neighbours, an operator's call it cannot.
    if x.dim() != 4:
        return Left(f"batch_norm of a {x.dim()}-D input under torch.compile (cuDNN's batchnorm takes 4-D)")
    if any(t is not None and t.dtype != torch.float32 for t in (mean, var, w, b)):
        return Left(
            "batch_norm with statistics or parameters not float32 under torch.compile (plancache serves float32 "
            "ones, as torch's mixed precision leaves them)"
        )
    if training:
        out, _mean, _inv, next_mean, next_var = OPS.batch_norm_train(x, w, b, mean, var, float(momentum), float(eps))
        mean.copy_(next_mean)  # buffers: no autograd history
        var.copy_(next_var)
        return out
    if _training(x, w, b):
        return Left(
            "autograd in evaluation mode (its backward is per-channel pointwise math, which cuDNN computes wrongly)"
        )
    # Evaluation is a per-channel scale and shift: inductor fuses torch's into the kernels beside it, where an
    # operator is a kernel of its own over the whole tensor; and cuDNN proposes no engine for the standalone
    # batchnorm inference graph (H200, cuDNN 9.19: GPU runs 35 and the op-family benchmark), so the operator
    # would only run torch's unfused. Eager, plancache.functional.batch_norm still asks, geometry by geometry.
    return Left(EVALUATION_BATCH_NORM_COMPILED)


Route = Callable[[tuple[Any, ...], dict[str, Any]], Any]
# torch.nn.functional's and the torch.* function it calls (which is what dynamo hands the mode for rms_norm).
ROUTES: dict[Callable[..., Any], tuple[str, Route]] = {
    F.layer_norm: ("layer_norm", _layer_norm),
    torch.layer_norm: ("layer_norm", _layer_norm),
    F.rms_norm: ("rms_norm", _rms_norm),
    torch.rms_norm: ("rms_norm", _rms_norm),
    F.linear: ("linear", _linear),
    torch.addmm: ("linear", _addmm),
    F.scaled_dot_product_attention: ("scaled_dot_product_attention", _sdpa),
    F.conv2d: ("conv2d", _conv2d),
    F.batch_norm: ("batch_norm", _batch_norm),
}


class PlanCacheMode(TorchFunctionMode):  # type: ignore[misc]
    """The mode: the routed calls plancache's, every other torch's. One
    instance is entered once at a time (nesting another instance is fine:
    the innermost routes, the outer ones see what it calls)."""

    def __init__(self) -> None:
        super().__init__()
        self._entered = False

    def __enter__(self) -> PlanCacheMode:
        if self._entered:
            raise InvalidRequest("plancache.torch.mode(): this mode is entered already (make a new one to nest)")
        self._entered = True
        try:
            super().__enter__()
        except BaseException:
            self._entered = False
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._entered = False

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        route = ROUTES.get(func)
        if route is None:
            return func(*args, **kwargs)
        function, call = route
        return dispatch(function, call, func, args, kwargs)


def dispatch(
    function: str, call: Route, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A routed call (the mode's, or a served module's: plancache.torch._serve): plancache's result, or torch's
    function's (`func`) where the route leaves it, counted (eager) or recorded (traced). Eager, a geometry's first
    call takes its plans where they are stored, else torch's function runs it while the service builds them
    (plancache.functional._first_call.STORED_ONLY): torch's function is what the call runs without plancache."""
    if _compiling():
        result = call(args, kwargs)
        if isinstance(result, Left):
            _note_left_compiled(function, result.reason)
            return func(*args, **kwargs)
        return result
    stored_only, STORED_ONLY.on = STORED_ONLY.on, True
    try:
        result = call(args, kwargs)
    finally:
        STORED_ONLY.on = stored_only
    if isinstance(result, Left):
        _count(function, result.reason)
        return func(*args, **kwargs)
    _count(function, None)
    return result


# ---- a served layer's call under torch.compile: the route's decision made once, at trace time ---------------
#
# Dynamo traces the Python it runs: the route's binding and checks, Left, dispatch, each a few hundred µs of a
# compiled program's cold start a layer call (the development CPU, a 72-layer stack: 1.1 s over torch's 0.7 s).
# A served layer's traced call (plancache.torch._serve) is the few lines below instead: its tensors kept as
# dynamo's fakes (comptime), whether it trains, and one constant-marked call that runs the route's own checks and
# race in plain Python on those fakes. What it decides is what the route decides for the call.


def _checked_linear(tensors: list[Any], options: tuple[Any, ...]) -> Left | tuple[Any, ...]:
    x, w, b = tensors
    left = _linear_unserved(x, w, b)
    return () if left is None else left


def _checked_layer_norm(tensors: list[Any], options: tuple[Any, ...]) -> Left | tuple[Any, ...]:
    (x, w, b), (shape, eps) = tensors, options
    left = _layer_norm_unserved(x, w, b)
    return (tuple(_shape(shape)), float(eps)) if left is None else left


def _checked_rms_norm(tensors: list[Any], options: tuple[Any, ...]) -> Left | tuple[Any, ...]:
    (x, w), (shape, eps) = tensors, options
    left = _rms_norm_unserved(x, w)
    return (tuple(_shape(shape)), None if eps is None else float(eps)) if left is None else left


def _checked_conv2d(tensors: list[Any], options: tuple[Any, ...]) -> Left | tuple[Any, ...]:
    (x, w, b), (stride, padding, dilation, groups) = tensors, options
    return _conv2d_checked(x, w, b, stride, padding, dilation, groups)


# Each traced function's checks on its call's fake tensors and options: a Left, or the options its race takes (as
# the route hands them to _raced_left).
_TRACED_CHECKS: dict[str, Callable[[list[Any], tuple[Any, ...]], Left | tuple[Any, ...]]] = {
    "linear": _checked_linear,
    "layer_norm": _checked_layer_norm,
    "rms_norm": _checked_rms_norm,
    "conv2d": _checked_conv2d,
}


def _traced_torch_runs(function: str, count: int, options: tuple[Any, ...], training: bool) -> bool | None:
    """Whether torch's function runs a served layer's traced call of `function` (its `count` tensors kept by
    _keep_traced, its options as the layer has them), else plancache's operator: run by dynamo once, as it traces
    the call, its result kept as a constant (as _note_left_compiled). The route's checks (a Left: its reason
    recorded, as dispatch records it), then, on a raced device, its race (_traced_verdict: a reason recorded where
    torch's function is faster). None where no fakes were kept (the call was not dynamo's to trace: torch.export's
    non-strict tracing, say): the caller takes the route."""
    fakes, _TRACED.fakes = _TRACED.fakes, None
    if fakes is None:
        return None
    tensors = fakes[:count]
    checked = _TRACED_CHECKS[function](tensors, options)
    if isinstance(checked, Left):
        _note_left_compiled(function, checked.reason)
        return True
    if tensors[0].device.type not in RACED_DEVICES:
        return False
    reason = _traced_verdict(function, tensors, checked, training)
    if reason is None:
        return False
    _note_left_compiled(function, reason)
    return True


_traced_torch_runs._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _traced_conv1d_torch_runs(training: bool) -> bool | None:
    """_traced_torch_runs for transformers' Conv1D, whose weight is kept as the layer holds it ([in, out]): the
    linear's call it makes is on that weight transposed, taken here on the fake tensor (a view, as the route's)."""
    fakes = _TRACED.fakes
    if fakes is not None:
        _TRACED.fakes = [fakes[0], fakes[1].t(), *fakes[2:]]
    return _traced_torch_runs("linear", 3, (), training)


_traced_conv1d_torch_runs._dynamo_marked_constant = True  # type: ignore[attr-defined]

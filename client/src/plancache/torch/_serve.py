"""`plancache.torch.serve(model)`: a model's own layers served by plancache, with no mode on every other call.

The mode (plancache.torch._mode) sees every torch call a program makes
while it is entered, and a TorchFunctionMode is Python: each call of the
step pays a few microseconds for it, routed or not (GPU run 50: an eager
GPT-2 step 1.47x torch's with most of its routed calls torch's own after
their races, the rest the mode's own host time). `serve(model)` reaches the
same plans module by module instead: each of the model's nn.Linear,
nn.LayerNorm, nn.RMSNorm and nn.Conv2d (zero padding) layers becomes the
served subclass of its class (ServedLinear, ...), and transformers' Conv1D
(GPT-2's addmm form of a linear) gets an instance forward: a forward that
makes the call the layer's own forward would, through the
mode's route for it (the same checks, the same plancache.functional call
eager and operator under torch.compile, the same counters in stats(), the
same race against torch's function), and every other call of the model is
torch's, untouched. Under torch.compile a served forward is the route's
traced form (plancache.torch._traced): the route's checks and race run
once, in plain Python on dynamo's fake tensors, and dynamo traces a few
lines rather than the route's Python (a compiled program's cold start).
What it does not reach: functions a model calls itself
(transformers' attention calls F.scaled_dot_product_attention; a module
whose forward is written out), batch norm (torch's). A layer whose
calls torch's function runs for good (races torch won, geometries plancache
cannot serve: RETURN_AFTER in a row) goes back to its own forward, so that
it costs nothing over torch's (`stats()[function].returned`). `unserve(model)`
takes them back; nothing outside the model changes (no torch class is
patched, no global state), so two models, or a served and an unserved copy, live
side by side.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from plancache.errors import InvalidRequest
from plancache.functional._race import LOOKUP
from plancache.torch import _mode
from plancache.torch._mode import Route

log = logging.getLogger("plancache.torch")


# A served layer whose calls torch's function ran for good this many times in a row (its geometries' races lost,
# or geometries plancache cannot serve) goes back to its own forward: torch runs its calls without the served
# forward's host time (its key, the table's lookup), which is most of what such a layer costs over torch's own
# (GPU run 52, H100: GPT-2 training eager 1.10-1.14x torch's with 10 of its 11 linears' races torch's). In a row:
# a layer some of whose geometries a plan runs stays served. What it gives up: a geometry it meets later (another
# sequence length) is torch's; serve(model) again serves it again.
RETURN_AFTER = 16
_TORCH_RUNS = "_plancache_torch_runs"  # a served layer's own count, in its __dict__ (no nn.Module __setattr__)
_returning = threading.Lock()


def _call(
    layer: nn.Module,
    function: str,
    decided: Callable[..., Any],
    undecided: Route,
    func: Callable[..., Any],
    args: Any,
    input: Tensor,
) -> Any:
    """A layer's call of `function` on `input` (`args`: the function's): its decided geometry's at once (most
    calls of a step), else the route's (`undecided`: its checks, plancache.functional's call; torch's `func`
    where it leaves the call), counted. Eager only: a served layer's forward under torch.compile is its traced
    call's (plancache.torch._traced)."""
    result = decided(*args, layer, input)
    if result is _mode.UNDECIDED:
        return _mode.dispatch(function, undecided, func, args, {})
    if LOOKUP.call is None:  # (set: this call is a race's run of the layer, not the program's)
        _mode._count(function, None)
    own = layer.__dict__
    if _mode.DECIDED_RUN.torch_for_good:
        _torch_ran(layer, function)
    elif _TORCH_RUNS in own:
        del own[_TORCH_RUNS]
    return result


def _torch_ran(layer: nn.Module, function: str) -> None:
    own = layer.__dict__
    runs = own.get(_TORCH_RUNS, 0) + 1
    if runs < RETURN_AFTER:
        own[_TORCH_RUNS] = runs
        return
    own.pop(_TORCH_RUNS, None)
    with _returning:  # of threads that reach here at once, one gives the layer back and counts it
        returned = _give_back(layer)
    if returned:
        _mode.note_returned(function)
        log.debug(
            "plancache.torch: a %s layer goes back to its own forward (torch ran its last %d calls)",
            type(layer).__name__,
            runs,
        )


def _linear(layer: nn.Linear, input: Tensor) -> Any:
    args = (input, layer.weight, layer.bias)
    return _call(layer, "linear", _mode.decided_linear, _mode.undecided_linear, F.linear, args, input)


def _layer_norm(layer: nn.LayerNorm, input: Tensor) -> Any:
    args = (input, layer.normalized_shape, layer.weight, layer.bias, layer.eps)
    return _call(layer, "layer_norm", _mode.decided_layer_norm, _mode.undecided_layer_norm, F.layer_norm, args, input)


def _rms_norm(layer: Any, input: Tensor) -> Any:
    args = (input, layer.normalized_shape, layer.weight, layer.eps)
    return _call(layer, "rms_norm", _mode.decided_rms_norm, _mode.undecided_rms_norm, F.rms_norm, args, input)


def _conv2d(layer: nn.Conv2d, input: Tensor) -> Any:
    args = (input, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation, layer.groups)
    return _call(layer, "conv2d", _mode.decided_conv2d, _mode.undecided_conv2d, F.conv2d, args, input)


def _conv1d_transformers(layer: Any, x: Tensor) -> Any:
    """transformers.pytorch_utils.Conv1D.forward, its addmm routed: x @ weight + bias over the last dim.

    Its torch.addmm(bias, x, weight) is F.linear(x, weight.T, bias): torch's linear is that addmm, the same
    kernel on the same operands (tests/unit/plancache_torch/test_serve.py), so the layer takes the linear route
    at once, as the mode's addmm route does after checks a Conv1D always passes (a 1-D bias, beta = alpha = 1).
    Under torch.compile a call the route leaves to torch is the layer's own addmm (_traced.traced_conv1d): the
    compiled graph is then the unserved model's, node for node."""
    size_out = (*x.size()[:-1], layer.nf)
    if torch.compiler.is_compiling():
        from plancache.torch._traced import traced_conv1d

        # Read in the order the layer's own forward reads them (bias, the input's view, weight): the order of the
        # compiled graph's inputs, and so inductor's cache key, is the order dynamo first meets them.
        bias, x2d, weight = layer.bias, x.view(-1, x.size(-1)), layer.weight
        return traced_conv1d(x2d, weight, bias).view(size_out)
    args = (x.view(-1, x.size(-1)), layer.weight.t(), layer.bias)
    result = _call(layer, "linear", _mode.decided_linear, _mode.undecided_linear, F.linear, args, x)
    return result.view(size_out)


class ServedLinear(nn.Linear):  # type: ignore[misc]  # (torch is untyped here)
    """An `nn.Linear` that serve() serves: its forward is the route's. A class rather than an instance forward per
    layer: a compiled program then guards one class's forward, not a partial on every layer and what it read
    (bench/compiled_guards.py, the development CPU: a compiled 53-block stack's frame and guards 1.29x torch's
    a call with instance forwards, 1.05x with served classes)."""

    torch_forward = nn.Linear.forward  # what the layer's race times plancache against

    def forward(self, input: Tensor) -> Any:
        if torch.compiler.is_compiling():
            from plancache.torch._traced import traced_linear

            return traced_linear(input, self.weight, self.bias)
        return _linear(self, input)


class ServedLayerNorm(nn.LayerNorm):  # type: ignore[misc]
    """An `nn.LayerNorm` that serve() serves (ServedLinear says why a class)."""

    torch_forward = nn.LayerNorm.forward  # what the layer's race times plancache against

    def forward(self, input: Tensor) -> Any:
        if torch.compiler.is_compiling():
            from plancache.torch._traced import traced_layer_norm

            return traced_layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        return _layer_norm(self, input)


class ServedConv2d(nn.Conv2d):  # type: ignore[misc]
    """An `nn.Conv2d` (zero padding) that serve() serves (ServedLinear says why a class)."""

    torch_forward = nn.Conv2d.forward  # what the layer's race times plancache against

    def forward(self, input: Tensor) -> Any:
        if torch.compiler.is_compiling():
            from plancache.torch._traced import traced_conv2d

            return traced_conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return _conv2d(self, input)


SERVED_CLASSES: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: ServedLinear,
    nn.LayerNorm: ServedLayerNorm,
    nn.Conv2d: ServedConv2d,
}
if hasattr(nn, "RMSNorm"):

    class ServedRMSNorm(nn.RMSNorm):  # type: ignore[misc]
        """An `nn.RMSNorm` that serve() serves (ServedLinear says why a class)."""

        torch_forward = nn.RMSNorm.forward

        def forward(self, input: Tensor) -> Any:
            if torch.compiler.is_compiling():
                from plancache.torch._traced import traced_rms_norm

                return traced_rms_norm(input, self.normalized_shape, self.weight, self.eps)
            return _rms_norm(self, input)

    SERVED_CLASSES[nn.RMSNorm] = ServedRMSNorm
BASE_CLASSES = {served: base for base, served in SERVED_CLASSES.items()}
FORWARDS = (_conv1d_transformers,)  # served by an instance forward: transformers' class is not ours to subclass


def _served_class(module: nn.Module) -> type[nn.Module] | None:
    """The served class for `module`'s exact class (a subclass may have changed what forward does), or None."""
    kind = type(module)
    if kind is nn.Conv2d and module.padding_mode != "zeros":
        return None
    return SERVED_CLASSES.get(kind)


def _forward_for(module: nn.Module) -> Callable[..., Any] | None:
    """The served instance forward for `module` (transformers' Conv1D), or None."""
    kind = type(module)
    if kind.__name__ == "Conv1D" and kind.__module__.startswith("transformers.") and hasattr(module, "nf"):
        return _conv1d_transformers
    return None


def _modules(function: str, model: Any) -> Any:
    if not isinstance(model, nn.Module):
        raise InvalidRequest(f"plancache.torch.{function}: model must be a torch.nn.Module, got {type(model).__name__}")
    return model.modules()


def served(module: nn.Module) -> bool:
    if type(module) in BASE_CLASSES:
        return True
    forward = module.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func in FORWARDS


def _give_back(module: nn.Module) -> bool:
    """`module`'s own forward back (its class, or without its instance forward); whether it was served."""
    base = BASE_CLASSES.get(type(module))
    if base is not None:
        module.__class__ = base
        return True
    forward = module.__dict__.get("forward")
    if isinstance(forward, functools.partial) and forward.func in FORWARDS:
        # pop, not del: of threads that reach here at once, one takes the forward away
        return module.__dict__.pop("forward", None) is not None
    return False


def serve(model: nn.Module) -> nn.Module:
    """Serve `model`'s layers (itself and every submodule) through plancache; returns `model`. A layer that has an
    instance forward of its own already (a hook's, another library's) is left as it is; serving twice is once.
    A served `nn.Linear`, `nn.LayerNorm`, `nn.Conv2d` or `nn.RMSNorm` becomes the served subclass of its class
    (ServedLinear, ...: isinstance checks hold, `type(layer) is nn.Linear` does not); transformers' Conv1D gets an
    instance forward."""
    for module in _modules("serve", model):
        if served(module) or "forward" in module.__dict__:
            continue
        served_class = _served_class(module)
        if served_class is not None:
            module.__class__ = served_class
        else:
            forward = _forward_for(module)
            if forward is None:
                continue
            module.forward = functools.partial(forward, module)
        module.__dict__.pop(_TORCH_RUNS, None)
    return model


def unserve(model: nn.Module) -> nn.Module:
    """Give `model`'s served layers their own forward back; returns `model`."""
    for module in _modules("unserve", model):
        _give_back(module)
        module.__dict__.pop(_TORCH_RUNS, None)
    return model

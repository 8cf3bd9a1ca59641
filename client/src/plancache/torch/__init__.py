"""plancache for torch programs as they are: torch operators, and a mode that routes an unchanged model's calls.

    import plancache.torch
    plancache.functional.configure("plancache.internal:50051")   # or PLANCACHE_SERVER
    with plancache.torch.mode():                                 # eager, or around/inside torch.compile
        loss = model(batch).loss
        loss.backward()
    step = plancache.torch.compile(model, fullgraph=True)        # compiled: the mode entered inside it

Inside the mode, the model's torch.nn.functional calls that plancache
serves (layer_norm, rms_norm, linear and transformers' addmm form of it,
scaled_dot_product_attention without dropout, conv2d; CUDA tensors of
float16 or bfloat16) run served cuDNN plans, forward and backward; every
other call, and every geometry cuDNN does not build, runs torch's own
function with the same result. `stats()` says what was routed and what was
left to torch, and why. The mode is a torch.overrides.TorchFunctionMode:
it lives on the thread that entered it, for as long as it is entered; it
patches nothing. `serve(model)` reaches the same plans through the model's
own layers instead (nn.Linear, nn.LayerNorm, nn.RMSNorm, nn.Conv2d,
transformers' Conv1D: a served subclass or an instance forward each,
`unserve(model)` removes them), so that the model's other torch calls pay nothing for plancache
(plancache.torch._serve); functions the model calls itself (attention) stay
the mode's to route.

The operators (`torch.ops.plancache.*`: plancache.torch._ops) are what a
compiled program calls: torch.compile(fullgraph=True) traces them without a
graph break, AOT autograd puts their backward operators in the backward
graph, and CUDA graphs (mode="reduce-overhead") capture their plans.
`compile()` is torch.compile of the model with the mode entered inside the
compiled function: the same graphs, and no TorchFunctionMode on the stack
while the compiled program runs (entered around it, the mode sees every call
the compiled program makes, its own operators' included, and each is
dispatched twice: ~14 µs an operator on the development CPU,
bench/torch_mode_cost.py).

Needs torch (an ImportError says so without it); plancache itself does not.
Owns: the operators (their schemas, fake implementations, autograd
registrations, and torch's own forward and backward for what plancache does
not serve: _torch_math), the mode and its routes, the mode's counters.
May import: plancache.functional, plancache.errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    import torch  # noqa: F401 (the operators below need it; say so at import)
except ImportError as e:  # pragma: no cover - exercised where torch is missing
    raise ImportError(
        "plancache.torch needs torch (pip install torch); plancache.functional does too", name="torch"
    ) from e

import plancache.functional as pf
from plancache.torch import _ops
from plancache.torch._mode import COUNTS, LEFT_COMPILED, PlanCacheMode, _counts_lock
from plancache.torch._serve import serve, unserve

__all__ = [
    "OPERATORS",
    "PlanCacheMode",
    "RouteStats",
    "clear_stats",
    "compile",
    "mode",
    "native_state",
    "serve",
    "stats",
    "unserve",
]

OPERATORS = tuple(op.qualname for op in _ops.OPERATORS)  # "plancache::layer_norm", ...


@dataclass(frozen=True)
class RouteStats:
    """One torch function's calls under the mode (eager), and what ran them."""

    routed: int = 0  # calls given to plancache (its plan, or torch's function where cuDNN does not serve the geometry)
    left: dict[str, int] = field(default_factory=dict)  # calls left to torch's own function, by reason
    cudnn: int = 0  # calls a plancache plan ran (plancache.functional.stats(), operators included)
    # calls plancache gave torch's function (a geometry cuDNN does not serve, or whose plan torch's function beat
    # in their race: plancache.functional.set_race_torch)
    torch: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # why, geometries per reason
    # Why a compiled program leaves calls of it to torch (recorded as it was traced: a compiled call is not
    # counted), a traced call torch's function won its race against the plan included.
    left_compiled: tuple[str, ...] = ()
    raced: int = 0  # geometries whose plan was raced against torch's function (eager, and as programs were traced)
    # serve(model)'s layers gone back to their own forward: torch's function ran their last calls, every one
    # (races torch won, geometries plancache cannot serve); their calls since are torch's, not counted
    returned: int = 0


def mode() -> PlanCacheMode:
    """A new mode: `with plancache.torch.mode(): ...` routes the calls plancache serves."""
    return PlanCacheMode()


def compile(model: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """`torch.compile(model, **options)` with the mode entered inside the compiled function: its graphs run
    plancache's operators (what the mode routes, traced), and the compiled program runs with no mode on the
    stack. Call the result as the model (`model` itself keeps its parameters, `train()`, `state_dict()`)."""
    import torch

    # Not functools.wraps: it would copy a module's __dict__ (its parameters' tables) onto the function.
    def routed(*args: Any, **kwargs: Any) -> Any:
        with mode():
            return model(*args, **kwargs)

    compiled: Callable[..., Any] = torch.compile(routed, **options)
    return compiled


def stats() -> dict[str, RouteStats]:
    """By torch function ("layer_norm", "linear", "scaled_dot_product_attention", ...): what the mode routed and
    left (eager calls), and what ran the routed ones (plancache.functional's counters, compiled calls included)."""
    served = pf.stats()
    with _counts_lock:
        routes = {name: (c.routed, dict(c.left), c.returned) for name, c in COUNTS.items()}
    compiled: dict[str, list[str]] = {}
    for function, reason in sorted(set(LEFT_COMPILED)):
        compiled.setdefault(function, []).append(reason)
    out = {}
    for name in sorted(set(routes) | set(served) | set(compiled)):
        routed, left, returned = routes.get(name, (0, {}, 0))
        s = served.get(name)
        out[name] = RouteStats(
            routed,
            left,
            s.cudnn if s else 0,
            s.torch if s else 0,
            dict(s.reasons) if s else {},
            tuple(compiled.get(name, ())),
            s.raced if s else 0,
            returned,
        )
    return out


def native_state() -> dict[str, Any]:
    """The native kernels in this process (plancache.torch.native): `state` (off: no CUDA call yet; building;
    on; disabled; failed: why), and when on, how many calls' geometries are `kept` (replayed in C++) and
    `refused` (theirs run the Python implementation every call: torch's function ran, or the implementation
    made or wrote a tensor the replay could not reproduce)."""
    from plancache.torch.native import NATIVE

    return NATIVE.info()


def clear_stats() -> None:
    """Forget the mode's counters (plancache.functional.clear() forgets the functions'). What compiled
    programs leave to torch (`left_compiled`) is kept: it is recorded when a program is traced, once."""
    with _counts_lock:
        COUNTS.clear()

"""A process's functions as a manifest, and a start-up that loads them before the first step.

    import plancache.functional as pf
    pending = pf.prefetch("functions.json")   # returns at once: fetched and loaded on a thread
    model, data = build_model(), load_data()  # the program's own start-up, meanwhile
    train(model, data)                        # first calls find their plans loaded
    ...
    pf.manifest().save("functions.json")      # once, after a step: what this run met

Why: a geometry's first call fetches its plans one after another (the
forward, then each backward graph) and deserializes each at its first
execute, all inside the program's first step (GPU run 22: a stored training
step's first step took 0.63 s against torch's 0.45 s). A manifest written by
an earlier run names every plan the functions ran; `prefetch` asks for all
of them in one streaming call and deserializes each as it arrives, on one
background thread (one: deserializing from several threads was slower on
the H200), while the program builds its model.

What a manifest can and cannot do: it names graph specs, keyed again here
for this node's GPU and the service's current options, and the plans come
through the client (signature and key verified). A first call still keys
its own geometry and takes a prefetched plan only under that key: a stale
or edited manifest fetches plans nobody asks for, never a plan for another
graph than the call's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from plancache.errors import InvalidRequest
from plancache.frontdoors.service import SERVICE
from plancache.functional import _tensor_ops
from plancache.functional._autograd import Differentiable
from plancache.functional._table import TABLE, Racing, Served
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.run.plan import Plan
from plancache.transport.background import BackgroundPrefetch
from plancache.transport.manifest import Manifest
from plancache.transport.prefetching import PrefetchStop
from plancache.transport.results import PrefetchResult


def _served(entry: object) -> list[tuple[str, Served]]:
    """The served plans of one table entry, named: a forward, and a training geometry's backward graphs."""
    if isinstance(entry, Racing):  # its race against torch's function still to run
        entry = entry.inner
    if isinstance(entry, Differentiable):
        function = entry.request.function
        pieces = [
            (f"{function}.backward" + ("" if name == "backward" else f".{name}"), piece)
            for name, piece in entry.pieces.items()
            if isinstance(piece, Served)
        ]
        return [(function, entry.forward), *pieces]
    if isinstance(entry, Served):
        return [(entry.request.function, entry)]
    return []


def manifest(device: int | None = None) -> Manifest:
    """Every plan the functions of this process ran on GPU `device` (default:
    the device of the first served geometry), forward and backward graphs,
    one entry each (name, key, spec) for that GPU's target and the service's
    options. Geometries torch runs are not in it."""
    specs: list[GraphSpec] = []
    names: list[str] = []
    seen: set[str] = set()
    for _, entry in TABLE.entries():
        for name, served in _served(entry):
            if device is None:
                device = served.device
            if served.device != device or served.plan.key in seen:
                continue
            seen.add(served.plan.key)
            specs.append(served.request.spec)
            names.append(name)
    if device is None:
        return Manifest(options=SERVICE.options or CompileOptions())
    return Manifest.from_specs(specs, SERVICE.target_for(device), SERVICE.options or CompileOptions(), names)


def prefetch(
    manifest: Manifest | str | Path,
    *,
    device: int | None = None,
    compile_missing: bool = False,
    timeout: float | None = None,
) -> BackgroundPrefetch:
    """Fetch and deserialize a manifest's plans on a background thread, for
    GPU `device` (default: torch's current device); returns at once. A
    first call whose plan is among them waits for that plan alone (if it is
    still on its way) instead of asking the service; one the prefetch could
    not get is asked for as usual. `compile_missing`: have the service build
    what is not stored (the plans arrive as their builds end). `timeout`:
    seconds the whole prefetch may take (default: the client's). The result
    says per entry what came (`.wait()`)."""
    if not isinstance(manifest, Manifest):
        manifest = Manifest.load(manifest)
    ops = _tensor_ops.ops()
    try:
        where = ops.current_device()() if device is None else device
    except ImportError as e:
        raise InvalidRequest(f"plancache.functional.prefetch loads plans for torch's GPU tensors: {e}") from None
    specs = [e.spec for e in manifest.entries if e.spec is not None]
    if len(specs) != len(manifest.entries):
        raise InvalidRequest(
            "plancache.functional.prefetch: every manifest entry needs its spec "
            "(a key alone names one GPU target's plan)"
        )
    client, target = SERVICE.client(), SERVICE.target_for(where)
    keyed = Manifest.from_specs(specs, target, SERVICE.options or CompileOptions(), [e.name for e in manifest.entries])

    stop = PrefetchStop()

    def run(on_plan: Callable[[int, Plan], None]) -> PrefetchResult:
        with ops.on_device(where):  # plans load for the GPU the program's tensors are on
            return client.prefetch(
                keyed, target, compile_missing=compile_missing, timeout=timeout, on_plan=on_plan, stop=stop
            )

    pending = BackgroundPrefetch(run, load=True, stop=stop.stop)
    SERVICE.expect([e.key or "" for e in keyed.entries], pending)
    return pending

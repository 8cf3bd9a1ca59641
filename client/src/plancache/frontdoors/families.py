"""Graph families the functions meet: shapes that vary get built ahead.

A program that calls a function at many sizes of some dim (decode batch
sizes, prefill lengths) makes a new geometry, so a new graph, each time.

The evidence that a dim varies (issue 43): graphs of one function made at
one call site (the program's line that called it, the first frame outside
plancache) with the same parameters (the shapes of the call's weights,
biases and statistics: `Evidence`) that differ only in other dims (same
ops, attributes, dtypes and layout order: one signature), at `threshold`
distinct sizes (3 by default). Resemblance is not evidence: the linear
layers of a model differ in their weights' dims, so each layer is its own
signature, and a fixed-shape program meets one size of each and asks for
nothing. The parameters' tensors are named in the family (`fixed`): the
service refuses a family that varies one of their dims. The drop-in
(plancache.cudnn) knows no parameters: its evidence is the call site alone.

Once a signature has its sizes, its family (plancache.graphspec.family:
the graph with the differing dims as symbols) is asked for, once, at
sizes 1..H for each symbol (H: the next power of two of the largest size
seen, at most FAMILY_GRAPHS graphs in all; with bucketing, the buckets up
to the one after the largest size seen's), on a background thread, with
the sizes seen: the service builds every size not stored at warming's
priority (each member's heuristic plan before any autotuning's
candidates), the members nearest the sizes seen first, and each later
size of that family is a hit (a fetch, not a build).
A family of one varying dim grows when the program passes its range: a
size past H asks for H+1..H' (H' the next power of two of that size), once
per doubling, while the new part is at most FAMILY_GRAPHS graphs; a
bucketed one, one bucket past the largest size's (a size past it asks for
the buckets up to the one after its own). What is built ahead follows what
the program met rather than guessing twice as far (run 33: a sweep of rows
1..199 had 1..512 built, 92 % never fetched; run 34, bucketed by 16 up to
256: the buckets 224-256 above the sweep's largest size were built and
never fetched, 28 %).

What this never does: serve anything. A call keys its own graph; a family
only decides what the service builds before it is asked.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from plancache.errors import PlanCacheError, SpecError
from plancache.frontdoors.buckets import AUTO, BUCKETS
from plancache.frontdoors.service import SERVICE, Once, describe
from plancache.graphspec import spec_io
from plancache.graphspec.family import Family, derive, without_sizes
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.jcs import canonicalize

log = logging.getLogger("plancache.functional")
_once = Once()

DEFAULT_THRESHOLD = 3
# The most graphs a family asked for on the program's behalf names (each one a worker's build).
FAMILY_GRAPHS = 512
# Signatures remembered (least recently seen out first).
MAX_SIGNATURES = 256
# Sizes kept per signature to say which the program met (the service builds those nearest first).
SEEN_KEPT = 64
# Frames in plancache's own package (as imported, and resolved: an install may reach it through a link) and
# torch's (between a model and a function it routes) are not call sites.
_PACKAGE_DIRS = tuple({str(Path(__file__).parent.parent), str(Path(__file__).resolve().parent.parent)})
_SKIPPED = ("/torch/", "<frozen ")


@dataclass(frozen=True)
class Evidence:
    """Where a graph was made and with what parameters: graphs that differ in other dims and share this
    are one layer at many sizes. `parameters`: (name, shape) of the call's weights, biases, statistics;
    `fixed`: their tensors' uids in the graph."""

    site: str
    parameters: tuple[tuple[str, tuple[int, ...]], ...] = ()
    fixed: tuple[int, ...] = ()

    def for_graph(self, spec: GraphSpec) -> Evidence:
        """The same call's evidence for another of its graphs (a backward piece): its parameters' tensors."""
        return replace(self, fixed=parameter_uids(spec))


# The tensors of plancache.functional's graphs that are a call's parameters (its slots' and graphs' names).
PARAMETERS = frozenset({"weight", "bias", "running_mean", "running_var"})


def parameter_uids(spec: GraphSpec) -> tuple[int, ...]:
    """The uids of `spec`'s tensors named as parameters (PARAMETERS)."""
    return tuple(t["uid"] for t in spec_io.to_dict(spec)["tensors"] if t.get("name") in PARAMETERS)


def evidence_of(arguments: Sequence[tuple[str, Any]], spec: GraphSpec) -> Evidence:
    """A plancache.functional first call's evidence: its call site, the shapes of the (name, tensor)
    `arguments` that are parameters, and their tensors in `spec`."""
    parameters = tuple((name, tuple(int(n) for n in tensor.shape)) for name, tensor in arguments if name in PARAMETERS)
    return Evidence(call_site(), parameters, parameter_uids(spec))


def call_site() -> str:
    """The program's line that called plancache: the first frame outside plancache (and torch)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE_DIRS) and not any(part in filename for part in _SKIPPED):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


@dataclass
class FamilyAsk:
    """A family the functions asked the service for, or why not."""

    function: str
    site: str = ""  # the call site whose graphs it is (Evidence.site)
    family_key: str = ""
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # symbol -> (1, H)
    graphs: int = 0
    over_budget: int = 0  # members the service did not queue: past the workload's budget
    status: str = "asking"  # asking, asked, refused
    reason: str = ""


@dataclass
class _Signature:
    function: str
    first: GraphSpec
    evidence: Evidence
    sizes: set[str] = field(default_factory=set)  # the distinct graphs seen (their dims, as text)
    seen: list[GraphSpec] = field(default_factory=list)  # the latest SEEN_KEPT of them
    asked: bool = False
    # Once asked, for a family of one varying dim: where that dim is and the highest size asked (growth)
    reach: tuple[tuple[int, int], int] | None = None
    growing: bool = False  # an ask for more of its range in flight (left set if refused: it grows no more)


class FamilyWatch:
    def __init__(self) -> None:
        self.threshold = DEFAULT_THRESHOLD
        self._lock = threading.Lock()
        self._signatures: OrderedDict[str, _Signature] = OrderedDict()
        # A graph alone so far among those that could share its signature (_coarse_key: the same function, call
        # site, parameters, tensor count and nodes' ops): its signature (~50-200 µs of canonical JSON and a
        # hash per graph) is made only when a second graph of that group comes, since one graph makes no family
        # unless the threshold is 1. A fixed-shape program's graphs each stay alone: none pays it.
        self._alone: OrderedDict[tuple[Any, ...], tuple[str, GraphSpec, int, Evidence]] = OrderedDict()
        self._grouped: OrderedDict[tuple[Any, ...], None] = OrderedDict()  # groups past their first graph
        self.asks: deque[FamilyAsk] = deque(
            maxlen=MAX_SIGNATURES
        )  # the latest asks (a long process meets endless graphs)
        self.starter: Callable[[Callable[[], None]], None] = _start_thread

    def seen(self, function: str, spec: GraphSpec, device: int, evidence: Evidence | None = None) -> None:
        """A first call's graph (served): count it toward its signature's family. `evidence`: where and
        with what parameters it was made (default: the call site alone)."""
        if self.threshold <= 0:
            return
        evidence = evidence or Evidence(call_site())
        if self.threshold > 1:
            group = _coarse_key(function, spec, evidence)
            with self._lock:
                if group in self._grouped:
                    self._grouped.move_to_end(group)
                    earlier = None
                else:
                    earlier = self._alone.pop(group, None)
                    if earlier is None:
                        self._alone[group] = (function, spec, device, evidence)
                        while len(self._alone) > MAX_SIGNATURES:
                            self._alone.popitem(last=False)
                        return
                    self._grouped[group] = None
                    while len(self._grouped) > MAX_SIGNATURES:
                        self._grouped.popitem(last=False)
            if earlier is not None:  # the group's first graph, counted now, before this one
                self._count(*earlier)
        self._count(function, spec, device, evidence)

    def _count(self, function: str, spec: GraphSpec, device: int, evidence: Evidence) -> None:
        try:
            signature, dims = _signature(spec, evidence)
        except SpecError:
            return
        with self._lock:
            entry = self._signatures.get(signature)
            if entry is None:
                entry = self._signatures[signature] = _Signature(function, spec, evidence)
                while len(self._signatures) > MAX_SIGNATURES:
                    self._signatures.popitem(last=False)
            self._signatures.move_to_end(signature)
            if dims not in entry.sizes:
                entry.sizes.add(dims)
                entry.seen = [*entry.seen[-(SEEN_KEPT - 1) :], spec]
            if entry.asked:
                extension = _extension(entry, spec)
                if extension is None:
                    return
                entry.growing = True
            elif len(entry.sizes) < self.threshold:
                return
            else:
                entry.asked, extension = True, None
            first, seen = entry.first, list(entry.seen)
        ask = FamilyAsk(function, site=evidence.site)
        self.asks.append(ask)

        def asked(reach: tuple[tuple[int, int], int] | None) -> None:
            with self._lock:
                entry.growing = False
                if reach is not None:
                    entry.reach = reach

        self.starter(lambda: _ask(ask, first, spec, device, evidence, seen, extension, asked))

    def asked_for(self, spec: GraphSpec, evidence: Evidence | None = None) -> bool:
        """Whether `spec`'s family was asked for (its signature's, `evidence` as for seen()): the service may
        be building it, so its first call asks first rather than expecting a miss
        (plancache.transport.hedged_calls). Free until a family is asked."""
        if not self.asks:
            return False
        try:
            signature, _ = _signature(spec, evidence or Evidence(call_site()))
        except SpecError:
            return False
        with self._lock:
            entry = self._signatures.get(signature)
            return entry is not None and entry.asked

    def clear(self) -> None:
        with self._lock:
            self._signatures.clear()
            self._alone.clear()
            self._grouped.clear()
            self.asks.clear()


def _extension(entry: _Signature, spec: GraphSpec) -> range | None:
    """The sizes a family of one varying dim grows by for `spec` (past its range), or None."""
    if entry.reach is None or entry.growing:
        return None
    place, high = entry.reach
    try:
        size = _size_at(spec, place)
    except SpecError:
        return None
    if size <= high:
        return None
    buckets = _bucket_sizes(entry.function)
    top = _bucket_reach(size, buckets) if buckets else _power_of_two_at_least(size)
    return range(high + 1, top + 1) if high < top and top - high <= FAMILY_GRAPHS else None


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(n)))


def _bucket_sizes(function: str) -> tuple[int, ...]:
    """The buckets `function`'s calls are padded to (its backward's too): set_buckets' policy, else the auto
    buckets of rows that vary (plancache.frontdoors.buckets), else none."""
    base = function.split(".", maxsplit=1)[0]
    if BUCKETS.sizes and base in BUCKETS.functions:
        return BUCKETS.sizes
    return AUTO.sizes if AUTO.pads(base) else ()


def _bucket_reach(size: int, buckets: Sequence[int]) -> int:
    """A bucketed family's top for a largest size met: the bucket after the one that size runs at (the last
    bucket at most)."""
    return buckets[min(bisect.bisect_left(buckets, size) + 1, len(buckets) - 1)]


def _coarse_key(function: str, spec: GraphSpec, evidence: Evidence) -> tuple[Any, ...]:
    """What every graph of one signature shares, made without walking the graph's JSON: the function, the call
    site and parameters (the evidence), how many tensors, and the nodes' ops in order (a signature holds all of
    them, so two graphs of one signature always share this)."""
    return (function, evidence.site, evidence.parameters, len(spec.tensors), tuple(node.op for node in spec.nodes))


def _signature(spec: GraphSpec, evidence: Evidence) -> tuple[str, str]:
    """(the graph without its declared dims and strides, with the evidence, hashed; its dims as text)."""
    graph, dims = without_sizes(spec)
    graph["evidence"] = {
        "site": evidence.site,
        "parameters": [[name, list(shape)] for name, shape in evidence.parameters],
    }
    return hashlib.sha256(canonicalize(graph)).hexdigest(), repr(dims)


def _ask(
    ask: FamilyAsk,
    first: GraphSpec,
    latest: GraphSpec,
    device: int,
    evidence: Evidence,
    seen: Sequence[GraphSpec],
    extension: range | None = None,
    asked: Callable[[tuple[tuple[int, int], int] | None], None] = lambda reach: None,
) -> None:
    """On a background thread: derive the family and ask the service to build it, the sizes seen first.
    `extension`: the sizes a one-dim family grows by (_extension) rather than 1..H; `asked` is told, once
    the service took the ask, where a one-dim family's dim is and the highest size asked (None: it does not
    grow); a refused ask tells it nothing."""
    reach: tuple[tuple[int, int], int] | None = None
    try:
        # which dims vary, and the sizes seen of each; a parameter's dim among them: SpecError
        probe = derive(first, latest, size_range=(1, 1), fixed=evidence.fixed)
        largest = {v.symbol: max(_size_at(first, v.places[0]), _size_at(latest, v.places[0])) for v in probe.varying}
        high = {s: _power_of_two_at_least(n) for s, n in largest.items()}
        while math.prod(high.values()) > FAMILY_GRAPHS:  # halve the largest until the family fits
            biggest = max(high, key=lambda s: high[s])
            high[biggest] //= 2
        sizes: dict[str, Sequence[int]] = {s: range(1, h + 1) for s, h in high.items()}
        buckets = _bucket_sizes(ask.function) if len(high) == 1 else ()
        if buckets:  # padded calls run at the buckets' sizes alone: those up to one past the largest met
            window = extension or range(1, _bucket_reach(max(largest.values()), buckets) + 1)
            sizes = {s: [b for b in buckets if b in window] for s in high}
        elif extension is not None and len(high) == 1:
            sizes = {s: extension for s in high}
        family: Family = derive(first, latest, sizes=sizes, fixed=evidence.fixed)
        if len(family.varying) == 1:
            (varying,) = family.varying
            reach = (varying.places[0], max(varying.sizes))
        met: dict[str, list[int]] = {v.symbol: [] for v in family.varying}
        for spec in seen:
            for symbol, size in _values_any_size(family, spec).items():
                met[symbol].append(size)
        client = SERVICE.client()
        workload = getattr(getattr(client, "workload", None), "name", "")  # whose budget it spends
        status = client.admin.build_family(
            family,
            SERVICE.target_for(device),
            SERVICE.options,
            seen={s: sorted(set(v)) for s, v in met.items() if v},
            workload=workload,
        )
        ask.family_key, ask.sizes, ask.graphs, ask.over_budget, ask.status = (
            status.family_key,
            {v.symbol: (v.sizes[0], v.sizes[-1]) for v in family.varying},
            status.total,
            status.over_budget,
            "asked",
        )
        asked(reach)
        log.info(
            "plancache.functional.%s: shapes vary: family %s (%d graphs, sizes %s) asked for; %d stored, %d queued",
            ask.function,
            status.family_key,
            status.total,
            ask.sizes,
            status.stored,
            status.queued,
        )
    except (SpecError, PlanCacheError) as e:
        ask.status, ask.reason = "refused", describe(e) if isinstance(e, PlanCacheError) else str(e)
        _once(
            log,
            f"family|{ask.function}|{type(e).__name__}",
            "plancache.functional.%s: shapes vary, but no family was asked for: %s",
            ask.function,
            ask.reason,
        )
    except Exception as e:  # never the program's failure: it only loses the builds ahead
        ask.status, ask.reason = "refused", f"{type(e).__name__}: {e}"
        _once(
            log,
            f"family|{ask.function}|unexpected",
            "plancache.functional.%s: asking for a family failed: %s",
            ask.function,
            ask.reason,
        )


def _values_any_size(family: Family, spec: GraphSpec) -> dict[str, int]:
    """The sizes `spec` has at the family's places (a size seen past the family's range included)."""
    return {v.symbol: _size_at(spec, v.places[0]) for v in family.varying}


def _size_at(spec: GraphSpec, place: tuple[int, int]) -> int:
    uid, axis = place
    for tensor in spec_io.to_dict(spec)["tensors"]:
        if tensor["uid"] == uid:
            return int(tensor["dim"][axis])
    raise SpecError(f"no tensor uid {uid}")


def _start_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="plancache-family", daemon=True).start()


WATCH = FamilyWatch()

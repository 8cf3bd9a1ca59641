"""Graph families the functions meet: shapes that vary get built ahead.

A program that calls a function at many sizes of some dim (decode batch
sizes, prefill lengths) makes a new geometry, so a new graph, each time.
Every served first call's graph is compared with the earlier graphs of the
same function that differ from it only in dims (same ops, attributes,
dtypes and layout order: one signature). Once `threshold` graphs of one
signature are seen (3 by default), their family (plancache.graphspec.family:
the graph with the differing dims as symbols) is asked for, once, at
sizes 1..H for each symbol (H: the next power of two of twice the largest
size seen, at most FAMILY_GRAPHS graphs in all; with bucketing, the
buckets' sizes), on a background thread:
the service builds every size not stored at warming's priority, and each
later size of that family is a hit (a fetch, not a build).

What this never does: serve anything. A call keys its own graph; a family
only decides what the service builds before it is asked.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from plancache.errors import PlanCacheError, SpecError
from plancache.frontdoors.buckets import BUCKETS
from plancache.frontdoors.service import SERVICE, Once, describe
from plancache.graphspec import spec_io
from plancache.graphspec.family import Family, derive
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.jcs import canonicalize

log = logging.getLogger("plancache.functional")
_once = Once()

DEFAULT_THRESHOLD = 3
# The most graphs a family asked for on the program's behalf names (each one a worker's build).
FAMILY_GRAPHS = 512
# Signatures remembered (least recently seen out first).
MAX_SIGNATURES = 256


@dataclass
class FamilyAsk:
    """A family the functions asked the service for, or why not."""

    function: str
    family_key: str = ""
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # symbol -> (1, H)
    graphs: int = 0
    status: str = "asking"  # asking, asked, refused
    reason: str = ""


@dataclass
class _Signature:
    function: str
    first: GraphSpec
    sizes: set[str] = field(default_factory=set)  # the distinct graphs seen (their dims, as text)
    asked: bool = False


class FamilyWatch:
    def __init__(self) -> None:
        self.threshold = DEFAULT_THRESHOLD
        self._lock = threading.Lock()
        self._signatures: OrderedDict[str, _Signature] = OrderedDict()
        self.asks: deque[FamilyAsk] = deque(
            maxlen=MAX_SIGNATURES
        )  # the latest asks (a long process meets endless graphs)
        self.starter: Callable[[Callable[[], None]], None] = _start_thread

    def seen(self, function: str, spec: GraphSpec, device: int) -> None:
        """A first call's graph (served): count it toward its signature's family."""
        if self.threshold <= 0:
            return
        try:
            signature, dims = _signature(spec)
        except SpecError:
            return
        with self._lock:
            entry = self._signatures.get(signature)
            if entry is None:
                entry = self._signatures[signature] = _Signature(function, spec)
                while len(self._signatures) > MAX_SIGNATURES:
                    self._signatures.popitem(last=False)
            self._signatures.move_to_end(signature)
            entry.sizes.add(dims)
            if entry.asked or len(entry.sizes) < self.threshold:
                return
            entry.asked = True
            first = entry.first
        ask = FamilyAsk(function)
        self.asks.append(ask)
        self.starter(lambda: _ask(ask, first, spec, device))

    def clear(self) -> None:
        with self._lock:
            self._signatures.clear()
            self.asks.clear()


def _signature(spec: GraphSpec) -> tuple[str, str]:
    """(the graph without its declared dims and strides, hashed; its dims as text)."""
    graph = spec_io.to_dict(spec)
    dims = []
    for tensor in graph["tensors"]:
        dims.append(tensor.pop("dim", None))
        stride = tensor.pop("stride", None)
        tensor["order"] = None if stride is None else sorted(range(len(stride)), key=lambda a: (-stride[a], a))
    return hashlib.sha256(canonicalize(graph)).hexdigest(), repr(dims)


def _ask(ask: FamilyAsk, first: GraphSpec, latest: GraphSpec, device: int) -> None:
    """On a background thread: derive the family and ask the service to build it."""
    try:
        probe = derive(first, latest, size_range=(1, 1))  # which dims vary, and the sizes seen of each
        largest = {v.symbol: max(_size_at(first, v.places[0]), _size_at(latest, v.places[0])) for v in probe.varying}
        high = {s: 1 << max(0, math.ceil(math.log2(2 * n))) for s, n in largest.items()}
        while math.prod(high.values()) > FAMILY_GRAPHS:  # halve the largest until the family fits
            biggest = max(high, key=lambda s: high[s])
            high[biggest] //= 2
        sizes: dict[str, Sequence[int]] = {s: range(1, h + 1) for s, h in high.items()}
        if len(high) == 1 and BUCKETS.sizes and ask.function.split(".")[0] in BUCKETS.functions:
            sizes = {s: BUCKETS.sizes for s in high}  # padded calls run at the buckets' sizes alone
        family: Family = derive(first, latest, sizes=sizes)
        status = SERVICE.client().admin.build_family(family, SERVICE.target_for(device), SERVICE.options)
        ask.family_key, ask.sizes, ask.graphs, ask.status = (
            status.family_key,
            {v.symbol: (v.sizes[0], v.sizes[-1]) for v in family.varying},
            status.total,
            "asked",
        )
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


def _size_at(spec: GraphSpec, place: tuple[int, int]) -> int:
    uid, axis = place
    for tensor in spec_io.to_dict(spec)["tensors"]:
        if tensor["uid"] == uid:
            return int(tensor["dim"][axis])
    raise SpecError(f"no tensor uid {uid}")


def _start_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="plancache-family", daemon=True).start()


WATCH = FamilyWatch()

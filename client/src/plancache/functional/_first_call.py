"""A geometry's first call: its plans fetched, the entry that runs it from then on, or why torch does.

Every operator's hot path is a geometry key, a table lookup and the entry's
call; a miss comes here with the call bound by slot (its `Bound`), the
forward's request, torch's fallback and, with autograd, the rule of its
backward graphs. What worked is kept in the table (a call torch refuses, a
mistake, leaves nothing behind); a geometry left to torch is counted
(`stats()`), logged once, and told to the service
(plancache.transport.outcomes) under its signature's node type when no spec
was made.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

from plancache.errors import InvalidRequest, NotStored, PlanCacheError
from plancache.frontdoors.buckets import AUTO
from plancache.frontdoors.families import WATCH, Evidence, evidence_of
from plancache.frontdoors.service import ABOUT_THE_GRAPH, SERVICE, TRANSIENT, Once, describe, reason_key
from plancache.functional import _tensor_ops
from plancache.functional._autograd import Differentiable, Rule
from plancache.functional._geometry import Unserved
from plancache.functional._op_call import OpCall
from plancache.functional._race import KEPT, RACE, RACE_NOW, TORCH_FASTER, Verdict, race
from plancache.functional._requests import Request
from plancache.functional._signature import Bound, Signature
from plancache.functional._table import TABLE, Entry, Fallback, Racing, Served, TorchFaster, counts, served
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.graph import GraphSpec
from plancache.graphspec.validation import normalize
from plancache.transport import outcomes
from plancache.wire import outcome_labels

log = logging.getLogger("plancache.functional")
_once = Once()


# Why torch's function runs a geometry whose plans were not stored when a plancache.torch route first asked.
NOT_STORED = "not stored yet: torch's function runs it while the service builds its plans"


class _StoredOnly(threading.local):
    """Set by plancache.torch while its eager route makes a call (and while it races a traced call): a
    geometry's first call takes its plans only where they are stored, else torch's function runs it (the
    service building them for the next call or process), where plancache.functional's own calls wait for a
    miss's build. A torch operator's call (plancache.torch's) is one too. Only where the client hedges (a miss
    then runs what the caller would run without plancache: for plancache.torch, torch's function); a client
    that does not waits for the service's plans as it chose (frontdoors.service.Service.compile)."""

    on = False


STORED_ONLY = _StoredOnly()


def first_call(
    bound: Bound,
    key: Hashable,
    request: Callable[[], Request],
    fallback: Callable[..., Any],
    needs_grad: bool,
    rule: Callable[[Request], Rule] | None = None,
    op: OpCall | None = None,
    raced: bool = False,
) -> Any:
    """Run the first call of a geometry and keep what ran it (what worked:
    a call torch refuses, a mistake, leaves nothing behind). With autograd,
    `request` is the training forward and `rule(request)` its backward: every
    plan of both is fetched now. No `rule`: the operator has no served backward.
    `op`: a torch operator's call (plancache.torch), given what `op.take` gives.
    `raced`: a served geometry of a call that may run again unchanged (no write
    to its arguments, no random draw) is raced against torch's function
    (plancache.functional._race), eager calls only: an operator is called below
    autograd, where its backward cannot be timed (a compiled program's calls
    were raced as it was traced: plancache.torch)."""
    function, tensors = bound.function, bound.tensors
    devices = [str(getattr(getattr(t, "device", None), "type", None)) for t in tensors]
    if all(d == "cpu" for d in devices):
        raise InvalidRequest(
            f"{function}: {bound.names[0]} is on the CPU: plancache.functional runs CUDA tensors "
            "(call torch's function for CPU tensors)"
        )
    ops = _tensor_ops.ops()
    if ops.capturing():
        raise InvalidRequest(
            f"{function}: the first call of a geometry ({bound.describe()}) while a CUDA graph is being captured: "
            "its plans are fetched and loaded then, which capture forbids; "
            "call it once before capturing (torch's warm-up)"
        )
    # torch runs the call outside the handlers: a mistake raises torch's own
    # error, not one chained to why plancache was not asked.
    unserved: Unserved | None = None
    try:
        if needs_grad and rule is None:
            raise Unserved(f"autograd: {function} has no served backward (torch's function runs it)")
        if set(devices) != {"cuda"} or len({t.get_device() for t in tensors}) != 1:
            raise Unserved(f"the tensors are on more than one device ({bound.where()})")
        asked = request()
        if asked.inputs != bound.uids:
            raise RuntimeError(f"plancache.functional.{function}: its spec binds {asked.inputs}, its call {bound.uids}")
        backward = rule(asked) if needs_grad and rule is not None else None
    except Unserved as e:
        unserved = e
    if unserved is not None:
        return _run_fallback(bound, key, fallback, unserved.reason, "not_asked", transient=unserved.transient, op=op)
    device = int(tensors[0].get_device())
    # Shapes that vary at this call site with the same parameters: their family built ahead (frontdoors.families).
    evidence = evidence_of(tuple(zip(bound.names, tensors, strict=True)), asked.spec)
    failed: tuple[str, bool, bool, str] | None = None  # (reason, transient, logged already, reason class)
    stored_only = op is not None or STORED_ONLY.on
    try:
        with ops.on_device(device):  # a miss this node builds itself (the hedge) builds on the tensors' GPU
            plan = _plan(asked.spec, device, evidence, stored_only, bound.signature, backward)
            if backward is None:
                entry: Entry = served(asked, plan, device, key)
            else:
                pieces = _backward_pieces(bound.signature, backward, device, evidence, stored_only)
                entry = Differentiable(Served(asked, plan, device), backward, pieces)
        result = entry(tensors) if op is None else op.take(entry, tensors)
    except NotStored as e:  # quiet: what plancache.torch's first calls meet until the service's builds land
        log.debug("plancache.functional.%s: %s", function, e.message)
        failed = (NOT_STORED, True, True, outcomes.reason_of(e))
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
        reason, transient, quiet, reason_class = failed
        return _run_fallback(
            bound, key, fallback, reason, reason_class, transient=transient, quiet=quiet, spec=asked.spec, op=op
        )
    c = counts(function)
    if raced and op is None and RACE.enabled and _tensor_ops.available():
        race = _Race(function, bound.describe(), key, fallback, needs_grad, device)
        entry = race.settle(entry, tensors, result) if RACE_NOW.on else Racing(entry, key, race.settle)
    TABLE.put(key, entry)
    c.geometries += 1
    WATCH.seen(function, asked.spec, device, evidence)
    if backward is not None:
        for piece in backward.requests.values():
            WATCH.seen(piece.function, piece.spec, device, evidence.for_graph(piece.spec))
    served_as = outcomes.served_outcome(plan.source)
    outcomes.record(
        "functional",
        outcomes.target_of(plan.key),
        served_as,
        _node_type(bound.signature, asked.spec),
        reason="hedged" if served_as is outcomes.Outcome.LOCAL else "",
    )
    log.debug("plancache.functional.%s: plan %s (%s) serves %s", function, plan.key, plan.source, bound.describe())
    return result


class _Race:
    """A served geometry's race against torch's function (plancache.functional._race), run once: at the first
    call past RACE_AFTER_S (its Racing entry's), or at once for a traced call's race (RACE_NOW)."""

    __slots__ = ("described", "device", "fallback", "function", "key", "needs_grad")

    def __init__(
        self, function: str, described: str, key: Hashable, fallback: Callable[..., Any], needs_grad: bool, device: int
    ) -> None:
        self.function, self.described, self.key = function, described, key
        self.fallback, self.needs_grad, self.device = fallback, needs_grad, device

    def settle(self, entry: Entry, tensors: tuple[Any, ...], result: Any) -> Entry:
        """The entry that runs the geometry from now on: `entry` (the plan's), or torch's where it won; `result`:
        a call of `entry` on `tensors`, just made."""
        verdict = self._run(entry, tensors, result)
        if verdict is None:
            return entry
        if not verdict.torch_wins:
            KEPT.note(self.key, verdict)
            return entry
        c = counts(self.function)
        c.torch_geometries += 1
        c.reasons[TORCH_FASTER] = c.reasons.get(TORCH_FASTER, 0) + 1
        log.debug("plancache.functional.%s: torch runs %s: %s", self.function, self.described, verdict.describe())
        return TorchFaster(self.function, self.key, self.fallback, verdict)

    def _run(self, entry: Entry, tensors: tuple[Any, ...], result: Any) -> Verdict | None:
        """The race, or None where it failed (the plan kept)."""
        # The race's runs of the plans are not the program's calls: the counters (stats()) are put back after it.
        counted = [counts(name) for name in (self.function, f"{self.function}.backward")]
        before = [c.cudnn for c in counted]
        try:
            verdict = race(entry, self.fallback, tensors, self.device, self.needs_grad, result)
        except Exception as e:  # a race is an optimisation: the plan, which ran, stays
            _once(
                log,
                f"race|{self.function}|{type(e).__name__}",
                "plancache.functional.%s: the race against torch's function failed (%s: %s); the plan runs it",
                self.function,
                type(e).__name__,
                e,
            )
            return None
        finally:
            for c, cudnn in zip(counted, before, strict=True):
                c.cudnn = cudnn
        counted[0].raced += 1
        return verdict


def torch_faster_reason(call: Callable[[], Any]) -> str | None:
    """Run `call` (one call of one of the functions, eager, STORED_ONLY) and say why torch's function runs its
    geometry (faster in its race, plancache.functional._race; its plans not stored yet; not served), else None:
    plancache.torch asks it for a compiled call, at trace time. The geometry is the last this thread looked up in
    the table during the call (its own, or its bucket's)."""
    keys: list[Hashable] = []
    caller, plain = threading.get_ident(), TABLE.get

    def get(key: Hashable) -> Entry | None:
        if threading.get_ident() == caller:
            keys.append(key)
        return plain(key)

    TABLE.get = get  # type: ignore[method-assign]  # this instance's, for this call only
    RACE_NOW.on = True  # the geometry's race now, not once its calls have gone on for a while
    stored_only, STORED_ONLY.on = STORED_ONLY.on, True  # a plan not stored yet is not waited for as dynamo traces
    try:
        call()
    finally:
        RACE_NOW.on, STORED_ONLY.on = False, stored_only
        del TABLE.get
    entry = plain(keys[-1]) if keys else None
    if isinstance(entry, TorchFaster):
        return f"{entry.reason}: {entry.verdict.describe()}"
    # Left to torch for another reason (its plans not stored yet, the service down): the traced program is then
    # torch's for the call, as it would be without plancache, rather than an operator that runs torch's function.
    return entry.reason if isinstance(entry, Fallback) else None


def _plan(
    spec: GraphSpec, device: int, evidence: Evidence, stored_only: bool, signature: Signature, backward: Rule | None
) -> Any:
    """The forward's plan (STORED_ONLY: a stored one, else NotStored once every graph of the call, its backward's
    too, was asked for, so that the service builds them all for the next call)."""
    try:
        return SERVICE.compile(spec, device, ask_first=WATCH.asked_for(spec, evidence), stored_only=stored_only)
    except NotStored:
        if backward is not None:
            _backward_pieces(signature, backward, device, evidence, stored_only)
        raise


def _backward_pieces(
    signature: Signature, rule: Rule, device: int, evidence: Evidence, stored_only: bool = False
) -> dict[str, Any]:
    """Every backward graph's plan (asked first where its family was asked for, as the forward's);
    a refused optional one (a bias gradient's reduction) is torch's, its reason counted under
    "<function>.backward". `stored_only` (STORED_ONLY): NotStored once every graph was asked for."""
    function = signature.function
    pieces: dict[str, Any] = {}
    not_stored: NotStored | None = None
    torch_pieces: list[str] = []  # optional pieces not stored: torch's, once the call is served
    for name, request in rule.requests.items():
        try:
            ahead = WATCH.asked_for(request.spec, evidence.for_graph(request.spec))
            plan = SERVICE.compile(request.spec, device, ask_first=ahead, stored_only=stored_only)
            pieces[name] = Served(request, plan, device)
        except NotStored as e:  # the rest asked all the same: the service builds each for the next call
            if name in rule.optional:  # torch's piece (a bias gradient's reduction): the rest of the call served
                pieces[name] = rule.optional[name]
                torch_pieces.append(name)
                continue
            not_stored = not_stored or e
        except PlanCacheError as e:
            if name not in rule.optional or not isinstance(e, ABOUT_THE_GRAPH):
                raise
            reason = f"{name}: {describe(e)}"
            c = counts(f"{function}.backward")
            c.reasons[reason] = c.reasons.get(reason, 0) + 1
            _record_local(signature, request.spec, outcomes.reason_of(e), device)
            _once(
                log,
                f"{function}|{name}|{reason_key(e)}",
                "plancache.functional.%s: torch runs the backward's %s: %s",
                function,
                name,
                describe(e),
            )
            pieces[name] = rule.optional[name]
    if not_stored is not None:
        raise not_stored
    c = counts(f"{function}.backward")
    for name in torch_pieces:
        reason = f"{name}: {NOT_STORED}"
        c.reasons[reason] = c.reasons.get(reason, 0) + 1
    return pieces


def _run_fallback(
    bound: Bound,
    key: Hashable,
    fn: Callable[..., Any],
    reason: str,
    reason_class: str,
    *,
    transient: bool,
    quiet: bool = False,
    spec: GraphSpec | None = None,
    op: OpCall | None = None,
) -> Any:
    function, tensors = bound.function, bound.tensors
    if not _tensor_ops.available():
        raise InvalidRequest(f"{function}: {reason} (and torch, which would run it, is not installed)")
    entry = Fallback(function, key, fn, reason, transient)
    result = entry(tensors)  # torch's own error, for a call torch refuses, propagates from here
    TABLE.put(key, entry)
    c = counts(function)
    c.geometries += 1
    c.torch_geometries += 1
    c.reasons[reason] = c.reasons.get(reason, 0) + 1
    _record_local(bound.signature, spec, reason_class, _device_of(tensors))
    if not quiet:
        _once(
            log,
            f"{function}|{key!r}",
            "plancache.functional.%s: torch runs %s: %s",
            function,
            bound.describe(),
            reason,
        )
    return result if op is None else op.take(entry, tensors)


def _node_type(signature: Signature, spec: GraphSpec | None) -> str:
    if spec is not None:
        return outcome_labels.anchor_of_ops(n.op for n in spec.nodes)
    return signature.node_type


def _device_of(tensors: tuple[Any, ...]) -> int:
    try:
        return int(tensors[0].get_device())
    except Exception:
        return 0


def _record_local(signature: Signature, spec: GraphSpec | None, reason_class: str, device: int) -> None:
    """A graph torch runs, told to the service (plancache.transport.outcomes):
    its spec hash only where the operator opted in."""
    spec_hash = hash_normalized(normalize(spec)) if spec is not None and outcomes.reports_specs() else ""
    outcomes.record(
        "functional",
        SERVICE.known_target_id(device),
        outcomes.Outcome.LOCAL,
        _node_type(signature, spec),
        reason=reason_class,
        spec_hash=spec_hash,
    )


def row_layer(key: tuple[Any, ...], x: Any) -> tuple[Any, ...]:
    """A linear or norm geometry's layer: its key without the input's shape and strides, with the input's last
    dim (frontdoors.buckets.AUTO counts the row counts a layer meets)."""
    shape = x.shape
    return (key[0], shape[-1] if len(shape) else None, *key[3:])  # a 0-d input: torch's own error follows


def auto_padded(function: str, key: tuple[Any, ...], x: Any) -> tuple[Any, int] | None:
    """A call whose geometry (`key`) has no entry: `x` padded to its rows' auto bucket, and its rows
    (frontdoors.buckets.AUTO: decided at an earlier call of this geometry, or now by its layer's rows), or None."""
    return AUTO.pad_known(key, x) or AUTO.pad_rows(function, row_layer(key, x), x, key)


def at_bucket(key: tuple[Any, ...], padded_input: Any, tensors: tuple[Any, ...], first: Callable[[], Any]) -> Any:
    """A padded call at its bucket: the bucket geometry's entry (its key is the caller's with the padded input's
    shape and strides; the rest, dtype to options, is the same) run on the padded input and the call's other
    tensors, without keying the call again; `first()` where the bucket has no entry yet (its first call)."""
    entry = TABLE.get((key[0], padded_input.shape, padded_input.stride(), *key[3:]))
    return entry((padded_input, *tensors[1:])) if entry is not None else first()


def auto_checked(key: tuple[Any, ...], x: Any, result: Any) -> Any:
    """`result`, after a geometry's first call: a layer torch runs for good (float32, say) is never padded."""
    entry = TABLE.get(key)
    if isinstance(entry, Fallback) and entry.expires is None:
        AUTO.unserved(row_layer(key, x))
    return result

"""A score modifier (the SDPA family's `score_mod` / `score_mod_bprop`) as data.

The frontend takes Python code there: a callback that cuDNN's lowering calls
with the graph and the attention score tensor, and that adds pointwise ops
to transform the scores (softcapping, masks built from gen_index and
comparisons, ...). Code has no spec form, but what it does to the graph
does: `trace(callback)` calls it with a recording graph and records each op
it adds (its pointwise mode, its inputs: the score, an earlier op's result,
or a tensor of the program's graph by uid; its attributes, compute type and
the result's data type and name). `replay(subgraph, ...)` is a callback
that adds the same ops to the graph it is given: the worker lowers exactly
what the program's callback would have lowered. A callback that does
anything else (reads a tensor's dims, branches on them, calls a method
this recorder does not know) is refused with SpecError naming what.

A reference is ("score", 0), ("result", i) for the i-th recorded op, or
("uid", u) for a tensor of the graph (bound by the caller at execute, like
every graph input).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from plancache.errors import SpecError

Ref = tuple[str, int]
# What a recorded op's attribute may hold (plain values; enums by member name).
Plain = bool | int | float | str | None | tuple[Any, ...]


@dataclass(frozen=True)
class SubgraphOp:
    op: str  # a pointwise mode (the graph method's name)
    inputs: tuple[tuple[str, Ref], ...]  # (port, reference), in the method's port order
    attributes: tuple[tuple[str, Plain], ...] = ()
    compute_data_type: str | None = None
    data_type: str | None = None  # set_data_type on the result
    name: str = ""


@dataclass(frozen=True)
class Subgraph:
    ops: tuple[SubgraphOp, ...]
    result: Ref  # what the callback returns

    def uids(self) -> set[int]:
        """The graph tensors it reads."""
        return {ref[1] for op in self.ops for _, ref in op.inputs if ref[0] == "uid"} | (
            {self.result[1]} if self.result[0] == "uid" else set()
        )

    def to_plain(self, *, names: bool = True) -> dict[str, Any]:
        """The JSON form; without names, the canonical form's (names are labels)."""
        return {
            "ops": [
                {
                    "op": o.op,
                    "inputs": {port: _plain_ref(ref) for port, ref in o.inputs},
                    "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in o.attributes},
                    "compute_data_type": o.compute_data_type,
                    "data_type": o.data_type,
                    **({"name": o.name} if names and o.name else {}),
                }
                for o in self.ops
            ],
            "result": _plain_ref(self.result),
        }


def _plain_ref(ref: Ref) -> dict[str, Any]:
    return {"score": True} if ref[0] == "score" else {ref[0]: ref[1]}


def _ref(raw: Any, where: str) -> Ref:
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise SpecError(f'{where}: a reference is {{"score": true}}, {{"result": i}} or {{"uid": u}}, got {raw!r}')
    ((kind, value),) = raw.items()
    if kind == "score" and value is True:
        return ("score", 0)
    if kind in ("result", "uid") and isinstance(value, int) and not isinstance(value, bool):
        return (kind, value)
    raise SpecError(f'{where}: a reference is {{"score": true}}, {{"result": i}} or {{"uid": u}}, got {raw!r}')


def from_plain(raw: Any, where: str) -> Subgraph:
    """The JSON form back (structure checked here; ops, ports and values by validation)."""
    if not isinstance(raw, Mapping) or set(raw) != {"ops", "result"} or not isinstance(raw["ops"], list):
        raise SpecError(f'{where}: a score modifier is {{"ops": [...], "result": reference}}')
    ops = []
    for i, op in enumerate(raw["ops"]):
        at = f"{where} op {i}"
        if (
            not isinstance(op, Mapping)
            or not isinstance(op.get("op"), str)
            or not isinstance(op.get("inputs", {}), Mapping)
        ):
            raise SpecError(f'{at}: expected {{"op": name, "inputs": {{port: reference}}, ...}}')
        attributes = op.get("attributes", {})
        if not isinstance(attributes, Mapping):
            raise SpecError(f"{at}: attributes must be an object")
        ops.append(
            SubgraphOp(
                op=op["op"],
                inputs=tuple((str(p), _ref(r, f"{at} input {p!r}")) for p, r in op.get("inputs", {}).items()),
                attributes=tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in attributes.items()),
                compute_data_type=op.get("compute_data_type"),
                data_type=op.get("data_type"),
                name=str(op.get("name", "")),
            )
        )
    return Subgraph(tuple(ops), _ref(raw["result"], f"{where} result"))


# ---- tracing a program's callback ---------------------------------------------------------------------------


class _Traced:
    """A tensor the callback sees: the score or a recorded op's result."""

    def __init__(self, recorder: _Recorder, ref: Ref) -> None:
        self._recorder, self.ref = recorder, ref

    def _op(self) -> dict[str, Any]:
        if self.ref[0] != "result":
            raise SpecError(f"{self._recorder.where}: the callback sets an attribute of the score tensor itself")
        return self._recorder.ops[self.ref[1]]

    def set_data_type(self, data_type: Any) -> _Traced:
        self._op()["data_type"] = self._recorder.data_type(data_type)
        return self

    def set_name(self, name: str) -> _Traced:
        self._op()["name"] = str(name)
        return self

    def __getattr__(self, name: str) -> Any:
        raise SpecError(
            f"{self._recorder.where}: the callback uses {name!r} of a tensor, which plancache cannot record"
        )


class _Recorder:
    """The graph a callback is handed while it is traced."""

    def __init__(
        self,
        where: str,
        ports: Callable[[str], tuple[str, ...] | None],
        uid_of: Callable[[Any], int | None],
        data_type: Callable[[Any], str | None],
        plain: Callable[[Any], Plain],
    ) -> None:
        self.where, self._ports, self._uid_of, self.data_type, self._plain = where, ports, uid_of, data_type, plain
        self.ops: list[dict[str, Any]] = []

    def ref(self, value: Any, what: str) -> Ref:
        if isinstance(value, _Traced):
            return value.ref
        uid = self._uid_of(value)
        if uid is None:
            raise SpecError(
                f"{self.where}: the callback passes {what} = {type(value).__name__}, not a tensor of the graph"
            )
        return ("uid", uid)

    def __getattr__(self, op: str) -> Any:
        ports = self._ports(op)
        if ports is None:
            raise SpecError(
                f"{self.where}: the callback calls graph.{op}(), which plancache cannot record (pointwise ops only)"
            )

        def call(*args: Any, name: str = "", compute_data_type: Any = None, **kwargs: Any) -> _Traced:
            given = dict(zip(ports, args, strict=False))
            if len(args) > len(ports):
                raise SpecError(
                    f"{self.where}: graph.{op}() takes {len(ports)} tensors, the callback gives {len(args)}"
                )
            for port in ports[len(args) :]:
                if port in kwargs:
                    given[port] = kwargs.pop(port)
            inputs = tuple((port, self.ref(given[port], f"{op}({port}=...)")) for port in ports if port in given)
            attributes = tuple(sorted((k, self._plain(v)) for k, v in kwargs.items() if v is not None))
            self.ops.append(
                {
                    "op": op,
                    "inputs": inputs,
                    "attributes": attributes,
                    "compute_data_type": self.data_type(compute_data_type),
                    "data_type": None,
                    "name": str(name),
                }
            )
            return _Traced(self, ("result", len(self.ops) - 1))

        return call


def trace(
    callback: Callable[..., Any],
    where: str,
    *,
    ports: Callable[[str], tuple[str, ...] | None],
    uid_of: Callable[[Any], int | None],
    data_type: Callable[[Any], str | None],
    plain: Callable[[Any], Plain],
) -> Subgraph:
    """Record what `callback(graph, score)` adds to the graph (see the module docstring)."""
    recorder = _Recorder(where, ports, uid_of, data_type, plain)
    try:
        returned = callback(recorder, _Traced(recorder, ("score", 0)))
    except SpecError:
        raise
    except Exception as e:  # the callback did something a recording graph cannot answer
        raise SpecError(f"{where}: tracing the callback failed: {type(e).__name__}: {e}") from None
    result = recorder.ref(returned, "its result")
    ops = tuple(
        SubgraphOp(o["op"], o["inputs"], o["attributes"], o["compute_data_type"], o["data_type"], o["name"])
        for o in recorder.ops
    )
    return Subgraph(ops, result)


def replay(
    subgraph: Subgraph,
    tensors: Mapping[int, Any],
    cast: Callable[[str, str, Plain], Any],
    data_type: Callable[[str], Any],
) -> Callable[..., Any]:
    """A callback that adds `subgraph`'s ops to the graph it is given (the frontend's lowering
    calls it with cuDNN's graph)."""

    def callback(graph: Any, score: Any) -> Any:
        results: list[Any] = []

        def value(ref: Ref) -> Any:
            return score if ref[0] == "score" else results[ref[1]] if ref[0] == "result" else tensors[ref[1]]

        for op in subgraph.ops:
            kwargs = {port: value(ref) for port, ref in op.inputs}
            kwargs.update({k: cast(op.op, k, v) for k, v in op.attributes})
            if op.compute_data_type is not None:
                kwargs["compute_data_type"] = data_type(op.compute_data_type)
            out = getattr(graph, op.op)(**kwargs, **({"name": op.name} if op.name else {}))
            if op.data_type is not None:
                out.set_data_type(data_type(op.data_type))
            results.append(out)
        return value(subgraph.result)

    callback.plancache_subgraph = subgraph  # type: ignore[attr-defined]  # what it replays (compare.py reads it back)
    return callback


def finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)

"""Property-based tests over the spec parser, validator and canonical hash:
thousands of generated specs, valid and malformed. Whatever comes in, the
answer is a normalized spec or a SpecError; never another exception."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plancache import GraphSpec, SpecError
from plancache.errors import PlanCacheError
from plancache.graphspec.canonical import hash_normalized
from plancache.graphspec.validation import normalize

UNARY = ["relu", "gelu", "tanh", "sigmoid", "swish", "exp", "abs", "neg"]
BINARY = ["add", "sub", "mul", "div"]
DTYPES = ["half", "bfloat16", "float"]


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A pointwise chain, optionally behind a batched matmul, as JSON data."""
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(2, 4))
    dims = draw(st.lists(st.integers(1, 64), min_size=rank, max_size=rank))
    tensors: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    uid = iter(range(1, 10_000))

    def tensor(dim: list[int], **extra: Any) -> int:
        t = {"uid": next(uid), "name": f"t{len(tensors)}", "dim": dim, **extra}
        tensors.append(t)
        return int(t["uid"])

    if draw(st.booleans()):
        k = draw(st.integers(1, 64))
        a = tensor([*dims[:-1], k])
        b = tensor([*dims[:-2], k, dims[-1]])
        current = tensor([], is_virtual=True)
        nodes.append({"op": "matmul", "inputs": {"A": a, "B": b}, "outputs": {"C": current}})
    else:
        current = tensor(dims)
    for _ in range(draw(st.integers(1, 5))):
        out = tensor([], is_virtual=True)
        if draw(st.booleans()):
            nodes.append({"op": draw(st.sampled_from(UNARY)), "inputs": {"input": current}, "outputs": {"OUT_0": out}})
        else:
            other = tensor(dims)
            nodes.append(
                {"op": draw(st.sampled_from(BINARY)), "inputs": {"a": current, "b": other}, "outputs": {"OUT_0": out}}
            )
        current = out
    tensors[[t["uid"] for t in tensors].index(current)] = {"uid": current, "name": "out", "is_output": True}
    return {"io_data_type": dtype, "tensors": tensors, "nodes": nodes}


def _shuffle(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffle(v, rng) for k, v in items}
    if isinstance(value, list):
        items = [_shuffle(v, rng) for v in value]
        if items and isinstance(items[0], dict) and "uid" in items[0]:
            rng.shuffle(items)
        return items
    return value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=30,
)


@st.composite
def mutated_specs(draw: st.DrawFn) -> Any:
    """A valid spec with one part replaced by an arbitrary JSON value."""
    spec = draw(valid_specs())
    path: list[Any] = []
    node: Any = spec
    while isinstance(node, dict | list) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node))) if isinstance(node, dict) else draw(st.integers(0, len(node) - 1))
        path.append(key)
        node = node[key]
    replacement = draw(json_values)
    if not path:
        return replacement
    parent: Any = spec
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = replacement
    return spec


def _parse_and_normalize(data: Any) -> GraphSpec | None:
    try:
        return normalize(GraphSpec.from_json(json.dumps(data, allow_nan=True)))
    except SpecError:
        return None


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs(), st.randoms(use_true_random=False))
def test_valid_specs_normalize_and_hash_stably(data: dict[str, Any], rng: random.Random) -> None:
    normalized = _parse_and_normalize(data)
    assert normalized is not None, data
    digest = hash_normalized(normalized)
    assert hash_normalized(normalize(normalized)) == digest  # idempotent
    assert hash_normalized(normalize(GraphSpec.from_json(normalized.to_json()))) == digest  # round trip
    shuffled = _shuffle(data, rng)
    for t in shuffled["tensors"]:
        t["name"] = f"renamed-{rng.random()}"
    assert hash_normalized(normalize(GraphSpec.from_json(json.dumps(shuffled)))) == digest


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_malformed_specs_are_refused_with_a_spec_error_only(data: Any) -> None:
    try:
        normalize(GraphSpec.from_json(json.dumps(data, allow_nan=True)))
    except SpecError as e:
        assert e.message  # names what is wrong
    except PlanCacheError as e:  # pragma: no cover - the assertion below explains
        raise AssertionError(f"{type(e).__name__} instead of SpecError: {e}") from e


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_arbitrary_text_is_refused_with_a_spec_error(raw: bytes) -> None:
    try:
        GraphSpec.from_json(raw.decode("utf-8", errors="replace"))
    except SpecError:
        pass

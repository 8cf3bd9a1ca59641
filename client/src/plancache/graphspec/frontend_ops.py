"""The frontend's graph API as catalog entries: frontend_ops.json (recorded
from the installed frontend by scripts/frontend-catalog.py, see
scripts/frontend_api.py) read into port, attribute and output descriptions.

plancache.graphspec.ops builds the catalog from these: ops it has written rules
for (matmul, convolutions, SDPA, the classic norms, pointwise) take their
extra ports and attributes from here; every other op is described by this
data alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

RECORDED = "frontend_ops.json"
# The frontend's dropout=(...) argument, flattened into ports and attributes:
# Philox (probability, seed tensor, offset tensor) or a mask (mask tensor, scale tensor).
DROPOUT_PHILOX = ("dropout_seed", "dropout_offset")
DROPOUT_MASK = ("dropout_mask", "dropout_scale")


@dataclass(frozen=True)
class FrontendOp:
    """One frontend graph method, as recorded."""

    name: str
    node_type: str
    frontend_family: str  # matmul, pointwise, structured, captured
    required_inputs: tuple[str, ...]
    optional_inputs: tuple[str, ...]
    ports: tuple[str, ...]  # every input port, in the frontend's order
    list_inputs: tuple[str, ...]
    params: Mapping[str, Mapping[str, Any]]
    outputs: tuple[str, ...]
    given_outputs: tuple[str, ...]
    takes_compute_type: bool
    pushes_output_dims: bool
    lowering: str
    positional: tuple[str, ...] = ()
    presence: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    output_dims: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    dtype_like: Mapping[str, str] = field(default_factory=dict)

    @property
    def tensor_params(self) -> tuple[str, ...]:
        """Attributes the frontend also takes as a tensor (attn_scale): then a port of that name."""
        return tuple(name for name, p in self.params.items() if p.get("or_tensor"))

    @property
    def callables(self) -> tuple[str, ...]:
        """Arguments that take Python code (score_mod): no spec form."""
        return tuple(name for name, p in self.params.items() if p.get("kind") == "callable")

    @property
    def dropout(self) -> bool:
        return any(p.get("kind") == "dropout" for p in self.params.values())


@dataclass(frozen=True)
class Recorded:
    frontend_version: str
    node_types: tuple[str, ...]
    without_builder: tuple[str, ...]
    enums: Mapping[str, tuple[str, ...]]
    data_types: tuple[str, ...]
    tensor_fields: tuple[str, ...]
    graph_arguments: tuple[str, ...]
    ops: Mapping[str, FrontendOp]


@cache
def recorded() -> Recorded:
    data = json.loads(resources.files("plancache.graphspec").joinpath(RECORDED).read_text())
    return parse(data)


def parse(data: Mapping[str, Any]) -> Recorded:
    return Recorded(
        frontend_version=str(data["frontend_version"]),
        node_types=tuple(data["node_types"]),
        without_builder=tuple(data["node_types_without_builder"]),
        enums={name: tuple(members) for name, members in data["enums"].items()},
        data_types=tuple(data["data_types"]),
        tensor_fields=tuple(data["tensor_fields"]),
        graph_arguments=tuple(data["graph_arguments"]),
        ops={name: _op(name, raw) for name, raw in data["ops"].items()},
    )


def _op(name: str, raw: Mapping[str, Any]) -> FrontendOp:
    inputs = raw["inputs"]
    return FrontendOp(
        name=name,
        node_type=str(raw["node_type"]),
        frontend_family=str(raw["family"]),
        required_inputs=tuple(p["port"] for p in inputs if p["required"]),
        optional_inputs=tuple(p["port"] for p in inputs if not p["required"]),
        ports=tuple(p["port"] for p in inputs),
        list_inputs=tuple(raw.get("list_inputs", ())),
        params={k: dict(v) for k, v in raw["params"].items()},
        outputs=tuple(raw["outputs"]),
        given_outputs=tuple(raw.get("given_outputs", ())),
        takes_compute_type=bool(raw["takes_compute_type"]),
        pushes_output_dims=bool(raw.get("pushes_output_dims", False)),
        lowering=str(raw.get("lowering", "backend")),
        positional=tuple(raw.get("positional", ())),
        presence=dict(raw.get("output_presence", {})),
        output_dims=dict(raw.get("output_dims", {})),
        dtype_like=dict(raw.get("output_dtype_like", {})),
    )


_FAMILY_PREFIXES = (
    ("SDPA_BWD", "sdpa_backward"),
    ("SDPA", "sdpa"),
    ("CONV", "conv"),
    ("ROPE", "rope"),
    ("MOE", "moe"),
    ("BLOCK_SCALE", "block_scale"),
    ("GDN", "linear_attention"),
    ("GDP", "linear_attention"),
    ("KDA", "linear_attention"),
    ("MAMBA2", "linear_attention"),
)


def family_of(node_type: str) -> str:
    """The op family statistics count a node type under (the classic catalog's names)."""
    for prefix, family in _FAMILY_PREFIXES:
        if node_type.startswith(prefix):
            return family
    if "NORM" in node_type:
        return "norm"
    if node_type in ("REDUCTION", "GENSTATS"):
        return "reduction"
    return node_type.lower()

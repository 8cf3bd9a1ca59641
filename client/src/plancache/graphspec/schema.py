"""What the op catalog is made of: an op's ports, attributes and rules
(OpSchema), and the helpers the classic shape rules share.

plancache.graphspec.ops assembles the catalog from these (classic_ops.py and
attention.py hold the rules plancache writes itself; frontend_ops.py the
frontend's own description of every other op).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plancache.graphspec.subgraph import Subgraph

Dims = tuple[int, ...]
SliceValue = tuple[int | None, int | None, int | None]
AttrValue = int | float | bool | str | tuple[int, ...] | tuple[SliceValue, ...] | Subgraph


class ShapeError(ValueError):
    """A shape rule failed; the validator prefixes the node's name."""


class AttrKind(enum.Enum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    INT_LIST = "int list"
    ENUM = "enum"
    STRING = "string"
    SLICES = "slices"
    # A bool or number passed on as given (arguments the frontend types `object`).
    SCALAR = "number or bool"
    # Ops a callback adds to the graph (score_mod), recorded (plancache.graphspec.subgraph).
    SUBGRAPH = "score modifier"


@dataclass(frozen=True)
class AttrSchema:
    kind: AttrKind
    choices: tuple[str, ...] = ()
    required: bool = False
    default: AttrValue | None = None
    # The cudnn enum whose member names `choices` are (for ENUM).
    enum_type: str | None = None


# infer(input dims by port, declared output dims by port, attributes)
#   -> output dims by port; raises ShapeError.
InferFn = Callable[[Mapping[str, Dims], Mapping[str, Dims | None], Mapping[str, AttrValue]], dict[str, Dims]]
# outputs_for(attributes, the input ports given) -> the output ports the node has.
OutputsFn = Callable[[Mapping[str, AttrValue], frozenset[str]], tuple[str, ...]]
CompleteFn = Callable[[Mapping[str, Dims], dict[str, AttrValue]], None]


@dataclass(frozen=True)
class OpSchema:
    name: str
    family: str
    inputs: tuple[str, ...]
    optional_inputs: tuple[str, ...]
    outputs_for: OutputsFn
    all_outputs: tuple[str, ...]
    attributes: Mapping[str, AttrSchema]
    infer: InferFn
    # Fills attribute defaults that depend on input ranks (conv padding ...).
    complete: CompleteFn | None = None
    # Whether the frontend method takes compute_data_type.
    takes_compute_type: bool = True
    # Ports whose tensor values must be integers in [1, bound] for the graph
    # to be meaningful: port -> (input port, axis) giving the bound.
    integer_bounds: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    # Ports holding indices into another input: values in [0, bound) (page tables).
    index_bounds: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    # Other ports that need integer tensors (dropout's seed and offset).
    integer_inputs: tuple[str, ...] = ()
    # Outputs the caller asks for by handing the op a tensor (sdpa_backward's
    # dBias=, as in the frontend); never produced otherwise.
    optional_outputs: tuple[str, ...] = ()
    # Ports whose tensors may be ragged (packed variable-length sequences).
    ragged_ports: tuple[str, ...] = ()
    # Attribute spellings turned into the catalog's before defaults are
    # filled (sdpa's is_inference into generate_stats).
    prepare: Callable[[dict[str, AttrValue]], None] | None = None
    # ---- from the frontend's own description (plancache.graphspec.frontend_ops) ----
    node_type: str = ""
    frontend_family: str = ""  # matmul, pointwise, structured, captured
    # No rules of plancache's: results keep the dims and strides the program set.
    derived: bool = False
    # Ports taking a list of tensors, written "<port>_0", "<port>_1", ...
    list_inputs: tuple[str, ...] = ()
    # The captured (SDPA family) methods' positional tensor arguments.
    positional: tuple[str, ...] = ()
    # The input ports in the frontend method's order (positional arguments of GraphSpec.node).
    port_order: tuple[str, ...] = ()
    # The frontend pushes its IR's dims of every result to cuDNN (else only those set).
    pushes_output_dims: bool = False
    # The SDPA family pushes its IR's strides of every result too.
    pushes_output_strides: bool = False
    output_rules: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Which outputs exist, as data (plancache.graphspec.rules; the published catalog): outputs_for's rule.
    output_presence: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    dtype_like: Mapping[str, str] = field(default_factory=dict)
    lowering: str = "backend"  # "python": only the frontend's python engines build it
    # Arguments that take Python code (score_mod): no spec form.
    callables: tuple[str, ...] = ()
    # Attributes the frontend also takes as a tensor (attn_scale), then a port of that name.
    tensor_attributes: tuple[str, ...] = ()

    def list_port(self, port: str) -> str | None:
        """The list argument a port like "inputs_2" belongs to."""
        for name in self.list_inputs:
            prefix = f"{name}_"
            if port.startswith(prefix) and port[len(prefix) :].isdigit():
                return name
        return None


def fixed(*ports: str) -> OutputsFn:
    return lambda _attrs, _ports: ports


def need_rank(port: str, dims: Dims, rank: int | None = None, at_least: int | None = None) -> None:
    if rank is not None and len(dims) != rank:
        raise ShapeError(f"input {port!r} must have rank {rank}, got dims {list(dims)}")
    if at_least is not None and len(dims) < at_least:
        raise ShapeError(f"input {port!r} must have rank >= {at_least}, got dims {list(dims)}")


def declared_or(declared: Dims | None, inferred: Dims, port: str) -> Dims:
    if declared is not None and tuple(declared) != tuple(inferred):
        raise ShapeError(f"output {port!r} declared with dims {list(declared)} but the op produces {list(inferred)}")
    return inferred


def broadcast(shapes: Sequence[tuple[str, Dims]]) -> Dims:
    """cuDNN pointwise broadcasting: equal ranks, each dim equal or 1."""
    (first_port, first), *rest = shapes
    out = list(first)
    for port, dims in rest:
        if len(dims) != len(out):
            raise ShapeError(
                f"inputs {first_port!r} {list(first)} and {port!r} {list(dims)} have different ranks"
                " (pointwise inputs broadcast over dims of size 1 but must share a rank)"
            )
        for i, (a, b) in enumerate(zip(out, dims, strict=True)):
            if a != b and 1 not in (a, b):
                raise ShapeError(
                    f"inputs {first_port!r} {list(first)} and {port!r} {list(dims)} do not broadcast at axis {i}"
                )
            out[i] = max(a, b)
    return tuple(out)

"""GraphSpec: a cuDNN graph described as data, built the way the frontend is.

    g = GraphSpec(io_data_type="half", compute_data_type="float")
    a = g.tensor(name="A", dim=[8, 256, 512], uid=1)
    b = g.tensor(name="B", dim=[8, 512, 256], uid=2)
    c = g.matmul(a, b)
    c.set_output(True).set_uid(3)

Nodes hold the Tensor objects themselves, so `set_uid` after the fact is
safe; uids are resolved when the spec is serialized. Tensors left without a
uid get the smallest free ones, in creation order, so the same building code
always yields the same spec (and the same plan key).

Validation, defaults and shape inference live in plancache.graphspec.validation; the
JSON and proto forms in plancache.graphspec.spec_io.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plancache import dtypes
from plancache.errors import SpecError
from plancache.graphspec.ops import CATALOG, AttrValue, OpSchema
from plancache.graphspec.suggest import did_you_mean, unknown_op


def shown(text: str, limit: int = 64) -> str:
    """A caller's name as error messages quote it: cut, so that a hostile
    name cannot bury the message (or fill memory) with itself."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


@dataclass(eq=False)
class Tensor:
    """One tensor of a graph; also the handle the builder returns."""

    uid: int | None = None
    name: str = ""
    dim: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    data_type: str | None = None
    is_virtual: bool = False
    is_pass_by_value: bool = False
    is_output: bool = False
    scalar_value: float | None = None
    # A ragged (packed, variable-length) tensor's offsets: a graph input of
    # dims [dim[0] + 1, 1, 1, 1] giving each batch's start, in elements.
    ragged_offset: Tensor | None = None
    # The frontend tensor's other attributes (each at its default unless the
    # program set it): cudnn.tensor_reordering name, the ragged offsets' unit,
    # the values' alignment promise.
    reordering_type: str | None = None
    ragged_offset_multiplier: int = 1
    alignment_value: int = 1
    # A scalar held in the graph (the frontend's tensor_scalar(value, scalar_type)):
    # its value (an int or a float, as the program gave it) and the
    # cudnn.scalar_type name. Never bound at execution.
    constant: int | float | None = None
    scalar_type: str | None = None
    # Dims an op's shape rule gives a result the spec leaves without dims
    # (normalize fills it; never part of the canonical form): what later
    # nodes' checks read. See plancache.graphspec.validation.
    inferred_dim: tuple[int, ...] = ()

    # Fluent setters mirror cudnn's Tensor so frontend code ports line by line.
    def set_uid(self, uid: int) -> Tensor:
        self.uid = uid
        return self

    def set_name(self, name: str) -> Tensor:
        self.name = name
        return self

    def set_dim(self, dim: Sequence[int]) -> Tensor:
        self.dim = tuple(dim)
        return self

    def set_stride(self, stride: Sequence[int]) -> Tensor:
        self.stride = tuple(stride)
        return self

    def set_data_type(self, data_type: str) -> Tensor:
        self.data_type = dtypes.normalize(data_type, f"tensor {self.name or self.uid}")
        return self

    def set_ragged_offset(self, offsets: Tensor) -> Tensor:
        """Make this a ragged tensor (packed THD attention inputs and outputs):
        `offsets` holds each batch's start in the packed buffer, in elements."""
        self.ragged_offset = offsets
        return self

    def set_output(self, is_output: bool = True) -> Tensor:
        """Make a node's result a graph output the caller binds at execution."""
        self.is_output = is_output
        self.is_virtual = not is_output
        return self

    def set_reordering_type(self, reordering_type: str) -> Tensor:
        self.reordering_type = reordering_type
        return self

    def set_ragged_offset_multiplier(self, multiplier: int) -> Tensor:
        self.ragged_offset_multiplier = multiplier
        return self

    def set_alignment_value(self, value: int) -> Tensor:
        self.alignment_value = value
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        """Its dims, or those its op's rule gives it when the spec leaves them out."""
        return self.dim or self.inferred_dim

    def label(self) -> str:
        """How error messages name this tensor."""
        name = shown(self.name)
        if self.name and self.uid is not None:
            return f"tensor {name!r} (uid {self.uid})"
        return f"tensor {name!r}" if self.name else f"tensor uid {self.uid}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    name: str = ""
    compute_data_type: str | None = None

    def label(self, index: int) -> str:
        return f"node {index} ({shown(self.name or self.op)})"


_TORCH_DTYPES = {
    "torch.float16": "half",
    "torch.bfloat16": "bfloat16",
    "torch.float32": "float",
    "torch.float64": "double",
    "torch.int8": "int8",
    "torch.int32": "int32",
    "torch.int64": "int64",
    "torch.uint8": "uint8",
    "torch.bool": "boolean",
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.float8_e5m2": "fp8_e5m2",
    "torch.float8_e8m0fnu": "fp8_e8m0",
    "torch.float4_e2m1fn_x2": "fp4_e2m1",
}


@dataclass(eq=False)
class GraphSpec:
    """A cuDNN graph as data: what Compile takes and what the plan key hashes."""

    io_data_type: str | None = None
    intermediate_data_type: str | None = "float"
    compute_data_type: str | None = "float"
    name: str = ""
    tensors: list[Tensor] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    # The frontend graph's constructor arguments that shape the plan (None /
    # False: not given). See GRAPH_ARGUMENTS.
    sm_count: int | None = None
    sm_version: int | None = None
    is_dynamic_shape_enabled: bool = False
    is_override_shape_enabled: bool = False
    kernel_cache: bool = False
    cuda_graph_retention: str | None = None
    is_cuda_graph_replay_expected: bool = False

    # ---- tensors -------------------------------------------------------

    def tensor(
        self,
        dim: Sequence[int],
        stride: Sequence[int] | None = None,
        data_type: str | None = None,
        *,
        name: str = "",
        uid: int | None = None,
        is_pass_by_value: bool = False,
        scalar_value: float | None = None,
        ragged_offset: Tensor | None = None,
    ) -> Tensor:
        """A graph input. Strides default to contiguous (row-major)."""
        t = Tensor(
            uid=uid,
            name=name,
            dim=tuple(dim),
            stride=tuple(stride or ()),
            data_type=dtypes.normalize(data_type, f"tensor {name or uid}") if data_type else None,
            is_pass_by_value=is_pass_by_value,
            scalar_value=scalar_value,
            ragged_offset=ragged_offset,
        )
        self.tensors.append(t)
        return t

    def tensor_scalar(
        self, value: int | float, scalar_type: str = "COMPILE_TIME_CONST", *, name: str = "", uid: int | None = None
    ) -> Tensor:
        """A scalar held in the graph itself (the frontend's tensor_scalar): never bound at execution."""
        t = self.tensor([1, 1, 1, 1], [1, 1, 1, 1], None, name=name, uid=uid, is_pass_by_value=True)
        t.constant, t.scalar_type = value, scalar_type
        return t

    def scalar(self, value: float, data_type: str = "float", *, name: str = "", uid: int | None = None) -> Tensor:
        """A pass-by-value host scalar (a norm's epsilon) with a default value."""
        return self.tensor(
            [1, 1, 1, 1], [1, 1, 1, 1], data_type, name=name, uid=uid, is_pass_by_value=True, scalar_value=value
        )

    def tensor_like(self, template: Any, *, name: str = "", uid: int | None = None) -> Tensor:
        """A graph input shaped like a torch tensor (dims, strides, dtype).

        Like the frontend's tensor_like, a CPU tensor becomes pass-by-value.
        """
        dtype = _TORCH_DTYPES.get(str(template.dtype))
        if dtype is None:
            raise SpecError(f"tensor_like: unsupported torch dtype {template.dtype}")
        on_host = str(getattr(template, "device", "cuda")).startswith("cpu")
        return self.tensor(
            list(template.shape), list(template.stride()), dtype, name=name, uid=uid, is_pass_by_value=on_host
        )

    # ---- nodes -----------------------------------------------------------

    def node(
        self, op: str, *args: Tensor, name: str = "", compute_data_type: str | None = None, **kwargs: Any
    ) -> list[Tensor | None]:
        """Add any catalog op. Tensors go to ports (positionally in the
        frontend's order, or by keyword; a list of tensors to a list port such
        as concatenate's `inputs`); everything else is an attribute (a slice
        op's `slices` may be Python slice objects). Returns every output port
        in the frontend's order, None where the inputs and attributes say the
        op does not produce it (e.g. sdpa's Stats)."""
        schema = _schema(op, f"node {len(self.nodes)}")
        ports = schema.port_order or (schema.inputs + schema.optional_inputs)
        if len(args) > len(ports):
            raise SpecError(f"{op}() takes at most {len(ports)} tensors {ports}, got {len(args)}")
        inputs: dict[str, Tensor] = dict(zip(ports, args, strict=False))
        attributes: dict[str, AttrValue] = {}
        given_outputs: dict[str, Tensor] = {}
        _flatten_dropout(op, kwargs)
        for key, value in kwargs.items():
            if isinstance(value, Tensor) and key in schema.optional_outputs:
                given_outputs[key] = value.set_output(True)  # the frontend's dBias=: a tensor the op writes
            elif isinstance(value, Tensor):
                inputs[key] = value
            elif key in schema.list_inputs and isinstance(value, list | tuple):
                inputs.update({f"{key}_{i}": t for i, t in enumerate(value)})
            elif isinstance(value, list | tuple) and value and all(isinstance(v, slice) for v in value):
                attributes[key] = tuple((v.start, v.stop, v.step) for v in value)
            elif value is not None:
                attributes[key] = tuple(value) if isinstance(value, list | tuple) else value
        node_name = name or f"{op}_{len(self.nodes)}"
        produced = set(schema.outputs_for(attributes, frozenset(inputs)))
        outputs = {port: self._intermediate(f"{node_name}::{port}") for port in schema.all_outputs if port in produced}
        outputs.update(given_outputs)
        self.nodes.append(
            Node(
                op=op,
                inputs=inputs,
                outputs=outputs,
                attributes=attributes,
                name=node_name,
                compute_data_type=dtypes.normalize(compute_data_type, node_name) if compute_data_type else None,
            )
        )
        return [outputs.get(port) for port in schema.all_outputs]

    def _intermediate(self, name: str) -> Tensor:
        t = Tensor(name=name, is_virtual=True)
        self.tensors.append(t)
        return t

    def _single(self, op: str, *args: Tensor, **kwargs: Any) -> Tensor:
        (out,) = self.node(op, *args, **kwargs)
        assert out is not None
        return out

    def matmul(self, A: Tensor, B: Tensor, **kwargs: Any) -> Tensor:
        return self._single("matmul", A, B, **kwargs)

    def conv_fprop(self, image: Tensor, weight: Tensor, **kwargs: Any) -> Tensor:
        return self._single("conv_fprop", image, weight, **kwargs)

    def conv_dgrad(self, loss: Tensor, filter: Tensor, **kwargs: Any) -> Tensor:
        return self._single("conv_dgrad", loss, filter, **kwargs)

    def conv_wgrad(self, image: Tensor, loss: Tensor, **kwargs: Any) -> Tensor:
        return self._single("conv_wgrad", image, loss, **kwargs)

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> list[Tensor | None]:
        """Returns [O, Stats]; Stats is None unless generate_stats=True."""
        return self.node("sdpa", q, k, v, **kwargs)

    def sdpa_fp8(self, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> list[Tensor | None]:
        """FP8 attention (scales and descales by keyword): returns [O, Stats, Amax_S, Amax_O];
        Stats is None unless generate_stats=True."""
        return self.node("sdpa_fp8", q, k, v, **kwargs)

    def sdpa_backward(
        self, q: Tensor, k: Tensor, v: Tensor, o: Tensor, dO: Tensor, stats: Tensor, **kwargs: Any
    ) -> list[Tensor | None]:
        """Returns [dQ, dK, dV]. As in the frontend, a bias gradient is asked
        for with dBias=<a tensor made with .tensor()>, which the op writes."""
        return self.node("sdpa_backward", q, k, v, o, dO, stats, **kwargs)

    def layernorm(
        self, input: Tensor, scale: Tensor, bias: Tensor, epsilon: Tensor, **kwargs: Any
    ) -> list[Tensor | None]:
        """Returns [Y, mean, inv_var]; the stats only in the TRAINING phase."""
        return self.node("layernorm", input, scale, bias, epsilon, **kwargs)

    def rmsnorm(
        self, input: Tensor, scale: Tensor, epsilon: Tensor, bias: Tensor | None = None, **kwargs: Any
    ) -> list[Tensor | None]:
        """Returns [Y, inv_var]; inv_var only in the TRAINING phase."""
        return self.node("rmsnorm", input=input, scale=scale, epsilon=epsilon, bias=bias, **kwargs)

    def batchnorm_inference(
        self, input: Tensor, mean: Tensor, inv_variance: Tensor, scale: Tensor, bias: Tensor, **kwargs: Any
    ) -> Tensor:
        return self._single("batchnorm_inference", input, mean, inv_variance, scale, bias, **kwargs)

    def reduction(self, input: Tensor, mode: str, **kwargs: Any) -> Tensor:
        """The output's dims must be set (1 on each reduced axis) before compiling."""
        return self._single("reduction", input, mode=mode, **kwargs)

    def pointwise(self, op: str, *inputs: Tensor, **kwargs: Any) -> Tensor:
        return self._single(op, *inputs, **kwargs)

    def __getattr__(self, op: str) -> Any:
        # Every other catalog op (add, relu, gelu, bias, ...) under its frontend name.
        if op in CATALOG:
            return lambda *args, **kwargs: self._single(op, *args, **kwargs)
        if op.startswith("_"):  # copy, pickle and hasattr probe these: no suggestion to compute
            raise AttributeError(op)
        raise AttributeError(f"GraphSpec has no method or op {op!r}{did_you_mean(op, (*CATALOG, *_METHODS))}")

    # ---- whole-spec helpers -----------------------------------------------

    def assign_uids(self) -> None:
        """Give tensors without a uid the smallest free ones, in creation order."""
        taken = {t.uid for t in self.tensors if t.uid is not None}
        candidate = 1
        for t in self.tensors:
            if t.uid is None:
                while candidate in taken:
                    candidate += 1
                t.uid = candidate
                taken.add(candidate)

    # The graph's forms and its hash live in modules above this one (they
    # build and read GraphSpecs); plancache.graphspec installs them here when it is
    # imported, which it always is first: no import runs back down to them.

    def spec_hash(self) -> str:
        """sha256 of the canonical form (see plancache.graphspec.canonical)."""
        return CODECS.spec_hash(self)

    def to_json(self, indent: int | None = 2) -> str:
        return CODECS.to_json(self, indent)

    @classmethod
    def from_pygraph(cls, graph: Any) -> GraphSpec:
        """Capture an existing cuDNN frontend graph (see plancache.graphspec.interop)."""
        return CODECS.from_pygraph(graph)

    @classmethod
    def from_json(cls, text: str) -> GraphSpec:
        return CODECS.from_json(text)

    @classmethod
    def from_dict(cls, data: Any) -> GraphSpec:
        """The spec of a JSON form already parsed (json.load's dict), checked as from_json checks it."""
        return CODECS.from_dict(data)

    def tensor_by_uid(self) -> dict[int, Tensor]:
        return {t.uid: t for t in self.tensors if t.uid is not None}


# GraphSpec's own methods, suggested beside the catalog's ops for a name it has neither of.
_METHODS = tuple(name for name in vars(GraphSpec) if not name.startswith("_"))


class Codecs:
    """What GraphSpec's convenience methods call: the canonical hash, the JSON
    form and the frontend capture, installed by plancache.graphspec."""

    spec_hash: Callable[[GraphSpec], str]
    to_json: Callable[[GraphSpec, int | None], str]
    from_json: Callable[[str], GraphSpec]
    from_dict: Callable[[Any], GraphSpec]
    from_pygraph: Callable[[Any], GraphSpec]


CODECS = Codecs()


def _flatten_dropout(op: str, kwargs: dict[str, Any]) -> None:
    """The frontend's dropout=(probability, seed, offset) or (mask, scale) tuple as the catalog's
    ports and attribute."""
    dropout = kwargs.pop("dropout", None)
    if dropout is None:
        return
    if (
        isinstance(dropout, tuple | list)
        and len(dropout) == 3
        and isinstance(dropout[1], Tensor)
        and isinstance(dropout[2], Tensor)
    ):
        kwargs.update(dropout_probability=dropout[0], dropout_seed=dropout[1], dropout_offset=dropout[2])
    elif isinstance(dropout, tuple | list) and len(dropout) == 2 and all(isinstance(d, Tensor) for d in dropout):
        kwargs.update(dropout_mask=dropout[0], dropout_scale=dropout[1])
    else:
        raise SpecError(
            f"{op}(): dropout must be (probability, seed tensor, offset tensor) or (mask tensor, scale tensor)"
        )


def _schema(op: str, where: str) -> OpSchema:
    schema = CATALOG.get(op)
    if schema is None:
        raise SpecError(f"{where}: {unknown_op(op, CATALOG)}")
    return schema

"""The op catalog: every cuDNN frontend graph method a spec may use.

One entry per method of the installed frontend's graph API, as the frontend
itself describes it (plancache.graphspec.frontend_ops, recorded from its code by
scripts/frontend-catalog.py). Port names are the method's keyword names
(`g.matmul(A=..., B=...)`, `g.sdpa(q=..., k=..., v=...)`) and output ports
are the names the frontend gives the returned tensors, so a spec reads like
the frontend code it replaces and the compiler can call the method by name.

The classic ops (matmul, convolutions, the SDPA forward, FP8 forward and
backward, layernorm, rmsnorm, batchnorm_inference, reduction and every
pointwise mode) have shape and layout rules of plancache's (classic_ops.py,
attention.py): a spec with a rank or shape mismatch is refused before
anything is allocated on a GPU, and their results' dims and strides are
written into the normal form. Their other ports and attributes (the SDPA's
diagonal bounds, score outputs, sink tokens ...) come from the frontend's
description. Every other op is that description alone (`derived`): its
results keep the dims and strides the program set, as the frontend lowers
them, and cuDNN infers the rest on the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from plancache.graphspec import rules
from plancache.graphspec.attention import attention_ops
from plancache.graphspec.classic_ops import classic_ops
from plancache.graphspec.frontend_ops import DROPOUT_MASK, DROPOUT_PHILOX, FrontendOp, family_of, recorded
from plancache.graphspec.schema import (
    AttrKind,
    AttrSchema,
    AttrValue,
    Dims,
    InferFn,
    OpSchema,
    OutputsFn,
    ShapeError,
    SliceValue,
    broadcast,
)

__all__ = [
    "CATALOG",
    "AttrKind",
    "AttrSchema",
    "AttrValue",
    "Dims",
    "OpSchema",
    "ShapeError",
    "SliceValue",
    "anchor_family",
    "broadcast",
    "schema",
]

_KINDS = {
    "bool": AttrKind.BOOL,
    "int": AttrKind.INT,
    "float": AttrKind.FLOAT,
    "int_list": AttrKind.INT_LIST,
    "enum": AttrKind.ENUM,
    "string": AttrKind.STRING,
    "slices": AttrKind.SLICES,
    "scalar": AttrKind.SCALAR,
    "callable": AttrKind.SUBGRAPH,
}
# Argument kinds with no attribute of their own: lists of tensors (ports), dropout (ports and an attribute).
_NOT_ATTRIBUTES = ("tensor_list", "dropout")


def _attribute(param: Mapping[str, Any]) -> AttrSchema:
    kind = _KINDS[str(param["kind"])]
    if kind is AttrKind.ENUM:
        members = recorded().enums[str(param["enum"])]
        return AttrSchema(
            kind,
            choices=tuple(m for m in members if m != "NOT_SET"),
            required=bool(param.get("required")),
            enum_type=str(param["enum"]),
        )
    return AttrSchema(kind, required=bool(param.get("required")))


def _attributes(op: FrontendOp) -> dict[str, AttrSchema]:
    attrs = {name: _attribute(p) for name, p in op.params.items() if p["kind"] not in _NOT_ATTRIBUTES}
    if op.dropout:
        attrs["dropout_probability"] = AttrSchema(AttrKind.FLOAT)
    return attrs


def _dropout_ports(op: FrontendOp) -> tuple[str, ...]:
    return (*DROPOUT_PHILOX, *DROPOUT_MASK) if op.dropout else ()


def _frontend_fields(op: FrontendOp) -> dict[str, Any]:
    """The OpSchema fields every op takes from the frontend's description."""
    return {
        "node_type": op.node_type,
        "frontend_family": op.frontend_family,
        "list_inputs": op.list_inputs,
        "positional": op.positional,
        "port_order": op.ports,
        "pushes_output_dims": op.pushes_output_dims,
        "pushes_output_strides": op.frontend_family == "captured",
        "output_rules": op.output_dims,
        "dtype_like": op.dtype_like,
        "lowering": op.lowering,
        "callables": op.callables,
        "tensor_attributes": op.tensor_params,
    }


def _with_frontend(classic: OpSchema, op: FrontendOp) -> OpSchema:
    """A classic op with the frontend's other ports, attributes and outputs."""
    known = set(classic.inputs) | set(classic.optional_inputs)
    extra_ports = tuple(
        p for p in (*op.required_inputs, *op.optional_inputs, *op.tensor_params, *_dropout_ports(op)) if p not in known
    )
    extra_attrs = {name: a for name, a in _attributes(op).items() if name not in classic.attributes}
    outputs = set(classic.all_outputs) | set(classic.optional_outputs)
    extra_outputs = tuple(p for p in (*op.outputs, *op.given_outputs) if p not in outputs)
    return replace(
        classic,
        optional_inputs=classic.optional_inputs + extra_ports,
        attributes={**classic.attributes, **extra_attrs},
        optional_outputs=classic.optional_outputs + extra_outputs,
        takes_compute_type=op.takes_compute_type,
        **_frontend_fields(op),
    )


def _outputs_for(op: FrontendOp) -> OutputsFn:
    def outputs_for(attributes: Mapping[str, AttrValue], ports: frozenset[str]) -> tuple[str, ...]:
        return tuple(
            p for p in op.outputs if p not in op.presence or rules.present(op.presence[p], attributes, set(ports))
        )

    return outputs_for


def _derived_infer(op: FrontendOp) -> InferFn:
    """Dims of the results the frontend's rules give (plancache.graphspec.rules);
    a result they do not cover keeps what the spec declares (maybe none)."""

    def infer(
        ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]
    ) -> dict[str, Dims]:
        found: dict[str, Dims] = {}
        declared = {port: d for port, d in outs.items() if d}
        for port in outs:
            rule = op.output_dims.get(port)
            if rule is not None:
                dims = rules.dims(rule, ins, attrs, declared)
                if dims is not None:
                    found[port] = dims
        return found

    return infer


# Shape rules of plancache's own for ops whose results the frontend leaves
# cuDNN to infer (rules.py): later nodes' checks need the dims.
_OWN_RULES: dict[str, dict[str, dict[str, Any]]] = {"concatenate": {"OUT_0": {"concatenate": "axis"}}}


def _derived(op: FrontendOp) -> OpSchema:
    op = replace(op, output_dims={**_OWN_RULES.get(op.name, {}), **op.output_dims})
    optional = (*op.optional_inputs, *op.tensor_params, *_dropout_ports(op))
    return OpSchema(
        name=op.name,
        family=family_of(op.node_type),
        inputs=op.required_inputs,
        optional_inputs=optional,
        outputs_for=_outputs_for(op),
        all_outputs=op.outputs,
        attributes=_attributes(op),
        infer=_derived_infer(op),
        takes_compute_type=op.takes_compute_type,
        optional_outputs=op.given_outputs,
        derived=True,
        output_presence=op.presence,
        **_frontend_fields(op),
    )


def _pointwise_modes() -> dict[str, tuple[tuple[str, ...], dict[str, AttrSchema]]]:
    return {
        name: (op.required_inputs, _attributes(op))
        for name, op in recorded().ops.items()
        if op.frontend_family == "pointwise"
    }


def _build_catalog() -> dict[str, OpSchema]:
    frontend = recorded().ops
    catalog = {op.name: op for op in (*classic_ops(_pointwise_modes()), *attention_ops())}
    for name, classic in list(catalog.items()):
        catalog[name] = _with_frontend(classic, frontend[name])
    for name, op in frontend.items():
        catalog.setdefault(name, _derived(op))
    return dict(sorted(catalog.items()))


CATALOG: Mapping[str, OpSchema] = _build_catalog()


def schema(op: str) -> OpSchema | None:
    return CATALOG.get(op)


def anchor_family(nodes_ops: list[str]) -> str:
    """The op family that anchors a graph (given its nodes' ops in order):
    the first non-pointwise one, else "pointwise". Statistics count by it."""
    families = [CATALOG[op].family for op in nodes_ops]
    return next((f for f in families if f != "pointwise"), "pointwise")

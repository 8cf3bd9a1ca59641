"""The op catalog as the installed cuDNN frontend defines it, read from its code.

The frontend (1.32) declares its graph API as data: `_STRUCTURED_OPS` (norms,
reductions, block scaling, MoE, convolutions, reshape/slice/transpose/
concatenate, rope, the linear-attention families), `_CAPTURED_OPS` (the SDPA
family, whose keyword surface is the C++ binding's), `_POINTWISE_TENSOR_ARGS`
and a few explicit builders (matmul, relu & co.). Each C++ binding's pybind
signature gives every argument's type and whether it has a default. This
module turns all of that into plain JSON (`derive()`), which
`scripts/frontend-catalog.py` records in plancache/graphspec/frontend_ops.json: the
catalog plancache ships, so that a machine without the frontend validates
specs the same way. A test derives it again from the installed frontend and
fails on any difference, so a frontend upgrade that adds a node type, a port
or a parameter is caught instead of dropped.

What cannot be read as data is read as code, narrowly: the per-output
presence predicates (`maybe`) and shape rules (`infer`) are lambdas and small
functions. Each is recognised by its name and closure, or by the shape of its
expression (`"x" in n.inputs`, `bool(n.params.get("p", ...))`, ...); a
predicate in any other shape stops the derivation with its source, so a new
rule is a visible change, never a silent guess.

Imports the frontend only inside `derive()`: the module itself is plain.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

# The C++ binding types of arguments, as pybind prints them.
_TENSOR = "cudnn._compiled_module.tensor"
_ENUM_PREFIX = "cudnn._compiled_module."
# Frontend methods that are not graph nodes (they create tensors or run things).
_NOT_OPS = {"tensor", "tensor_like", "tensor_scalar"}


class DerivationError(RuntimeError):
    """The frontend declares something this derivation has no reading for."""


def derive() -> dict[str, Any]:
    """The installed frontend's graph API as JSON-ready data (see the module docstring)."""
    import cudnn
    from cudnn import _pygraph as pg
    from cudnn.graph_types import NodeType

    backend = cudnn._pybind_module.backend_graph
    ops: dict[str, dict[str, Any]] = {}
    ops["matmul"] = _matmul(backend)
    for mode, ports in pg.pygraph._POINTWISE_TENSOR_ARGS.items():
        ops[mode] = _pointwise(backend, mode, tuple(ports))
    for mode in ("relu", "leaky_relu", "swish", "gen_index", "relu_backward", "leaky_relu_backward", "swish_backward"):
        ops[mode] = _pointwise(backend, mode, None)
    for name, table in pg._STRUCTURED_OPS.items():
        ops[name] = _structured(backend, pg, name, table)
    for name, table in pg._CAPTURED_OPS.items():
        ops[name] = _captured(backend, pg, name, table)
    built = {op["node_type"] for op in ops.values()}
    return {
        "frontend_version": str(cudnn.__version__),
        "node_types": [t.name for t in NodeType],
        # Node types the frontend's graph API has no builder for: no program can make one.
        "node_types_without_builder": sorted(t.name for t in NodeType if t.name not in built),
        "enums": {name: _members(getattr(cudnn._compiled_module, name)) for name in sorted(_enum_names(ops))},
        "data_types": [m for m in _members(cudnn.data_type) if m != "NOT_SET"],
        "tensor_fields": [f for f in _tensor_fields()],
        "graph_arguments": _graph_arguments(pg),
        "ops": dict(sorted(ops.items())),
    }


# ---------------------------------------------------------------------------
# signatures
# ---------------------------------------------------------------------------


def _signature(backend: Any, method: str) -> list[tuple[str, str, bool]]:
    """(name, type, has a default) of each argument of a C++ graph method (all overloads merged)."""
    doc = getattr(getattr(backend, method, None), "__doc__", None) or ""
    heads = [line for line in doc.splitlines() if line.startswith(f"{method}(self")]
    if not heads:
        return []
    merged: dict[str, tuple[str, str, bool]] = {}
    for head in heads:
        inner = head[head.index("(") + 1 : head.rindex(") ->")]
        for part in _split_top(inner)[1:]:  # drop self
            name, _, rest = part.partition(":")
            kind, eq, _default = rest.partition("=")
            merged.setdefault(name.strip(), (name.strip(), kind.strip(), bool(eq)))
    return list(merged.values())


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if current:
        parts.append("".join(current).strip())
    return parts


def _doc_type(backend: Any, method: str, arg: str) -> str:
    """The type the binding's docstring gives an argument typed `object` ("Optional[int]" ...)."""
    doc = getattr(getattr(backend, method, None), "__doc__", None) or ""
    found = re.search(rf"^\s*{re.escape(arg)} \((.*?)\):", doc, re.M)
    return found.group(1) if found else ""


def _param_kind(cpp_type: str, doc_type: str) -> dict[str, Any]:
    """How a non-tensor argument is written in a spec."""
    base = cpp_type.replace(" | None", "").strip()
    if base == "bool":
        return {"kind": "bool"}
    if base == "int":
        return {"kind": "int"}
    if base == "float":
        return {"kind": "float"}
    if base == "str":
        return {"kind": "string"}
    if base == "collections.abc.Sequence[int]":
        return {"kind": "int_list"}
    if base == "collections.abc.Sequence[slice]":
        return {"kind": "slices"}
    if base.startswith("collections.abc.Callable"):
        return {"kind": "callable"}
    if base.startswith(_ENUM_PREFIX):
        return {"kind": "enum", "enum": base[len(_ENUM_PREFIX) :]}
    if base == "object":
        if "Tuple" in doc_type:
            return {"kind": "dropout"}
        if "cudnn_tensor" in doc_type and "float" in doc_type:
            return {"kind": "float", "or_tensor": True}
        if "bool" in doc_type:
            return {"kind": "bool"}
        if "int" in doc_type:
            return {"kind": "int"}
        return {"kind": "scalar"}
    raise DerivationError(f"no spec form for a C++ argument of type {cpp_type!r}")


def _arguments(backend: Any, method: str) -> tuple[list[tuple[str, bool]], dict[str, dict[str, Any]]]:
    """(tensor ports with whether each is required, params) of a C++ method, name and compute type left out."""
    ports: list[tuple[str, bool]] = []
    params: dict[str, dict[str, Any]] = {}
    for name, kind, has_default in _signature(backend, method):
        if name in ("name", "compute_data_type"):
            continue
        if kind.replace(" | None", "") == _TENSOR:
            ports.append((name, not has_default and "| None" not in kind))
        elif kind.replace(" | None", "") == f"collections.abc.Sequence[{_TENSOR}]":
            params[name] = {"kind": "tensor_list"}
        else:
            params[name] = {
                **_param_kind(kind, _doc_type(backend, method, name)),
                "required": not has_default and "| None" not in kind,
            }
    return ports, params


def _takes_compute_type(backend: Any, method: str) -> bool:
    return any(name == "compute_data_type" for name, _, _ in _signature(backend, method))


# ---------------------------------------------------------------------------
# op families
# ---------------------------------------------------------------------------


def _matmul(backend: Any) -> dict[str, Any]:
    ports, params = _arguments(backend, "matmul")
    return _op("MATMUL", "matmul", ports, params, ["C"], takes_compute_type=True)


def _pointwise(backend: Any, mode: str, table_ports: tuple[str, ...] | None) -> dict[str, Any]:
    ports, params = _arguments(backend, mode)
    if table_ports is not None and tuple(p for p, _ in ports) != table_ports:
        raise DerivationError(
            f"pointwise {mode}: the frontend's table names ports {table_ports}, its binding {[p for p, _ in ports]}"
        )
    # Every pointwise port is required: the builders take them positionally.
    return _op(
        "POINTWISE",
        "pointwise",
        [(p, True) for p, _ in ports],
        params,
        ["OUT_0"],
        takes_compute_type=_takes_compute_type(backend, mode),
    )


def _structured(backend: Any, pg: Any, name: str, table: Mapping[str, Any]) -> dict[str, Any]:
    python_only = bool(table.get("python_only"))
    cpp_ports, cpp_params = _arguments(backend, name) if not python_only else ([], {})
    required = {p for p, req in cpp_ports if req}
    ports = [(p, p in required) for p in table["inputs"]]
    ports += [(p, False) for p in table.get("keyword_inputs", ())]
    params: dict[str, dict[str, Any]] = {}
    for attr in table.get("attrs", ()):
        params[attr] = cpp_params.get(attr) or {"kind": "scalar", "required": False}
    for list_port in table.get("list_inputs", ()):
        params.pop(list_port, None)
    op = _op(
        table["node_type"].name,
        "structured",
        ports,
        params,
        list(table["outputs"]),
        takes_compute_type=not table.get("no_cdt", False),
    )
    op["list_inputs"] = list(table.get("list_inputs", ()))
    op["pushes_output_dims"] = bool(table.get("push_output_dims", False))
    op["lowering"] = "python" if python_only else "backend"
    op["output_presence"] = {port: _presence(pg, fn) for port, fn in table.get("maybe", {}).items()}
    op["output_dims"] = {port: _dims_rule(pg, fn) for port, fn in table.get("infer", {}).items()}
    op["output_dtype_like"] = dict(table.get("dtype_like", {}))
    return op


def _captured(backend: Any, pg: Any, name: str, table: Mapping[str, Any]) -> dict[str, Any]:
    cpp_ports, params = _arguments(backend, name)
    given = list(table.get("out_kwargs", ()))
    ports = [(p, req) for p, req in cpp_ports if p not in given]
    for port in table.get("python_only_in_kwargs", ()):
        ports.append((port, False))
    for attr in table.get("python_only_attrs", ()):
        params.setdefault(attr, {"kind": "scalar", "required": False})
    for port in table.get("python_only_out_kwargs", ()):
        if port not in given:
            given.append(port)
    op = _op(table["node_type"].name, "captured", ports, params, list(table["outputs"]), takes_compute_type=True)
    op["positional"] = list(table.get("pos", ()))
    op["given_outputs"] = given
    op["pushes_output_dims"] = True  # the SDPA family's lowering pushes every output's IR dims and strides
    op["lowering"] = "backend"
    op["python_only"] = {
        "params": list(table.get("python_only_attrs", ())),
        "inputs": list(table.get("python_only_in_kwargs", ())),
        "outputs": list(table.get("python_only_out_kwargs", ())),
    }
    op["output_presence"] = {port: _presence(pg, fn) for port, fn in table.get("maybe", {}).items()}
    op["output_dims"] = {port: _dims_rule(pg, fn) for port, fn in table.get("infer", {}).items()}
    return op


def _op(
    node_type: str,
    family: str,
    ports: list[tuple[str, bool]],
    params: dict[str, dict[str, Any]],
    outputs: list[str],
    *,
    takes_compute_type: bool,
) -> dict[str, Any]:
    return {
        "node_type": node_type,
        "family": family,
        "inputs": [{"port": p, "required": req} for p, req in ports],
        "params": params,
        "outputs": outputs,
        "takes_compute_type": takes_compute_type,
    }


def _enum_names(ops: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {str(p["enum"]) for op in ops.values() for p in op["params"].values() if p.get("kind") == "enum"} | {
        "tensor_reordering",
        "scalar_type",
    }


def _members(enum_type: Any) -> list[str]:
    return [str(m) for m in enum_type.__members__]


def _tensor_fields() -> list[str]:
    import dataclasses

    from cudnn.graph_types import Tensor

    return [f.name for f in dataclasses.fields(Tensor)]


def _graph_arguments(pg: Any) -> list[str]:
    """The pygraph constructor's arguments, as the graph records them."""
    return [name for name in inspect.signature(pg.pygraph.__init__).parameters if name not in ("self", "kwargs")]


# ---------------------------------------------------------------------------
# presence predicates and shape rules, read from their code
# ---------------------------------------------------------------------------


def _presence(pg: Any, fn: Callable[..., Any]) -> dict[str, Any]:
    named: dict[Any, dict[str, Any]] = {
        getattr(pg, "_training_phase", None): {"param_not": ["norm_forward_phase", "INFERENCE"]},
        getattr(pg, "_has_scale", None): {"input": "scale"},
        getattr(pg, "_stats_expected", None): {"stats": True},
    }
    if fn in named:
        return named[fn]
    return _presence_expr(pg, _lambda_body(fn), fn)


def _presence_expr(pg: Any, node: ast.expr, fn: Callable[..., Any]) -> dict[str, Any]:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return {"all": [_presence_expr(pg, v, fn) for v in node.values]}
    # "port" in n.inputs
    if (
        isinstance(node, ast.Compare)
        and isinstance(node.ops[0], ast.In)
        and _is_attr(node.comparators[0], "inputs")
        and _const(node.left) is not None
    ):
        return {"input": _const(node.left)}
    # bool(n.params.get("p", False)) / bool(n.params.get("p") or 0)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool":
        inner = node.args[0]
        if isinstance(inner, ast.BoolOp):
            inner = inner.values[0]
        param = _params_get(inner)
        if param is not None:
            return {"param_truthy": param}
    # n.params.get("p", True) is not False
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.IsNot) and _const(node.comparators[0]) is False:
        param = _params_get(node.left)
        if param is not None:
            return {"param_not_false": param}
    # a named predicate called on the node
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and hasattr(pg, node.func.id):
        return _presence(pg, getattr(pg, node.func.id))
    raise DerivationError(f"no reading for the output presence rule {_source(fn)!r}")


def _dims_rule(pg: Any, fn: Callable[..., Any]) -> dict[str, Any]:
    qualname = getattr(fn, "__qualname__", "")
    cells = {
        name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False)
    }
    if qualname == "_like.<locals>.<lambda>":
        return {"like": cells["port"]}
    if qualname == "_stats_like.<locals>.infer":
        return {"stats_like": cells["port"], "keep": list(cells["keep_axes"])}
    if qualname == "_norm_stats_like.<locals>.infer":
        return {"norm_stats": cells["first_axis"]}
    if qualname == "_layernorm_stat_like.<locals>.infer":
        return {"norm_stats": 0, "or_like_output": cells["other"]}
    by_name = {
        "_sdpa_o_dims": {"sdpa_o": True},
        "_sdpa_stats_dims": {"sdpa_stats": True},
        "_conv_fprop_dims": {"conv_fprop": True},
        "_slice_dims": {"slice": True},
        "_block_quant_scale_dims": {"block_scale": True},
    }
    if qualname in by_name and getattr(pg, qualname, None) is fn:
        return by_name[qualname]
    if fn is getattr(pg, "_AMAX", None):
        return {"fixed": [1, 1, 1, 1]}
    if qualname == "<lambda>":
        body = _lambda_body(fn)
        # [n.inputs["input"].dim[i] for i in n.params["permutation"]] if ... else None
        if isinstance(body, ast.IfExp):
            body = body.body
        if isinstance(body, ast.ListComp) and isinstance(body.elt, ast.Subscript):
            source = _inputs_dim(body.elt.value)
            over = body.generators[0].iter
            if source is not None and isinstance(over, ast.Subscript) and _is_attr(over.value, "params"):
                return {"permute": source, "by": _const(over.slice)}
    # A rule plancache has no reading for: the spec carries the dims (a captured graph has them).
    return {"declared": qualname or repr(fn)}


def _lambda_body(fn: Callable[..., Any]) -> ast.expr:
    source = textwrap.dedent(_source(fn))
    start = source.find("lambda")
    if start < 0:  # a def: its single return
        tree = ast.parse(source)
        func = tree.body[0]
        if (
            isinstance(func, ast.FunctionDef)
            and len(func.body) == 1
            and isinstance(func.body[0], ast.Return)
            and func.body[0].value is not None
        ):
            return func.body[0].value
        raise DerivationError(f"no reading for {source!r}")
    text = source[start:]
    for end in range(len(text), 0, -1):  # the lambda ends where the text first parses
        try:
            expression = ast.parse(text[:end].strip(), mode="eval")
        except SyntaxError:
            continue
        if isinstance(expression.body, ast.Lambda):
            return expression.body.body
    raise DerivationError(f"no reading for {source!r}")


def _source(fn: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(fn).strip()
    except (OSError, TypeError):
        return repr(fn)


def _is_attr(node: ast.expr, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr


def _const(node: ast.expr) -> Any:
    return node.value if isinstance(node, ast.Constant) else None


def _params_get(node: ast.expr) -> str | None:
    """'p' of n.params.get('p', ...)."""
    if isinstance(node, ast.Call) and _is_attr(node.func, "get") and _is_attr(node.func.value, "params") and node.args:  # type: ignore[attr-defined]
        value = _const(node.args[0])
        return value if isinstance(value, str) else None
    return None


def _inputs_dim(node: ast.expr) -> str | None:
    """'x' of n.inputs['x'].dim."""
    if _is_attr(node, "dim") and isinstance(node.value, ast.Subscript) and _is_attr(node.value.value, "inputs"):  # type: ignore[attr-defined]
        value = _const(node.value.slice)  # type: ignore[attr-defined]
        return value if isinstance(value, str) else None
    return None

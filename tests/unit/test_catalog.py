"""The whole graph API has a spec form, derived from the frontend itself.

Against the recorded list (plancache/graphspec/frontend_ops.json, always): every
node type the frontend can build and every pointwise mode has a catalog op.
Against the installed frontend (where it imports, as in `make test`): the
recorded list is what the frontend says today, so an upgrade that adds a
node type, a port or a parameter fails here until scripts/frontend-catalog.py
records it (the GPU suite checks the frontend there the same way). And the
published contract (proto/plancache/v1/catalog.json) is current."""

from __future__ import annotations

import importlib.util
import json
from types import ModuleType

import pytest

from plancache.graphspec.catalog_export import export
from plancache.graphspec.frontend_ops import recorded
from plancache.graphspec.ops import CATALOG
from tests.support.processes import REPO

RECORDED = REPO / "client/src/plancache/graphspec/frontend_ops.json"
PUBLISHED = REPO / "proto/plancache/v1/catalog.json"


def _node_types_served() -> set[str]:
    return {s.node_type for s in CATALOG.values()}


def test_every_recorded_node_type_and_pointwise_mode_has_a_spec_form() -> None:
    frontend = recorded()
    buildable = set(frontend.node_types) - set(frontend.without_builder)
    assert buildable <= _node_types_served(), sorted(buildable - _node_types_served())
    modes = {name for name, op in frontend.ops.items() if op.frontend_family == "pointwise"}
    assert modes <= set(CATALOG) and len(modes) >= 50
    assert set(frontend.without_builder) == {
        "COMPOSITE",
        "MATMUL_FP8",
    }  # no builder in the frontend's API: no program makes one


def test_every_port_and_parameter_of_the_frontend_has_a_form() -> None:
    for name, op in recorded().ops.items():
        schema = CATALOG[name]
        ports = set(schema.inputs) | set(schema.optional_inputs)
        assert set(op.required_inputs) <= ports | set(schema.list_inputs), name
        assert set(op.optional_inputs) <= ports, name
        for param, described in op.params.items():
            kind = described["kind"]
            if kind == "callable":
                assert param in schema.callables, (name, param)  # refused, naming it
            elif kind == "dropout":
                assert "dropout_probability" in schema.attributes and "dropout_mask" in schema.optional_inputs, name
            elif kind != "tensor_list":
                assert param in schema.attributes, (name, param)


def test_the_published_catalog_is_current() -> None:
    assert json.loads(PUBLISHED.read_text()) == json.loads(json.dumps(export())), (
        "stale: run .venv/bin/python scripts/frontend-catalog.py"
    )


def _installed_frontend() -> ModuleType:
    if importlib.util.find_spec("cudnn") is None:
        pytest.skip("the cuDNN frontend is not installed here (make setup installs its IR)")
    import cudnn

    return cudnn


def test_the_recorded_list_is_the_installed_frontends() -> None:
    cudnn = _installed_frontend()
    from tests.support.scripts import load_script

    derive = load_script("frontend_api").derive

    derived = derive()
    assert derived["frontend_version"] == cudnn.__version__
    assert derived == json.loads(RECORDED.read_text()), (
        "the installed frontend differs from the recorded list: run scripts/frontend-catalog.py"
    )


def test_every_node_type_and_pointwise_mode_of_the_installed_frontend_has_a_spec_form() -> None:
    cudnn = _installed_frontend()
    from cudnn import _pygraph
    from cudnn.graph_types import NodeType

    builders = {
        spec["node_type"].name for spec in [*_pygraph._STRUCTURED_OPS.values(), *_pygraph._CAPTURED_OPS.values()]
    } | {"MATMUL", "POINTWISE"}
    missing = sorted(t.name for t in NodeType if t.name in builders and t.name not in _node_types_served())
    assert not missing, f"frontend {cudnn.__version__} builds node types with no spec form: {missing}"
    modes = set(_pygraph.pygraph._POINTWISE_TENSOR_ARGS) | {
        "relu",
        "leaky_relu",
        "swish",
        "gen_index",
        "relu_backward",
        "leaky_relu_backward",
        "swish_backward",
    }
    assert modes <= set(CATALOG), sorted(modes - set(CATALOG))

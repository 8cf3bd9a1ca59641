"""A mistyped op, attribute, port or JSON field is refused with the closest names first ("did you mean"),
not the catalog's whole list; `plancache ops` lists every op and `plancache ops NAME` one op's."""

from __future__ import annotations

import json

import pytest

from plancache import GraphSpec, SpecError
from plancache.cli.entry import main as cli
from plancache.graphspec import spec_io
from plancache.graphspec.ops import CATALOG
from plancache.graphspec.suggest import closest, did_you_mean
from plancache.graphspec.validation import normalize
from tests.support.specs import matmul_spec


def _refusal(spec: GraphSpec) -> str:
    with pytest.raises(SpecError) as info:
        normalize(spec)
    return info.value.message


def test_an_unknown_op_names_the_closest_not_all_of_them() -> None:
    g = matmul_spec()
    g.nodes[0].op = "matmull"
    message = _refusal(g)
    assert "unknown op 'matmull'; did you mean 'matmul'" in message
    assert f"({len(CATALOG)} ops: `plancache ops` lists them)" in message
    assert "conv_fprop" not in message and len(message) < 200  # not the 107 names


def test_case_is_ignored_and_a_name_far_from_all_gets_no_guess() -> None:
    assert closest("MatMul", CATALOG) == ["matmul"]
    assert did_you_mean("qqqqqqqq", CATALOG) == ""
    g = matmul_spec()
    g.nodes[0].op = "qqqqqqqq"
    assert f"unknown op 'qqqqqqqq' ({len(CATALOG)} ops: `plancache ops` lists them)" in _refusal(g)


def test_an_unknown_attribute_names_the_closest_first() -> None:
    g = GraphSpec(io_data_type="half")
    x, w = g.tensor([8, 64, 56, 56], name="x"), g.tensor([128, 64, 3, 3], name="w")
    g.conv_fprop(x, w, paddin=[1, 1]).set_output(True)
    assert "conv_fprop has no attribute 'paddin'; did you mean 'padding'" in _refusal(g)


def test_an_unknown_port_names_the_closest() -> None:
    g = matmul_spec()
    node = g.nodes[0]
    node.inputs["AA"] = node.inputs.pop("A")
    assert "matmul has no input port 'AA'; did you mean 'A'" in _refusal(g)


def test_the_builder_suggests_too() -> None:
    g = GraphSpec()
    with pytest.raises(SpecError, match=r"unknown op 'conv_frop'; did you mean 'conv_fprop'"):
        g.node("conv_frop")
    with pytest.raises(AttributeError, match=r"GraphSpec has no method or op 'matmull'; did you mean 'matmul'"):
        g.matmull  # noqa: B018
    assert not hasattr(g, "__deepcopy__")  # the probes copy and pickle make still answer plainly


def test_an_unknown_json_field_names_the_closest() -> None:
    data = spec_io.to_dict(matmul_spec())
    data["tensors"][0]["dims"] = data["tensors"][0].pop("dim")
    with pytest.raises(SpecError, match=r"tensor 0: unknown field\(s\) 'dims'; did you mean 'dim'"):
        GraphSpec.from_json(json.dumps(data))


def test_plancache_ops_lists_every_op_and_describes_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["ops"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == sorted(CATALOG)
    assert cli(["ops", "conv_fprop"]) == 0
    described = capsys.readouterr().out
    assert "inputs: image, weight" in described and "attribute padding: int list" in described
    assert cli(["ops", "conv_frop"]) == 1
    assert "did you mean 'conv_fprop'" in capsys.readouterr().err

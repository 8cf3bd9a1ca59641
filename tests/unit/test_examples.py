"""examples/*.json are valid specs and exactly what examples/generate.py writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.generate import EXAMPLES, EXAMPLES_DIR, render
from plancache import GraphSpec
from plancache.spec.ops import CATALOG
from plancache.spec.validation import normalize


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_file_matches_its_builder_and_validates(name: str) -> None:
    path = EXAMPLES_DIR / f"{name}.json"
    assert path.read_text() == render(name), f"{path} is stale: run python examples/generate.py"
    spec = GraphSpec.from_json(path.read_text())
    normalize(spec)
    assert spec.spec_hash() == EXAMPLES[name]().spec_hash()


def test_every_op_family_has_an_example() -> None:
    used = {CATALOG[n.op].family for f in EXAMPLES.values() for n in f().nodes}
    assert used == {s.family for s in CATALOG.values()}
    ops = {n.op for f in EXAMPLES.values() for n in f().nodes}
    required = {"matmul", "conv_fprop", "conv_dgrad", "conv_wgrad", "sdpa", "sdpa_backward", "layernorm", "rmsnorm",
                "batchnorm_inference", "add", "sub", "mul", "div", "bias", "scale", "relu", "gelu", "tanh", "sigmoid", "swish", "reduction"}  # fmt: skip
    assert required <= ops


def test_no_stray_json_files() -> None:
    assert {p.stem for p in Path(EXAMPLES_DIR).glob("*.json")} == set(EXAMPLES)

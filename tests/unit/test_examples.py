"""examples/*.json are valid specs and exactly what examples/generate.py writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.generate import EXAMPLES, EXAMPLES_DIR, render
from plancache import GraphSpec
from plancache.graphspec.ops import CATALOG
from plancache.graphspec.validation import normalize


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_file_matches_its_builder_and_validates(name: str) -> None:
    path = EXAMPLES_DIR / f"{name}.json"
    assert path.read_text() == render(name), f"{path} is stale: run python examples/generate.py"
    spec = GraphSpec.from_json(path.read_text())
    normalize(spec)
    assert spec.spec_hash() == EXAMPLES[name]().spec_hash()


# Op families that cannot run on the GPUs the examples are checked on (sm_90,
# cuDNN 9.19, frontend 1.32: tests/gpu), with the reason. An example of one
# may still be kept, with a strict expected failure in tests/gpu.
NOT_ON_SM90_CUDNN_919 = {
    "linear_attention": "python engines only: the frontend has no backend lowering for these ops",
    "block_scale": "FP4/MXFP8 block scaling needs compute capability 10.x",
    "rope": "the frontend lowers rope to CUDNN_BACKEND_OPERATION_ROPE_FWD/BWD_DESCRIPTOR, only available from cuDNN 9.24",
    "transpose": "the frontend's transpose requires cuDNN 9.22",
    "slice": "the frontend lowers slice to the backend slice operation, which requires cuDNN 9.22",
    "reshape": "cuDNN 9.19 has no engine on sm_90 for a graph with a reshape",
}


def test_every_op_family_has_an_example() -> None:
    used = {CATALOG[n.op].family for f in EXAMPLES.values() for n in f().nodes}
    families = {s.family for s in CATALOG.values()}
    assert set(NOT_ON_SM90_CUDNN_919) <= families
    assert families - set(NOT_ON_SM90_CUDNN_919) <= used, sorted(families - set(NOT_ON_SM90_CUDNN_919) - used)
    ops = {n.op for f in EXAMPLES.values() for n in f().nodes}
    required = {
        "matmul",
        "conv_fprop",
        "conv_dgrad",
        "conv_wgrad",
        "sdpa",
        "sdpa_backward",
        "layernorm",
        "rmsnorm",
        "batchnorm_inference",
        "add",
        "sub",
        "mul",
        "div",
        "bias",
        "scale",
        "relu",
        "gelu",
        "tanh",
        "sigmoid",
        "swish",
        "reduction",
        "layernorm_backward",
        "rmsnorm_backward",
        "batchnorm",
        "batchnorm_backward",
        "instancenorm",
        "adalayernorm",
        "adalayernorm_backward",
        "genstats",
        "concatenate",
        "moe_grouped_matmul",
        "gen_index",
        "cmp_ge",
        "cmp_gt",
        "logical_or",
        "binary_select",
        "slice",
        "reshape",
        "transpose",
    }
    assert required <= ops, sorted(required - ops)


def test_no_stray_json_files() -> None:
    assert {p.stem for p in Path(EXAMPLES_DIR).glob("*.json")} == set(EXAMPLES)

"""Known cuDNN defects are refused before a wrong plan can be stored: only
in the form measured wrong, only on the versions measured
(tests/gpu/test_gpu_defects.py measures both sides on the GPU)."""

from __future__ import annotations

import pytest

from examples.generate import EXAMPLES
from plancache import CompileFailed, GraphSpec
from plancache.frontend_graph.defects import check_known_defects
from plancache.graphspec.validation import normalize
from plancache.keys.target import Target

MEASURED = Target("sm_90", 91900, "1.32.0")
LATER = Target("sm_90", 92100, "1.32.0")


def _pointwise(bias_dims: list[int], *, pass_by_value: bool = False) -> GraphSpec:
    g = GraphSpec(io_data_type="half")
    x = g.tensor([4, 256, 512], name="x")
    b = g.tensor(bias_dims, name="b", is_pass_by_value=pass_by_value, data_type="float" if pass_by_value else None)
    g.bias(g.relu(x), b).set_output(True)
    return normalize(g)


def test_broadcast_over_leading_axes_in_a_pointwise_only_graph_is_refused_with_the_workaround() -> None:
    with pytest.raises(
        CompileFailed,
        match=r"node 1 \(bias_1\): input 'bias' .* dims \[1, 1, 512\].*cudnn-frontend issue #107.*full size",
    ):
        check_known_defects(_pointwise([1, 1, 512]), MEASURED)


@pytest.mark.parametrize(
    ("dims", "pass_by_value"),
    [([4, 256, 512], False), ([4, 1, 512], False), ([1, 1, 1], False), ([1, 1, 1], True)],
    ids=[
        "full size",
        "one middle axis (measured right)",
        "all ones (measured right)",
        "a host scalar (the frontend's own test)",
    ],
)
def test_forms_measured_right_are_built(dims: list[int], pass_by_value: bool) -> None:
    check_known_defects(_pointwise(dims, pass_by_value=pass_by_value), MEASURED)


def test_the_refusal_holds_only_on_the_versions_measured() -> None:
    check_known_defects(_pointwise([1, 1, 512]), LATER)


def test_fused_broadcast_and_the_examples_are_accepted() -> None:
    for name in ("matmul_bias_relu_bf16", "conv_bias_relu_fp16", "pointwise_binary_fp16", "pointwise_unary_fp16"):
        check_known_defects(normalize(EXAMPLES[name]()), MEASURED)

"""Known cuDNN defects are refused before a wrong plan can be stored."""

from __future__ import annotations

import pytest

from examples.generate import EXAMPLES
from plancache import CompileFailed, GraphSpec
from plancache.spec.validation import normalize
from plancache_server.worker.compiler.defects import check_known_defects


def _pointwise(bias_dims: list[int]) -> GraphSpec:
    g = GraphSpec(io_data_type="half")
    x = g.tensor([4, 256, 512], name="x")
    b = g.tensor(bias_dims, name="b")
    g.bias(g.relu(x), b).set_output(True)
    return normalize(g)


def test_broadcast_in_a_pointwise_only_graph_is_refused_with_the_workaround() -> None:
    with pytest.raises(CompileFailed, match=r"node 1 \(bias_1\): input 'bias' .* dims \[1, 1, 512\].*cudnn-frontend issue #107.*full size"):
        check_known_defects(_pointwise([1, 1, 512]))


def test_full_size_pointwise_and_fused_broadcast_are_accepted() -> None:
    check_known_defects(_pointwise([4, 256, 512]))
    for name in ("matmul_bias_relu_bf16", "conv_bias_relu_fp16", "pointwise_binary_fp16", "pointwise_unary_fp16"):
        check_known_defects(normalize(EXAMPLES[name]()))

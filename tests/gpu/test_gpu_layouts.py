"""Output layouts, the frontend's own: for every op family (every example,
and the layout cases of tests/support/layout_specs.py), the graph is built
with the cuDNN frontend on the GPU leaving the results' strides to it; the
strides it lays out (read back after build_operation_graph) must be the
ones normalize inferred (results whose dims it leaves to cuDNN, as the
frontend's own ops' are, are read from cuDNN when a plan is built). Then a spec that leaves them out, the same graph
captured with from_pygraph, and one that writes them out are one key."""

from __future__ import annotations

from typing import Any

import pytest

from examples.generate import EXAMPLES
from plancache import GraphSpec
from plancache.graphspec.validation import normalize
from tests.support.layout_specs import LAYOUT_CASES, without_result_strides

pytestmark = pytest.mark.gpu

BUILDERS = {**{f"example:{n}": b for n, b in EXAMPLES.items()}, **{f"layout:{n}": b for n, b in LAYOUT_CASES.items()}}
# Measured on an H200, cuDNN 9.19 (GPU run 21): the frontend lowers these to backend operations newer than 9.19 and says so.
_NEWER_BACKEND = {
    "example:slice_matmul_bf16": "'Slice backend operation requires 9.22.0'",
    "example:transpose_fp32": "'Transpose requires cuDNN v9.22.0'",
}
CASES = [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=_NEWER_BACKEND[c])) if c in _NEWER_BACKEND else c
    for c in BUILDERS
]


@pytest.fixture(scope="module")
def compiler() -> Any:
    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    return CudnnCompiler(0)


def _built(compiler: Any, case: str) -> tuple[GraphSpec, Any]:
    normalized = normalize(without_result_strides(BUILDERS[case]()))
    g = compiler.graph(normalized, result_strides=False)
    g.validate()
    g.build_operation_graph()  # the backend lays the results out; the Python graph reads its strides back
    return normalized, g


@pytest.mark.parametrize("case", CASES)
def test_inferred_result_strides_are_the_frontends(compiler: Any, case: str) -> None:
    normalized, g = _built(compiler, case)
    mismatches = []
    for index, (ours, theirs) in enumerate(zip(normalized.nodes, g.nodes, strict=True)):
        for port, t in ours.outputs.items():
            if (
                not t.dim or not t.stride
            ):  # left to cuDNN (a frontend op's result, or what follows one): the worker reads what it gave
                continue
            laid_out = tuple(theirs.outputs[port].stride or ())
            if laid_out != tuple(t.stride):
                mismatches.append(
                    f"node {index} {ours.op}.{port} dims {list(t.dim)}: frontend {list(laid_out)}, plancache {list(t.stride)}"
                )
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.parametrize("case", CASES)
def test_a_capture_of_the_frontends_graph_is_the_same_key(compiler: Any, case: str) -> None:
    normalized, g = _built(compiler, case)
    captured = GraphSpec.from_pygraph(g)
    # The compiler binds scalars at execute time, so its graph holds no
    # scalar values: the spec's defaults are put back to compare the rest.
    defaults = {t.uid: t.scalar_value for t in normalized.tensors if t.is_pass_by_value}
    for t in captured.tensors:
        if t.uid in defaults:
            t.scalar_value = defaults[t.uid]
    assert captured.spec_hash() == normalized.spec_hash()

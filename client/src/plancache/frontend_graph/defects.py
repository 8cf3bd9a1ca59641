"""Graphs the cuDNN backend accepts but computes wrongly: refused up front.

A plan that builds and runs but gives wrong numbers is worse than no plan,
so the worker refuses these graphs with the reason and a workaround
instead of storing them, and a node's own build (plancache.run.local)
refuses them alike. A refusal is exact: only the form measured wrong,
only on the backend versions it was measured wrong on. Any other graph is
built as the program would build it (tests/gpu/test_gpu_defects.py measures
both sides of each line on the GPU: the refused form is still wrong, the
neighbouring forms are right).
"""

from __future__ import annotations

from plancache.errors import CompileFailed
from plancache.graphspec.graph import GraphSpec, Tensor
from plancache.graphspec.ops import CATALOG
from plancache.keys.target import Target

# The cuDNN backend versions each defect was measured on (docs/gpu-runs/: runs 1 and 20).
POINTWISE_BROADCAST_WRONG_ON = frozenset({91900})
CONCATENATE_COPY_WRONG_ON = frozenset({91900})
INSTANCENORM_BACKWARD_NOT_LOADABLE_ON = frozenset({91900})


def check_known_defects(spec: GraphSpec, target: Target, *, served: bool = True) -> None:
    """Raise CompileFailed for a graph known to produce wrong results on `target`,
    or, for a plan to be `served` (stored and loaded elsewhere), whose plans
    cannot be loaded. A node's own build (served=False) runs the plan it
    built: only the wrong results refuse it."""
    version = target.cudnn_version
    if version in POINTWISE_BROADCAST_WRONG_ON:
        _pointwise_only_broadcast(spec)
    for index, node in enumerate(spec.nodes):
        where = f"node {index} ({node.name or node.op})"
        if (
            node.op == "concatenate"
            and "in_place_index" not in node.attributes
            and version in CONCATENATE_COPY_WRONG_ON
        ):
            # Measured (GPU run 20): a concatenate that copies every input leaves one input's part of the
            # output unwritten (262,144 of 524,288 elements), with no error; in place (in_place_index) it is right.
            raise CompileFailed(
                f"{where}: a concatenate without in_place_index leaves part of its "
                "output unwritten on cuDNN 9.19 (measured); give in_place_index "
                "(the input whose buffer is the output's), or concatenate outside the graph"
            )
        if node.op == "instancenorm_backward" and version in INSTANCENORM_BACKWARD_NOT_LOADABLE_ON and served:
            # Measured (GPU run 20): every plan builds and runs, but deserializing one fails
            # ("cuda_graph_end_capture ... failed") and leaves an error for the process's next CUDA call.
            raise CompileFailed(
                f"{where}: instancenorm_backward plans do not deserialize on cuDNN 9.19 (measured), "
                "so a stored one could never be loaded; build it where it runs"
            )


def leading_broadcast(t: Tensor, out: tuple[int, ...]) -> bool:
    """The measured form: a tensor bound on the GPU, broadcast over its
    leading axes (at least two) and full-size on the rest (at least one):
    x[4,256,512] + b[1,1,512] read out of bounds (relative error 0.4-0.9,
    also with zero strides). b[4,1,512], b[1,1,1] and a pass-by-value
    scalar were right, as was the same b behind a matmul or convolution."""
    if t.is_virtual or t.is_pass_by_value or len(t.dim) != len(out) or tuple(t.dim) == tuple(out):
        return False
    broadcast = [d == 1 and o != 1 for d, o in zip(t.dim, out, strict=True)]
    leading = next((i for i, b in enumerate(broadcast) if not b), len(broadcast))
    full = all(d == o for d, o in zip(t.dim[leading:], out[leading:], strict=True))
    return leading >= 2 and leading < len(out) and full


def _pointwise_only_broadcast(spec: GraphSpec) -> None:
    # Public report: NVIDIA/cudnn-frontend issue #107.
    if not spec.nodes or any(CATALOG[n.op].family != "pointwise" for n in spec.nodes):
        return
    for index, node in enumerate(spec.nodes):
        (out,) = node.outputs.values()
        for port, t in node.inputs.items():
            if leading_broadcast(t, tuple(out.dim)):
                raise CompileFailed(
                    f"node {index} ({node.name or node.op}): input {port!r} ({t.label()}, dims {list(t.dim)}) "
                    f"is broadcast over its leading axes to {list(out.dim)} in a graph of pointwise ops only, "
                    "which cuDNN 9.19 computes wrongly (cudnn-frontend issue #107); "
                    "pass it at full size, or fuse the pointwise ops behind a matmul or convolution"
                )

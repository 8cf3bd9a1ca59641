"""Graphs the cuDNN backend accepts but computes wrongly: refused up front.

A plan that builds and runs but gives wrong numbers is worse than no plan,
so the compiler refuses these graphs with the reason and a workaround
instead of storing them.
"""

from __future__ import annotations

from plancache.errors import CompileFailed
from plancache.spec.graph import GraphSpec
from plancache.spec.ops import CATALOG


def check_known_defects(spec: GraphSpec) -> None:
    """Raise CompileFailed for a graph known to produce wrong results."""
    _pointwise_only_broadcast(spec)


def _pointwise_only_broadcast(spec: GraphSpec) -> None:
    # Measured on an H200 with cuDNN 9.19 / frontend 1.32 (docs/gpu-runs/):
    # in a graph of pointwise ops alone, an input broadcast over size-1 dims
    # (x[4,256,512] + b[1,1,512]) reads out of bounds and returns wrong values
    # (relative error 0.4-0.9, also with zero strides on the broadcast dims);
    # the same inputs at full size are right, and broadcasting in graphs
    # anchored by a matmul or convolution (bias epilogues) is right.
    # Public report: NVIDIA/cudnn-frontend issue #107.
    if not spec.nodes or any(CATALOG[n.op].family != "pointwise" for n in spec.nodes):
        return
    for index, node in enumerate(spec.nodes):
        (out,) = node.outputs.values()
        for port, t in node.inputs.items():
            if not t.is_virtual and tuple(t.dim) != tuple(out.dim):
                raise CompileFailed(
                    f"node {index} ({node.name or node.op}): input {port!r} ({t.label()}, dims {list(t.dim)}) is broadcast to "
                    f"{list(out.dim)} in a graph of pointwise ops only, which cuDNN computes wrongly (cudnn-frontend issue #107); "
                    "pass it at full size, or fuse the pointwise ops behind a matmul or convolution"
                )

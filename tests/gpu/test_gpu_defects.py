"""Known-defect refusals are exact: measured on this GPU, with the frontend
alone (no plancache in the path).

Pointwise-only graphs `relu(x) + b` (and `x * s` with a host scalar) are
built and run natively for several shapes of b; each is compared with
torch. A form plancache refuses on this backend version must compute wrong
here, and a form it builds must compute right: a refusal wider or narrower
than the defect fails, naming the form. Measurements go to
$PLANCACHE_TEST_GPU_OUT/defects.json for docs/gpu-runs/."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from plancache import GraphSpec
from plancache.errors import CompileFailed
from plancache.frontend_graph.defects import check_known_defects
from plancache.graphspec.validation import normalize
from plancache.keys.target import Target

pytestmark = pytest.mark.gpu
X = [4, 256, 512]
FORMS = {
    "b[1,1,512] (the measured defect)": [1, 1, 512],
    "b[1,256,512] (the first axis only)": [1, 256, 512],
    "b[4,1,512] (a middle axis)": [4, 1, 512],
    "b[1,1,1] (all axes)": [1, 1, 1],
    "b[4,256,512] (full size)": [4, 256, 512],
}
WRONG = 1e-1  # relative error past which a result is wrong (the defect measured 0.4-0.9)
RIGHT = 1e-2  # half precision, one add


def _native(frontend: Any, torch: Any, handle: Any, b_dims: list[int] | None) -> float:
    """rel err of relu(x) + b (or x * a host scalar when b_dims is None), built and run by the frontend alone."""
    half = frontend.data_type.HALF
    g = frontend.pygraph(
        io_data_type=half,
        intermediate_data_type=frontend.data_type.FLOAT,
        compute_data_type=frontend.data_type.FLOAT,
        handle=handle,
    )
    x = torch.randn(*X, device="cuda", dtype=torch.float16)
    tx = g.tensor_like(x)
    if b_dims is None:
        s = torch.full((1, 1, 1), 0.5, dtype=torch.float32)  # on the host: pass-by-value
        ts = g.tensor_like(s)
        y = g.scale(input=tx, scale=ts)
        expected, pack = x.float() * 0.5, {tx: x, ts: s}
    else:
        b = torch.randn(*b_dims, device="cuda", dtype=torch.float16)
        tb = g.tensor_like(b)
        y = g.bias(input=g.relu(input=tx), bias=tb)
        expected, pack = torch.relu(x.float()) + b.float(), {tx: x, tb: b}
    y.set_output(True)
    g.build([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
    out = torch.full(X, float("nan"), device="cuda", dtype=torch.float16)
    workspace = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
    g.execute({**pack, y: out}, workspace, handle=handle)
    torch.cuda.synchronize()
    return float((out.float() - expected).norm() / expected.norm())


def _refused(b_dims: list[int] | None, target: Target) -> bool:
    spec = GraphSpec(io_data_type="half")
    x = spec.tensor(X, name="x")
    if b_dims is None:
        spec.scale(x, spec.tensor([1, 1, 1], data_type="float", name="s", is_pass_by_value=True)).set_output(True)
    else:
        spec.bias(spec.relu(x), spec.tensor(b_dims, name="b")).set_output(True)
    try:
        check_known_defects(normalize(spec), target)
    except CompileFailed:
        return True
    return False


def test_the_pointwise_broadcast_refusal_is_the_measured_defect() -> None:
    import cudnn
    import torch

    from plancache.gpu.target import detect_target

    torch.manual_seed(0)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    target = detect_target()
    rows = []
    for name, dims in [*FORMS.items(), ("a host scalar s[1,1,1] (the frontend's own test)", None)]:
        errors = [_native(cudnn, torch, handle, dims) for _ in range(2)]
        rows.append({"form": name, "rel_err": errors, "refused": _refused(dims, target)})
    out = Path(os.environ.get("PLANCACHE_TEST_GPU_OUT", "/tmp"))
    (out / "defects.json").write_text(json.dumps({"cudnn": target.cudnn_version, "forms": rows}, indent=1))
    wrong_but_built = [r for r in rows if max(r["rel_err"]) > WRONG and not r["refused"]]
    right_but_refused = [r for r in rows if max(r["rel_err"]) < RIGHT and r["refused"]]
    assert not wrong_but_built and not right_but_refused, json.dumps(rows, indent=1)

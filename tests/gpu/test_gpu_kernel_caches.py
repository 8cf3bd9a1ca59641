"""A node's own builds of norm graphs from one kernel cache per layout
(plancache.frontend_graph.kernel_caches), on the GPU: every size's plan,
built through plancache.run.local.build_local as a hedged miss builds it,
computes torch's norm (the same bounds as tests/gpu/test_gpu_functional.py),
and the sizes shared one cache. How fast the later sizes build is
bench/scripts territory (scripts/dynamic_shapes_probe.py, GPU run 32)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu

SIZES = (8, 33, 100, 150)


def _run(request: Any, inputs: tuple[Any, ...]) -> Any:
    from plancache.functional._tensor_ops import TorchOps
    from plancache.gpu.target import detect_target
    from plancache.keys.query import PlanQuery
    from plancache.run.local import build_local

    plan = build_local(PlanQuery.of(request.spec, detect_target()))
    ops = TorchOps()
    outputs = [ops.allocator(o.shape, o.stride, o.dtype, 0)() for o in request.outputs]
    constants = [ops.constant(c, 0) for c in request.constants]
    # The plan's tensors are [N, C, 1, 1] views of torch's [N, C] ones (as plancache.functional binds them).
    # Same memory, the plan's dims and strides (a unit dim's stride is the plan's choice).
    built = {t.uid: (tuple(t.dim), tuple(t.stride)) for t in plan.metadata.tensors}
    tensors: dict[str | int, Any] = {
        uid: value.as_strided(*built[uid]) for uid, value in zip(request.inputs, inputs, strict=True)
    }
    tensors.update({o.uid: t.as_strided(*built[o.uid]) for o, t in zip(request.outputs, outputs, strict=True)})
    tensors.update({c.uid: t for c, t in zip(request.constants, constants, strict=True)})
    plan.execute(tensors)
    return outputs[0]


@pytest.mark.parametrize("function", ["rms_norm", "layer_norm"])
def test_a_nodes_own_norm_builds_share_a_kernel_cache_and_compute_torchs_norm(
    function: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import torch.nn.functional as F

    from plancache.frontend_graph import kernel_caches
    from plancache.functional._geometry import geo
    from plancache.functional._norms import layer_norm_request, rms_norm_request
    from plancache.run import local

    caches = kernel_caches.KernelCaches()
    monkeypatch.setattr(local, "KERNEL_CACHES", caches)
    hidden = 1024
    g = torch.Generator(device="cuda").manual_seed(5)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).to(torch.bfloat16)
    b = (0.1 * torch.randn(hidden, device="cuda", generator=g)).to(torch.bfloat16)
    for rows in SIZES:
        x = torch.randn(rows, hidden, device="cuda", generator=g).to(torch.bfloat16)
        if function == "rms_norm":
            request = rms_norm_request(geo("input", x), (hidden,), geo("weight", w), 1e-5)
            got, expected = _run(request, (x, w)), F.rms_norm(x.float(), (hidden,), w.float(), 1e-5)
        else:
            request = layer_norm_request(geo("input", x), (hidden,), geo("weight", w), geo("bias", b), 1e-5)
            got, expected = _run(request, (x, w, b)), F.layer_norm(x.float(), (hidden,), w.float(), b.float(), 1e-5)
        torch.cuda.synchronize()
        got = got.view(expected.shape)
        error = float((got.float() - expected).abs().max() / expected.abs().max())
        assert error < 1e-2, (function, rows, error)  # bfloat16 output of a float32 computation
    assert caches.builds == len(SIZES) and caches.caches_made == 1 and len(caches) == 1

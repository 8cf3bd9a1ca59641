"""Graph families and bucketing on a real GPU (issue 31), against the GPU
session's server and worker: a family the worker built serves each of its
sizes as a hit whose results equal torch's; bucketing (padding to the next
size) gives the unpadded result for linear rows, RMSNorm rows and a causal
SDPA's sequence, forward and backward."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.gpu.functional_helpers import _t, randn, rel_err

pytestmark = pytest.mark.gpu


def test_a_family_built_by_the_worker_serves_every_size_as_a_hit(pf: Any) -> None:
    from plancache.frontdoors.service import SERVICE
    from plancache.graphspec.family import derive

    torch = _t()
    pf.set_auto_buckets(False)  # each size its own graph here (a layer's rows are padded once they vary)
    w = randn(256, 128, dtype="bfloat16", scale=128**-0.5)
    recorded: list[Any] = []
    original = SERVICE.compile
    SERVICE.compile = lambda spec, *a, **k: recorded.append(spec) or original(spec, *a, **k)  # type: ignore[method-assign]
    try:
        for rows in (8, 17):
            pf.linear(randn(rows, 128, dtype="bfloat16"), w, activation="relu")
    finally:
        SERVICE.compile = original  # type: ignore[method-assign]
    family = derive(recorded[0], recorded[1], sizes={"d0": [3, 5, 9, 33]})
    client = SERVICE.client()
    status = client.admin.build_family(family, SERVICE.target_for(0), SERVICE.options)
    deadline = time.monotonic() + 240
    while not (status := client.admin.family_status(status.family_key)).complete:
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    for rows in (3, 5, 9, 33):
        x = randn(rows, 128, dtype="bfloat16")
        y = pf.linear(x, w, activation="relu")
        (geometry,) = [g for g in pf.geometries() if g.function == "linear" and g.key[1] == (rows, 128)]
        assert geometry.plan is not None and geometry.plan.source == "hit", geometry
        assert rel_err(y, torch.relu(x.float() @ w.float().T)) < 2e-2
    pf.set_auto_buckets(None)


def test_a_layers_varying_rows_run_at_auto_buckets_with_the_unpadded_result(pf: Any) -> None:
    """Without a policy, a layer that met three row counts runs each new one at its auto bucket (a multiple of
    16 below 256): values and gradients those of the unpadded call, the padded geometry a served plan."""
    torch = _t()
    pf.set_auto_buckets(True)
    w, b, g = randn(48, 80, dtype="bfloat16", scale=80**-0.5), randn(48, dtype="bfloat16"), randn(80, dtype="bfloat16")
    for rows in (7, 19, 40):  # the first two as they are; 40 -> 48
        x = randn(rows, 80, dtype="bfloat16")
        leaf = x.detach().clone().requires_grad_(True)
        y = pf.linear(leaf, w, b, activation="gelu")
        y.float().sum().backward()
        reference = x.detach().clone().requires_grad_(True)
        want = torch.nn.functional.gelu(torch.nn.functional.linear(reference.float(), w.float(), b.float()))
        want.sum().backward()
        assert y.shape == (rows, 48) and rel_err(y, want) < 2e-2
        assert leaf.grad is not None and reference.grad is not None and rel_err(leaf.grad, reference.grad) < 2e-2
        normed = pf.rms_norm(x, (80,), g, 1e-5)
        assert rel_err(normed, torch.nn.functional.rms_norm(x.float(), (80,), g.float(), 1e-5)) < 2e-2
    torch.cuda.synchronize()
    # This layer's geometries alone (80 input features): the process's earlier tests left theirs (GPU run 37).
    linear_rows = sorted(
        int(geo.key[1][0]) for geo in pf.geometries() if geo.function == "linear" and geo.key[1][1:] == (80,)
    )
    assert linear_rows == [7, 19, 48], linear_rows
    padded = [geo for geo in pf.geometries() if geo.function == "linear" and geo.key[1] == (48, 80)]
    assert padded[0].plan is not None  # a served plan at the bucket
    assert pf.bucket_stats().auto_layers >= 1
    pf.set_auto_buckets(None)


def test_bucketing_gives_the_unpadded_result_forward_and_backward(pf: Any) -> None:
    torch = _t()
    w, b, g = randn(64, 96, dtype="bfloat16", scale=96**-0.5), randn(64, dtype="bfloat16"), randn(96, dtype="bfloat16")
    x = randn(2, 11, 96, dtype="bfloat16")
    q, k, v = (randn(1, 4, 37, 64, dtype="bfloat16") for _ in range(3))
    expected = {
        "linear": pf.linear(x, w, b, activation="gelu"),
        "rms_norm": pf.rms_norm(x, (96,), g, 1e-5),
        "sdpa": pf.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    leaf = x.detach().clone().requires_grad_(True)
    pf.linear(leaf, w, b, activation="gelu").float().sum().backward()
    pf.set_buckets([16, 32, 64])
    try:
        got = {
            "linear": pf.linear(x, w, b, activation="gelu"),
            "rms_norm": pf.rms_norm(x, (96,), g, 1e-5),
            "sdpa": pf.scaled_dot_product_attention(q, k, v, is_causal=True),
        }
        padded_leaf = x.detach().clone().requires_grad_(True)
        pf.linear(padded_leaf, w, b, activation="gelu").float().sum().backward()
        stats = pf.bucket_stats()
    finally:
        pf.set_buckets(None)
    torch.cuda.synchronize()
    for name, want in expected.items():
        assert got[name].shape == want.shape and rel_err(got[name], want) < 1e-2, name
    assert padded_leaf.grad is not None and leaf.grad is not None and rel_err(padded_leaf.grad, leaf.grad) < 1e-2
    assert stats.padded_calls >= 4 and 0 < stats.waste < 1  # 22 rows -> 32, 37 keys -> 64
    padded = [g for g in pf.geometries() if g.function == "scaled_dot_product_attention" and g.key[1] == (1, 4, 64, 64)]
    assert padded and padded[0].plan is not None  # the padded call ran a served plan at the bucket's length

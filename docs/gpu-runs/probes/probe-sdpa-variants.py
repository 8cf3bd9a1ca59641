#!/usr/bin/env python3
"""Which SDPA and FP8 variants the cuDNN frontend builds and runs on this GPU
(issue 16), straight through the frontend (no plancache): for each variant,
build (heuristic modes A and FALLBACK), execute plan 0 and compare with a
torch reference where one exists. One JSON line per variant, then a summary
to $OUT/sdpa_variants.json. Run on a GPU machine:
`source scripts/gpu-env.sh && python3 docs/gpu-runs/probes/probe-sdpa-variants.py`.

A refusal is recorded with cuDNN's reason: it is a finding, not a failure.
"""

# Graph tensors are named as in the frontend and the papers (Q, K, V, O, scales).
# ruff: noqa: N806, E741

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import cudnn
import torch

torch.manual_seed(0)
HANDLE = cudnn.create_handle()
cudnn.set_stream(HANDLE, torch.cuda.current_stream().cuda_stream)
BF16, F32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT


def graph(io: Any = BF16) -> Any:
    return cudnn.pygraph(handle=HANDLE, io_data_type=io, intermediate_data_type=F32, compute_data_type=F32)


def run(g: Any, pack: dict[int, torch.Tensor]) -> int:
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
    ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
    g.execute(pack, ws, handle=HANDLE)
    torch.cuda.synchronize()
    return int(g.get_execution_plan_count())


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.float(), expected.float()
    return float((a - e).norm() / max(e.norm(), 1e-6))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.float()
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], device=s.device, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.float()


def paged_decode() -> dict[str, Any]:
    b, h, d, page, max_kv = 4, 8, 128, 64, 512
    pages_per_seq = max_kv // page
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
    num_pages = b * pages_per_seq
    kc = torch.randn(num_pages, h, page, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(num_pages, device="cuda", dtype=torch.int32).reshape(b, 1, pages_per_seq, 1)
    seq_kv = torch.randint(1, max_kv + 1, (b, 1, 1, 1), device="cuda", dtype=torch.int32)
    seq_q = torch.ones(b, 1, 1, 1, device="cuda", dtype=torch.int32)
    o = torch.empty_like(q)
    scale = 1 / math.sqrt(d)
    g = graph()
    Q, K, V = g.tensor_like(q).set_uid(1), g.tensor_like(kc).set_uid(2), g.tensor_like(vc).set_uid(3)
    TK, TV = g.tensor_like(table).set_uid(4), g.tensor_like(table.clone()).set_uid(5)
    SQ, SK = g.tensor_like(seq_q).set_uid(6), g.tensor_like(seq_kv).set_uid(7)
    O, _ = g.sdpa(
        q=Q,
        k=K,
        v=V,
        attn_scale=scale,
        generate_stats=False,
        use_padding_mask=True,
        seq_len_q=SQ,
        seq_len_kv=SK,
        paged_attention_k_table=TK,
        paged_attention_v_table=TV,
        paged_attention_max_seq_len_kv=max_kv,
    )
    O.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride())).set_uid(8)
    plans = run(g, {1: q, 2: kc, 3: vc, 4: table, 5: table, 6: seq_q, 7: seq_kv, 8: o})
    err = 0.0
    for i in range(b):
        pages = table[i, 0, :, 0].long()
        k_i = kc[pages].permute(1, 0, 2, 3).reshape(h, pages_per_seq * page, d)[:, : int(seq_kv[i])]
        v_i = vc[pages].permute(1, 0, 2, 3).reshape(h, pages_per_seq * page, d)[:, : int(seq_kv[i])]
        err = max(err, rel_err(o[i], attention(q[i], k_i, v_i, scale)))
    return {"plans": plans, "rel_err": err}


def bias_and_alibi(alibi: bool) -> dict[str, Any]:
    b, h, s, d = 2, 4, 128, 64
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, h, s, s, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(q)
    scale = 1 / math.sqrt(d)
    g = graph()
    Q, K, V = g.tensor_like(q).set_uid(1), g.tensor_like(k).set_uid(2), g.tensor_like(v).set_uid(3)
    pack = {1: q, 2: k, 3: v}
    if alibi:
        O, _ = g.sdpa(q=Q, k=K, v=V, attn_scale=scale, generate_stats=False, use_alibi_mask=True, use_causal_mask=True)
    else:
        B = g.tensor_like(bias).set_uid(4)
        pack[4] = bias
        O, _ = g.sdpa(q=Q, k=K, v=V, attn_scale=scale, generate_stats=False, bias=B)
    O.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride())).set_uid(9)
    pack[9] = o
    plans = run(g, pack)
    if alibi:  # ALiBi slopes 2^(-8 i / H) for head i = 1..H; a penalty growing with distance, causal
        slopes = torch.tensor([2 ** (-8 * (i + 1) / h) for i in range(h)], device="cuda").view(1, h, 1, 1)
        pos = torch.arange(s, device="cuda")
        ref_bias = slopes * (pos.view(1, 1, 1, s) - pos.view(1, 1, s, 1)).float()
        expected = attention(q, k, v, scale, ref_bias, causal=True)
    else:
        expected = attention(q, k, v, scale, bias)
    return {"plans": plans, "rel_err": rel_err(o, expected)}


def dropout() -> dict[str, Any]:
    b, h, s, d = 2, 4, 128, 64
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    seed = torch.full((1, 1, 1, 1), 123456, dtype=torch.int64, device="cuda")
    offset = torch.full((1, 1, 1, 1), 1, dtype=torch.int64, device="cuda")
    o = torch.empty_like(q)
    g = graph()
    Q, K, V = g.tensor_like(q).set_uid(1), g.tensor_like(k).set_uid(2), g.tensor_like(v).set_uid(3)
    S, OF = g.tensor_like(seed).set_uid(4), g.tensor_like(offset).set_uid(5)
    O, _ = g.sdpa(q=Q, k=K, v=V, attn_scale=1 / math.sqrt(d), generate_stats=False, dropout=(0.1, S, OF))
    O.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride())).set_uid(9)
    plans = run(g, {1: q, 2: k, 3: v, 4: seed, 5: offset, 9: o})
    # No elementwise reference (cuDNN's RNG); the mean of O over the dropped and
    # rescaled probabilities stays close to the undropped one.
    expected = attention(q, k, v, 1 / math.sqrt(d))
    return {"plans": plans, "mean_rel_diff": float((o.float().mean() - expected.mean()).abs() / expected.abs().mean())}


def ragged_prefill() -> dict[str, Any]:
    lengths = [100, 37, 256, 19]
    b, h, d, s_max = len(lengths), 4, 64, 256
    total = sum(lengths)
    packed = [torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    o_packed = torch.zeros(total, h, d, device="cuda", dtype=torch.bfloat16)
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    offsets = (starts * h * d).reshape(b + 1, 1, 1, 1)  # element offsets of each sequence (THD)
    seq = torch.tensor(lengths, dtype=torch.int32, device="cuda").reshape(b, 1, 1, 1)

    def as_bhsd(t: torch.Tensor) -> torch.Tensor:  # dims (b, h, s_max, d) over the packed buffer; strides of THD
        return torch.as_strided(t, (b, h, s_max, d), (0, d, h * d, 1))

    g = graph()
    ragged = g.tensor_like(offsets).set_uid(10)
    ts = []
    for uid, t in zip((1, 2, 3), packed, strict=True):
        view = as_bhsd(t)
        ts.append(
            g.tensor(name=f"t{uid}", dim=list(view.shape), stride=[s_max * h * d, d, h * d, 1], data_type=BF16)
            .set_uid(uid)
            .set_ragged_offset(ragged)
        )
    SQ, SK = g.tensor_like(seq).set_uid(11), g.tensor_like(seq.clone()).set_uid(12)
    O, _ = g.sdpa(
        q=ts[0],
        k=ts[1],
        v=ts[2],
        attn_scale=1 / math.sqrt(d),
        generate_stats=False,
        use_causal_mask=True,
        use_padding_mask=True,
        seq_len_q=SQ,
        seq_len_kv=SK,
    )
    O.set_output(True).set_dim([b, h, s_max, d]).set_stride([s_max * h * d, d, h * d, 1]).set_uid(4).set_ragged_offset(
        ragged
    )
    plans = run(g, {1: packed[0], 2: packed[1], 3: packed[2], 4: o_packed, 10: offsets, 11: seq, 12: seq})
    err = 0.0
    for i, n in enumerate(lengths):
        sl = slice(int(starts[i]), int(starts[i]) + n)
        q_i, k_i, v_i = (t[sl].permute(1, 0, 2) for t in packed)
        err = max(err, rel_err(o_packed[sl].permute(1, 0, 2), attention(q_i, k_i, v_i, 1 / math.sqrt(d), causal=True)))
    return {"plans": plans, "rel_err": err}


def fp8_sdpa() -> dict[str, Any]:
    b, h, s, d = 2, 4, 256, 128
    real = [torch.randn(b, h, s, d, device="cuda") for _ in range(3)]
    fp8 = [t.to(torch.float8_e4m3fn) for t in real]
    one = torch.ones(1, 1, 1, 1, device="cuda")
    o = torch.empty(b, h, s, d, device="cuda", dtype=torch.float8_e4m3fn)
    amax_s, amax_o = torch.zeros(1, 1, 1, 1, device="cuda"), torch.zeros(1, 1, 1, 1, device="cuda")
    g = graph(cudnn.data_type.FP8_E4M3)
    Q, K, V = (
        g.tensor(name=n, dim=[b, h, s, d], stride=list(fp8[0].stride()), data_type=cudnn.data_type.FP8_E4M3).set_uid(u)
        for n, u in (("q", 1), ("k", 2), ("v", 3))
    )
    sc = [g.tensor_like(one.clone()).set_uid(10 + i) for i in range(6)]
    O, _, AS, AO = g.sdpa_fp8(
        q=Q,
        k=K,
        v=V,
        descale_q=sc[0],
        descale_k=sc[1],
        descale_v=sc[2],
        descale_s=sc[3],
        scale_s=sc[4],
        scale_o=sc[5],
        attn_scale=1 / math.sqrt(d),
        generate_stats=False,
        use_causal_mask=True,
    )
    O.set_output(True).set_dim([b, h, s, d]).set_stride(list(o.stride())).set_uid(20).set_data_type(
        cudnn.data_type.FP8_E4M3
    )
    AS.set_output(True).set_uid(21).set_data_type(F32)
    AO.set_output(True).set_uid(22).set_data_type(F32)
    pack = {1: fp8[0], 2: fp8[1], 3: fp8[2], 20: o, 21: amax_s, 22: amax_o, **{10 + i: one.clone() for i in range(6)}}
    plans = run(g, pack)
    expected = attention(*(t.float() for t in fp8), 1 / math.sqrt(d), causal=True)
    return {
        "plans": plans,
        "rel_err": rel_err(o.float(), expected),
        "amax_o": float(amax_o),
        "amax_o_expected": float(expected.abs().max()),
    }


def fp8_matmul() -> dict[str, Any]:
    m = n = k = 1024
    a = (torch.randn(1, m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    bt = (torch.randn(1, n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    b = bt.transpose(1, 2)  # column-major B, as FP8 GEMMs want
    sa, sb = torch.full((1, 1, 1), 0.5, device="cuda"), torch.full((1, 1, 1), 2.0, device="cuda")
    c = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
    g = graph(cudnn.data_type.FP8_E4M3)
    A = g.tensor(name="A", dim=[1, m, k], stride=list(a.stride()), data_type=cudnn.data_type.FP8_E4M3).set_uid(1)
    B = g.tensor(name="B", dim=[1, k, n], stride=list(b.stride()), data_type=cudnn.data_type.FP8_E4M3).set_uid(2)
    SA, SB = g.tensor_like(sa).set_uid(3), g.tensor_like(sb).set_uid(4)
    prod = g.matmul(A=A, B=B, compute_data_type=F32)
    prod.set_data_type(F32)
    C = g.mul(a=g.mul(a=prod, b=SA), b=SB)
    C.set_output(True).set_data_type(BF16).set_uid(5)
    plans = run(g, {1: a, 2: b, 3: sa, 4: sb, 5: c})
    expected = (a.float() @ b.float()) * 0.5 * 2.0
    return {"plans": plans, "rel_err": rel_err(c, expected)}


VARIANTS: dict[str, Callable[[], dict[str, Any]]] = {
    "paged_decode_bf16": paged_decode,
    "bias_bf16": lambda: bias_and_alibi(False),
    "alibi_causal_bf16": lambda: bias_and_alibi(True),
    "dropout_bf16": dropout,
    "ragged_prefill_causal_bf16": ragged_prefill,
    "sdpa_fp8_e4m3": fp8_sdpa,
    "matmul_fp8_e4m3_scaled_bf16_out": fp8_matmul,
}


def main() -> None:
    results = {}
    for name, fn in VARIANTS.items():
        try:
            results[name] = {"status": "ran", **fn()}
        except Exception as e:  # a refusal or a failure: its reason is the finding
            results[name] = {
                "status": "refused or failed",
                "error": f"{type(e).__name__}: {str(e)[:600]}",
                "traceback": traceback.format_exc()[-1500:],
            }
        print(json.dumps({"variant": name, **{k: v for k, v in results[name].items() if k != "traceback"}}), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "sdpa_variants.json"), "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(0),
                    "cudnn": cudnn.backend_version(),
                    "frontend": cudnn.__version__,
                    "variants": results,
                },
                f,
                indent=1,
            )
    sys.exit(0)


if __name__ == "__main__":
    main()

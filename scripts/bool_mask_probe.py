"""Probe (GPU): what torch's own attention gives a query that sees no key, per SDPA backend, against
plancache's boolean-mask conversion (plancache.functional._attention.boolean_mask_as_bias) run through torch's
float-bias attention. Prints JSON lines; `python scripts/bool_mask_probe.py > OUT`."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from plancache.functional._attention import boolean_mask_as_bias


def summary(t: torch.Tensor) -> dict[str, object]:
    return {"nan": int(t.isnan().sum()), "nonzero": int((t != 0).sum()), "absmax": float(t.nan_to_num().abs().max())}


def main() -> None:
    torch.manual_seed(0)
    b, h, s, d = 2, 8, 128, 64
    mask = torch.ones(s, s, dtype=torch.bool, device="cuda").tril().expand(b, 1, s, s).clone()
    mask[1, :, :, :16] = False
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        bias, unattended = boolean_mask_as_bias(mask, q, k)
        ours = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).masked_fill(unattended, 0.0)
        rows = {
            "default": None,
            "math": SDPBackend.MATH,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
        }
        for name, backend in rows.items():
            try:
                if backend is None:
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                else:
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                g = torch.autograd.grad(out.float().sum(), (q, k, v))
                diff = (out[1, :, 16:].float() - ours[1, :, 16:].float()).abs().max().item()
                print(
                    json.dumps(
                        {
                            "dtype": str(dtype),
                            "backend": name,
                            "unseen_rows": summary(out[1, :, :16]),
                            "seen_rows_maxdiff_vs_ours": diff,
                            "grad_nan": [int(x.isnan().sum()) for x in g],
                            "ours_unseen": summary(ours[1, :, :16]),
                        }
                    ),
                    flush=True,
                )
            except Exception as e:  # a backend that refuses this call
                print(json.dumps({"dtype": str(dtype), "backend": name, "error": f"{type(e).__name__}: {e}"[:300]}))


if __name__ == "__main__":
    main()

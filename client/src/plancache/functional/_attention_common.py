"""What scaled_dot_product_attention and paged_decode_attention share: lengths as SDPA ports, attention in torch.

cuDNN's SDPA node takes per-sequence lengths as [b, 1, 1, 1] int32 ports
(padding, a paged cache's sequence lengths); both operators' torch
fallbacks end in the same attention written out in float32 with a mask of
the keys each query may see (plancache.functional._attention's options
torch lacks, _paged_decode's gathered pages).
"""

from __future__ import annotations

import math
from typing import Any

from plancache.errors import InvalidRequest
from plancache.functional._geometry import Geo, Unserved, is_dense
from plancache.functional._requests import Constant
from plancache.functional._tensor_ops import torch_module
from plancache.graphspec.graph import GraphSpec, Tensor


def length_port(
    g: GraphSpec, lengths: Geo | None, batch: int, full: int, name: str, uid: int
) -> tuple[Tensor, Constant | None]:
    """Per-sequence lengths as cuDNN takes them ([b, 1, 1, 1] int32); a
    missing side is the full length, a constant."""
    if lengths is not None:
        if lengths.shape not in ((batch,), (batch, 1, 1, 1)):
            raise InvalidRequest(f"{name} must have dims ({batch},) (one length per sequence), got {lengths.shape}")
        if lengths.dtype != "int32":
            raise Unserved(f"{name} is {lengths.dtype_text}: cuDNN takes int32 lengths")
        if not is_dense(lengths):
            raise Unserved(f"{name} is not contiguous")
    t = g.tensor([batch, 1, 1, 1], data_type="int32", name=name, uid=uid)
    return t, (Constant(uid, (batch, 1, 1, 1), float(full), "int32") if lengths is None else None)


def masked_attention(
    q: Any, k: Any, v: Any, allowed: Any, bias: Any, scale: float | None, dropout_p: float, enable_gqa: bool
) -> Any:
    """softmax(q k^T scale + bias, where allowed) v in float32, cast back to q's dtype."""
    torch = torch_module()
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    scores = (
        torch.matmul(q.float(), k.float().transpose(-1, -2))
        * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        + bias
    )
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    if dropout_p:
        weights = torch.nn.functional.dropout(weights, dropout_p)
    return torch.matmul(weights, v.float()).to(q.dtype)

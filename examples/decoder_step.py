"""One decode step of a small transformer, written with plancache.functional.

    make run                                            # a local server (another shell)
    python examples/decoder_step.py --server 127.0.0.1:50051

A few layers with random weights, each: RMSNorm, the QKV projection (one
linear), the new token's key and value written into a paged KV cache,
grouped-query decode attention over the cache (paged_decode_attention),
the output projection, RMSNorm and an MLP (linear with a fused SiLU, then
linear); the batch's sequences have different lengths and their pages lie
shuffled in one pool. The same model runs in torch eager on a copy of the
cache, and the step's outputs are compared: the max relative error
(max |ours - torch| / max |torch|) is printed, and the program exits 1 past
the tolerance of its dtype (TOLERANCE), or with --require-cudnn when a call
ran torch's own function instead of a plan.

The first run compiles each geometry's plan on the server's GPU worker (a
few seconds each, the heuristic plan first); a second run gets them from
the client's disk cache. The client trusts the key of a `make run` server
(<data dir>/keys/plan-signing.pub.pem) unless --trusted-key or
PLANCACHE_TRUSTED_KEYS says otherwise.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client" / "src"))

# Relative error allowed against torch eager in the same dtype (after LAYERS
# layers of rounding in both): bfloat16 keeps 8 mantissa bits, float16 11.
TOLERANCE = {"bfloat16": 3e-2, "float16": 1e-2}


@dataclass(frozen=True)
class Config:
    layers: int = 4
    hidden: int = 1024
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 64
    mlp: int = 2816
    batch: int = 8
    page_size: int = 64
    pages_per_seq: int = 16  # up to 1,024 tokens a sequence
    eps: float = 1e-5


@dataclass
class Model:
    config: Config
    layers: list[dict[str, Any]]
    final_norm: Any


@dataclass
class Cache:
    """Keys and values of every layer in one pool of pages each, a page table
    per sequence (its pages, shuffled through the pool) and the lengths."""

    k: list[Any]
    v: list[Any]
    page_table: Any
    lengths: Any  # tokens held before this step, int32 [batch]
    extra: dict[str, Any] = field(default_factory=dict)

    def clone(self) -> Cache:
        return Cache(
            [t.clone() for t in self.k], [t.clone() for t in self.v], self.page_table.clone(), self.lengths.clone()
        )


def build(config: Config, dtype: Any, device: Any, seed: int = 0) -> tuple[Model, Cache, Any]:
    """Random weights (scaled so activations stay near unit size), a cache
    of random past tokens, and the step's input hidden states."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    c = config

    def weight(out: int, inp: int) -> Any:
        return (torch.randn(out, inp, generator=g) / math.sqrt(inp)).to(device=device, dtype=dtype)

    def norm() -> Any:
        return (1 + 0.1 * torch.randn(c.hidden, generator=g)).to(device=device, dtype=dtype)

    qkv = (c.heads + 2 * c.kv_heads) * c.head_dim
    layers = [
        {
            "attn_norm": norm(),
            "wqkv": weight(qkv, c.hidden),
            "wo": weight(c.hidden, c.heads * c.head_dim),
            "mlp_norm": norm(),
            "w_up": weight(c.mlp, c.hidden),
            "w_down": weight(c.hidden, c.mlp),
        }
        for _ in range(c.layers)
    ]
    pages = c.batch * c.pages_per_seq
    pool = (pages, c.kv_heads, c.page_size, c.head_dim)
    k = [torch.randn(pool, generator=g).to(device=device, dtype=dtype) for _ in range(c.layers)]
    v = [torch.randn(pool, generator=g).to(device=device, dtype=dtype) for _ in range(c.layers)]
    table = torch.randperm(pages, generator=g).to(torch.int32).view(c.batch, c.pages_per_seq).to(device)
    capacity = c.pages_per_seq * c.page_size
    lengths = (
        torch.linspace(1, capacity - 1, c.batch).round().to(torch.int32).to(device)
    )  # one token short of a page edge, a full table ...
    x = torch.randn(c.batch, c.hidden, generator=g).to(device=device, dtype=dtype)
    return Model(config, layers, norm()), Cache(k, v, table, lengths), x


def decode_step(model: Model, cache: Cache, x: Any, ops: Any) -> Any:
    """The step: every layer on the new token of each sequence; the new
    keys and values are written into the cache (in place)."""
    c = model.config
    b = x.shape[0]
    lengths = cache.lengths + 1  # the new token is attended to
    position = cache.lengths.long()
    page = cache.page_table.gather(1, (position // c.page_size).view(b, 1)).view(b).long()
    slot = position % c.page_size
    for layer, k_pool, v_pool in zip(model.layers, cache.k, cache.v, strict=True):
        h = ops.rms_norm(x, (c.hidden,), layer["attn_norm"], eps=c.eps)
        qkv = ops.linear(h, layer["wqkv"])
        q, k, v = qkv.split([c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], dim=-1)
        k_pool[page, :, slot] = k.reshape(b, c.kv_heads, c.head_dim)
        v_pool[page, :, slot] = v.reshape(b, c.kv_heads, c.head_dim)
        attn = ops.paged_decode_attention(q.view(b, c.heads, 1, c.head_dim), k_pool, v_pool, cache.page_table, lengths)
        x = x + ops.linear(attn.reshape(b, c.heads * c.head_dim), layer["wo"])
        h = ops.rms_norm(x, (c.hidden,), layer["mlp_norm"], eps=c.eps)
        x = x + ops.linear(ops.linear(h, layer["w_up"], activation="silu"), layer["w_down"])
    return ops.rms_norm(x, (c.hidden,), model.final_norm, eps=c.eps)


def torch_ops() -> Any:
    """The same functions in torch eager: F.linear (+ SiLU), F.rms_norm, and
    decode attention over the gathered pages with F.scaled_dot_product_attention."""
    import torch
    import torch.nn.functional as F

    def linear(x: Any, w: Any, bias: Any = None, *, activation: str | None = None) -> Any:
        y = F.linear(x, w, bias)
        return F.silu(y) if activation == "silu" else y

    def paged_decode_attention(q: Any, k_pool: Any, v_pool: Any, table: Any, lengths: Any) -> Any:
        b, heads, _, d = q.shape
        kv_heads = k_pool.shape[1]
        keys = k_pool[table.long()].permute(0, 2, 1, 3, 4).reshape(b, kv_heads, -1, d)
        values = v_pool[table.long()].permute(0, 2, 1, 3, 4).reshape(b, kv_heads, -1, d)
        visible = (torch.arange(keys.shape[2], device=q.device).view(1, -1) < lengths.view(-1, 1).long()).view(
            b, 1, 1, -1
        )
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, enable_gqa=heads != kv_heads)

    return SimpleNamespace(linear=linear, rms_norm=F.rms_norm, paged_decode_attention=paged_decode_attention)


def functional_ops() -> Any:
    import plancache.functional as pf

    return SimpleNamespace(linear=pf.linear, rms_norm=pf.rms_norm, paged_decode_attention=pf.paged_decode_attention)


def relative_error(ours: Any, reference: Any) -> float:
    diff = (ours.float() - reference.float()).abs().max()
    return float(diff / reference.float().abs().max().clamp_min(1e-30))


def default_trusted_keys() -> list[str]:
    if os.environ.get("PLANCACHE_TRUSTED_KEYS"):
        return []  # the client reads them itself
    base = Path(
        os.environ.get("PLANCACHE_DATA_DIR")
        or Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "plancache"
    )
    key = base / "keys" / "plan-signing.pub.pem"
    return [str(key)] if key.exists() else []


def compare(model: Model, cache: Cache, x: Any, step: Callable[..., Any] = decode_step) -> dict[str, Any]:
    """Run the step both ways on copies of the cache; the errors of the
    output and of the cache the step wrote."""
    torch_cache, ours_cache = cache.clone(), cache.clone()
    expected = step(model, torch_cache, x, torch_ops())
    got = step(model, ours_cache, x, functional_ops())
    cache_error = max(
        relative_error(a, b) for a, b in zip(ours_cache.k + ours_cache.v, torch_cache.k + torch_cache.v, strict=True)
    )
    return {"output": got, "expected": expected, "rel_err": relative_error(got, expected), "cache_rel_err": cache_error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        default=os.environ.get("PLANCACHE_SERVER", "127.0.0.1:50051"),
        help="host:port of plancache-server (env PLANCACHE_SERVER)",
    )
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="bfloat16")
    parser.add_argument("--layers", type=int, default=Config.layers)
    parser.add_argument("--batch", type=int, default=Config.batch)
    parser.add_argument(
        "--trusted-key", action="append", default=None, help="public key (PEM) plans must be signed with; repeatable"
    )
    parser.add_argument(
        "--require-cudnn",
        action="store_true",
        help="exit 1 when a call ran torch's function instead of a plancache plan",
    )
    args = parser.parse_args(argv)

    import torch

    import plancache.functional as pf
    from plancache import Client

    if not torch.cuda.is_available():
        print("decoder_step: needs a CUDA GPU", file=sys.stderr)
        return 2
    pf.configure(Client(args.server, trusted_keys=args.trusted_key or default_trusted_keys()))
    config = Config(layers=args.layers, batch=args.batch)
    dtype = getattr(torch, args.dtype)
    model, cache, x = build(config, dtype, torch.device("cuda"))
    with torch.inference_mode():
        result = compare(model, cache, x)
    counts = pf.stats()
    tolerance = TOLERANCE[args.dtype]
    print(
        f"decoder step: {config.layers} layers, batch {config.batch}, hidden {config.hidden}, {config.heads} heads ({config.kv_heads} kv), {args.dtype}"
    )
    for name, s in sorted(counts.items()):
        print(
            f"  {name:24s} cudnn calls {s.cudnn:3d}  torch calls {s.torch:3d}"
            + (f"  (torch: {'; '.join(s.reasons)})" if s.reasons else "")
        )
    print(
        f"max rel error vs torch eager: {result['rel_err']:.2e} (tolerance {tolerance:g}); the cache it wrote: {result['cache_rel_err']:.2e}"
    )
    failed = result["rel_err"] > tolerance or result["cache_rel_err"] > tolerance
    if args.require_cudnn and any(s.torch for s in counts.values()):
        print("decoder_step: some calls ran torch's own function (--require-cudnn)", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

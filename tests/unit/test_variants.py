"""The attention and precision variants are validated before any GPU work:
page tables, lengths, bias dims, ALiBi's mask and FP8 scales, each refusal
naming the tensor or attribute (GPU numerics: tests/gpu, docs/gpu-runs/)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from plancache import SpecError, spec_io
from plancache.validation import normalize
from tests.support.processes import REPO


def example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO / "examples" / f"{name}.json").read_text())
    return data


def tensor(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(t for t in spec["tensors"] if t.get("name") == name)
    return found


def attrs(spec: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = spec["nodes"][0].setdefault("attributes", {})
    return found


def refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        normalize(spec_io.from_dict(spec))


def test_the_variant_examples_normalize() -> None:
    for name in ("sdpa_paged_decode_bf16", "sdpa_bias_bf16", "sdpa_alibi_bf16", "sdpa_fp8_causal", "matmul_fp8_scaled_bf16"):
        normalize(spec_io.from_dict(example(name)))


PAGED_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("a page table of another batch", lambda s: tensor(s, "k_page_table").update(dim=[4, 1, 16, 1]), r"'paged_attention_k_table' must have dims \[8, 1, pages per sequence, 1\]"),
    ("too few pages for the longest sequence", lambda s: [tensor(s, n).update(dim=[8, 1, 8, 1]) for n in ("k_page_table", "v_page_table")],
     r"8 pages of 64 tokens hold fewer than paged_attention_max_seq_len_kv = 1024"),
    ("a float page table", lambda s: tensor(s, "v_page_table").update(data_type="float"), r"'paged_attention_v_table' must have an integer data type"),
    ("no maximum length", lambda s: attrs(s).pop("paged_attention_max_seq_len_kv"), "needs paged_attention_max_seq_len_kv"),
    ("no padding mask", lambda s: attrs(s).update(use_padding_mask=False), "needs use_padding_mask"),
    ("one table only", lambda s: s["nodes"][0]["inputs"].pop("paged_attention_v_table") and s["tensors"].remove(tensor(s, "v_page_table")),
     "needs both paged_attention_k_table and paged_attention_v_table"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "damage", "message"), PAGED_CASES, ids=[c[0] for c in PAGED_CASES])
def test_a_bad_paged_kv_cache_is_refused(what: str, damage: Callable[[dict[str, Any]], None], message: str) -> None:
    spec = example("sdpa_paged_decode_bf16")
    damage(spec)
    refused(spec, message)


def test_a_bias_of_the_wrong_shape_and_alibi_without_causal_are_refused() -> None:
    spec = example("sdpa_bias_bf16")
    tensor(spec, "bias").update(dim=[1, 8, 256, 128])
    refused(spec, r"input 'bias' must have dims \[1 or 2, 1 or 8, 256, 256\]")
    spec = example("sdpa_alibi_bf16")
    attrs(spec).update(use_causal_mask=False)
    refused(spec, "use_alibi_mask needs use_causal_mask")
    spec = example("sdpa_causal_fp16")
    attrs(spec).update(paged_attention_max_seq_len_kv=512)
    refused(spec, "paged_attention_max_seq_len_kv is for a paged KV cache")


def test_fp8_attention_scales_must_be_one_per_tensor() -> None:
    spec = example("sdpa_fp8_causal")
    tensor(spec, "scale_s").update(dim=[1, 4, 1, 1])
    refused(spec, r"input 'scale_s' must have dims \[1, 1, 1, 1\]")

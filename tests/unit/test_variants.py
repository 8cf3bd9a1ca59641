"""The attention and precision variants are validated before any GPU work:
page tables, lengths, bias dims, ALiBi's mask, FP8 scales, ragged offsets,
dropout's seed and offset and the bias gradient, each refusal naming the
tensor or attribute (GPU numerics: tests/gpu, docs/gpu-runs/)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from plancache import SpecError
from plancache.graphspec import spec_io
from plancache.graphspec.validation import normalize
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


VARIANT_EXAMPLES = (
    "sdpa_paged_decode_bf16",
    "sdpa_bias_bf16",
    "sdpa_alibi_bf16",
    "sdpa_fp8_causal",
    "matmul_fp8_scaled_bf16",
    "sdpa_ragged_prefill_bf16",
    "sdpa_backward_ragged_bf16",
    "sdpa_dropout_bf16",
    "sdpa_backward_dropout_bf16",
    "sdpa_backward_bias_bf16",
    "sdpa_fp8_paged_decode",
    "matmul_fp8_bias_gelu_amax_bf16",
    "matmul_fp8_bias_relu_fp16",
    "sdpa_paged_chunk_causal_bf16",
)


def test_the_variant_examples_normalize() -> None:
    for name in VARIANT_EXAMPLES:
        normalize(spec_io.from_dict(example(name)))


PAGED_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "a page table of another batch",
        lambda s: tensor(s, "k_page_table").update(dim=[4, 1, 16, 1]),
        r"'paged_attention_k_table' must have dims \[8, 1, pages per sequence, 1\]",
    ),
    (
        "too few pages for the longest sequence",
        lambda s: [tensor(s, n).update(dim=[8, 1, 8, 1]) for n in ("k_page_table", "v_page_table")],
        r"8 pages of 64 tokens hold fewer than paged_attention_max_seq_len_kv = 1024",
    ),
    (
        "a float page table",
        lambda s: tensor(s, "v_page_table").update(data_type="float"),
        r"'paged_attention_v_table' must have an integer data type",
    ),
    (
        "a zero maximum length",
        lambda s: attrs(s).update(paged_attention_max_seq_len_kv=0),
        "paged_attention_max_seq_len_kv must be a positive",
    ),
    (
        "one table only",
        lambda s: (
            s["nodes"][0]["inputs"].pop("paged_attention_v_table") and s["tensors"].remove(tensor(s, "v_page_table"))
        ),
        "needs both paged_attention_k_table and paged_attention_v_table",
    ),
]


def test_a_paged_cache_the_frontend_takes_is_taken() -> None:
    """Without its longest length ("optional, but recommended") or without the
    padding mask (test_flexible_sdpa masks in a score modifier), as the frontend."""
    for damage in (
        lambda s: attrs(s).pop("paged_attention_max_seq_len_kv"),
        lambda s: attrs(s).update(use_padding_mask=False),
    ):
        spec = example("sdpa_paged_decode_bf16")
        damage(spec)
        normalize(spec_io.from_dict(spec))


def test_a_side_result_the_program_leaves_unused_stays_in_its_graph() -> None:
    """`o, _ = graph.sdpa(..., is_inference=False)` (the frontend's sample 52)
    leaves Stats virtual and unconsumed: the frontend builds that graph, so
    its spec keeps it, virtual, and differs from the graph that keeps Stats."""
    spec = example("sdpa_stats_bf16")
    tensor(spec, "stats")["is_output"] = False
    dangling = normalize(spec_io.from_dict(spec))
    assert next(t for t in dangling.tensors if t.name == "stats").is_virtual
    assert spec_io.from_dict(spec).spec_hash() != spec_io.from_dict(example("sdpa_stats_bf16")).spec_hash()


def packed_page_tables(spec: dict[str, Any]) -> dict[str, Any]:
    """The paged decode with its page tables packed, ragged offsets on both
    (the frontend's sample 53_sdpa_decode_with_paged_caches)."""
    spec["tensors"].append({"uid": 19, "name": "page_offsets", "dim": [9, 1, 1, 1], "data_type": "int32"})
    for name in ("k_page_table", "v_page_table"):
        tensor(spec, name)["ragged_offset_uid"] = 19
    return spec


def test_packed_page_tables_are_taken() -> None:
    spec = normalize(spec_io.from_dict(packed_page_tables(example("sdpa_paged_decode_bf16"))))
    assert {t.name: t.ragged_offset.uid for t in spec.tensors if t.ragged_offset is not None} == {
        "k_page_table": 19,
        "v_page_table": 19,
    }


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
    spec = example(
        "sdpa_causal_fp16"
    )  # the frontend takes (and ignores) a paged cache's length without the cache: so does plancache
    attrs(spec).update(paged_attention_max_seq_len_kv=512)
    assert spec_io.from_dict(spec).spec_hash() != spec_io.from_dict(example("sdpa_causal_fp16")).spec_hash()


def test_fp8_attention_scales_must_be_one_per_tensor() -> None:
    spec = example("sdpa_fp8_causal")
    tensor(spec, "scale_s").update(dim=[1, 4, 1, 1])
    refused(spec, r"input 'scale_s' must have dims \[1, 1, 1, 1\]")


def test_fp8_paged_decode_checks_its_page_tables() -> None:
    spec = example("sdpa_fp8_paged_decode")
    tensor(spec, "k_page_table").update(dim=[8, 1, 8, 1])
    refused(
        spec, r"'paged_attention_k_table': 8 pages of 64 tokens hold fewer than paged_attention_max_seq_len_kv = 1024"
    )


def _ragged_uid(spec: dict[str, Any]) -> int:
    uid: int = tensor(spec, "token_offsets")["uid"]
    return uid


RAGGED_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "offsets for another batch",
        lambda s: tensor(s, "token_offsets").update(dim=[4, 1, 1, 1]),
        r"tensor 'q' \(uid 11\): its ragged offsets tensor 'token_offsets' \(uid 19\) must have dims \[5, 1, 1, 1\]",
    ),
    (
        "float offsets",
        lambda s: tensor(s, "token_offsets").update(data_type="float"),
        r"ragged offsets tensor 'token_offsets' \(uid 19\) must be int32 or int64",
    ),
    (
        "offsets naming no tensor",
        lambda s: tensor(s, "q").update(ragged_offset_uid=99),
        r"tensor 'q' \(uid 11\): ragged_offset_uid 99 names no tensor",
    ),
    (
        "offsets that are ragged themselves",
        lambda s: tensor(s, "token_offsets").update(ragged_offset_uid=_ragged_uid(s)),
        "must be a GPU tensor the caller binds",
    ),
    (
        "no padding mask",
        lambda s: attrs(s).update(use_padding_mask=False),
        r"ragged 'q', 'k', 'v', 'O' need use_padding_mask",
    ),
    (
        "a ragged output without its packed strides",
        lambda s: tensor(s, "o").pop("stride"),
        r"ragged output 'O' .* needs its strides",
    ),
    (
        "a token total for a dense q",
        lambda s: tensor(s, "q").pop("ragged_offset_uid") and attrs(s).update(max_total_seq_len_q=100),
        r"max_total_seq_len_q is for a ragged 'q'",
    ),
    (
        "a token total over b × s",
        lambda s: attrs(s).update(max_total_seq_len_kv=4096),
        r"max_total_seq_len_kv = 4096 must be in \[1, 2048\]",
    ),
]


@pytest.mark.parametrize(("what", "damage", "message"), RAGGED_CASES, ids=[c[0] for c in RAGGED_CASES])
def test_bad_ragged_offsets_are_refused(what: str, damage: Callable[[dict[str, Any]], None], message: str) -> None:
    spec = example("sdpa_ragged_prefill_bf16")
    damage(spec)
    refused(spec, message)


def test_only_attention_ports_take_ragged_tensors() -> None:
    spec = example("matmul_fp16")
    spec["tensors"].append({"uid": 50, "name": "offsets", "dim": [9, 1, 1], "data_type": "int32"})
    tensor(spec, "A").update(ragged_offset_uid=50)
    refused(spec, r"'A' \(tensor 'A' \(uid 1\)\) is ragged, but matmul takes ragged tensors on none")
    spec = example("sdpa_backward_ragged_bf16")
    tensor(spec, "bias" if any(t["name"] == "bias" for t in spec["tensors"]) else "seq_len_q").update(
        ragged_offset_uid=19
    )
    refused(spec, r"is ragged, but sdpa_backward takes ragged tensors on only q, k, v, o, dO, stats, dQ, dK, dV")


def test_ragged_offsets_are_part_of_the_key_and_survive_both_wire_forms() -> None:
    spec = spec_io.from_dict(example("sdpa_ragged_prefill_bf16"))
    key = spec.spec_hash()
    assert spec_io.from_json(spec.to_json()).spec_hash() == key
    assert spec_io.from_proto(spec_io.to_proto(spec)).spec_hash() == key
    assert {t.name: t.ragged_offset_uid for t in spec_io.to_proto(spec).tensors if t.ragged_offset_uid} == {
        "q": 19,
        "k": 19,
        "v": 19,
        "o": 19,
    }
    dense = example("sdpa_ragged_prefill_bf16")
    tensor(dense, "o").pop("ragged_offset_uid")  # the same graph but for a dense O (offsets still used by q, k, v)
    assert spec_io.from_dict(dense).spec_hash() != key


DROPOUT_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "no probability",
        lambda s: attrs(s).pop("dropout_probability"),
        "dropout needs dropout_probability with both dropout_seed and dropout_offset",
    ),
    (
        "no offset",
        lambda s: s["nodes"][0]["inputs"].pop("dropout_offset") and s["tensors"].remove(tensor(s, "dropout_offset")),
        "dropout needs",
    ),
    (
        "probability 1",
        lambda s: attrs(s).update(dropout_probability=1.0),
        r"dropout_probability must be in \(0, 1\), got 1.0",
    ),
    (
        "a seed per batch",
        lambda s: tensor(s, "dropout_seed").update(dim=[2, 1, 1, 1]),
        r"input 'dropout_seed' must have dims \[1, 1, 1, 1\]",
    ),
    (
        "a float offset",
        lambda s: tensor(s, "dropout_offset").update(data_type="float"),
        "input 'dropout_offset' must have an integer data type",
    ),
]


@pytest.mark.parametrize(("what", "damage", "message"), DROPOUT_CASES, ids=[c[0] for c in DROPOUT_CASES])
@pytest.mark.parametrize("case", ["sdpa_dropout_bf16", "sdpa_backward_dropout_bf16"])
def test_bad_dropout_is_refused_forward_and_backward(
    case: str, what: str, damage: Callable[[dict[str, Any]], None], message: str
) -> None:
    spec = example(case)
    damage(spec)
    refused(spec, message)


def test_dropout_builds_from_the_frontends_tuple_only() -> None:
    from plancache import GraphSpec

    g = GraphSpec(io_data_type="bfloat16")
    q, k, v = (g.tensor([1, 2, 64, 64], name=n) for n in "qkv")
    seed = g.tensor([1, 1, 1, 1], data_type="int64")
    with pytest.raises(SpecError, match=r"dropout must be \(probability, seed tensor, offset tensor\)"):
        g.sdpa(q, k, v, dropout=(0.1, seed))


def test_the_bias_gradient_needs_a_bias_of_its_dims() -> None:
    spec = example("sdpa_backward_bias_bf16")
    tensor(spec, "dBias").update(dim=[1, 8, 256, 128])
    refused(spec, r"output 'dBias' declared with dims \[1, 8, 256, 128\] but the op produces \[1, 8, 256, 256\]")
    spec = example("sdpa_backward_bias_bf16")
    s_in = spec["nodes"][0]["inputs"]
    s_in.pop("bias")
    spec["tensors"].remove(tensor(spec, "bias"))
    refused(spec, r"output 'dBias' \(the bias gradient\) needs input 'bias'")
    spec = example("sdpa_bias_bf16")  # the forward has no bias gradient to give
    spec["tensors"].append({"uid": 40, "name": "dBias", "dim": [1, 8, 256, 256], "is_output": True})
    spec["nodes"][0]["outputs"]["dBias"] = 40
    refused(spec, r"sdpa does not produce 'dBias'")

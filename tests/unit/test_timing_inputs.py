"""The autotuner's integer inputs keep every candidate inside its buffers:
lengths within their axes and token totals, page indices within the pool,
ragged offsets within the packed buffers (a candidate timed on anything
else reads or writes out of bounds on the GPU)."""

from __future__ import annotations

import pytest

from examples.generate import EXAMPLES
from plancache.graphspec import spec_io
from plancache.graphspec.validation import normalize, storage_elements
from plancache_server.worker.compiler.timing_inputs import timing_inputs
from tests.unit.test_variants import example, packed_page_tables


def by_name(spec_name: str) -> dict[str, int]:
    spec = normalize(EXAMPLES[spec_name]())
    return {t.name: t.uid or 0 for t in spec.tensors}


def test_a_ragged_backward_stays_within_its_token_totals() -> None:
    spec = normalize(EXAMPLES["sdpa_backward_ragged_bf16"]())
    rules = timing_inputs(spec)
    uid = by_name("sdpa_backward_ragged_bf16")
    # b 4, h 8, d 128, at most 1024 tokens: 256 positions per sequence.
    assert rules.ragged_steps == {uid["token_offsets"]: 256 * 8 * 128}
    assert rules.lengths[uid["seq_len_q"]] == rules.lengths[uid["seq_len_kv"]] == 256


def test_a_ragged_prefill_spaces_sequences_at_their_full_length() -> None:
    spec = normalize(EXAMPLES["sdpa_ragged_prefill_bf16"]())
    uid = by_name("sdpa_ragged_prefill_bf16")
    rules = timing_inputs(spec)
    assert rules.ragged_steps == {uid["token_offsets"]: 512 * 8 * 128}
    assert rules.lengths[uid["seq_len_q"]] == 512


def test_a_paged_cache_is_timed_at_its_longest_sequence_with_indices_in_the_pool() -> None:
    spec = normalize(EXAMPLES["sdpa_paged_decode_bf16"]())
    uid = by_name("sdpa_paged_decode_bf16")
    rules = timing_inputs(spec)
    assert rules.lengths[uid["seq_len_kv"]] == 1024 and rules.lengths[uid["seq_len_q"]] == 1
    assert rules.indices[uid["k_page_table"]] == rules.indices[uid["v_page_table"]] == 128


@pytest.mark.parametrize("name", [n for n in EXAMPLES if "ragged" in n])
def test_every_sequence_the_offsets_place_ends_inside_each_buffer(name: str) -> None:
    spec = normalize(EXAMPLES[name]())
    rules = timing_inputs(spec)
    for t in spec.tensors:
        if t.ragged_offset is None:
            continue
        step = rules.ragged_steps[t.ragged_offset.uid or 0]
        batch = t.dim[0]
        per_position = t.stride[0] // t.dim[2]
        longest = max(rules.lengths.values())
        last_element = (batch - 1) * step + longest * per_position  # the last sequence's end
        assert last_element <= storage_elements(t.dim, t.stride), t.label()


def test_packed_page_tables_give_each_sequence_its_own_row_of_pages() -> None:
    """The frontend's sample 53 packs its page tables (ragged offsets on them):
    batch i's pages start at row i of the padded table, so every sequence's
    pages up to the longest length lie inside the table the autotuner fills."""
    spec = normalize(spec_io.from_dict(packed_page_tables(example("sdpa_paged_decode_bf16"))))
    rules = timing_inputs(spec)
    table = next(t for t in spec.tensors if t.name == "k_page_table")
    assert table.ragged_offset is not None
    step = rules.ragged_steps[table.ragged_offset.uid or 0]
    assert step == 16  # [8, 1, 16, 1]: 16 pages a sequence
    pages_needed = -(-rules.lengths[by_name_of(spec, "seq_len_kv")] // 64)  # pages of 64 tokens
    assert (table.dim[0] - 1) * step + pages_needed <= storage_elements(table.dim, table.stride)
    assert rules.indices[table.uid or 0] == 128


def by_name_of(spec: object, name: str) -> int:
    return next(t.uid or 0 for t in spec.tensors if t.name == name)  # type: ignore[attr-defined]

"""bench/torch_models_startup.py's summary: medians per label, the stored first step over torch's."""

from __future__ import annotations

import pytest

from bench.torch_models_startup import summarize


def _run(label: str, first: float, total: float, repeat: int = -1) -> dict[str, object]:
    return {
        "label": label,
        "repeat": repeat,
        "model": "gpt2-256",
        "mode": "eager",
        "first_step_s": first,
        "process_to_first_step_done_s": total,
    }


def test_the_ratio_is_of_medians_and_failed_processes_are_left_out() -> None:
    runs = [
        _run("first (nothing stored)", 9.0, 20.0),
        _run("stored", 1.0, 8.0, repeat=0),
        _run("torch", 2.0, 9.0, repeat=0),
        _run("torch", 2.0, 9.0, repeat=1),
        _run("stored", 3.0, 10.0, repeat=1),
        {"label": "stored", "model": "gpt2-256", "mode": "eager", "repeat": 2, "error": "it crashed"},
        _run("torch", 4.0, 9.0, repeat=2),
    ]
    case = summarize(runs)["gpt2-256/eager"]
    assert case["first_step_s"] == {"first (nothing stored)": 9.0, "stored": 2.0, "torch": 2.0}
    assert case["stored_over_torch"] == pytest.approx(1.0)
    # Each repeat's two processes paired (a repeat whose stored process failed has no pair): 0.5 and 1.5.
    assert case["pairs"] == [pytest.approx(0.5), pytest.approx(1.5)]
    assert case["paired_stored_over_torch"] == pytest.approx(1.0)
    assert case["nothing_stored_over_torch"] == pytest.approx(4.5)
    assert case["to_first_step_done_s"]["stored"] == pytest.approx(9.0)


def test_the_nothing_stored_processes_pair_with_torchs_on_empty_caches() -> None:
    """Each cold pair (repeats -1, -2, ...: a nothing-stored process beside torch's, inductor's caches empty) is
    paired on its own; the warm pairs are not mixed in."""
    runs = [
        _run("first (nothing stored)", 12.0, 30.0, repeat=-1),
        _run("torch (empty caches)", 10.0, 28.0, repeat=-1),
        _run("torch (empty caches)", 10.0, 28.0, repeat=-2),
        _run("first (nothing stored)", 9.0, 28.0, repeat=-2),
        _run("stored", 1.0, 8.0, repeat=0),
        _run("torch", 2.0, 9.0, repeat=0),
    ]
    case = summarize(runs)["gpt2-256/eager"]
    assert case["cold_pairs"] == [pytest.approx(1.2), pytest.approx(0.9)]
    assert case["paired_nothing_stored_over_torch_empty_caches"] == pytest.approx(1.05)
    assert case["pairs"] == [pytest.approx(0.5)]
    assert case["first_step_s"]["torch (empty caches)"] == pytest.approx(10.0)

"""bench/torch_models_startup.py's summary: medians per label, the stored first step over torch's."""

from __future__ import annotations

import pytest

from bench.torch_models_startup import summarize


def _run(label: str, first: float, total: float) -> dict[str, object]:
    return {
        "label": label,
        "model": "gpt2-256",
        "mode": "eager",
        "first_step_s": first,
        "process_to_first_step_done_s": total,
    }


def test_the_ratio_is_of_medians_and_failed_processes_are_left_out() -> None:
    runs = [
        _run("first (nothing stored)", 9.0, 20.0),
        _run("stored", 1.0, 8.0),
        _run("torch", 2.0, 9.0),
        _run("stored", 3.0, 10.0),
        _run("torch", 2.0, 9.0),
        {"label": "stored", "model": "gpt2-256", "mode": "eager", "error": "it crashed"},
    ]
    case = summarize(runs)["gpt2-256/eager"]
    assert case["first_step_s"] == {"first (nothing stored)": 9.0, "stored": 2.0, "torch": 2.0}
    assert case["stored_over_torch"] == pytest.approx(1.0)
    assert case["nothing_stored_over_torch"] == pytest.approx(4.5)
    assert case["to_first_step_done_s"]["stored"] == pytest.approx(9.0)

"""bench/hedge_arms.py's estimators of a hedged first node against its local equivalent, on a host whose speed
changes between runs and within one (GPU run 44)."""

from __future__ import annotations

import pytest

from bench.cpu_speed_map import pace_ms
from bench.hedge_arms import (
    best_of,
    build_paced_pairs,
    clocked,
    graphwise_fastest,
    own_ms,
    paced_pairs,
    pair_ratios,
)


def _run(path: str, gaps_ms: list[float], **extra: object) -> dict[str, object]:
    times, now = [], 0.0
    for gap in gaps_ms:
        now += gap / 1000
        times.append(now)
    return {"jit": "warm", "path": path, "total_s": now, "runnable_s": times, **extra}


def test_each_graphs_fastest_run_compares_the_same_speed_where_whole_runs_do_not() -> None:
    # The same two programs: the hedged one 2 % slower a graph; each run slow (1.6x) on a different stretch.
    local, hedged = [100.0] * 10, [102.0] * 10
    slow_first = [g * 1.6 if i < 5 else g for i, g in enumerate(local)]
    slow_last = [g * 1.6 if i >= 5 else g for i, g in enumerate(hedged)]
    runs = [
        _run("local-program", [g * 1.6 for g in local]),
        _run("first-dropin+hedge", [g * 1.6 if i < 5 else g for i, g in enumerate(hedged)]),
        _run("local-program", slow_first),
        _run("first-dropin+hedge", slow_last),
        _run("local-program", [g * 1.6 if i >= 5 else g for i, g in enumerate(local)]),
    ]
    assert graphwise_fastest(runs)["first-dropin+hedge"] == pytest.approx(1.02)
    # A pair whose local run was the slower throughout says 0.83x.
    assert [round(r, 2) for r in pair_ratios(runs)["first-dropin+hedge"]] == [0.83, 1.02]


def test_plancaches_own_time_is_its_build_step_less_the_nodes_own_build_inside_it() -> None:
    phases = {
        "dropin_build": {"each_ms": [20.0, 12.0, 41.0, 43.0, 45.0]},
        "race_build": {"each_ms": [10.0, 9.0, 40.0, 42.0, 43.5]},
        "dropin_capture": {"each_ms": [0.9, 0.8, 0.7, 0.6, 0.7]},
        "touch": {"each_ms": [6.5]},
    }
    own = own_ms([_run("first-dropin+hedge", [50.0] * 5, phases=phases)])["first-dropin+hedge"]
    assert own["median_ms_past_two"] == pytest.approx(1.0)
    assert own["first_two_ms"] == [10.0, 3.0]
    assert own["capture_median_ms_past_two"] == pytest.approx(0.7)
    assert own["touch_ms"] == [6.5]


def test_a_compile_nodes_own_time_is_compile_less_its_local_build_per_process() -> None:
    per_process = [
        {"compile": {"each_ms": [9.0, 5.0, 31.0]}, "local_build": {"each_ms": [3.0, 2.0, 30.0]}},
        {"compile": {"each_ms": [8.0, 6.0, 32.0]}, "local_build": {"each_ms": [2.0, 3.0, 30.0]}},
    ]
    own = own_ms([_run("first-compile-4proc+hedge", [40.0] * 3, phases=per_process)])["first-compile-4proc+hedge"]
    assert own["median_ms_past_two"] == pytest.approx(1.5)
    assert own["first_two_ms"] == [6.0, 3.0, 6.0, 3.0]


def test_only_pairs_whose_two_runs_held_one_pace_are_kept() -> None:
    runs = [
        _run("local-program", [100.0] * 10, pace_ms=[11.0, 11.2]),
        _run("first-dropin+hedge", [103.0] * 10, pace_ms=[11.1, 11.0]),  # kept: 1.03x
        _run("local-program", [100.0] * 10, pace_ms=[11.0, 11.1]),
        _run("first-dropin+hedge", [160.0] * 10, pace_ms=[17.5, 17.8]),  # steady, but at the other pace
        _run("local-program", [100.0] * 10, pace_ms=[11.0, 11.0]),
        _run("first-dropin+hedge", [130.0] * 10, pace_ms=[11.0, 17.6]),  # its pace moved across its clock
        _run("local-program", [100.0] * 10),  # no record: not kept
        _run("first-dropin+hedge", [100.0] * 10, pace_ms=[11.0, 11.0]),
    ]
    assert [round(r, 2) for r in paced_pairs(runs)["first-dropin+hedge"]] == [1.03]
    assert len(pair_ratios(runs)["first-dropin+hedge"]) == 4


def test_only_pairs_whose_graphs_built_at_one_pace_are_kept_whatever_the_pace_probe_said() -> None:
    # GPU run 47: the probe around the clock moved in every run; the builds themselves tell the host's two paces.
    first_two = [400.0, 350.0]
    runs = [
        _run("local-program", [*first_two, *[46.0] * 11], pace_ms=[10.9, 31.0]),
        _run("first-dropin+hedge", [*first_two, *[73.0] * 11], pace_ms=[10.3, 21.9]),  # the slow mode: not kept
        _run("local-program", [*first_two, *[70.0] * 11]),
        _run("first-dropin+hedge", [*first_two, *[71.0] * 11]),  # kept
        _run("local-heuristic", [*first_two, *[40.0] * 11]),
        _run("first-lazy+hedge", [*first_two, *[91.0] * 11], lazy_s=0.05, graphs=13),  # 41 ms a graph built: kept
        _run("local-heuristic-4proc", [*first_two, *[20.0] * 11], processes=4),  # several processes: not judged
        _run("first-compile-4proc+hedge", [*first_two, *[20.0] * 11], processes=4),
    ]
    kept = build_paced_pairs(runs)
    assert [round(r, 3) for r in kept["first-dropin+hedge"]] == [round((750 + 71 * 11) / (750 + 70 * 11), 3)]
    assert len(kept["first-lazy+hedge"]) == 1 and kept["first-compile-4proc+hedge"] == []
    assert paced_pairs(runs)["first-dropin+hedge"] == []  # the probe kept none of them


def test_the_pace_probe_times_the_same_work_each_time() -> None:
    first, second = pace_ms(items=2_000), pace_ms(items=2_000)
    assert first > 0 and second > 0
    assert pace_ms(items=20_000) > first  # ten times the loop: longer on any machine


def test_a_lazy_nodes_sleeps_are_added_to_its_local_run_in_every_ratio() -> None:
    # The lazy hedged node sleeps 50 ms after each of its 10 graphs; its local equivalent does not sleep.
    runs = [
        _run("local-heuristic", [100.0] * 10),
        _run("first-lazy+hedge", [152.0] * 10, lazy_s=0.05, graphs=10),
    ]
    assert pair_ratios(runs)["first-lazy+hedge"] == [pytest.approx(1.52 / 1.5)]
    assert best_of(runs)["first-lazy+hedge"] == pytest.approx(1.52 / 1.5)


def test_rows_of_processes_that_went_together_are_timed_by_their_own_clocks() -> None:
    # GPU run 45's hedged rows ended 110-220 ms after their processes' clocks (a stamp after the pace loop).
    local = {"jit": "warm", "path": "local-program", "total_s": 1.0}
    hedged = {
        "jit": "warm",
        "path": "first-dropin+hedge",
        "total_s": 1.25,
        "per_process": [{"total_s": 1.05}],
    }
    cold = {**local, "jit": "cold", "total_s": 4.0}
    runs = clocked([local, cold, hedged])
    assert len(runs) == 2  # the warm runs only: a cold local run between them is no pair's
    assert runs[1]["total_s"] == 1.05 and runs[1]["total_s_recorded"] == 1.25
    assert runs[0] is local  # a single process's row is its own clock already
    assert pair_ratios(runs)["first-dropin+hedge"] == [1.05]
    assert clocked([local, cold, hedged], "cold") == [cold]


def test_the_training_steps_hedged_first_node_is_paired_with_its_local_step() -> None:
    runs = [
        _run("local-functional", [500.0]),
        _run("local-functional-train", [1000.0]),
        _run("first-functional+hedge", [510.0]),
        _run("first-functional-train+hedge", [1030.0]),
    ]
    ratios = pair_ratios(runs)
    assert ratios["first-functional-train+hedge"] == [pytest.approx(1.03)]
    assert ratios["first-functional+hedge"] == [pytest.approx(1.02)]  # each step against its own local run

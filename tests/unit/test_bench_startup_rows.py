"""bench/startup.py's row of a first node's processes keeps what each process recorded about its own run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.startup import merge_shares


def test_a_merged_row_keeps_each_processs_collections_ended_threads_and_steps() -> None:
    # GPU runs 42-43 read the hedged nodes' garbage collections from rows that had silently dropped them.
    parts = [
        {
            "graphs": 2,
            "total_s": 0.4 + share / 10,  # each process's clock, from the go
            "end_wall": 10.5,
            "setup_s": 1.0,
            "share": [share, 2],
            "indices": [share],
            "gc": {"collections": [40 + share, 4, 1], "pause_ms": [5.0, 5.0, 100.0 + share]},
            "ended_threads": [["plancache-workload", 0.01, 0.02 + share, 0.001]],
            "steps": {"validate": [0.5, 188.0 + share], "build_plans": [0.2, 44.0]},
            "pace_ms": [11.0 + share, 11.2],
        }
        for share in (0, 1)
    ]
    row = merge_shares(parts)
    assert row["gc"] == parts[0]["gc"] and row["ended_threads"] == parts[0]["ended_threads"]
    assert row["steps"] == parts[0]["steps"]  # GPU run 44's hedged drop-in rows had lost the program's steps
    assert row["pace_ms"] == parts[0]["pace_ms"]
    assert [p["pace_ms"] for p in row["per_process"]] == [p["pace_ms"] for p in parts]
    assert [p["gc"] for p in row["per_process"]] == [p["gc"] for p in parts]
    assert [p["ended_threads"] for p in row["per_process"]] == [p["ended_threads"] for p in parts]
    assert row["total_s"] == 0.5  # the last process to stop


def test_a_merged_row_ends_at_the_last_process_clock_not_at_work_done_after_it() -> None:
    # GPU run 45: each process stamped end_wall after its post-clock work (a pace loop, 110-220 ms), and the row
    # read end_wall - go as the node's time: every hedged first node read 0.11-0.22 s slower than it ran.
    parts = [
        {
            "graphs": 1,
            "total_s": 1.10,
            "end_wall": 1_000.0 + 1.10 + 0.2,
            "setup_s": 1.0,
            "share": [0, 1],
            "indices": [0],
        }
    ]
    assert merge_shares(parts)["total_s"] == 1.10


def test_nodes_go_once_the_machine_is_quiet_and_say_how_long_that_took(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPU run 46: first nodes let go as their fresh worker's pool had just loaded torch and cuDNN ran their builds
    # up to 1.5x slower than local runs started on an idle machine.
    from bench import startup_deploy

    busy = iter([0.0, 3.0, 3.0, 5.0, 5.0, 5.1])  # busy CPU seconds since boot, read at each window's ends
    monkeypatch.setattr(startup_deploy, "_machine_busy_s", lambda: next(busy))
    monkeypatch.setattr(startup_deploy, "QUIET_WINDOW_S", 0.5)
    monkeypatch.setattr(startup_deploy.time, "sleep", lambda s: None)
    clock = iter(x * 0.5 for x in range(100))
    monkeypatch.setattr(startup_deploy.time, "monotonic", lambda: next(clock))
    # Three windows: 6 busy CPUs, 4, then 0.2: it goes after the third, 4.5 s on the clock.
    assert startup_deploy.wait_quiet() == {"waited_s": 4.5, "busy_cpus": 0.2, "quiet": True}


def test_a_machine_that_never_quiets_is_waited_for_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import startup_deploy

    readings = iter(float(x) for x in range(0, 10_000, 2))  # 2 busy CPU seconds every reading: never quiet
    monkeypatch.setattr(startup_deploy, "_machine_busy_s", lambda: next(readings))
    monkeypatch.setattr(startup_deploy.time, "sleep", lambda s: None)
    clock = iter(x * 0.25 for x in range(10_000))
    monkeypatch.setattr(startup_deploy.time, "monotonic", lambda: next(clock))
    found = startup_deploy.wait_quiet(max_s=5.0)
    assert not found["quiet"] and 5.0 <= found["waited_s"] < 6.0


def test_the_imports_diagnosis_runs_the_local_program_with_the_drop_ins_imports_loaded(tmp_path: Path) -> None:
    # GPU run 46: the drop-in's first graph's own build was +115-164 ms over the local program's; this local run,
    # the drop-in's libraries imported and unused, tells whether they are what slows it.
    from bench.startup import LOCAL_IMPORTED, PAIRED_LOCAL, Bench, base

    assert base(LOCAL_IMPORTED) == "local-program" and LOCAL_IMPORTED in PAIRED_LOCAL  # started as a pair's local
    bench = Bench(tmp_path, 60.0, 1, 0.0, None, 0, "hedge-paired")
    assert bench.node_env(LOCAL_IMPORTED, "warm", {})["PLANCACHE_BENCH_PREIMPORT"] == "1"
    assert "PLANCACHE_BENCH_PREIMPORT" not in bench.node_env("local-program", "warm", {})


def test_the_imports_diagnosis_runs_the_drop_ins_pair_once_its_local_runs_before_it(tmp_path: Path) -> None:
    from bench.startup import LOCAL_IMPORTED, Bench

    bench = Bench(tmp_path, 60.0, 1, 0.0, None, 0, "hedge-paired")
    bench.pairs = ("first-dropin", LOCAL_IMPORTED)
    groups = bench.paired_groups()
    assert [g for g in groups if "first-dropin+hedge" in g] == [(LOCAL_IMPORTED, "local-program", "first-dropin+hedge")]
    bench.pairs = ("first-dropin",)
    assert bench.paired_groups() == [("local-program", "first-dropin+hedge")]

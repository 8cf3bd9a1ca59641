"""bench/startup.py's row of a first node's processes keeps what each process recorded about its own run."""

from __future__ import annotations

from bench.startup import merge_shares


def test_a_merged_row_keeps_each_processs_collections_ended_threads_and_steps() -> None:
    # GPU runs 42-43 read the hedged nodes' garbage collections from rows that had silently dropped them.
    parts = [
        {
            "graphs": 2,
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
    row = merge_shares(parts, go=10.0)
    assert row["gc"] == parts[0]["gc"] and row["ended_threads"] == parts[0]["ended_threads"]
    assert row["steps"] == parts[0]["steps"]  # GPU run 44's hedged drop-in rows had lost the program's steps
    assert row["pace_ms"] == parts[0]["pace_ms"]
    assert [p["pace_ms"] for p in row["per_process"]] == [p["pace_ms"] for p in parts]
    assert [p["gc"] for p in row["per_process"]] == [p["gc"] for p in parts]
    assert [p["ended_threads"] for p in row["per_process"]] == [p["ended_threads"] for p in parts]
    assert row["total_s"] == 0.5

"""bench/import_cost.py: fresh processes in turn, the door's import timed inside and the whole process outside."""

from __future__ import annotations

import json
from pathlib import Path

from bench.import_cost import measure, report


def test_each_door_is_paired_with_the_baseline_and_reported(tmp_path: Path) -> None:
    # Small standard-library modules stand in for torch and plancache: the pairing and the report are what is tested.
    results = measure(2, ("json",), ("csv", "decimal"))
    assert [row["door"] for row in results["rows"]] == ["csv", "decimal"]
    for row in results["rows"]:
        assert len(row["runs"]["baseline"]) == len(row["runs"]["door"]) == len(row["ratios"]) == 2
        assert all(run["wall_s"] > 0 for side in row["runs"].values() for run in side)
        assert all(run["import_s"] < 1e-3 for run in row["runs"]["baseline"])  # nothing added on that side
        assert all(0 < run["import_s"] < run["wall_s"] for run in row["runs"]["door"])
    report(results, tmp_path, "smoke")
    written = json.loads((tmp_path / "import_cost_smoke.json").read_text())
    assert written["baseline"] == ["json"] and (tmp_path / "import_cost_smoke.png").stat().st_size > 0

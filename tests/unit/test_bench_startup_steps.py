"""bench/startup.py's two steps through plancache.functional (issue 41 item 3): examples/decoder_step.py's decode step
and examples/train_transformer_block.py's training step, each first node beside its local equivalent, as tables
alone (no GPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.startup import (
    HEDGE_STUDY,
    ISSUE_29,
    PAIR_NAMES,
    PAIRED_LOCAL,
    STEP_OF,
    VERSUS_LOCAL,
    WORKLOAD_OF,
    Bench,
    main,
    summarize,
)
from tests.support.processes import REPO


def _bench(tmp_path: Path, *pairs: str) -> Bench:
    bench = Bench(tmp_path, 60.0, 1, 0.0, None, 0, "hedge-paired")
    bench.pairs = pairs
    return bench


def test_the_training_steps_pair_is_its_local_step_then_its_hedged_first_node_as_the_decode_steps_is(
    tmp_path: Path,
) -> None:
    assert _bench(tmp_path, "first-functional-train").paired_groups() == [
        ("local-functional-train", "first-functional-train+hedge")
    ]
    both = _bench(tmp_path, "first-functional-train", "first-functional").paired_groups()
    assert both == [
        ("local-functional", "first-functional+hedge"),
        ("local-functional-train", "first-functional-train+hedge"),
    ]
    assert "first-functional-train" in PAIR_NAMES
    assert ("local-functional-train", "first-functional-train+hedge") in _bench(tmp_path).paired_groups()  # all


def test_each_side_of_the_training_steps_pair_starts_as_the_decode_steps_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The local side together() (a barrier, a quiet machine, the go), the hedged side a first node (a fresh worker).
    bench = _bench(tmp_path)
    started: list[tuple[str, str]] = []
    monkeypatch.setattr(bench, "local_group", lambda path, *_: started.append(("local_group", path)))
    monkeypatch.setattr(bench, "first", lambda path, *_: started.append(("first", path)))
    for path in (
        "local-functional",
        "first-functional+hedge",
        "local-functional-train",
        "first-functional-train+hedge",
    ):
        bench.run(path, "warm", {}, "127.0.0.1:1", "redis://")
    assert started == [
        ("local_group", "local-functional"),
        ("first", "first-functional+hedge"),
        ("local_group", "local-functional-train"),
        ("first", "first-functional-train+hedge"),
    ]
    assert "local-functional-train" in PAIRED_LOCAL


def test_the_training_step_runs_in_hedge_paired_alone_the_older_studies_unchanged() -> None:
    decode = ("local-functional", "torch-step", "first-functional+hedge", "first-functional")
    assert decode in HEDGE_STUDY and decode in ISSUE_29
    studies = [path for group in (*HEDGE_STUDY, *ISSUE_29) for path in group]
    assert not [path for path in studies if "train" in path]


def test_the_two_steps_never_share_a_workload_record(tmp_path: Path) -> None:
    bench = _bench(tmp_path)
    decode, train = (
        bench.node_env(path, "warm", {})["PLANCACHE_WORKLOAD"]
        for path in ("first-functional", "first-functional-train")
    )
    assert (decode, train) == ("bench-decode-step", "bench-train-step")
    assert WORKLOAD_OF["first-functional-train"] not in {
        workload for path, workload in WORKLOAD_OF.items() if path != "first-functional-train"
    }
    hedged = bench.node_env("first-functional-train+hedge", "warm", {})
    assert hedged["PLANCACHE_WORKLOAD"] == "bench-train-step" and hedged["PLANCACHE_HEDGE"] == "1"


def test_a_steps_first_node_starts_without_its_own_steps_plans_alone(tmp_path: Path) -> None:
    bench = _bench(tmp_path)
    bench.keys, bench.more_keys = ["g0", "g1"], {"g2"}
    bench.step_keys = {"decode": {"d1", "d0"}, "train": {"t0"}}
    assert bench.own_keys("first-functional+hedge") == ["d0", "d1"]
    assert bench.own_keys("first-functional-train+hedge") == ["t0"]
    assert bench.own_keys("first-compile") == ["g0", "g1", "g2"]
    assert {STEP_OF[p] for p in ("local-functional-train", "torch-train-step", "first-functional-train")} == {"train"}


def _row(path: str, total_s: float, **extra: Any) -> dict[str, Any]:
    return {"jit": "warm", "path": path, "hedge": path.endswith("+hedge"), "total_s": total_s, **extra}


def test_the_training_steps_ratios_are_its_first_node_over_its_local_step() -> None:
    races = {"functional": {"local_won": 3, "service_won": 1}}
    runs = [
        _row("local-functional", 1.0),
        _row("first-functional+hedge", 1.1),
        _row("local-functional-train", 2.0),
        _row("first-functional-train+hedge", 2.04, races=races),
        _row("local-functional-train", 2.2),
        _row("first-functional-train+hedge", 2.2, races=races),
        _row("first-functional-train", 3.0),
    ]
    warm = summarize(runs)["warm"]
    assert VERSUS_LOCAL["first-functional-train"][0] == "local-functional-train"
    assert warm["paired"]["first_functional_train_hedge_over_local_functional_train"] == pytest.approx(1.01)
    assert warm["paired"]["first_functional_hedge_over_local_functional"] == pytest.approx(1.1)  # its own pair's
    assert warm["first_functional_train_hedge_over_local_functional_train"] == pytest.approx(2.12 / 2.1)
    assert warm["first_functional_train_over_local_functional_train"] == pytest.approx(3.0 / 2.1)
    assert warm["met"]["first_functional_train_hedge_over_local_functional_train"]
    assert warm["races"]["first-functional-train+hedge"] == {"runs": 2, "local_won": 6, "service_won": 2}


def test_a_misspelt_pair_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "startup.py",
        "--out",
        str(tmp_path / "out"),
        "--study",
        "hedge-paired",
        "--pairs",
        "first-functional-training",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        main()
    assert "first-functional-training" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("torch", "cudnn")), reason="the node program imports both"
)
def test_the_node_program_runs_every_step_path_and_imports_the_training_example_only_to_set_it_up() -> None:
    # In a process of its own: the node program patches threading.Thread.run when imported.
    probe = (
        "import json, sys; import bench.startup_node as node; "
        "print(json.dumps({'paths': node.PATHS, 'train': node.TRAIN_PATHS, "
        "'imported': 'examples.train_transformer_block' in sys.modules}))"
    )
    found = json.loads(
        subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True).stdout
    )
    assert set(STEP_OF) <= set(found["paths"])
    assert set(found["train"]) == {path for path, step in STEP_OF.items() if step == "train"}
    assert not found["imported"]

"""The parts of scripts/frontend_suite.py that need no GPU: the one-line
change to the frontend's files, its notebooks as scripts, a run's outcomes
(pytest's junit XML and the plugin's events, from a real pytest run of a
small suite), and the report's comparison and counts."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def _load(name: str) -> ModuleType:
    """A module of scripts/ by name (registered, so its siblings' imports of it resolve)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sources = _load("frontend_suite_sources")
report = _load("frontend_suite_report")
plugin = _load("frontend_suite_plugin")
suite = _load("frontend_suite")
Outcome = report.Outcome


# ---- the one-line change ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("import cudnn\n", "import plancache.cudnn as cudnn\n"),
        ("import cudnn as cd  # the frontend\n", "import plancache.cudnn as cd  # the frontend\n"),
        ("from cudnn import pygraph, data_type as dt\n", "from plancache.cudnn import pygraph, data_type as dt\n"),
        (
            "from cudnn import (\n    pygraph,\n    data_type,\n)\n",
            "from plancache.cudnn import (\n    pygraph,\n    data_type,\n)\n",
        ),
        # In a function: the submodule is loaded and the local name `cudnn` stays plancache's.
        (
            "def f():\n    import cudnn.sdpa  # noqa: F401\n",
            "def f():\n    import cudnn.sdpa; import plancache.cudnn as cudnn  # noqa: F401\n",
        ),
        ("import cudnn\r\nx = 1\r\n", "import plancache.cudnn as cudnn\r\nx = 1\r\n"),
    ],
)
def test_each_form_of_import_is_rewritten_on_its_own_line(before: str, after: str) -> None:
    rewrite = sources.rewrite_imports(before, "t.py")
    assert rewrite.text == after
    assert rewrite.changed == 1 and rewrite.kept == []
    ast.parse(rewrite.text)


def test_only_the_import_lines_change_and_frontend_submodules_are_kept() -> None:
    source = textwrap.dedent('''\
        """Tests: import cudnn in a docstring is not an import."""
        import pytest
        import cudnn
        from cudnn.experimental.ops import moe_grouped_matmul
        import cudnn.graph_types as graph_types

        def test_x():
            s = "import cudnn"
            return cudnn.pygraph()
        ''')
    rewrite = sources.rewrite_imports(source, "test_x.py")
    before, after = source.splitlines(), rewrite.text.splitlines()
    assert len(before) == len(after)  # one for one: tracebacks point at the same lines in both copies
    assert [(i, a, b) for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [
        (2, "import cudnn", "import plancache.cudnn as cudnn")
    ]
    assert rewrite.changed == 1
    assert rewrite.kept == [
        "4: from cudnn.experimental.ops import moe_grouped_matmul",
        "5: import cudnn.graph_types as graph_types",
    ]


def test_a_file_without_cudnn_is_left_as_it_is() -> None:
    rewrite = sources.rewrite_imports("import torch\n", "helpers.py")
    assert rewrite.text == "import torch\n" and rewrite.changed == 0


@pytest.mark.parametrize(
    "source",
    [
        "import os, cudnn\n",
        "import cudnn; import torch\n",
        "if True: import cudnn\n",
        "cudnn = __import__('cudnn')\n",
        "import importlib\ncudnn = importlib.import_module('cudnn')\n",
        "import cudnn as (\n",  # not Python
    ],
)
def test_an_import_the_rewrite_does_not_cover_is_refused(source: str) -> None:
    with pytest.raises(sources.ImportRewriteError, match=r"t\.py"):
        sources.rewrite_imports(source, "t.py")


def _fake_suite(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_prepare_makes_a_native_copy_and_a_rewritten_one_and_counts_per_file(tmp_path: Path) -> None:
    suite_dir = _fake_suite(
        tmp_path / "suite",
        {
            "test/python/conftest.py": "import cudnn\n",
            "test/python/test_a.py": "import cudnn\nfrom cudnn import pygraph\n",
            "test/python/sdpa/helpers.py": "import cudnn\n",
            "test/python/test_not_selected.py": "import os, cudnn\n",
            "samples/10_matmul.py": "import cudnn\nimport torch\n",
        },
    )
    prepared = sources.prepare(suite_dir, tmp_path / "work", ["test_a.py"], ["10_matmul.py"])
    assert (tmp_path / "work/native/test/python/test_a.py").read_text() == "import cudnn\nfrom cudnn import pygraph\n"
    assert (
        tmp_path / "work/plancache/test/python/test_a.py"
    ).read_text() == "import plancache.cudnn as cudnn\nfrom plancache.cudnn import pygraph\n"
    assert (
        (tmp_path / "work/plancache/samples/10_matmul.py").read_text().startswith("import plancache.cudnn as cudnn\n")
    )
    assert {f: r["rewritten"] for f, r in prepared.rewrites.items()} == {
        "samples/10_matmul.py": 1,
        "test/python/conftest.py": 1,
        "test/python/sdpa/helpers.py": 1,
        "test/python/test_a.py": 2,
    }
    assert list(prepared.unrewritten) == ["test_not_selected.py"]  # never collected: noted, not fatal


def test_prepare_refuses_when_a_file_the_run_imports_cannot_be_rewritten(tmp_path: Path) -> None:
    suite_dir = _fake_suite(
        tmp_path / "suite", {"test/python/conftest.py": "import cudnn\n", "test/python/test_a.py": "import os, cudnn\n"}
    )
    with pytest.raises(sources.ImportRewriteError, match=r"test_a\.py:1"):
        sources.prepare(suite_dir, tmp_path / "work", ["test_a.py"], [])
    suite_dir = _fake_suite(
        tmp_path / "suite2",
        {
            "test/python/conftest.py": "import cudnn\n",
            "test/python/test_a.py": "from test_utils import rng\n",
            "test/python/test_utils.py": "import torch, cudnn\n",
        },
    )
    with pytest.raises(sources.ImportRewriteError, match=r"test_utils\.py"):  # not selected, but imported by a test
        sources.prepare(suite_dir, tmp_path / "work2", ["test_a.py"], [])


# ---- notebooks ------------------------------------------------------------------------------------


def _notebook(*cells: tuple[str, str | list[str]]) -> str:
    return json.dumps(
        {"nbformat": 4, "cells": [{"cell_type": kind, "source": source, "metadata": {}} for kind, source in cells]}
    )


def test_a_notebook_becomes_its_code_cells_with_shell_magic_and_display_made_no_ops() -> None:
    notebook = _notebook(
        ("markdown", "# Title\nimport nothing here"),
        ("code", ["!pip install nvidia-cudnn-frontend\n", "%matplotlib inline\n", "x = 1\n"]),
        ("code", "%%capture\ny = x + 1"),
        ("code", "%%bash\necho not python\nls -la"),
        (
            "code",
            "if x:\n    !nvidia-smi\nfrom IPython.display import display, Markdown as md\nimport IPython\ndisplay(md('**y**'))\nget_ipython().run_line_magic('time', '')",
        ),
        ("code", "# get_ipython().system('nvidia-smi')  (a comment stays)\nz = y * 10"),
    )
    script = sources.notebook_to_script(notebook, "samples/python/00_x.ipynb")
    assert "import nothing here" not in script  # markdown cells are left out
    assert "pass  # notebook only: !pip install nvidia-cudnn-frontend" in script
    assert "    pass  # notebook only: !nvidia-smi" in script  # kept in its block
    assert "# echo not python" in script  # a non-Python cell magic: the cell commented out
    assert "display = md = _notebook_only" in script
    assert "# get_ipython().system('nvidia-smi')  (a comment stays)" in script
    namespace: dict[str, Any] = {}
    exec(compile(script, "00_x.py", "exec"), namespace)  # runs outside a notebook, IPython or not
    assert (namespace["x"], namespace["y"], namespace["z"]) == (1, 2, 20)


def test_converting_a_folder_names_scripts_after_the_notebooks_and_warns_on_what_does_not_compile(
    tmp_path: Path,
) -> None:
    (tmp_path / "nb").mkdir()
    (tmp_path / "nb" / "10_matmul.ipynb").write_text(_notebook(("code", "a = 1")))
    (tmp_path / "nb" / "20_bad.ipynb").write_text(_notebook(("code", "def f(:")))
    warnings = sources.convert_notebooks(tmp_path / "nb", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["10_matmul.py", "20_bad.py"]
    assert len(warnings) == 1 and "20_bad.ipynb" in warnings[0]


# ---- outcomes ------------------------------------------------------------------------------------------

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="2" failures="1" skipped="2" tests="7">
<testcase classname="" name="test_broken" time="0.0"><error message="collection failure">ImportError</error></testcase>
<testcase classname="test_conv" name="test_ok" time="0.1" />
<testcase classname="test_conv" name="test_bad[fp16-True]" time="0.1"><failure message="AssertionError: mismatch">...</failure></testcase>
<testcase classname="test_conv" name="test_waived" time="0.0"><skipped type="pytest.skip" message="TEST WAIVED: unsupported graph.">x</skipped></testcase>
<testcase classname="test_conv" name="test_known" time="0.0"><skipped type="pytest.xfail" message="known bug" /></testcase>
<testcase classname="test_moe.TestMoE" name="test_fwd[fp16-4exp]" time="0.0"><error message="failed on setup with &quot;RuntimeError&quot;">x</error></testcase>
<testcase classname="test_conv" name="test_td" time="0.0"><failure message="assert 0">x</failure><error message="failed on teardown">y</error></testcase>
</testsuite></testsuites>"""


def test_junit_xml_gives_each_test_its_outcome_and_message() -> None:
    parsed = report.parse_junit(JUNIT)
    assert parsed[("test_conv", "test_bad[fp16-True]")] == Outcome("failed", "AssertionError: mismatch")
    assert parsed[("test_conv", "test_waived")] == Outcome("skipped", "TEST WAIVED: unsupported graph.")
    assert parsed[("test_conv", "test_known")] == Outcome("xfailed", "known bug")
    assert parsed[("test_moe.TestMoE", "test_fwd[fp16-4exp]")].outcome == "error"
    assert (
        parsed[("test_conv", "test_td")].outcome == "failed"
    )  # failed, then errored in teardown: pytest counts the failure
    assert parsed[("test_conv", "test_ok")] == Outcome("passed")
    assert parsed[("", "test_broken")].outcome == "error"


@pytest.mark.parametrize(
    "nodeid",
    [
        "test_conv.py::test_bad[fp16-True]",
        "test_moe.py::TestMoE::test_fwd[fp16-4exp]",
        "test_broken.py",
        "test_conv.py::test_x[a.b::c]",
    ],
)
def test_junit_ids_map_back_to_nodeids(nodeid: str) -> None:
    assert report.guess_nodeid(*report.junit_id(nodeid)) == nodeid


def test_junit_outcomes_are_keyed_by_the_nodeids_the_events_name_and_events_fill_in_what_it_lacks() -> None:
    events = [
        {"e": "start", "nodeid": "test_conv.py::test_ok"},
        {"e": "report", "nodeid": "test_conv.py::test_ok", "when": "call", "outcome": "passed"},
        {"e": "start", "nodeid": "test_conv.py::test_bad[fp16-True]"},
        {"e": "start", "nodeid": "test_sdpa.py::test_hang"},  # in progress when the phase was cut: no junit case
    ]
    outcomes = report.phase_outcomes(JUNIT, events, timed_out=True)
    assert outcomes["test_conv.py::test_bad[fp16-True]"].outcome == "failed"
    assert outcomes["test_moe.py::TestMoE::test_fwd[fp16-4exp]"].outcome == "error"  # from the junit id alone
    assert outcomes["test_broken.py"].outcome == "error"
    assert outcomes["test_sdpa.py::test_hang"].outcome == "timeout"
    assert len(outcomes) == 8


def test_events_alone_tell_a_crash_from_a_cut() -> None:
    events = [
        {"e": "start", "nodeid": "a.py::t1"},
        {"e": "report", "nodeid": "a.py::t1", "when": "setup", "outcome": "skipped", "message": "needs sm_100"},
        {"e": "report", "nodeid": "a.py::t1", "when": "teardown", "outcome": "passed"},
        {"e": "start", "nodeid": "a.py::t2"},
        {"e": "report", "nodeid": "a.py::t2", "when": "setup", "outcome": "passed"},
        {"e": "report", "nodeid": "a.py::t2", "when": "call", "outcome": "passed"},
        {
            "e": "report",
            "nodeid": "a.py::t2",
            "when": "teardown",
            "outcome": "failed",
            "message": "E   RuntimeError: handle",
        },
        {"e": "start", "nodeid": "a.py::t3"},
        {"e": "report", "nodeid": "a.py::t3", "when": "setup", "outcome": "passed"},
    ]
    crashed = report.outcomes_from_events(events)
    assert crashed["a.py::t1"] == Outcome("skipped", "needs sm_100")
    assert crashed["a.py::t2"] == Outcome("error", "teardown: E   RuntimeError: handle")
    assert crashed["a.py::t3"].outcome == "crashed"
    assert report.outcomes_from_events(events, timed_out=True)["a.py::t3"].outcome == "timeout"


def _write_small_suite(root: Path) -> Path:
    """A fake plancache.cudnn (counters and a list of built graphs, as the shim
    keeps them) and tests of every outcome that build graphs through it."""
    _fake_suite(
        root,
        {
            "shim/plancache/__init__.py": "",
            "shim/plancache/cudnn.py": """\
            from dataclasses import dataclass
            from types import SimpleNamespace

            @dataclass
            class Built:
                name: str
                plan: object = None
                reason: object = None
                node_types: tuple = ()

                @property
                def source(self):
                    return self.plan.source if self.plan is not None else "local"

            _built = []

            def build(name, key=None, reason=None, node_types=()):
                plan = SimpleNamespace(key=key, source="compiled", provisional=True) if key else None
                _built.append(Built(name, plan, reason, node_types))

            def stats():
                return SimpleNamespace(served=sum(b.plan is not None for b in _built), local=sum(b.plan is None for b in _built))

            def graphs():
                return list(_built[-256:])
            """,
            "tests/test_fake.py": """\
            import pytest
            import plancache.cudnn as shim

            shim.build("at_import", key="k0", node_types=("MATMUL",))

            def test_pass():
                shim.build("mm", key="k1", node_types=("MATMUL", "POINTWISE:RELU_FWD", "MATMUL"))

            def test_fail():
                shim.build("conv", reason="capturing the graph failed: X", node_types=("CONV_FPROP",))
                assert 1 == 2

            @pytest.mark.skipif(True, reason="not on this GPU")
            def test_skip_marker():
                pass

            def test_skip_inside():
                pytest.skip("TEST WAIVED: unsupported graph.")

            @pytest.mark.xfail(reason="known")
            def test_xfail():
                assert False

            @pytest.fixture
            def broken():
                raise RuntimeError("setup broke")

            def test_setup_error(broken):
                pass

            @pytest.fixture
            def bad_teardown():
                yield
                raise RuntimeError("teardown broke")

            def test_teardown_error(bad_teardown):
                pass

            @pytest.mark.parametrize("i", range(5))
            def test_many(i):
                pass

            class TestGroup:
                @pytest.mark.parametrize("d", ["a", "b"])
                def test_in_class(self, d):
                    pass
            """,
            "tests/test_broken_module.py": "raise ImportError('looseversion')\n",
            "tests/test_crash.py": """\
            import os

            def test_ok():
                pass

            def test_exit():
                os._exit(3)
            """,
        },
    )
    return root


def _pytest(
    root: Path, files: list[str], tag: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], Path]:
    events, junit = root / f"{tag}-events.jsonl", root / f"{tag}-junit.xml"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root / "shim"), str(SCRIPTS)]),
        "FRONTEND_SUITE_EVENTS": str(events),
        "FRONTEND_SUITE_GRAPHS": "1",
        "FRONTEND_SUITE_CAPS": json.dumps({"test_fake.py": 3}),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *files,
            "-p",
            "no:cacheprovider",
            "-p",
            "frontend_suite_plugin",
            "-q",
            "-o",
            "addopts=",
            f"--junitxml={junit}",
            "--continue-on-collection-errors",
            "--rootdir",
            str(root / "tests"),
            "-p",
            "no:randomly",
        ],
        cwd=root / "tests",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc, report.read_events(events), junit


EXPECTED = {
    "test_broken_module.py": "error",
    "test_fake.py::test_pass": "passed",
    "test_fake.py::test_fail": "failed",
    "test_fake.py::test_skip_marker": "skipped",
    "test_fake.py::test_skip_inside": "skipped",
    "test_fake.py::test_xfail": "xfailed",
    "test_fake.py::test_setup_error": "error",
    "test_fake.py::test_teardown_error": "error",
    "test_fake.py::test_many[0]": "passed",
    "test_fake.py::test_many[1]": "passed",
    "test_fake.py::test_many[2]": "passed",  # [3] and [4]: past the cap of 3
    "test_fake.py::TestGroup::test_in_class[a]": "passed",
    "test_fake.py::TestGroup::test_in_class[b]": "passed",
}


@pytest.mark.slow
def test_a_real_pytest_run_with_the_plugin_gives_outcomes_graphs_and_caps(tmp_path: Path) -> None:
    root = _write_small_suite(tmp_path)
    proc, events, junit = _pytest(root, ["test_fake.py", "test_broken_module.py"], "run")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    from_junit = report.phase_outcomes(junit.read_text(), events)
    assert {n: o.outcome for n, o in from_junit.items()} == EXPECTED
    assert {n: o.outcome for n, o in report.phase_outcomes(None, events).items()} == EXPECTED  # the events agree
    assert from_junit["test_fake.py::test_skip_marker"].message == "not on this GPU"
    assert from_junit["test_fake.py::test_skip_inside"].message == "TEST WAIVED: unsupported graph."
    assert "assert 1 == 2" in report.phase_outcomes(None, events)["test_fake.py::test_fail"].message
    assert any(e["e"] == "capped" and e["count"] == 2 for e in events)
    graphs, lost = report.graphs_by_test(events)
    assert lost == 0
    assert {n: [g["name"] for g in gs] for n, gs in graphs.items()} == {
        "(between tests)": ["at_import"],
        "test_fake.py::test_pass": ["mm"],
        "test_fake.py::test_fail": ["conv"],
    }
    assert graphs["test_fake.py::test_pass"][0] == {
        "name": "mm",
        "source": "compiled",
        "provisional": True,
        "reason": None,
        "key": "k1",
        "node_types": ["MATMUL", "POINTWISE:RELU_FWD", "MATMUL"],
        "local_built": None,
    }
    assert graphs["test_fake.py::test_fail"][0]["source"] == "local"


@pytest.mark.slow
def test_a_run_that_dies_in_a_test_names_it_crashed_and_keeps_what_ran_before(tmp_path: Path) -> None:
    root = _write_small_suite(tmp_path)
    proc, events, junit = _pytest(root, ["test_crash.py"], "crash")
    assert proc.returncode == 3 and not junit.exists()
    outcomes = report.phase_outcomes(None, events)
    assert {n: o.outcome for n, o in outcomes.items()} == {
        "test_crash.py::test_ok": "passed",
        "test_crash.py::test_exit": "crashed",
    }


def test_a_process_past_its_limit_is_interrupted_then_killed(tmp_path: Path) -> None:
    rc, timed_out, wall = suite.run_limited(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        cwd=tmp_path,
        env=dict(os.environ),
        log=tmp_path / "log",
        limit=0.5,
    )
    assert timed_out and rc != 0 and wall < 30


@pytest.mark.slow
def test_samples_run_side_by_side_each_to_its_exit_or_its_timeout_and_their_graphs_are_recorded(tmp_path: Path) -> None:
    root = _write_small_suite(tmp_path)
    samples = _fake_suite(
        tmp_path / "samples",
        {
            "10_ok.py": "import plancache.cudnn as shim\nshim.build('mm', key='k1', node_types=('MATMUL',))\nprint('done')\n",
            "20_fails.py": "import plancache.cudnn as shim\nshim.build('ln', reason='no server')\nraise SystemExit('rel err too large')\n",
            "30_hangs.py": "import time\ntime.sleep(60)\n",
        },
    )
    run = report.PhaseRun("plancache")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "shim"), str(SCRIPTS)])}
    suite.run_samples(
        run,
        samples,
        ["10_ok.py", "20_fails.py", "30_hangs.py"],
        env,
        deadline=time.monotonic() + 60,
        jobs=2,
        timeout=15.0,  # a sample that exits: well inside it even on a CI machine saturated by other tests
        logs=tmp_path / "logs",
        events_dir=tmp_path / "events",
    )
    assert run.outcomes == {
        "samples/10_ok.py": Outcome("passed"),
        "samples/20_fails.py": Outcome("failed", "exit 1: rel err too large"),
        "samples/30_hangs.py": Outcome("failed", "no exit within 15 s"),
    }
    assert {n: [(g["name"], g["source"]) for g in gs] for n, gs in run.graphs.items()} == {
        "samples/10_ok.py": [("mm", "compiled")],
        "samples/20_fails.py": [("ln", "local")],
    }
    assert (tmp_path / "logs" / "10_ok.py.log").read_text() == "done\n"


# ---- the report ------------------------------------------------------------------------------------------


def _graph(
    name: str, source: str, key: str | None = None, types: tuple[str, ...] = (), reason: str | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "source": source,
        "provisional": None,
        "reason": reason,
        "key": key,
        "node_types": list(types),
    }


def test_outcomes_that_differ_between_native_and_plancache_are_found_and_cut_runs_set_apart() -> None:
    native = {
        "t.py::a": Outcome("passed"),
        "t.py::b": Outcome("passed"),
        "t.py::c": Outcome("skipped", "sm_100 only"),
        "t.py::d": Outcome("passed"),
        "t.py::e": Outcome("failed", "x"),
        "t.py::f": Outcome("skipped", "reason 1"),
    }
    plancache = {
        "t.py::a": Outcome("passed"),
        "t.py::b": Outcome("failed", "E  mismatch"),
        "t.py::c": Outcome("skipped", "sm_100 only"),
        "t.py::e": Outcome("failed", "y"),
        "t.py::f": Outcome("skipped", "reason 2"),
        "t.py::g": Outcome("timeout"),
    }
    result = report.compare(native, plancache, ("native", "plancache"))
    assert [d["nodeid"] for d in result["differences"]] == ["t.py::b"]
    assert result["differences"][0]["plancache"] == {"outcome": "failed", "message": "E  mismatch"}
    assert [d["nodeid"] for d in result["incomplete"]] == [
        "t.py::d",
        "t.py::g",
    ]  # not run / cut at the limit: not differences
    assert [d["nodeid"] for d in result["other_skip_reason"]] == ["t.py::f"]


def test_graphs_count_once_per_distinct_node_type_they_hold() -> None:
    graphs = {
        "t.py::a": [
            _graph("mm", "compiled", "k1", ("MATMUL", "POINTWISE:ADD", "POINTWISE:ADD")),
            _graph("mm", "cache", "k1", ("MATMUL",)),
        ],
        "t.py::b": [_graph("ln", "local", None, ("LAYERNORM", "POINTWISE:ADD"), "capturing the graph failed: dtype")],
        "(between tests)": [_graph("old", "local", None, (), "the program calls select_plan()")],
    }
    graphs["t.py::c"] = [
        {**_graph("sdpa", "local", None, ("SDPA",), "CompileFailed: no engine"), "local_built": False}
    ]  # the frontend fails too
    summary = report.graph_summary(graphs)
    assert (summary["total"], summary["served"], summary["local"], summary["served_pct"]) == (5, 2, 3, 40.0)
    assert (summary["unbuildable"], summary["served_pct_of_buildable"]) == (1, 50.0)
    assert summary["by_node_type"] == {
        "MATMUL": {"graphs": 2, "served": 2, "local": 0, "unbuildable": 0},
        "POINTWISE:ADD": {"graphs": 2, "served": 1, "local": 1, "unbuildable": 0},
        "(node types unknown)": {"graphs": 1, "served": 0, "local": 1, "unbuildable": 0},
        "LAYERNORM": {"graphs": 1, "served": 0, "local": 1, "unbuildable": 0},
        "SDPA": {"graphs": 1, "served": 0, "local": 1, "unbuildable": 1},
    }
    assert summary["local_reasons"] == {"capturing the graph failed: dtype": 1, "the program calls select_plan()": 1}
    assert summary["sources"] == {"compiled": 1, "cache": 1, "local": 3}


def test_again_expects_a_hit_for_every_plan_served_before() -> None:
    first = {
        "t.py::a": [_graph("mm", "compiled", "k1"), _graph("mm", "cache", "k1")],
        "t.py::b": [_graph("sdpa", "provisional", "k2")],
        "t.py::c": [_graph("conv", "compiled", "k3")],
        "t.py::d": [_graph("ln", "local", None)],
    }
    again = {
        "t.py::a": [_graph("mm", "hit", "k1"), _graph("mm", "cache", "k1")],
        "t.py::b": [_graph("sdpa", "local", None, reason="Unavailable: server down")],
        "t.py::d": [_graph("ln", "local", None)],
    }
    check = report.again_check(first, again)
    assert check["served_keys"] == 3
    assert check["first_answer"] == {"hit": 1, "local": 1, "absent": 1}
    assert [(d["key"], d["again"], d["reason"]) for d in check["not_hit"]] == [
        ("k2", "local", "Unavailable: server down"),
        ("k3", "absent", "not built in again"),
    ]


def test_the_report_lists_differences_counts_and_renders() -> None:
    runs = {
        "native": report.PhaseRun(
            "native", wall_s=10.0, rc=1, outcomes={"t.py::a": Outcome("passed"), "t.py::b": Outcome("passed")}
        ),
        "plancache": report.PhaseRun(
            "plancache",
            wall_s=12.0,
            rc=1,
            outcomes={"t.py::a": Outcome("passed"), "t.py::b": Outcome("failed", "E  boom")},
            graphs={"t.py::a": [_graph("mm", "compiled", "k1", ("MATMUL",))]},
        ),
        "again": report.PhaseRun(
            "again",
            wall_s=8.0,
            rc=0,
            outcomes={"t.py::a": Outcome("passed"), "t.py::b": Outcome("passed")},
            graphs={"t.py::a": [_graph("mm", "hit", "k1", ("MATMUL",))]},
        ),
    }
    built = report.build_report(runs, {"source": {"commit": "abc"}, "selection": {"tests": ["t.py"]}})
    json.dumps(built)
    assert report.differences(built) == 1
    assert built["tests"]["t.py::b"] == {
        "native": {"outcome": "passed", "message": ""},
        "plancache": {"outcome": "failed", "message": "E  boom"},
        "again": {"outcome": "passed", "message": ""},
    }
    assert built["phases"]["plancache"]["counts"] == {"passed": 1, "failed": 1}
    assert built["again_check"]["first_answer"] == {"hit": 1}
    assert built["graphs_per_test"] == {"t.py::a": {"plancache": "1/0", "again": "1/0"}}
    markdown = report.render_markdown(built)
    assert (
        "## Outcomes that differ, native-vs-plancache: 1" in markdown
        and "| t.py::b | passed | failed: E  boom |" in markdown
    )
    assert "| MATMUL | 1 | 1 | 0 |" in markdown
    summary = "\n".join(report.summary_lines(built))
    assert "native-vs-plancache: 1 outcome(s) differ" in summary and "native-vs-again: 0 outcome(s) differ" in summary


# ---- the program -----------------------------------------------------------------------------------------


def test_caps_limits_and_sample_selection() -> None:
    assert suite.parse_caps(["test_mhas_v2.py=2", "10"]) == {"test_mhas_v2.py": 2, "*": 10}
    assert suite.parse_limits("300") == {"native": 300.0, "plancache": 300.0, "again": 300.0}
    assert suite.parse_limits("again=90")["again"] == 90.0
    keep = plugin.capped(["a.py::t[0]", "a.py::t[1]", "a.py::u", "b.py::t[0]", "b.py::t[1]"], {"a.py": 1})
    assert keep == [True, False, True, True, True]


def test_a_dry_run_prepares_both_copies_and_prints_each_phase_s_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite_dir = _fake_suite(
        tmp_path / "suite",
        {
            "test/python/conftest.py": "import cudnn\n",
            "test/python/test_a.py": "import cudnn\n",
            "samples/10_mm.py": "import cudnn\n",
            "samples/20_ln.py": "import cudnn\n",
        },
    )
    argv = [
        "--suite",
        str(suite_dir),
        "--out",
        str(tmp_path / "out"),
        "--work",
        str(tmp_path / "work"),
        "--tests",
        "test_a",
        "--samples",
        "10",
        "--dry-run",
        "-k",
        "not slow",
        "--",
        "-x",
    ]
    assert suite.main(argv) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "work/plancache/test/python/test_a.py").read_text() == "import plancache.cudnn as cudnn\n"
    assert sorted(p.name for p in (tmp_path / "work/native/samples").iterdir()) == ["10_mm.py"]
    commands = [line for line in printed.splitlines() if line.startswith(("native", "plancache", "again"))]
    assert len(commands) == 3
    assert all(
        "-m pytest test_a.py -p no:cacheprovider" in c and "-o addopts=" in c and c.endswith("-m L0 -k not slow -x")
        for c in commands
    )
    assert "plancache/test/python" in commands[2]  # "again" runs the rewritten copy


@pytest.mark.slow
def test_a_native_phase_runs_the_frontend_s_own_conftest_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite_dir = _fake_suite(
        tmp_path / "suite",
        {
            "SOURCE": "repository: NVIDIA/cudnn-frontend\ncommit: abc123\n",
            "test/python/pytest.ini": "[pytest]\nmarkers =\n    L0: level 0\naddopts = -m L0 --this-option-does-not-exist\n",
            "test/python/conftest.py": "import pytest\n\n@pytest.fixture(scope='session')\ndef cudnn_handle():\n    return 'handle'\n",
            "test/python/test_a.py": """\
            import pytest

            @pytest.mark.L0
            def test_uses_the_handle(cudnn_handle):
                assert cudnn_handle == "handle"

            @pytest.mark.L0
            def test_waived():
                pytest.skip("TEST WAIVED: unsupported graph.")

            @pytest.mark.L1
            def test_not_level_0():
                pass
            """,
            "samples/10_ok.py": "print('sample ran')\n",
        },
    )
    out = tmp_path / "out"
    argv = [
        "--suite",
        str(suite_dir),
        "--out",
        str(out),
        "--work",
        str(tmp_path / "work"),
        "--tests",
        "test_a",
        "--samples",
        "--phases",
        "native",
    ]
    assert suite.main(argv) == 0
    written = json.loads((out / "frontend-suite.json").read_text())
    assert written["tests"] == {
        "samples/10_ok.py": {"native": {"outcome": "passed", "message": ""}},
        "test_a.py::test_uses_the_handle": {"native": {"outcome": "passed", "message": ""}},
        "test_a.py::test_waived": {"native": {"outcome": "skipped", "message": "TEST WAIVED: unsupported graph."}},
    }
    assert written["phases"]["native"]["junit_written"] and written["phases"]["native"]["rc"] == 0
    assert written["source"]["commit"] == "abc123"
    assert (out / "frontend-suite.md").read_text().startswith("# The cuDNN frontend's own tests")
    assert "native" in capsys.readouterr().out.splitlines()[-1]  # the summary table ends the output


def test_a_native_phase_that_crashes_in_its_thread_is_the_run_s_error_not_a_missing_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPU run 26: the native phase's thread died on an import deadlock; the report showed two phases and
    # exited as if native had never been asked for.
    suite_dir = _fake_suite(
        tmp_path / "suite", {"test/python/conftest.py": "import cudnn\n", "test/python/test_a.py": "import cudnn\n"}
    )

    def crash(self: Any, phase: str, dep: Any) -> Any:
        raise RuntimeError(f"{phase} could not start")

    monkeypatch.setattr(suite.Suite, "phase", crash)
    out = tmp_path / "out"
    argv = ["--suite", str(suite_dir), "--out", str(out), "--work", str(tmp_path / "work")]
    assert suite.main([*argv, "--tests", "test_a", "--phases", "native", "--parallel"]) == 2
    written = json.loads((out / "frontend-suite.json").read_text())
    assert written["error"] == "native phase: RuntimeError: native could not start"
    assert "**The run ended early: native phase: RuntimeError" in (out / "frontend-suite.md").read_text()

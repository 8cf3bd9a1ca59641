"""Names moved in issue 39 that users wrote in their programs keep working (with a warning)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


def test_plancache_spec_is_the_graphspec_modules_under_their_old_name() -> None:
    with pytest.warns(DeprecationWarning, match="plancache.graphspec"):
        sys.modules.pop("plancache.spec", None)
        old = importlib.import_module("plancache.spec")
    from plancache.graphspec import family, graph
    from plancache.graphspec.validation import limits

    assert importlib.import_module("plancache.spec.family") is family
    assert old.GraphSpec is graph.GraphSpec
    assert importlib.import_module("plancache.spec.validation.limits") is limits


def test_a_program_that_imports_the_old_name_in_a_fresh_process_runs() -> None:
    # The README of c5e76a8 showed `from plancache.spec.family import derive`.
    program = "from plancache.spec.family import derive; from plancache.graphspec.family import derive as d; assert derive is d"
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", program], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr

"""docs/architecture.md is what scripts/architecture-doc.py writes from the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_architecture_page_is_current() -> None:
    spec = importlib.util.spec_from_file_location("architecture_doc", REPO / "scripts" / "architecture-doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == (REPO / "docs" / "architecture.md").read_text(), (
        "docs/architecture.md is stale: run python3 scripts/architecture-doc.py"
    )

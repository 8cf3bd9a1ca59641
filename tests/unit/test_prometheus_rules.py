"""The alert and recording rules (docker/prometheus-rules.yml) pass
Prometheus's own checker, and each alert fires when its condition has
lasted its `for` and not before (`promtool test rules`, Debian's
prometheus package: `make setup-test` installs it). The same expressions
are evaluated against a live server by tests/integration/test_prometheus.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docker" / "prometheus-rules.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "rules_test.yml"


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, (
        "no promtool: `make setup-test` (scripts/install-os-package.sh promtool prometheus) installs Debian's prometheus"
    )
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def test_the_rules_pass_promtools_checker() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout


def test_every_alert_fires_after_its_duration_and_not_before() -> None:
    tested = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    covered = {
        a["alertname"] for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for a in t.get("alert_rule_test", [])
    }
    assert (
        alerts
        == covered
        == {
            "PlancacheHitRateLow",
            "PlancacheQueueGrowing",
            "PlancacheNoLiveWorker",
            "PlancacheUntrustedBuilds",
            "PlancacheFleetCoverageLow",
        }
    )


def test_a_wrong_expectation_fails_the_rule_tests(tmp_path: Path) -> None:
    """The rule tests can fail: the same file with the hit-rate alert expected 5 minutes early does."""
    broken = RULE_TESTS.read_text().replace(
        "eval_time: 10m\n        exp_alerts: []",
        "eval_time: 10m\n        exp_alerts: [{exp_labels: {severity: warning, target: a}}]",
        1,
    )
    assert broken != RULE_TESTS.read_text()
    (tmp_path / "rules_test.yml").write_text(broken.replace("../../docker/prometheus-rules.yml", str(RULES)))
    assert _promtool("test", "rules", "rules_test.yml", cwd=tmp_path).returncode != 0

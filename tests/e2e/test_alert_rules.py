"""deploy/vultrscale-rules.yml: Prometheus's own tool accepts the rules, and its unit tests
(deploy/vultrscale-rules-test.yml) fire and clear every alert. That they name only metrics the
scaler exports is checked against a real scrape in test_metric_names.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e  # runs promtool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "vultrscale-rules.yml"
TESTS = DEPLOY / "vultrscale-rules-test.yml"


def _promtool(*args: str, cwd: Path = DEPLOY) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: scripts/setup --test-system installs it (Debian: prometheus)"
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def _alerts() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    result = _promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_the_unit_tests_pass() -> None:
    result = _promtool("test", "rules", TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_then_cleared() -> None:
    doc = yaml.safe_load(TESTS.read_text())
    checks: dict[str, list[tuple[str, bool]]] = {}
    for group in doc["tests"]:
        for check in group["alert_rule_test"]:
            checks.setdefault(check["alertname"], []).append(
                (check["eval_time"], bool(check["exp_alerts"]))
            )
    for rule in _alerts():
        name = str(rule["alert"])
        seen = checks.get(name, [])
        fired = [n for n, (_, firing) in enumerate(seen) if firing]
        assert fired, f"{name}: no test fires it"
        assert any(not firing for _, firing in seen[fired[0] + 1 :]), f"{name}: never cleared"
        annotations = rule["annotations"]
        assert isinstance(annotations, dict) and "Look at" in annotations["summary"], name


def test_the_unit_tests_catch_a_rule_that_does_not_fit(tmp_path: Path) -> None:
    # Guards test_the_unit_tests_pass: a threshold moved makes the tests fail.
    shutil.copy(TESTS, tmp_path / TESTS.name)
    rule = "vultrscale_queue_oldest_ready_seconds > 600\n"
    assert rule in RULES.read_text()
    moved = RULES.read_text().replace(rule, rule.replace("600", "6000"))
    (tmp_path / RULES.name).write_text(moved)
    result = _promtool("test", "rules", TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "VultrscaleOldJobWaiting" in result.stdout + result.stderr

"""cloud-init/worker.service: systemd accepts it and its stop timing fits the drain."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

from vultrscale.config import (
    RESTART_SECONDS,
    START_LIMIT_BURST,
    WorkerConfig,
    outage_budget,
    start_limit_interval_seconds,
    timeout_stop_seconds,
)

UNIT = Path(__file__).resolve().parents[2] / "cloud-init" / "worker.service"
EXEC = "/opt/vultrscale/venv/bin/vultrscale"


def _service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def _verify(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    unit = tmp_path / "worker.service"
    unit.write_text(text)
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.e2e  # runs systemd-analyze
def test_systemd_finds_nothing_but_the_missing_instance_binary(tmp_path: Path) -> None:
    result = _verify(UNIT.read_text(), tmp_path)
    complaints = [line for line in result.stderr.splitlines() if line.strip()]
    # The venv exists only on an instance; that one complaint is expected here.
    others = [c for c in complaints if not (EXEC in c and "is not executable" in c)]
    assert others == []


@pytest.mark.e2e  # runs systemd-analyze
def test_systemd_accepts_the_unit_when_the_binary_exists(tmp_path: Path) -> None:
    result = _verify(UNIT.read_text().replace(EXEC, sys.executable), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


@pytest.mark.e2e  # runs systemd-analyze
def test_verify_would_catch_a_typo(tmp_path: Path) -> None:
    # Guards the two tests above: systemd-analyze really reads the keys.
    text = UNIT.read_text().replace(EXEC, sys.executable).replace("KillSignal=", "KillSignl=")
    result = _verify(text, tmp_path)
    assert "KillSignl" in result.stderr


def test_stop_timing_and_restart_policy() -> None:
    svc = _service()
    assert svc["KillSignal"] == "SIGTERM"
    assert svc["Restart"] == "on-failure"
    assert svc["EnvironmentFile"] == "/etc/vultrscale/worker.env"
    assert svc["User"] == "worker"
    assert svc["ExecStart"] == f"{EXEC} worker"
    stop = int(svc["TimeoutStopSec"])
    default = WorkerConfig()
    assert stop == timeout_stop_seconds(default)
    assert stop >= default.drain_seconds + 10  # room to give jobs back after the drain


def _unit() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Unit"]


def test_restarts_after_outages_never_reach_the_start_limit() -> None:
    """Each exit after an outage came at least budget + RestartSec after the start before it;
    StartLimitBurst + 1 such starts must span more than StartLimitIntervalSec."""
    svc, unit = _service(), _unit()
    default = WorkerConfig()
    restart = int(svc["RestartSec"])
    burst = int(unit["StartLimitBurst"])
    interval = int(unit["StartLimitIntervalSec"])
    assert (restart, burst) == (RESTART_SECONDS, START_LIMIT_BURST)
    assert interval == start_limit_interval_seconds(default)
    budget = outage_budget(default.outage_seconds, default.lease_seconds)
    assert burst * (budget + restart) > interval
    # ... while a worker failing at once (a crash loop) does reach it.
    assert (burst + 1) * restart <= interval

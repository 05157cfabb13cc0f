"""cloud-init/worker.service: its stop timing fits the drain (systemd's own check of the file is
in tests/e2e/test_unit_file_verify.py: it runs systemd-analyze)."""

from __future__ import annotations

import configparser
from pathlib import Path

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

"""A sweep replayed on a pool of processes gives the same rows as on one process."""

from __future__ import annotations

import json

import pytest

from vultrscale.cli import main


def _sweep(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cores: int) -> list:
    monkeypatch.setattr("vultrscale.replay.command.os.cpu_count", lambda: cores)
    argv = ["simulate", "--days", "1", "--jobs-per-day", "200", "--seed", "5", "--json",
            "--sweep", "policy.idle_before_scale_down=90s,5m,15m"]  # fmt: skip
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["results"]


def test_a_sweep_on_two_processes_gives_the_rows_of_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _sweep(monkeypatch, capsys, 1)
    two = _sweep(monkeypatch, capsys, 2)
    assert len(one) >= 4  # three variants and the baselines
    assert two == one

"""`vultrscale worker` settings: flags over VULTRSCALE_WORKER_* over defaults, and a bad
--app stops the command (exit 2) before any database is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from vultrscale import cli
from vultrscale.worker import runtime


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no ./vultrscale.toml or .env from the checkout
    for name in ("DATABASE_URL", "WORKER_DATABASE_URL", "VULTRSCALE_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def test_app_comes_from_the_environment_when_no_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VULTRSCALE_WORKER_APP", "from_env_module_xyz:handle")
    monkeypatch.setenv("VULTRSCALE_WORKER_ID", "w-7")  # a process name, not a config key
    assert cli.main(["worker"]) == 2
    assert "cannot import module 'from_env_module_xyz'" in capsys.readouterr().err


def test_the_flag_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VULTRSCALE_WORKER_APP", "from_env_module_xyz:handle")
    assert cli.main(["worker", "--app", "from_flag_module_xyz:handle"]) == 2
    err = capsys.readouterr().err
    assert "from_flag_module_xyz" in err and "from_env_module_xyz" not in err


def test_a_good_app_without_database_url_exits_2_with_a_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["worker", "--app", "vultrscale.worker.examples:noop"]) == 2
    assert "DATABASE_URL is not set" in capsys.readouterr().err


def test_invalid_numbers_are_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["worker", "--app", "m:f", "--lease-seconds", "1"]) == 2
    assert "worker.lease_seconds" in capsys.readouterr().err


def test_load_handler_finds_sync_and_async_functions() -> None:
    from vultrscale.worker import examples

    assert runtime.load_handler("vultrscale.worker.examples:noop") is examples.noop
    assert runtime.load_handler("vultrscale.worker.examples:noop_async") is examples.noop_async


def test_summary_line_names_every_outcome() -> None:
    s = runtime.Summary(taken=8, succeeded=6, retried=1, dead=1, given_back=0, elapsed=5.66)
    assert s.line() == (
        "Done in 5.7 s: 8 taken, 6 succeeded, 1 to retry later, 0 failed, 1 dead, "
        "0 given back, 0 lost lease."
    )

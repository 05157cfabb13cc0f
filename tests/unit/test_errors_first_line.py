"""redaction.first_line: the one helper that turns an error into one line that is safe to show."""

from __future__ import annotations

import pytest

from vultrscale import cli, config
from vultrscale.redaction import first_line, secret_values

PW = "Se#cr/et?Pw"  # '#', '/' and '?' defeat a URL parser


def test_first_line_keeps_only_the_first_line_and_names_an_empty_error() -> None:
    assert first_line(ValueError("  bad thing\n\tdetail\n")) == "bad thing"
    assert first_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert first_line("") == "unknown error"


@pytest.mark.parametrize(
    "url",
    [f"postgresql://scaler:{PW}@db:5432/jobs", f"host=db user=scaler password={PW} dbname=jobs"],
    ids=["url", "key-value"],
)
def test_first_line_redacts_a_secret_and_the_password_inside_it(url: str) -> None:
    exc = RuntimeError(f'bad token "{PW}" in {url}\nmore')
    line = first_line(exc, [url, None])
    assert PW not in line and "Se#cr" not in line
    assert line.startswith('bad token "***" in ')


def test_first_line_masks_url_and_keyword_passwords_it_was_not_told_about() -> None:
    line = first_line(OSError("at postgresql://u:hunter2x@h/db and password=hunter3x ok"))
    assert line == "at postgresql://u:***@h/db and password=*** ok"


def test_secrets_from_the_environment_are_the_configs_secrets() -> None:
    env = {"VULTR_API_KEY": "k" * 20, "DATABASE_URL": f"postgresql://u:{PW}@h/db"}
    values = config.Secrets.from_env(env).values()
    assert values == secret_values(["k" * 20, f"postgresql://u:{PW}@h/db"])
    assert PW in values


def test_cli_errors_redact_the_environments_secrets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKER_DATABASE_URL", f"host=h password={PW}")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert cli.fail(f"boom {PW}", f"hint {PW}", 1) == 1
    err = capsys.readouterr().err
    assert PW not in err and "Error: boom ***" in err and "Fix: hint ***" in err

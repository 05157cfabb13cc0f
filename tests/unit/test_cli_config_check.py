"""`config check` says in words which database login the workers get."""

from __future__ import annotations

from pathlib import Path

import pytest

from vultrscale.cli import main
from vultrscale.cli.views import worker_login_line
from vultrscale.db.roles import WorkerAccess


@pytest.mark.parametrize(
    ("access", "line"),
    [
        pytest.param(
            WorkerAccess(None, "", ()),
            "Workers' database login: none yet (WORKER_DATABASE_URL is not set)",
            id="no-worker-url",
        ),
        pytest.param(
            WorkerAccess(None, "WORKER_DATABASE_URL", ()),
            "Workers log in with WORKER_DATABASE_URL, which names no user (libpq then uses the "
            "operating system user's name on the instance)",
            id="url-without-user",
        ),
        pytest.param(
            WorkerAccess("vultrscale_worker", "WORKER_DATABASE_URL", ()),
            "Workers log in as vultrscale_worker (from WORKER_DATABASE_URL)",
            id="named-role",
        ),
    ],
)
def test_the_workers_login_line_says_what_it_means(access: WorkerAccess, line: str) -> None:
    assert worker_login_line(access) == line


def test_config_check_without_a_worker_url_says_there_is_none_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("VULTRSCALE_CONFIG", "WORKER_DATABASE_URL", "DATABASE_URL", "VULTR_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert "none yet (WORKER_DATABASE_URL is not set)" in out
    assert "nowhere" not in out and "(no role named)" not in out

"""Paths below a directory the user cannot search: exit 2 with a Fix line, not an unexpected
PermissionError. Root searches every directory, so as root these tests run as the user
nobody (the effective user only, restored after); another user is denied already."""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from vultrscale import metrics
from vultrscale.cli import main
from vultrscale.errors import UsageError


@contextlib.contextmanager
def _not_root() -> Iterator[None]:
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(pwd.getpwnam("nobody").pw_uid)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def locked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    # What a failing command imports lazily, imported while it can be: the Python
    # installation may sit where nobody cannot read it.
    main(["--config", "/nonexistent/vultrscale.toml", "config", "check"])
    capsys.readouterr()
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o000)
    return folder


def test_a_metrics_file_below_an_unsearchable_directory_is_a_usage_error(locked: Path) -> None:
    with _not_root(), pytest.raises(UsageError) as info:
        metrics.check_textfile(str(locked / "textfile" / "vultrscale.prom"))
    assert "cannot be searched" in info.value.message
    assert "--metrics-file" in info.value.hint


def test_a_config_below_an_unsearchable_directory_is_exit_2_with_a_fix(
    locked: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _not_root():
        code = main(["--config", str(locked / "vultrscale.toml"), "config", "check"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cannot be searched" in err and "Fix: Give this user search (x) permission" in err
    assert "unexpected" not in err

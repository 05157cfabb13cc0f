"""`vultrscale init` on a disk that refuses the write: a fresh interpreter under a file size
limit (the rest of init's tests run in-process, in tests/unit/test_init.py)."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vultrscale import scaffold


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("VULTRSCALE_CONFIG", "VULTR_API_URL", *scaffold.SECRETS):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _file_size_limit() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG


def test_a_write_the_system_refuses_is_exit_1_and_leaves_no_file(here: Path) -> None:
    """A real failed write (past RLIMIT_FSIZE, as on a full disk): one error line, no file."""
    proc = subprocess.run(
        [sys.executable, "-m", "vultrscale.cli", "init", "--defaults"],
        capture_output=True,
        text=True,
        preexec_fn=_file_size_limit,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        "Error: cannot write vultrscale.toml: File too large; nothing written.",
        "Fix: Free space on that disk (or fix it), then run init again.",
    ]
    assert list(here.iterdir()) == []

"""cloud-init/worker.service: systemd accepts it (runs systemd-analyze; the unit's timing rules
are checked without a process in tests/unit/test_unit_file.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "cloud-init" / "worker.service"
EXEC = "/opt/vultrscale/venv/bin/vultrscale"


def _verify(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    unit = tmp_path / "worker.service"
    unit.write_text(text)
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )


def test_systemd_finds_nothing_but_the_missing_instance_binary(tmp_path: Path) -> None:
    result = _verify(UNIT.read_text(), tmp_path)
    complaints = [line for line in result.stderr.splitlines() if line.strip()]
    # The venv exists only on an instance; that one complaint is expected here.
    others = [c for c in complaints if not (EXEC in c and "is not executable" in c)]
    assert others == []


def test_systemd_accepts_the_unit_when_the_binary_exists(tmp_path: Path) -> None:
    result = _verify(UNIT.read_text().replace(EXEC, sys.executable), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_verify_would_catch_a_typo(tmp_path: Path) -> None:
    # Guards the two tests above: systemd-analyze really reads the keys.
    text = UNIT.read_text().replace(EXEC, sys.executable).replace("KillSignal=", "KillSignl=")
    result = _verify(text, tmp_path)
    assert "KillSignl" in result.stderr

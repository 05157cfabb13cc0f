"""Every script under scripts/ is executable and answers --help with its own usage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted(p for p in (Path(__file__).parents[2] / "scripts").iterdir() if p.is_file())


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_script_is_executable_and_has_its_own_help(script: Path) -> None:
    assert os.access(script, os.X_OK), f"chmod +x {script.name} (git: mode 755)"
    # this interpreter first on PATH, as with the project's .venv activated
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        [str(script), "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.lower().startswith("usage:"), done.stdout[:200]
    assert script.name in done.stdout
    assert "pytest" not in done.stdout.splitlines()[0]  # scripts/test's own help, not pytest's

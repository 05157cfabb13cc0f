"""The cron lines of docs/real-fleet.md work as cron runs them: a bare PATH without the virtual
environment, the home directory as the working directory (no vultrscale.toml there), no
secrets in the environment (they come from the .env next to the config)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cli_world import World, cli_world

API_KEY = "VKEY-cron-0123456789abcdefghijklmnop"
REAL_FLEET = Path(__file__).parents[2] / "docs" / "real-fleet.md"
VENV_BIN = "/opt/vultrscale/.venv/bin/"
CONFIG = "/etc/vultrscale/vultrscale.toml"
LOG = "/var/log/vultrscale.log"


def _cron_lines() -> list[str]:
    text = REAL_FLEET.read_text()
    block = text.split("With a clone in `/opt/vultrscale`:", 1)[1].split("```", 2)[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def world(
    pg_admin_url: str, _migrated_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    with cli_world(
        pg_admin_url, _migrated_template, tmp_path_factory.mktemp("cron"), API_KEY, "pw"
    ) as w:
        yield w


def _as_cron(line: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``line`` run the way cron runs it: /bin/sh, a bare PATH, the home directory."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "SHELL": "/bin/sh", "LOGNAME": "root"}
    return subprocess.run(
        ["/bin/sh", "-c", line], env=env, cwd=home, capture_output=True, text=True, timeout=120
    )


def test_the_docs_name_a_cron_line_per_half_minute() -> None:
    lines = _cron_lines()
    assert len(lines) == 2
    assert all(line.startswith("* * * * * ") for line in lines)
    assert "sleep 30;" in lines[1]


@pytest.mark.parametrize("n", [0, 1], ids=["on-the-minute", "half-past"])
def test_the_docs_cron_line_runs_a_pass_from_a_bare_environment(
    n: int, world: World, tmp_path: Path
) -> None:
    etc, home = tmp_path / "etc", tmp_path / "home"
    etc.mkdir()
    home.mkdir()
    config = etc / "vultrscale.toml"
    config.write_text(world.config.read_text())
    (etc / ".env").write_text(
        f"VULTR_API_KEY={API_KEY}\nVULTR_API_URL={world.server.url}\nDATABASE_URL={world.db}\n"
    )
    log = tmp_path / "vultrscale.log"
    venv_bin = str(Path(sys.executable).parent) + "/"
    command = _cron_lines()[n].removeprefix("* * * * * ").replace("sleep 30; ", "")
    line = command.replace(VENV_BIN, venv_bin).replace(CONFIG, str(config)).replace(LOG, str(log))

    done = _as_cron(line, home)

    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert re.match(r"desired 0, target 0 ", log.read_text()), log.read_text()  # the pass's plan
    # what the docs said before: neither the program nor the config is found from cron
    bare = _as_cron("vultrscale reconcile", home)
    assert bare.returncode == 127

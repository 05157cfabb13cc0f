"""Start-up stays light: commands import only what they use (a fresh interpreter each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("httpx", "psycopg", "paramiko", "rich", "tenacity", "prometheus_client", "croniter")
# What `--version` and the root `--help` must not import either: the command groups (Typer
# building their command trees is most of a slow start-up) and the config loader.
COMMAND_MODULES = (
    "vultrscale.cli.fleet",
    "vultrscale.cli.forecast",
    "vultrscale.cli.image",
    "vultrscale.cli.queue",
    "vultrscale.cli.local",
    "vultrscale.cli.simulate",
    "vultrscale.cli.views",
    "vultrscale.config",
    "logging",
)


def loaded_after(
    code: str, watched: tuple[str, ...] = HEAVY, env: dict[str, str] | None = None
) -> set[str]:
    probe = (
        "import sys, json\n"
        f"{code}\n"
        f"print(json.dumps([m for m in {list(watched)!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_version_and_help_import_no_heavy_library_and_no_command() -> None:
    for argv in (["--version"], ["--help"], ["-h"]):
        code = f"from vultrscale.cli import main; main({argv!r})"
        assert loaded_after(code, HEAVY + COMMAND_MODULES) == set(), argv


def test_a_command_imports_only_its_own_group() -> None:
    code = "from vultrscale.cli import main; main(['status', '--help'])"
    # logging: the root callback quiets third-party loggers before any command runs
    assert loaded_after(code, HEAVY + COMMAND_MODULES) == {"vultrscale.cli.fleet", "logging"}


def test_policy_and_reconcile_modules_import_no_ssh_or_http() -> None:
    # reconcile imports its adapters lazily: paramiko only when a drain needs SSH
    assert (
        loaded_after("import vultrscale.reconcile, vultrscale.ssh") & {"paramiko", "httpx"} == set()
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--help"],
        ["reconcile", "--help"],
        ["--config", "/nonexistent/vultrscale.toml", "reconcile", "--dry-run"],
        ["reconcile", "--interval", "1s"],  # refused by our own parser
    ],
    ids=["status-help", "reconcile-help", "missing-config", "bad-flag"],
)
def test_real_commands_read_their_flags_without_a_validation_library(argv: list[str]) -> None:
    """Typer coerced every flag through pydantic (about 150 ms of a 400 ms start-up); string
    and boolean flags, and those our own parsers read, need none."""
    code = f"from vultrscale.cli import main; main({argv!r})"
    assert loaded_after(code, ("pydantic",)) == set()


def test_a_reconcile_whose_config_is_missing_fails_before_importing_the_pass() -> None:
    code = (
        "from vultrscale.cli import main\n"
        "assert main(['--config', '/nonexistent/vultrscale.toml', 'reconcile']) == 2"
    )
    watched = ("vultrscale.reconcile", "vultrscale.cli.views", "rich", "httpx", "psycopg")
    assert loaded_after(code, watched) == set()


def test_a_failing_command_masks_the_database_password_without_importing_psycopg() -> None:
    # Before: the error path read DATABASE_URL with psycopg to mask its password, 2.8x
    # `import typer` for a dry run refused at once for its missing config.
    env = {**os.environ, "DATABASE_URL": "postgresql://scaler:Hunter2-pw@db.example/jobs"}
    code = (
        "from vultrscale.cli import main\n"
        "assert main(['--config', '/nonexistent/vultrscale.toml', 'reconcile', '--dry-run']) == 2"
    )
    assert loaded_after(code, ("psycopg",), env) == set()


def test_the_vultr_client_imports_httpx_without_its_command_line_client() -> None:
    # Before: `import httpx` brought its `httpx` command (click, pygments, rich), about a
    # tenth of a cron pass's CPU. Its module still imports for whoever asks for it.
    cli_parts = ("httpx._main", "click", "pygments", "rich")
    assert loaded_after("import vultrscale.vultr.client", cli_parts) == set()
    code = "import vultrscale.vultr.client, httpx._main"
    assert loaded_after(code, ("httpx._main",)) == {"httpx._main"}

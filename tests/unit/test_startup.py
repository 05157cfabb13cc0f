"""Start-up stays light: commands import only what they use (a fresh interpreter each)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # a fresh interpreter per test

HEAVY = ("httpx", "psycopg", "paramiko", "rich", "tenacity", "prometheus_client", "croniter")


def loaded_after(code: str) -> set[str]:
    probe = (
        "import sys, json\n"
        f"{code}\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_version_and_help_import_no_heavy_library() -> None:
    assert loaded_after("from vultrscale.cli import main; main(['--version'])") == set()
    assert loaded_after("from vultrscale.cli import main; main(['--help'])") <= {"rich"}


def test_policy_and_reconcile_modules_import_no_ssh_or_http() -> None:
    # reconcile imports its adapters lazily: paramiko only when a drain needs SSH
    assert (
        loaded_after("import vultrscale.reconcile, vultrscale.ssh") & {"paramiko", "httpx"} == set()
    )

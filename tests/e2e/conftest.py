"""Fixtures shared by the worker-process tests (the Postgres fixtures are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.e2e.worker_procs import WorkerProcess


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to this test's database."""
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


@pytest.fixture
def procs() -> Iterator[list[WorkerProcess]]:
    """Worker processes the test starts; each is stopped when the test ends."""
    started: list[WorkerProcess] = []
    yield started
    for p in started:
        p.stop()

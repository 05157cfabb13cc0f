"""The one error a running worker ends with when the database fails it (worker/database.py)."""

from __future__ import annotations

import psycopg.errors

from vultrscale.db import pg
from vultrscale.worker import database

URL = "postgresql://app:s3cret@db.example:5432/jobs"


def test_a_running_worker_ended_by_any_database_error_names_its_leases_in_the_hint() -> None:
    """A failover to a read-only replica (not a connection error) ends the worker: the hint
    says what happens to its jobs, not "run `vultrscale db init`"."""
    exc = psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction")
    err = database.database_error(exc, URL, 60)
    assert err.message.startswith("lost the database at ")
    assert "s3cret" not in err.message
    assert "return to the queue when their lease expires (at most 60 s)" in err.hint
    assert "db init" not in err.hint


def test_the_worker_keeps_the_specific_hints_for_missing_tables_and_privileges() -> None:
    missing = database.database_error(psycopg.errors.UndefinedTable("no jobs"), URL, 60)
    assert missing.hint == pg.HINT_NO_TABLES
    denied = database.database_error(psycopg.errors.InsufficientPrivilege("no"), URL, 60)
    assert denied.hint == pg.HINT_PRIVILEGE


def test_a_worker_newer_than_the_schema_is_told_to_run_db_init() -> None:
    """Workers rolled out before `vultrscale db init` upgraded the schema (v6 added
    jobs.started_at, which the claim writes): every claim fails. The hint said "Check that
    Postgres is reachable", and systemd restarted the worker into the same failure."""
    exc = psycopg.errors.UndefinedColumn('column "started_at" of relation "jobs" does not exist')
    err = database.database_error(exc, URL, 60)
    assert "older than this vultrscale" in err.message
    assert err.hint == pg.HINT_OLD_SCHEMA and "vultrscale db init" in err.hint

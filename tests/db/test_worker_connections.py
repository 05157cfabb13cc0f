"""The worker's connections carry timeouts sized from the lease (checked on a real server)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from vultrscale.db import pg
from vultrscale.errors import DatabaseError
from vultrscale.worker import database
from vultrscale.worker.runtime import Worker, WorkerSettings


def _check(conn: psycopg.Connection[Any], statement_timeout: str) -> None:
    assert conn.execute("SHOW statement_timeout").fetchone() == (statement_timeout,)
    assert conn.execute("SHOW lock_timeout").fetchone() == ("7s",)
    assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
    params = dict(conn.info.get_parameters())
    assert params.get("keepalives") == "1" and params.get("keepalives_idle") == "10"
    assert params.get("tcp_user_timeout") == "20000"


def test_worker_connections_get_keepalives_and_a_statement_timeout_from_the_lease(
    db_url: str,
) -> None:
    s = WorkerSettings(app="x:y", lease_seconds=60)
    url = db_url + "?options=-c%20lock_timeout%3D7s"  # the address's own options are kept
    with database.connect(url, s.lease_seconds, s.statement_timeout_seconds, "t") as conn:
        _check(conn, "10s")
    pool = database.pool(url, s.lease_seconds, s.statement_timeout_seconds * 2, max_size=2)
    pool.open(wait=True)
    try:
        with pool.connection() as conn:
            _check(conn, "20s")
    finally:
        pool.close()


def test_a_worker_started_on_a_database_without_the_tables_says_to_run_db_init(
    pg_url: str,
) -> None:
    """The worker's error comes from the one translation in db/pg, with its hint."""
    raised: list[DatabaseError] = []

    def run() -> None:  # off the main thread: the worker installs no signal handlers here
        try:
            Worker(WorkerSettings(app="x:y"), pg_url, lambda job: None, say=print).run()
        except DatabaseError as exc:
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert len(raised) == 1
    assert raised[0].message.startswith("cannot start on the database at ")
    assert "the vultrscale tables are missing" in raised[0].message
    assert raised[0].hint == pg.HINT_NO_TABLES

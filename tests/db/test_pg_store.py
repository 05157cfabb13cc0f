"""The Store's kept connection (``PgStore(keep=True)``, used by `reconcile --loop` and
`status --watch`): reused pass after pass, never carrying a lock or a transaction across,
replaced when it broke in between."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from vultrscale.config import Config
from vultrscale.db import pg
from vultrscale.db.ledger import PgLedger, PgStore, lock_key, try_lock
from vultrscale.errors import DatabaseError

MONTH = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def cfg() -> Config:
    return Config()


@pytest.fixture
def store(db_url: str) -> Iterator[PgStore]:
    store = PgStore(db_url, keep=True)
    yield store
    store.close()


def _backend(ledger: Any) -> int:
    assert isinstance(ledger, PgLedger)
    row = ledger.conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def test_a_kept_connection_serves_the_next_pass_and_holds_no_lock_between(
    store: PgStore, cfg: Config, db_url: str
) -> None:
    with store.session(cfg) as (ledger, _signals):
        assert ledger.lock()
        first = _backend(ledger)
        with psycopg.connect(db_url, autocommit=True) as other:
            assert not try_lock(other, cfg.fleet.name)  # held while the pass runs
    with psycopg.connect(db_url, autocommit=True) as other:
        held = other.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
            (lock_key(cfg.fleet.name),),
        ).fetchone()
        assert held == (0,)  # released when the session ended, though the connection lives on
    with store.session(cfg) as (ledger, _signals):
        assert _backend(ledger) == first
        assert ledger.lock()


def test_a_kept_connection_killed_between_passes_is_replaced_before_the_pass_uses_it(
    store: PgStore, cfg: Config, db_url: str
) -> None:
    with store.session(cfg) as (ledger, _signals):
        first = _backend(ledger)
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (first,))
    with store.session(cfg) as (ledger, _signals):
        assert ledger.lock()
        assert _backend(ledger) != first


def test_a_session_left_inside_a_transaction_is_closed_not_kept(
    store: PgStore, cfg: Config
) -> None:
    with store.session(cfg) as (ledger, _signals):
        first = _backend(ledger)
        assert isinstance(ledger, PgLedger)
        ledger.conn.execute("BEGIN")  # as if a pass died inside one
        kept = ledger.conn
    assert kept.closed
    with store.session(cfg) as (ledger, _signals):
        assert _backend(ledger) != first


def test_without_keep_every_session_has_its_own_connection(db_url: str, cfg: Config) -> None:
    store = PgStore(db_url)
    with store.session(cfg) as (ledger, _signals):
        assert isinstance(ledger, PgLedger)
        conn = ledger.conn
    assert conn.closed


def test_the_pass_connection_bounds_statements_and_ends_a_silent_network(
    store: PgStore, cfg: Config
) -> None:
    with store.session(cfg) as (ledger, _signals):
        assert isinstance(ledger, PgLedger)
        assert ledger.conn.execute("SHOW statement_timeout").fetchone() == ("30s",)
        params = dict(ledger.conn.info.get_parameters())
    assert params.get("keepalives") == "1" and params.get("tcp_user_timeout") == "10000"


def test_a_pass_stuck_behind_a_lock_fails_within_the_bound_and_frees_the_fleet_lock(
    db_url: str, cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session holding the ledger's table (a migration, a hand-run LOCK): the pass's read
    ends in a DatabaseError saying why, not a wait as long as the lock, and the fleet's lock is
    free for the next pass (`--loop` goes on)."""
    monkeypatch.setattr(pg, "PASS_STALL_S", 1.0)
    store = PgStore(db_url, keep=True)
    with psycopg.connect(db_url) as blocker:  # not autocommit: the lock lasts until rollback
        blocker.execute("LOCK TABLE fleet_instances IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(DatabaseError) as caught, store.session(cfg) as (ledger, _signals):
            assert ledger.lock()
            ledger.rows(since=MONTH)
        assert "statement timeout" in caught.value.message
        assert caught.value.hint == pg.HINT_STALLED
        with psycopg.connect(db_url, autocommit=True) as other:
            assert try_lock(other, cfg.fleet.name)  # the pass's lock went with its session
            # Freed by a statement: the close alone frees it only when the server gets to it.
            other.execute("SELECT pg_advisory_unlock_all()")
        blocker.rollback()
    with store.session(cfg) as (ledger, _signals):
        assert ledger.lock() and ledger.rows(since=MONTH) == []
    store.close()


@pytest.mark.parametrize("keep", [False, True], ids=["one-shot", "kept"])
def test_the_fleet_lock_is_free_the_moment_a_session_ends(
    db_url: str, cfg: Config, keep: bool
) -> None:
    """The next pass (cron's, the loop's, a test's) must not find the lock of one that has
    returned. Closing a connection only asks its server process to end; the lock went with it
    some milliseconds later, and a pass run right after found "lock held" and did nothing."""
    store = PgStore(db_url, keep=keep)
    with psycopg.connect(db_url, autocommit=True) as other:
        for attempt in range(30):
            with store.session(cfg) as (ledger, _signals):
                assert ledger.lock()
            assert try_lock(other, cfg.fleet.name), f"still held after session {attempt + 1}"
            other.execute("SELECT pg_advisory_unlock_all()")
    store.close()

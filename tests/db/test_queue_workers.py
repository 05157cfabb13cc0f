"""Worker registration, batch give-back and the v2 migration against a real Postgres."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from vultrscale.db import queue as q
from vultrscale.db import schema


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


def _draining(conn: psycopg.Connection, worker_id: str) -> bool:
    row = conn.execute("SELECT draining FROM workers WHERE worker_id = %s", (worker_id,))
    found = row.fetchone()
    assert found is not None
    return bool(found[0])


def _instance(conn: psycopg.Connection, label: str, state: str) -> None:
    conn.execute(
        "INSERT INTO fleet_instances (label, fleet, state, created_at, state_since)"
        " VALUES (%s, 'workers', %s, now(), now())",
        (label, state),
    )


def test_a_restarted_worker_keeps_the_scalers_draining_mark(conn: psycopg.Connection) -> None:
    _instance(conn, "worker-1", "running")
    q.register_worker(conn, "worker-1", "worker-1")
    # the scaler's mark (ledger.mark_draining): the instance and its workers
    conn.execute("UPDATE fleet_instances SET state = 'draining' WHERE label = 'worker-1'")
    conn.execute("UPDATE workers SET draining = true WHERE instance_label = 'worker-1'")
    q.register_worker(conn, "worker-1", "worker-1")  # systemd restarted it (same id)
    assert _draining(conn, "worker-1")
    q.enqueue(conn, [{}])
    assert q.claim(conn, "worker-1", "default", 1, 30) == []


@pytest.mark.parametrize(
    ("state", "draining"), [("draining", True), ("deleting", True), ("running", False)]
)
def test_registration_reads_draining_from_the_instance_state(
    conn: psycopg.Connection, state: str, draining: bool
) -> None:
    _instance(conn, "worker-7", state)
    q.register_worker(conn, "worker-7-1234", "worker-7")  # a fresh worker id on that instance
    assert _draining(conn, "worker-7-1234") is draining
    q.register_worker(conn, "worker-7-1234", "worker-7")  # and again on conflict
    assert _draining(conn, "worker-7-1234") is draining


def test_a_worker_killed_during_its_own_drain_claims_again_after_a_restart(
    conn: psycopg.Connection,
) -> None:
    _instance(conn, "w-k", "running")
    q.register_worker(conn, "w-k", "w-k")
    q.set_draining(conn, "w-k")  # `systemctl restart`: SIGTERM, its own drain ...
    # ... cut short by SIGKILL after TimeoutStopSec: no stopped_at
    q.register_worker(conn, "w-k", "w-k")
    assert not _draining(conn, "w-k")
    q.enqueue(conn, [{}])
    assert len(q.claim(conn, "w-k", "default", 1, 30)) == 1


def test_a_worker_restarted_after_its_own_clean_stop_claims_again(
    conn: psycopg.Connection,
) -> None:
    q.register_worker(conn, "w-own", "w-own")
    q.set_draining(conn, "w-own")  # its own SIGTERM drain
    q.mark_stopped(conn, "w-own")
    q.register_worker(conn, "w-own", "w-own")
    assert not _draining(conn, "w-own")


def test_give_back_many_is_fenced_per_job(conn: psycopg.Connection) -> None:
    ids = q.enqueue(conn, [{}] * 3)
    held = q.claim(conn, "w", "default", 3, 30)
    assert q.complete(conn, held[0].id, "w", held[0].token)
    wrong = [(held[1].id, held[2].token)]  # a token from another job: refused
    assert q.give_back_many(conn, "w", wrong) == set()
    back = q.give_back_many(conn, "w", [(c.id, c.token) for c in held])
    assert back == {held[1].id, held[2].id}
    rows: dict[int, str] = dict(
        conn.execute("SELECT id, (state, attempts)::text FROM jobs").fetchall()
    )
    assert rows == {ids[0]: "(succeeded,1)", ids[1]: "(ready,0)", ids[2]: "(ready,0)"}


def test_v2_drops_the_active_state_index_no_query_used(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as c:
        # A database at v1, as shipped.
        c.execute(
            "CREATE TABLE vultrscale_schema ("
            " version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        c.execute(schema.MIGRATIONS[0][1].encode())
        c.execute("INSERT INTO vultrscale_schema (version) VALUES (1)")
        assert c.execute("SELECT to_regclass('jobs_active_state_idx')").fetchone() != (None,)
    assert schema.migrate(pg_url) == schema.LATEST
    with psycopg.connect(pg_url) as c:
        assert c.execute("SELECT to_regclass('jobs_active_state_idx')").fetchone() == (None,)
        assert c.execute("SELECT to_regclass('jobs_ready_idx')").fetchone() != (None,)


def test_a_missing_version_below_the_highest_applied_one_is_applied(pg_url: str) -> None:
    # Versions numbered on parallel branches: a database that has 1 and 5 but not 2 gets 2.
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(
            "CREATE TABLE vultrscale_schema ("
            " version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, sql in schema.MIGRATIONS:
            if version != 2:
                c.execute(sql.encode())
                c.execute("INSERT INTO vultrscale_schema (version) VALUES (%s)", (version,))
    assert schema.migrate(pg_url) == schema.LATEST
    with psycopg.connect(pg_url) as c:
        assert c.execute("SELECT to_regclass('jobs_active_state_idx')").fetchone() == (None,)
        versions = [r[0] for r in c.execute("SELECT version FROM vultrscale_schema ORDER BY 1")]
        assert versions == [v for v, _ in schema.MIGRATIONS]


def test_a_revived_instance_s_workers_claim_again_and_a_deleting_one_is_never_revived(
    conn: psycopg.Connection,
) -> None:
    from datetime import UTC, datetime

    from vultrscale.db import ledger

    now = datetime.now(UTC)
    _instance(conn, "w-r", "running")
    q.register_worker(conn, "w-r", "w-r")
    ledger.mark_draining(conn, "w-r", now, fleet="workers")  # scale-in, then the stop
    q.mark_stopped(conn, "w-r")  # the worker drained and exited (its own mark stays)
    ledger.revive(conn, "w-r", now, fleet="workers")  # work came back
    state, draining_at = conn.execute(
        "SELECT state, draining_at FROM fleet_instances WHERE label = 'w-r'"
    ).fetchone() or ("", None)
    assert (state, draining_at) == ("running", None)
    q.register_worker(conn, "w-r", "w-r")  # `systemctl start`: a new process registers
    assert not _draining(conn, "w-r")
    q.enqueue(conn, [{}])
    assert len(q.claim(conn, "w-r", "default", 1, 30)) == 1
    # Its delete sent: never back.
    _instance(conn, "w-d", "deleting")
    q.register_worker(conn, "w-d", "w-d")
    ledger.revive(conn, "w-d", now, fleet="workers")
    assert conn.execute("SELECT state FROM fleet_instances WHERE label = 'w-d'").fetchone() == (
        "deleting",
    )
    assert _draining(conn, "w-d")


def test_a_revive_clears_the_draining_flag_in_the_same_transaction_as_the_row(
    conn: psycopg.Connection,
) -> None:
    # A worker row still there (its process still draining, or not yet stopped): the claim
    # and the heartbeat read the flag, which the revive clears with the row's state.
    from datetime import UTC, datetime

    from vultrscale.db import ledger

    now = datetime.now(UTC)
    _instance(conn, "w-s", "running")
    q.register_worker(conn, "w-s", "w-s")
    ledger.mark_draining(conn, "w-s", now, fleet="workers")
    assert _draining(conn, "w-s")
    ledger.revive(conn, "w-s", now, fleet="workers")
    assert not _draining(conn, "w-s") and q.worker_heartbeat(conn, "w-s") is False
    q.enqueue(conn, [{}])
    assert len(q.claim(conn, "w-s", "default", 1, 30)) == 1


def test_a_start_refused_drains_the_instance_again_and_marks_it_never_to_be_revived(
    conn: psycopg.Connection,
) -> None:
    """One transaction: the row and its workers draining, the mark, the error for a person;
    a later write of last_error (a delete refused, a transition) leaves the mark."""
    from datetime import UTC, datetime

    from vultrscale.db import ledger

    now = datetime.now(UTC)
    _instance(conn, "w-x", "running")
    q.register_worker(conn, "w-x", "w-x")
    ledger.start_refused(conn, "w-x", now, "systemctl start failed: refused", fleet="workers")
    assert _draining(conn, "w-x")
    ledger.note_error(conn, "w-x", "instance locked", fleet="workers", delete=True)
    (row,) = ledger.rows(conn, "workers")
    assert (row.state.value, row.never_revive, row.last_error) == (
        "draining",
        True,
        "instance locked",
    )


def test_v10_marks_the_rows_a_refused_start_left_never_to_be_revived(pg_url: str) -> None:
    """Before v10 the mark was the head of last_error: rows written so keep their meaning."""
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(
            "CREATE TABLE vultrscale_schema ("
            " version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, sql in schema.MIGRATIONS:
            if version < 10:
                c.execute(sql.encode())
                c.execute("INSERT INTO vultrscale_schema (version) VALUES (%s)", (version,))
        for label, error in (("w-refused", "systemctl start failed: exit 1"), ("w-ok", None)):
            c.execute(
                "INSERT INTO fleet_instances (label, fleet, state, created_at, state_since,"
                " last_error) VALUES (%s, 'workers', 'draining', now(), now(), %s)",
                (label, error),
            )
    assert schema.migrate(pg_url) == schema.LATEST
    with psycopg.connect(pg_url) as c:
        marks = dict(c.execute("SELECT label, never_revive FROM fleet_instances").fetchall())
    assert marks == {"w-refused": True, "w-ok": False}

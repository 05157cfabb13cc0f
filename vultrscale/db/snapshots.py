"""The fleet's snapshots in Postgres: which ones `vultrscale snapshot` made, and the current one.

``fleet_snapshots`` lists every snapshot baked for a fleet (pending ones too, so a bake that was
interrupted or timed out is never lost track of); ``fleet_state.snapshot_id`` is the one new
instances boot from when ``fleet.snapshot_id`` is empty in the config. Only a ``complete``
snapshot ever becomes the fleet's snapshot: Vultr cannot create an instance from a pending one.

Each function runs in its own transaction (a savepoint when the caller already has one open)
and translates psycopg errors into ``DatabaseError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import psycopg

from vultrscale.db import pg
from vultrscale.db.locks import lock_key

COMPLETE = "complete"
PENDING = "pending"


@dataclass(frozen=True)
class FleetSnapshot:
    """One row of ``fleet_snapshots``."""

    snapshot_id: str
    fleet: str
    description: str | None
    created_at: datetime
    status: str | None


def connect(url: str) -> psycopg.Connection:
    """An autocommit connection to ``url``; an unreachable database is a ``DatabaseError``."""
    return pg.connect(url)


@contextmanager
def _translated(what: str) -> Iterator[None]:
    with pg.translated(what):
        yield


def record_snapshot(
    conn: psycopg.Connection,
    fleet: str,
    snapshot_id: str,
    description: str | None,
    created_at: datetime,
    status: str,
) -> None:
    """Insert or update the snapshot's row; a ``complete`` one also becomes the fleet's snapshot.

    Idempotent: recording the same snapshot again updates its status (``pending`` then
    ``complete``). A snapshot in any other status is listed but never made the fleet's one.
    """
    with _translated(f"recording snapshot {snapshot_id}"), conn.transaction():
        conn.execute(
            "INSERT INTO fleet_snapshots (snapshot_id, fleet, description, created_at, status)"
            " VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (snapshot_id) DO UPDATE SET status = EXCLUDED.status,"
            " description = EXCLUDED.description",
            (snapshot_id, fleet, description, created_at, status),
        )
        if status == COMPLETE:
            conn.execute(
                "INSERT INTO fleet_state (fleet, snapshot_id, updated_at) VALUES (%s, %s, now())"
                " ON CONFLICT (fleet) DO UPDATE SET snapshot_id = EXCLUDED.snapshot_id,"
                " updated_at = now()",
                (fleet, snapshot_id),
            )


# Keeps the snapshot lock apart from the pass lock (db.ledger's namespace) and an app's own.
_LOCK_NAMESPACE = 0x56534E


@contextmanager
def fleet_lock(conn: psycopg.Connection, fleet: str) -> Iterator[None]:
    """Hold ``fleet``'s snapshot lock on ``conn`` (waiting for it): two bakes or resumes that
    finish at once record and prune one after the other, each knowing the other's snapshot.
    A reconcile pass never takes it."""
    key = (_LOCK_NAMESPACE, lock_key(fleet))
    with _translated(f"taking the snapshot lock of fleet {fleet!r}"):
        conn.execute("SELECT pg_advisory_lock(%s, %s)", key)
    try:
        yield
    finally:
        if not conn.closed:
            with contextlib.suppress(psycopg.Error):  # closing the connection frees it too
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", key)


def recorded_snapshot(conn: psycopg.Connection, fleet: str) -> str | None:
    """The snapshot id new instances of ``fleet`` boot from, or None if none was baked yet."""
    with _translated(f"reading the snapshot of fleet {fleet!r}"):
        row = conn.execute(
            "SELECT snapshot_id FROM fleet_state WHERE fleet = %s", (fleet,)
        ).fetchone()
    return row[0] if row and row[0] else None


def fleet_snapshots(conn: psycopg.Connection, fleet: str) -> list[FleetSnapshot]:
    """Every snapshot recorded for ``fleet``, newest first."""
    with _translated(f"listing the snapshots of fleet {fleet!r}"):
        rows = conn.execute(
            "SELECT snapshot_id, fleet, description, created_at, status FROM fleet_snapshots"
            " WHERE fleet = %s ORDER BY created_at DESC, snapshot_id DESC",
            (fleet,),
        ).fetchall()
    return [FleetSnapshot(*row) for row in rows]


def snapshot_fleet(conn: psycopg.Connection, snapshot_id: str) -> str | None:
    """The fleet a snapshot is recorded for, or None if none has it."""
    with _translated(f"reading the fleet of snapshot {snapshot_id}"):
        row = conn.execute(
            "SELECT fleet FROM fleet_snapshots WHERE snapshot_id = %s", (snapshot_id,)
        ).fetchone()
    return row[0] if row else None


def forget_snapshot(conn: psycopg.Connection, snapshot_id: str) -> None:
    """Remove the snapshot's row (it was deleted at Vultr, or is gone).

    A fleet whose current snapshot it was is left without one rather than pointing at an image
    that no longer exists; its next bake (or ``fleet.snapshot_id``) sets a new one.
    """
    with _translated(f"forgetting snapshot {snapshot_id}"), conn.transaction():
        conn.execute("DELETE FROM fleet_snapshots WHERE snapshot_id = %s", (snapshot_id,))
        conn.execute(
            "UPDATE fleet_state SET snapshot_id = NULL, updated_at = now() WHERE snapshot_id = %s",
            (snapshot_id,),
        )

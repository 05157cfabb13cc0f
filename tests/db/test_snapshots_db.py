"""The fleet's snapshot records in a real Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vultrscale.db import snapshots as store
from vultrscale.errors import DatabaseError

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def test_pending_is_listed_but_not_the_fleets_snapshot_until_complete(db_url: str) -> None:
    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "workers") is None
        store.record_snapshot(conn, "workers", "snap-a", "workers-a", T0, store.PENDING)
        assert store.recorded_snapshot(conn, "workers") is None
        assert [s.status for s in store.fleet_snapshots(conn, "workers")] == ["pending"]

        store.record_snapshot(conn, "workers", "snap-a", "workers-a", T0, store.COMPLETE)
        assert store.recorded_snapshot(conn, "workers") == "snap-a"
        rows = store.fleet_snapshots(conn, "workers")
        assert [(s.snapshot_id, s.status) for s in rows] == [("snap-a", "complete")]


def test_newest_first_per_fleet_and_the_latest_complete_wins(db_url: str) -> None:
    with store.connect(db_url) as conn:
        for i, sid in enumerate(["s1", "s2", "s3"]):
            store.record_snapshot(
                conn, "workers", sid, None, T0 + timedelta(minutes=i), store.COMPLETE
            )
        store.record_snapshot(conn, "other", "o1", None, T0 + timedelta(hours=1), store.COMPLETE)
        assert [s.snapshot_id for s in store.fleet_snapshots(conn, "workers")] == ["s3", "s2", "s1"]
        assert store.recorded_snapshot(conn, "workers") == "s3"
        assert store.recorded_snapshot(conn, "other") == "o1"


def test_forget_removes_the_row_and_clears_a_dangling_pointer(db_url: str) -> None:
    with store.connect(db_url) as conn:
        store.record_snapshot(conn, "workers", "s1", None, T0, store.COMPLETE)
        store.record_snapshot(conn, "workers", "s2", None, T0 + timedelta(1), store.COMPLETE)
        store.forget_snapshot(conn, "s1")
        assert store.recorded_snapshot(conn, "workers") == "s2"
        store.forget_snapshot(conn, "s2")
        assert store.recorded_snapshot(conn, "workers") is None
        assert store.fleet_snapshots(conn, "workers") == []


def test_missing_schema_says_run_db_init(pg_url: str) -> None:
    with store.connect(pg_url) as conn, pytest.raises(DatabaseError) as info:
        store.recorded_snapshot(conn, "workers")
    assert "db init" in info.value.hint


def test_unreachable_database_is_a_database_error_without_the_password() -> None:
    url = "postgresql://u:sekret-pw@127.0.0.1:1/nodb"
    with pytest.raises(DatabaseError) as info:
        store.connect(url)
    assert "sekret-pw" not in str(info.value)
    assert "***" in str(info.value)

"""The scaler's connections read timestamps in UTC whatever the server's TimeZone: in a zone
with daylight saving, two timestamps of one zone subtract in wall-clock time in Python."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from vultrscale.config import Offering
from vultrscale.core.model import InstanceState, PlanPrice
from vultrscale.db import ledger, pg
from vultrscale.rules import budget
from vultrscale.rules.offerings import Choice

# Berlin leaves summer time at 01:00 UTC on 2026-10-25: 00:30 to 02:30 UTC is two hours,
# 02:30 CEST to 03:30 CET on the wall
CREATED = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
GONE = CREATED + timedelta(hours=2)


def test_a_gone_instance_across_a_daylight_saving_change_bills_its_real_hours(
    db_url: str,
) -> None:
    with psycopg.connect(db_url, autocommit=True) as admin:
        (db,) = admin.execute("SELECT current_database()").fetchone() or ("",)
        admin.execute(f"ALTER DATABASE \"{db}\" SET TimeZone = 'Europe/Berlin'")
        choice = Choice(Offering("ewr", "vc2-1c-2gb"), PlanPrice("vc2-1c-2gb", 10.0, 0.015), 1)
        ledger.insert_intent(admin, "workers", "w-1", choice, "ssh-ed25519 AAAA", CREATED)
        ledger.transition(admin, "w-1", InstanceState.GONE, GONE, fleet="workers")
    # every connection of the scaler's (the pass's store, `events`, the replayed history)
    with pg.session(db_url, "reading the ledger") as conn:
        (row,) = ledger.rows(conn, "workers", since=budget.month_bounds(GONE)[0])
    assert row.gone_at is not None and row.gone_at - row.created_at == timedelta(hours=2)
    bills = budget.ledger_bills([row], None, GONE + timedelta(days=1))
    assert bills == {"w-1": 2 * 0.015}
